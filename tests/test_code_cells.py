"""The code cells read in the student's language: an English lesson's cells hold English and no
translation call; a Chinese lesson's cells hold no English prose (every string and comment meant for a
reader was filled in from the translation file), and what they print is Chinese. Each rule is also
shown to fail on a cell that breaks it."""
from __future__ import annotations

import json
import re

import pytest

from workbench import edition

EN = edition.en_lessons()
IDS = [p.stem for p in EN]
TRANSLATION_CALL = re.compile(r"(?<![\w])(tr|Text|_|N_)\(")
# A cell whose output is not prose (C source, a compiler's or debugger's text, numbers) says so in its
# metadata, with the reason: {"lessonkit": {"output": "C source"}}. Its outputs need no Chinese.
OUTPUT_KEY = "output"


def code_cells(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [c for c in nb["cells"] if c["cell_type"] == "code" and c["id"] != edition.LANGUAGE_CELL_ID]


def english_faults(source: str) -> list[str]:
    """A translation call or a Chinese character in an English lesson's code."""
    found = [f"a translation call: {m.group()}" for m in TRANSLATION_CALL.finditer(source)]
    found += [f"Chinese: {ln.strip()}" for ln in source.split("\n") if edition.is_chinese(ln)]
    return found


def english_left(source: str, kept: set[str]) -> list[str]:
    """The prose literals of a Chinese lesson's code that are still English (those the translation file
    keeps on purpose aside)."""
    return [lit.text for lit in edition.prose(source) if not edition.is_chinese(lit.text) and lit.text not in kept]


def output_text(output: dict) -> str | None:
    """The text an output shows the student; None for a figure (an image, its text is a repr)."""
    if output["output_type"] == "stream":
        return "".join(output["text"])
    if output["output_type"] == "error":
        return "\n".join([output["ename"], output["evalue"]])
    data = output.get("data", {})
    if any(k.startswith("image/") for k in data):
        return None
    text = data.get("text/html") or data.get("text/markdown") or data.get("text/plain") or ""
    return "".join(text) if isinstance(text, list) else text


def not_chinese_outputs(cell: dict) -> list[str]:
    """The text outputs of a cell that hold no Chinese. A cell marked as printing no prose is excused,
    but for what it writes to stderr: a warning a student sees is never excused."""
    outputs = cell.get("outputs", [])
    if cell.get("metadata", {}).get("lessonkit", {}).get(OUTPUT_KEY):
        outputs = [o for o in outputs if o["output_type"] == "stream" and o.get("name") == "stderr"]
    texts = [output_text(o) for o in outputs]
    return [t for t in texts if t is not None and t.strip() and not edition.is_chinese(t)]


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_english_code_cells_hold_no_translation_call_and_no_chinese(en):
    found = {c["id"]: english_faults(edition.cell_text(c)) for c in code_cells(en)}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"{en.name}: write the English alone; the translation file holds the Chinese: {found}"


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_chinese_code_cells_hold_no_english_prose(en):
    kept = {b.cell_id: {p.en for p in edition.read_pairs(b) if p.kept}
            for b in edition.read_blocks(edition.source_path(en)) if b.kind == "code"}
    found = {c["id"]: english_left(edition.cell_text(c), kept.get(c["id"], set())) for c in code_cells(edition.zh_path(en))}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"{edition.zh_path(en).name}: English strings or comments left: {found}"


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_chinese_code_cells_print_chinese(en):
    """Every text output of the Chinese lesson's committed run holds Chinese, but for the cells whose
    metadata says why their output is not prose."""
    found = {c["id"]: [t[:120] for t in not_chinese_outputs(c)] for c in code_cells(edition.zh_path(en))}
    found = {k: v for k, v in found.items() if v}
    assert not found, f"{edition.zh_path(en).name}: outputs without Chinese: {found}"


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_a_cell_that_prints_no_prose_says_why(en):
    """The mark is a reason, and it sits on a cell that has output to excuse."""
    for c in code_cells(en):
        reason = c.get("metadata", {}).get("lessonkit", {}).get(OUTPUT_KEY)
        if reason is not None:
            assert isinstance(reason, str) and len(reason) > 3, (c["id"], reason)


def test_the_rules_catch_a_broken_cell():
    """Each rule fails on a cell that breaks it (and passes the same cell written right)."""
    assert english_faults('print(lk.tr("max error", "最大误差"))')
    assert english_faults('print(Text("a", "b"))') and english_faults('print(_("max error"))')
    assert english_faults('print("最大误差")') and english_faults('x = 1  # 误差')
    assert not english_faults('print("max error:", err)  # the largest')
    assert english_left('print("max error:", err)', set()) == ['"max error:"']
    assert english_left('x = 1  # the largest', set()) == ["# the largest"]
    assert english_left('print("hd 32")', {'"hd 32"'}) == []
    assert english_left('print("最大误差：", err)  # 最大的', set()) == []
    english = {"output_type": "stream", "name": "stdout", "text": ["max error: 0.1\n"]}
    chinese = {"output_type": "stream", "name": "stdout", "text": ["最大误差：0.1\n"]}
    figure = {"output_type": "display_data", "data": {"image/png": "", "text/plain": "<Figure>"}, "metadata": {}}
    assert not_chinese_outputs({"outputs": [english, chinese, figure]}) == ["max error: 0.1\n"]
    assert not_chinese_outputs({"outputs": [english], "metadata": {"lessonkit": {OUTPUT_KEY: "C source"}}}) == []
    warning = {"output_type": "stream", "name": "stderr", "text": ["findfont: Failed to find font weight bold\n"]}
    assert not_chinese_outputs({"outputs": [warning], "metadata": {"lessonkit": {OUTPUT_KEY: "C source"}}})
    table = {"output_type": "execute_result", "data": {"text/html": "<table><th>tokens</th></table>"}, "metadata": {}}
    assert not_chinese_outputs({"outputs": [table]})
