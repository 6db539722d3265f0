"""The language the workbook speaks to the student: English (the default) or Simplified Chinese.

The Chinese lessons (``notebooks/zh/``) start with ``lessonkit.set_language("zh")``; from then on
lessonkit's messages, exercise texts and verdicts, the set-up check and plot labels are Chinese.
Code identifiers, C source and compiler output stay as they are in both languages.

Every message goes through one gettext catalog: the English text is the msgid, written at the call
site, and ``lessonkit/locale/zh_CN/LC_MESSAGES/lessonkit.po`` holds its Chinese (compiled to the
``.mo`` beside it with ``make catalog``; ``tests/test_catalog.py`` holds the two to each other):

    _("tokens")                        # a text shown now, in the current language
    _("{n} tokens").format(n=n)        # with numbers: named fields, filled after translation
    N_("Correct")                      # a text defined now and shown later (an exercise's question,
                                       # built when its module is imported): str() translates it

``LESSONKIT_LANG=zh`` in the environment makes Chinese the default of a new process (the tests
use it; a lesson says it in its first cell instead)."""
from __future__ import annotations

import gettext
import os
from pathlib import Path

LANGUAGES = {"en": "English", "zh": "简体中文 (Simplified Chinese)"}
LOCALE_DIR = Path(__file__).resolve().parents[1] / "locale"
DOMAIN = "lessonkit"
_GETTEXT_LANGUAGE = {"zh": "zh_CN"}


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


def _catalog(lang: str) -> gettext.NullTranslations:
    """The compiled catalog of ``lang``; English is the msgids themselves."""
    if lang == "en":
        return gettext.NullTranslations()
    return gettext.translation(DOMAIN, LOCALE_DIR, languages=[_GETTEXT_LANGUAGE[lang]])


_current = _from_environment()
_translations = _catalog(_current)

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
    global _current, _translations
    new = _checked(lang)
    _translations = _catalog(new)
    before, _current = _current, new
    for listener in _listeners:
        listener(_current)
    return before


def language() -> str:
    """The current language: "en" or "zh"."""
    return _current


def _(message: str) -> str:
    """``message`` (an English msgid of the catalog) in the current language."""
    return _translations.gettext(message)


def from_c(message: str) -> str:
    """``_(message)`` for an English text that native/ holds, not Python (a segment's title, what a
    version adds): the catalog has those of the shipped sources, which tests/test_catalog.py reads
    from there; a text a student wrote into the C is shown as written."""
    return _translations.gettext(message)


class N_:
    """A message defined now and translated each time it is shown: ``str(N_("Correct"))`` and
    ``f"{N_('Correct')}"`` are the current language's text; ``.msgid`` is the English. Fields given
    now fill the text when it is shown: ``N_("{n} tokens", n=4)``. Not a str, so that no string
    operation can use the English by mistake."""
    __slots__ = ("msgid", "fields")

    def __init__(self, msgid: str, **fields):
        self.msgid, self.fields = msgid, fields

    def __str__(self) -> str:
        return _(self.msgid).format(**self.fields) if self.fields else _(self.msgid)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def format(self, *args, **kwargs) -> str:
        return str(self).format(*args, **kwargs)

    def __add__(self, other) -> str:
        return str(self) + str(other)

    def __radd__(self, other) -> str:
        return str(other) + str(self)

    def __bool__(self) -> bool:
        return bool(self.msgid)

    def __eq__(self, other) -> bool:
        return isinstance(other, N_) and (other.msgid, other.fields) == (self.msgid, self.fields)

    def __hash__(self) -> int:
        return hash(self.msgid)

    def __repr__(self) -> str:
        return f"N_({self.msgid!r})"


def text(value) -> str:
    """A plain string, an ``N_`` message or None as the current language's string ("" for None)."""
    return "" if value is None else str(value)
