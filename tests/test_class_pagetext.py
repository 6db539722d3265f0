"""class/pagetext.py without a hub: the password pages have every word in both languages, with the
same placeholders, and a browser that has not logged in gets the first of zh and en it prefers (the
class's default language when it names neither)."""
from __future__ import annotations

import re
import string
import sys
from pathlib import Path

import pytest

CLASS = Path(__file__).resolve().parent.parent / "class"
sys.path.insert(0, str(CLASS))
import pagetext  # noqa: E402


def placeholders(text: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(text) if field}


def test_both_languages_have_every_word_with_the_same_placeholders():
    assert set(pagetext.TEXT) == set(pagetext.LANGUAGES)
    en, zh = pagetext.TEXT["en"], pagetext.TEXT["zh"]
    assert set(en) == set(zh)
    for key in en:
        assert placeholders(en[key]) == placeholders(zh[key]), key
        assert en[key].format(name="ming", length=8) and zh[key].format(name="ming", length=8)


def test_every_word_the_templates_use_is_there():
    used = set()
    for template in (CLASS / "templates").glob("*.html"):
        used |= set(re.findall(r"\bt\.(\w+)", template.read_text(encoding="utf-8")))
    assert used and used <= set(pagetext.TEXT["en"]), used - set(pagetext.TEXT["en"])


@pytest.mark.parametrize("header, default, expected", [
    ("zh-CN,zh;q=0.9,en;q=0.8", "en", "zh"),        # a Chinese browser
    ("en-US,en;q=0.9", "zh", "en"),                  # an English one
    ("en-GB;q=0.5, zh-TW;q=0.7", "en", "zh"),        # the weight decides, not the order
    ("fr-FR,fr;q=0.9,en;q=0.5,zh;q=0.4", "zh", "en"),  # the first of the two it names
    ("fr-FR,de", "zh", "zh"),                        # neither: the class's default
    ("zh;q=0, en;q=0.1", "zh", "en"),                # q=0 means "not this one"
    ("ZH-hans", "en", "zh"),                         # tags are case-insensitive
    ("zh;q=x", "en", "en"),                          # a weight that cannot be read counts for nothing
    ("", "zh", "zh"),
    (None, "en", "en"),                              # no header at all
])
def test_a_browser_gets_the_first_class_language_it_prefers(header, default, expected):
    assert pagetext.browser_language(header, default) == expected


def test_the_class_default_is_chinese_unless_set(monkeypatch):
    monkeypatch.delenv("CLASS_DEFAULT_LANG", raising=False)
    assert pagetext.class_default() == "zh"
    monkeypatch.setenv("CLASS_DEFAULT_LANG", "en")
    assert pagetext.class_default() == "en"
    monkeypatch.setenv("CLASS_DEFAULT_LANG", "fr")  # not a class language
    assert pagetext.class_default() == "zh"
