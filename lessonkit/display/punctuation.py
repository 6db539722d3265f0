"""Full-width punctuation typed in code (the Chinese edition, from lesson 00 on).

A Chinese input method types ``，`` for ``,`` and ``（`` for ``(``; Python then says, in English,
``SyntaxError: invalid character '，' (U+FF0C)``. When the language is Chinese, a cell that fails so in
IPython (Jupyter) gets one more line, in Chinese, naming the character and the ASCII one to type.
The code is never rewritten: the student fixes it, and learns where the mark came from.
``lessonkit.set_language("zh")`` switches the check on in the running IPython, ``"en"`` off.
"""
from __future__ import annotations

import re
import sys
import unicodedata

from ..core.language import _, language, on_change

# CJK punctuation an input method types where code wants ASCII, beyond the full-width forms
# U+FF01..U+FF5E (which NFKC maps to ASCII: ，→, （→( ：→: ＝→=)
_CJK_PUNCTUATION = {"、": ",", "。": ".", "“": '"', "”": '"', "‘": "'", "’": "'", "【": "[", "】": "]",
                    "《": "<", "》": ">", "\u3000": " ", "…": "..."}   # not "·": prose writes q · k for a product
# Python 3.9+: "invalid character '，' (U+FF0C)"; a full-width space: "invalid non-printable character U+3000"
_INVALID = re.compile(r"invalid (?:non-printable )?character (?:'.' )?\(?U\+([0-9A-Fa-f]{4,6})\)?")


def ascii_for(char: str) -> str | None:
    """The ASCII punctuation a full-width or CJK mark stands for in code, or None."""
    if char in _CJK_PUNCTUATION:
        return _CJK_PUNCTUATION[char]
    if len(char) == 1 and "\uff01" <= char <= "\uff5e":
        return unicodedata.normalize("NFKC", char)
    return None


def fullwidth_in(error: BaseException) -> tuple[int | None, str, str] | None:
    """(line, character, its ASCII) when ``error`` is a SyntaxError at a full-width punctuation mark
    in code (not in a string or a comment: the tokenizer met it as code), else None."""
    if not isinstance(error, SyntaxError):
        return None
    found = []
    m = _INVALID.search(str(error.msg or ""))
    if m:
        found.append(chr(int(m.group(1), 16)))
    line, offset = error.text or "", error.offset
    if isinstance(offset, int) and 0 < offset <= len(line):
        found.append(line[offset - 1])   # a mark that makes another error (an unclosed "（")
    for char in found:
        replacement = ascii_for(char)
        if replacement is not None:
            return error.lineno, char, replacement
    return None


def tip(error: BaseException) -> str | None:
    """The line that names the full-width mark of ``error`` and its ASCII replacement, or None."""
    found = fullwidth_in(error)
    if found is None:
        return None
    line, char, replacement = found
    return _("Line {line}: {char!r} is a full-width (Chinese) character; in code, type the English "
             "{ascii!r} instead (Chinese inside strings and comments is fine).").format(
             line=line, char=char, ascii=replacement)


def _after_cell(result) -> None:
    """IPython's post_run_cell event: add the tip under the SyntaxError the cell showed."""
    for error in (result.error_before_exec, result.error_in_exec):
        line = tip(error) if error is not None else None
        if line:
            print(line)
            return


def _shell():
    ipython = sys.modules.get("IPython")   # never imported here: outside IPython there is no cell to check
    return ipython.get_ipython() if ipython is not None else None


def check_input(enabled: bool) -> bool:
    """Register (or remove) the check in the running IPython; False when there is none."""
    shell = _shell()
    if shell is None:
        return False
    callbacks = shell.events.callbacks["post_run_cell"]
    if enabled and _after_cell not in callbacks:
        shell.events.register("post_run_cell", _after_cell)
    elif not enabled and _after_cell in callbacks:
        shell.events.unregister("post_run_cell", _after_cell)
    return True


def follow_language() -> None:
    """On in Chinese, off in English, from now on (``LESSONKIT_LANG=zh`` included)."""
    on_change(lambda lang: check_input(lang == "zh"))
    if language() == "zh":
        check_input(True)
