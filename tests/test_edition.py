"""The Chinese edition (notebooks/zh/) cannot drift from the English one: every English markdown
cell has a translation that records which version of it it translates, the Chinese notebooks are
exactly what lessonkit.edition builds from the English lessons and the translations (the code cells
are the English ones), their text is Chinese, and every link in both editions leads somewhere."""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from lessonkit import edition

REPO = edition.REPO_DIR
EN = edition.en_lessons()
IDS = [p.stem for p in EN]
MIN_SHARE = 0.80  # of the Chinese twin's markdown; article 9-2 itself scores 0.83 by chinese_share


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_lessons_are_found():
    assert len(EN) >= 11 and EN[0].name == "00_start_here.ipynb"


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_every_english_markdown_cell_has_a_current_translation(en):
    found = edition.problems(en)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_the_chinese_lesson_is_built_from_the_english_one(en):
    """Cell by cell: the language cell first, then the English cells in order with the same ids;
    code cells with the English source and metadata; markdown from the translation file, with the
    English cell's sha in its metadata. (Outputs are the Chinese run's own.)"""
    zh_path = edition.zh_path(en)
    assert zh_path.exists(), f"no {zh_path.relative_to(REPO)}: python -m lessonkit.edition build {en.stem[:3]} --execute"
    english, chinese = load(en)["cells"], load(zh_path)["cells"]
    first, rest = chinese[0], chinese[1:]
    assert first["cell_type"] == "code" and first["id"] == edition.LANGUAGE_CELL_ID
    assert edition.cell_text(first) == edition.LANGUAGE_CELL
    assert [(c["id"], c["cell_type"]) for c in rest] == [(c["id"], c["cell_type"]) for c in english]
    blocks = {b.cell_id: b for b in edition.read_blocks(edition.source_path(en))}
    rebuild = f"python -m lessonkit.edition build {en.stem[:3]} --execute"
    for e, z in zip(english, rest):
        if e["cell_type"] == "code":
            assert edition.cell_text(z) == edition.cell_text(e), f"code cell {e['id']} differs from English: {rebuild}"
            assert z["metadata"] == e["metadata"], f"code cell {e['id']}'s metadata differs: {rebuild}"
        else:
            assert edition.cell_text(z) == blocks[e["id"]].text, f"markdown cell {e['id']} is not its translation: {rebuild}"
            meta = z["metadata"].get("lessonkit", {})
            assert meta == {"translates": e["id"], "en_sha": edition.en_sha(edition.cell_text(e))}, rebuild


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_the_chinese_lesson_has_been_run(en):
    """Its committed outputs come from a run of its own code (nbval compares them when it runs it):
    every code cell that the English lesson ran has an execution count."""
    for e, z in zip(load(en)["cells"], load(edition.zh_path(en))["cells"][1:]):
        if e["cell_type"] == "code" and e.get("execution_count"):
            assert z.get("execution_count"), f"cell {z['id']} has no outputs yet: lessonkit.edition build ... --execute"


def test_a_changed_english_cell_is_reported_stale(tmp_path, monkeypatch):
    """The drift check can fail: edit one English markdown cell of a copy and its translation is
    reported stale, with the new English text to translate."""
    en = EN[4]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "zh").mkdir()
    copy = tmp_path / "notebooks" / en.name
    nb = load(en)
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    cell["source"] = edition.cell_text(cell) + "\nOne more sentence."
    copy.write_text(json.dumps(nb), encoding="utf-8")
    shutil.copy(edition.source_path(en), tmp_path / "zh" / edition.source_path(en).name)
    monkeypatch.setattr(edition, "SOURCES_DIR", tmp_path / "zh")
    monkeypatch.setattr(edition, "REPO_DIR", tmp_path)
    stale = [p for p in edition.problems(copy) if "STALE" in p]
    assert len(stale) == 1 and f"(cell {cell['id']})" in stale[0] and "One more sentence." in stale[0], stale
    with pytest.raises(ValueError, match="STALE"):
        edition.build(copy)


def test_chinese_share_counts_as_documented():
    assert edition.chinese_share("在线 softmax 的运行最大值") == pytest.approx(8 / (8 + 7 / 5))
    assert edition.chinese_share("只有中文。") == 1.0
    assert edition.chinese_share("only English here") == 0.0
    # code, formulas and link targets are left out
    assert edition.chinese_share("看 `flash_attn_single_q_q8_neon` 和 $e^{x-M}$，[参考](../../docs/references.md)") == 1.0


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_the_chinese_lesson_reads_in_chinese(en):
    text = "\n\n".join(b.text for b in edition.read_blocks(edition.source_path(en)))
    share = edition.chinese_share(text)
    assert share >= MIN_SHARE, f"{edition.source_path(en).name}: {share:.1%} Chinese, below {MIN_SHARE:.0%}"


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_every_chinese_lesson_links_the_glossary(en):
    first = edition.read_blocks(edition.source_path(en))[0].text
    assert "](../glossary.md" in first, "the first cell of the Chinese lesson links the glossary [术语表](../glossary.md)"


