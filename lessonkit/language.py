"""The language the workbook speaks to the student: English (the default) or Simplified Chinese.

The Chinese lessons (``notebooks/zh/``) start with ``lessonkit.set_language("zh")``; from then on
lessonkit's messages, exercise texts and verdicts, the set-up check and plot labels are Chinese.
Code identifiers, C source and compiler output stay as they are in both languages.

Two ways to write a text in both languages, next to each other where it is used:

    tr("tokens", "token 数")        # a text shown now: the current language's half
    Text("tokens", "token 数")      # a text defined now and shown later (an exercise's question,
                                     # built when its module is imported): str() picks the half

``LESSONKIT_LANG=zh`` in the environment makes Chinese the default of a new process (the tests
use it; a lesson says it in its first cell instead)."""
from __future__ import annotations

import os
import unicodedata

LANGUAGES = {"en": "English", "zh": "简体中文 (Simplified Chinese)"}


def _checked(lang) -> str:
    if not isinstance(lang, str) or lang.strip().lower() not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(map(repr, LANGUAGES))}; got {lang!r} "
                         "(for example lessonkit.set_language('zh')) / 语言只能是 'en' 或 'zh'")
    return lang.strip().lower()


def _from_environment() -> str:
    """LESSONKIT_LANG's language; English, with a warning, for a value that is none (importing
    lessonkit must not fail on it)."""
    try:
        return _checked(os.environ.get("LESSONKIT_LANG") or "en")
    except ValueError as e:
        import warnings
        warnings.warn(f"LESSONKIT_LANG: {e}; speaking English", stacklevel=3)
        return "en"


_current = _from_environment()


# Called with the new language after each switch: lessonkit.plotstyle registers itself here (so that
# the plots' font follows the language, and Chinese checks for a Chinese font) without this module
# importing matplotlib.
_listeners: list = []


def on_change(listener) -> None:
    """Call ``listener(lang)`` after every ``set_language``."""
    _listeners.append(listener)


def set_language(lang: str) -> str:
    """Speak ``lang`` ("en" or "zh") from now on in this process; returns the language before.
    In Chinese, lessonkit.plotstyle's style also picks a Chinese font (and says once what to install
    if there is none)."""
    global _current
    before, _current = _current, _checked(lang)
    for listener in _listeners:
        listener(_current)
    return before


def language() -> str:
    """The current language: "en" or "zh"."""
    return _current


def tr(en: str, zh: str) -> str:
    """``zh`` when the current language is Chinese, else ``en``."""
    return zh if _current == "zh" else en


class Text:
    """A text in both languages, resolved when it is shown: ``str(Text(en, zh))`` is the current
    language's half (``tr``), ``Text.en`` and ``Text.zh`` are the halves."""
    __slots__ = ("en", "zh")

    def __init__(self, en: str, zh: str):
        self.en, self.zh = en, zh

    def __str__(self) -> str:
        return tr(self.en, self.zh)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"Text({self.en!r}, {self.zh!r})"

    def __bool__(self) -> bool:
        return bool(self.en or self.zh)

    def __eq__(self, other) -> bool:
        return isinstance(other, Text) and (self.en, self.zh) == (other.en, other.zh)

    def __hash__(self) -> int:
        return hash((self.en, self.zh))


def text(value) -> str:
    """A plain string, a ``Text`` or None as the current language's string ("" for None)."""
    return "" if value is None else str(value)


# Tables printed in Chinese: a Chinese character takes two columns of a fixed-width font, where
# str.ljust and f"{s:<n}" count one, so a Chinese table's columns would drift without these.

def columns(s: str) -> int:
    """The columns ``s`` takes in a fixed-width font: two for each wide (Chinese) character."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in s)


def pad(s: str, width: int, right: bool = False) -> str:
    """``s`` padded with spaces to ``width`` columns, on the right (``f"{s:<width}"`` for ASCII),
    or on the left with ``right=True`` (``f"{s:>width}"``)."""
    fill = " " * max(0, width - columns(s))
    return fill + s if right else s + fill


def cut(s: str, width: int) -> str:
    """``s`` cut to at most ``width`` columns (``s[:width]`` for ASCII)."""
    while columns(s) > width:
        s = s[:-1]
    return s
