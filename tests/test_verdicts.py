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
VERDICT = {"en": re.compile(r"(?P<a>[^\n]+?) vs (?P<b>[^\n]+?): (?:(?P<w>[^\n]+?) faster by (?P<x>[\d.]+)x"
                            r"|(?P<no>cannot tell here)(?:: the time of [^\n]+? is (?P<r>[\d.]+), and this run's band "
                            r"(?P<lo>[\d.]+)-(?P<hi>[\d.]+))?)"),
           "zh": re.compile(r"(?P<a>[^\n]+?) 对比 (?P<b>[^\n]+?)：(?:(?P<w>[^\n]+?) 更快，速度是另一方的 (?P<x>[\d.]+) 倍（"
                            r"|(?P<no>这里无法判断)(?:：[^\n]+? = (?P<r>[\d.]+)，本次运行的噪声区间 "
                            r"(?P<lo>[\d.]+)-(?P<hi>[\d.]+))?)")}
SPINE_CELLS, SPINE_WORDS = 35, 2000


def outputs(path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def verdicts(text: str, lang: str) -> list[str]:
    """Each verdict's outcome in order: "a" (the first named is faster), "b", or "cannot tell"."""
    return [v[0] for v in read(text, lang)]


def read(text: str, lang: str) -> list[tuple]:
    """Each verdict in order as (outcome, b's time / a's time, its band): the band of a "cannot tell" (None when the
    machine was busy), the ratio a "faster" verdict gives."""
    out = []
    for m in VERDICT[lang].finditer(text):
        if m.group("no"):
            band = (float(m.group("lo")), float(m.group("hi"))) if m.group("lo") else None
            out.append(("cannot tell", None, band))
        elif m.group("a").endswith(m.group("w")):
            out.append(("a", float(m.group("x")), None))
        elif m.group("b") == m.group("w"):
            out.append(("b", 1 / float(m.group("x")), None))
        else:
            out.append((f"unreadable: {m.group(0)}", None, None))
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
    """The editions print the same verdicts, one by one. They may differ only within a band: where one says "cannot
    tell" and the other names a faster contender, the other's ratio lies inside the first one's band (to the two
    decimals printed), and the lessons say why a rerun may differ that way. Opposite verdicts fail."""
    en, zh = read(outputs(path), "en"), read(outputs(zh_of(path)), "zh")
    assert len(en) == len(zh), f"{path.stem}: {len(en)} verdicts in English, {len(zh)} in Chinese"
    wrong = []
    for i, (e, z) in enumerate(zip(en, zh)):
        if e[0] == z[0]:
            continue
        told, said = (e, z) if e[0] == "cannot tell" else (z, e)
        if told[0] != "cannot tell" or told[2] is None or not told[2][0] - 0.01 <= said[1] <= told[2][1] + 0.01:
            wrong.append((i, e, z))
    assert not wrong, (f"{path.stem}: the editions differ beyond a band (verdict, English, Chinese): {wrong}; run both "
                       "again, one after the other, on a quiet machine")


@pytest.mark.parametrize("path", EN, ids=IDS)
def test_the_spine_keeps_its_shape(path):
    cells = nbformat.read(path, as_version=4).cells
    end = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"
                and re.search(r"^#+ .*Going further", c.source, re.M)), len(cells))
    words = sum(len(c.source.split()) for c in cells[:end] if c.cell_type == "markdown")
    assert end <= SPINE_CELLS and words <= SPINE_WORDS, (
        f"{path.stem}: {end} cells and {words} words before 'Going further' (at most {SPINE_CELLS} and "
        f"{SPINE_WORDS}): fold what is not the spine into 'Going further'")