def test_lesson_00_of_each_edition_links_the_other():
    en00 = "\n".join(edition.cell_text(c) for c in load(EN[0])["cells"] if c["cell_type"] == "markdown")
    zh00 = "\n".join(edition.cell_text(c) for c in load(edition.zh_path(EN[0]))["cells"] if c["cell_type"] == "markdown")
    assert "](zh/00_start_here.ipynb)" in en00
    assert "](../00_start_here.ipynb)" in zh00


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _documents():
    for nb in [*EN, *(edition.zh_path(p) for p in EN)]:
        if nb.exists():
            yield nb, "\n".join(edition.cell_text(c) for c in load(nb)["cells"] if c["cell_type"] == "markdown")
    for md in [REPO / "notebooks" / "glossary.md", REPO / "README.md", REPO / "README.zh-CN.md"]:
        if md.exists():
            yield md, md.read_text(encoding="utf-8")


@pytest.mark.parametrize("doc,text", list(_documents()), ids=lambda v: v.relative_to(REPO).as_posix() if isinstance(v, Path) else "")
def test_every_relative_link_resolves(doc, text):
    """A link that works from notebooks/ may not from notebooks/zh/: each one is followed."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(REPO)}: links to missing files: {broken}"


# ----------------------------------------------------------------------------- plot text goes through tr

TEXT_CALLS = {"set_title": (0,), "set_xlabel": (0,), "set_ylabel": (0,), "suptitle": (0,),
              "labelled": (1, 3, 5)}  # plotstyle.labelled(ax, xlabel, xunit, ylabel, yunit, title)
TEXT_KEYWORDS = {"title", "xlabel", "ylabel"}


def _untranslated(tree: ast.AST) -> list[str]:
    """Titles and axis labels given as literal words, not through tr()/Text()."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = [a for i, a in enumerate(node.args) if i in TEXT_CALLS.get(name, ())]
        if name in TEXT_CALLS or name == "set":
            args += [k.value for k in node.keywords if k.arg in TEXT_KEYWORDS]
        for a in args:
            literal = (isinstance(a, ast.Constant) and isinstance(a.value, str)) or isinstance(a, ast.JoinedStr)
            if literal and re.search(r"[A-Za-z]{2,}", ast.unparse(a)):
                out.append(f"line {a.lineno}: {name}({ast.unparse(a)[:60]})")
    return out


def _code_units():
    for nb in EN:
        cells = [edition.cell_text(c) for c in load(nb)["cells"] if c["cell_type"] == "code"]
        # IPython's % and ! lines are not Python: blanked, so that line numbers stay
        code = "\n".join(cells)
        yield nb.name, "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in code.split("\n"))
    for py in sorted((REPO / "lessonkit").rglob("*.py")):
        yield py.relative_to(REPO).as_posix(), py.read_text(encoding="utf-8")


@pytest.mark.parametrize("name,code", list(_code_units()), ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_plot_titles_and_axis_labels_are_in_both_languages(name, code):
    """Every literal plot title and axis label of the lessons and lessonkit goes through
    lessonkit.tr (or Text), so the Chinese lessons' plots are labelled in Chinese."""
    found = _untranslated(ast.parse(code))
    assert not found, f"{name}: wrap these in tr(English, 中文): " + "; ".join(found)


MATH_AND_HAN = re.compile(r"\$[^$]+\$.*[\u4e00-\u9fff]|[\u4e00-\u9fff].*\$[^$]+\$", re.S)


def _math_with_chinese(tree: ast.AST) -> list[str]:
    """Chinese halves of tr()/Text() that mix $...$ with Chinese characters."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2 and \
                (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("tr", "Text"):
            zh = ast.unparse(node.args[1])
            if MATH_AND_HAN.search(zh):
                out.append(f"line {node.lineno}: {zh[:60]}")
    return out


@pytest.mark.parametrize("name,code", list(_code_units()), ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_no_chinese_text_inside_a_mathtext_label(name, code):
    """matplotlib draws a label holding $...$ entirely with its mathtext fonts, which have no Chinese:
    the Chinese becomes boxes, with only a log line, no warning. Chinese labels write Sₜ, not $S_t$."""
    found = _math_with_chinese(ast.parse(code))
    assert not found, f"{name}: a $...$ formula beside Chinese in one text (use Unicode: Sₜ, Mₜ, e^x): " + "; ".join(found)


CJK_BREAK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]\n[ \t]*[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_no_line_break_inside_a_chinese_sentence(en):
    """Markdown joins a paragraph's lines with a space, which a browser shows between two Chinese
    characters: a Chinese paragraph is one line."""
    for b in edition.read_blocks(edition.source_path(en)):
        prose = re.sub(r"```.*?```", "", b.text, flags=re.S)
        hit = CJK_BREAK.search(prose)
        assert not hit, f"{edition.source_path(en).name}, cell {b.cell_id}: a line break inside {hit.group()!r}"
