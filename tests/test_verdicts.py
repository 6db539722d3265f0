"""What the committed lessons conclude about time holds: no committed output comes from a busy run, the two
editions' committed verdicts (``lessonkit.core.compare``'s sentences) agree one by one, and every lesson keeps
the spine's shape (at most 35 cells and 2,000 words of markdown before "Going further")."""
from __future__ import annotations

import re

import nbformat
import pytest

from workbench import edition

EN = edition.en_lessons()
IDS = [p.stem for p in EN]

# what a busy run prints: compare's verdict on a loaded machine, in each language
BUSY = ("the machine was busy", "unreliable", "机器当时很忙", "不可靠")
# a verdict names a, b, then the faster one ("{a} vs {b}: {fast} faster by"), or says it cannot tell
VERDICT = {"en": re.compile(r"(?P<a>[^\n]+?) vs (?P<b>[^\n]+?): (?:(?P<w>[^\n]+?) faster by |(?P<no>cannot tell here))"),
           "zh": re.compile(r"(?P<a>[^\n]+?) 对比 (?P<b>[^\n]+?)：(?:(?P<w>[^\n]+?) 快 [\d.]+ 倍（|(?P<no>这里无法判断))")}
SPINE_CELLS, SPINE_WORDS = 35, 2000


def outputs(path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def verdicts(text: str, lang: str) -> list[str]:
    """Each verdict's outcome in order: "a" (the first named is faster), "b", or "cannot tell"."""
    out = []
    for m in VERDICT[lang].finditer(text):
        out.append("cannot tell" if m.group("no") else "a" if m.group("a").endswith(m.group("w")) else
                   "b" if m.group("b") == m.group("w") else f"unreadable: {m.group(0)}")
    return out


def zh_of(en_path):
    return en_path.parent / "zh" / en_path.name


def test_the_patterns_read_both_languages():
    """The patterns read compare's own sentences (so that this test cannot pass by reading nothing)."""
    import lessonkit
    from lessonkit.core.compare import Verdict
    v = lambda ratio: Verdict("4 calls", "one call", ratio, (ratio * 0.9, ratio * 1.1), 7, {}, {}, (0.1, 0.1), 2)
    for lang in ("en", "zh"):
        lessonkit.set_language(lang)
        try:
            text = "\n".join(f"8K: {v(r)}" for r in (2.0, 0.5, 1.0))
        finally:
            lessonkit.set_language("en")
        assert verdicts(text, lang) == ["a", "b", "cannot tell"], (lang, text)


@pytest.mark.parametrize("path", EN, ids=IDS)
def test_no_committed_output_comes_from_a_busy_run(path):
    for p in (path, zh_of(path)):
        text = outputs(p)
        found = [w for w in BUSY if w in text]
        assert not found, (f"{p.relative_to(p.parents[2])} was run on a busy machine (it prints {found}): run it again "
                           "when the load average is under the number of cores")


@pytest.mark.parametrize("path", EN, ids=IDS)
def test_the_editions_verdicts_agree(path):
    """The editions print the same verdicts, one by one, and never opposite ones. One may say "cannot tell" where the
    other names a faster contender: the two runs differ then within their bands (a second thread on a 2-core virtual
    machine is the usual case: whether the other core is free changes from run to run), which a lesson's verdict
    sentence says ("this run's band"). A verdict naming the other contender faster would be a contradiction."""
    en, zh = verdicts(outputs(path), "en"), verdicts(outputs(zh_of(path)), "zh")
    assert len(en) == len(zh), f"{path.stem}: {len(en)} verdicts in English, {len(zh)} in Chinese"
    opposite = [(i, a, b) for i, (a, b) in enumerate(zip(en, zh)) if {a, b} == {"a", "b"}]
    unread = [v for v in en + zh if v.startswith("unreadable")]
    assert not opposite and not unread, (f"{path.stem}: the editions conclude opposite things (verdict, English, "
                                         f"Chinese): {opposite or unread}; run both again, one after the other, on a "
                                         "quiet machine")


@pytest.mark.parametrize("path", EN, ids=IDS)
def test_the_spine_keeps_its_shape(path):
    cells = nbformat.read(path, as_version=4).cells
    end = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"
                and re.search(r"^#+ .*Going further", c.source, re.M)), len(cells))
    words = sum(len(c.source.split()) for c in cells[:end] if c.cell_type == "markdown")
    assert end <= SPINE_CELLS and words <= SPINE_WORDS, (
        f"{path.stem}: {end} cells and {words} words before 'Going further' (at most {SPINE_CELLS} and "
        f"{SPINE_WORDS}): fold what is not the spine into 'Going further'")
