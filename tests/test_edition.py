"""The Chinese edition (notebooks/zh/) cannot drift from the English one: every English markdown
cell and every English code cell's prose (strings and comments) has a translation that records which
version of it it translates, the Chinese notebooks are exactly what workbench/edition.py builds from the
English lessons and the translations (the code cells are the English ones with their prose filled
in), their text is Chinese, and every link in both editions leads somewhere."""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from workbench import edition

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
    code cells with the English source (its prose filled in from the translation file) and metadata;
    markdown from the translation file, with the English cell's sha in its metadata. (Outputs are
    the Chinese run's own.)"""
    zh_path = edition.zh_path(en)
    assert zh_path.exists(), f"no {zh_path.relative_to(REPO)}: python -m workbench edition build {en.stem[:3]} --execute"
    english, chinese = load(en)["cells"], load(zh_path)["cells"]
    first, rest = chinese[0], chinese[1:]
    assert first["cell_type"] == "code" and first["id"] == edition.LANGUAGE_CELL_ID
    assert edition.cell_text(first) == edition.LANGUAGE_CELL
    assert [(c["id"], c["cell_type"]) for c in rest] == [(c["id"], c["cell_type"]) for c in english]
    blocks = {b.cell_id: b for b in edition.read_blocks(edition.source_path(en)) if b.kind == "cell"}
    pairs = {b.cell_id: edition.read_pairs(b) for b in edition.read_blocks(edition.source_path(en)) if b.kind == "code"}
    rebuild = f"python -m workbench edition build {en.stem[:3]} --execute"
    for e, z in zip(english, rest):
        if e["cell_type"] == "code":
            filled = edition.fill(edition.cell_text(e), pairs.get(e["id"], []))
            assert edition.cell_text(z) == filled, f"code cell {e['id']} is not the English one filled in: {rebuild}"
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
            assert z.get("execution_count"), f"cell {z['id']} has no outputs yet: python -m workbench edition build ... --execute"


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


def _copy(tmp_path, monkeypatch, en, nb=None):
    """A copy of lesson ``en`` (or ``nb`` in its place) in tmp_path/notebooks/, with the real translation
    file and the real Chinese twin beside it, where a build writes."""
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    (tmp_path / "zh").mkdir()
    copy = tmp_path / "notebooks" / en.name
    copy.write_text(json.dumps(load(en) if nb is None else nb), encoding="utf-8")
    shutil.copy(edition.source_path(en), tmp_path / "zh" / edition.source_path(en).name)
    shutil.copy(edition.zh_path(en), tmp_path / "notebooks" / "zh" / en.name)
    monkeypatch.setattr(edition, "SOURCES_DIR", tmp_path / "zh")
    monkeypatch.setattr(edition, "ZH_DIR", tmp_path / "notebooks" / "zh")
    monkeypatch.setattr(edition, "REPO_DIR", tmp_path)
    return copy


def _changed_copy(tmp_path, monkeypatch, en, cell_id, old, new):
    """A copy of lesson ``en`` with ``old`` replaced by ``new`` in cell ``cell_id``, and the real
    translation file beside it."""
    nb = load(en)
    cell = next(c for c in nb["cells"] if c["id"] == cell_id)
    assert edition.cell_text(cell).count(old) == 1
    cell["source"] = edition.cell_text(cell).replace(old, new)
    return _copy(tmp_path, monkeypatch, en, nb)


def test_a_failed_build_leaves_the_old_notebook(tmp_path, monkeypatch):
    """The Chinese notebook is written beside itself and renamed into place: a write that fails (here
    the text cannot be encoded, a lone surrogate in the notebook's metadata) leaves the old twin whole
    and no temporary file."""
    nb = load(EN[0])
    nb["metadata"]["note"] = "\ud800"
    copy = _copy(tmp_path, monkeypatch, EN[0], nb)
    twin = edition.zh_path(copy)
    old = twin.read_bytes()
    with pytest.raises(UnicodeEncodeError):
        edition.build(copy)
    assert twin.read_bytes() == old
    assert [p.name for p in twin.parent.iterdir()] == [twin.name]
    del nb["metadata"]["note"]
    copy.write_text(json.dumps(nb), encoding="utf-8")
    assert edition.build(copy) == twin and twin.read_bytes() == old  # the same sources build the same file


def test_a_byte_order_mark_is_read_past(tmp_path):
    """A translation file saved by an editor that writes a UTF-8 byte-order mark reads as without it
    (not as text before the first header)."""
    src = edition.source_path(EN[0])
    (bom := tmp_path / src.name).write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    assert edition.read_blocks(bom) == edition.read_blocks(src)


def test_a_translation_file_that_is_not_utf8_is_named(tmp_path, monkeypatch):
    copy = _copy(tmp_path, monkeypatch, EN[0])
    src = edition.source_path(copy)
    lines = src.read_bytes().split(b"\n")
    lines[2] = "中文".encode("gbk")  # saved in the Chinese Windows encoding
    src.write_bytes(b"\n".join(lines))
    [found] = edition.problems(copy)
    assert found.startswith(f"zh/{src.name}:3: not UTF-8 text") and "save it as UTF-8" in found, found
    with pytest.raises(ValueError, match="not UTF-8 text"):
        edition.build(copy)


@pytest.mark.parametrize("text,why", [
    (lambda good: good[:len(good) // 2], "not valid JSON"),
    (lambda good: "[]", "not a notebook"),
    (lambda good: '{"cells": [{"source": "x"}]}', "not a notebook"),
], ids=["cut off", "a list", "a cell without type or id"])
def test_a_corrupt_notebook_is_named(tmp_path, monkeypatch, text, why):
    """An English lesson, or the Chinese twin a build keeps the outputs of, that is not a notebook:
    the message names the file, what is wrong and what to do (not a bare JSONDecodeError)."""
    copy = _copy(tmp_path, monkeypatch, EN[0])
    good = copy.read_text(encoding="utf-8")
    copy.write_text(text(good), encoding="utf-8")
    [found] = edition.problems(copy)
    assert found.startswith(f"notebooks/{copy.name}") and why in found and "git checkout --" in found, found
    copy.write_text(good, encoding="utf-8")
    twin = edition.zh_path(copy)
    twin.write_text(text(twin.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ValueError, match=f"notebooks/zh/{copy.name}.*{why}"):
        edition.build(copy)


def test_a_changed_english_string_is_reported(tmp_path, monkeypatch):
    """The drift check covers the code cells' prose: change one printed string of a copy of lesson 00
    and its block is stale, the new string has no Chinese, the old pair is unused; a new comment
    has no Chinese either."""
    copy = _changed_copy(tmp_path, monkeypatch, EN[0], "fd3de2c8", '"max |kernel - float64| = ', '"largest |kernel - float64| = ')
    found = edition.problems(copy)
    assert any("STALE" in p and "(code fd3de2c8)" in p for p in found), found
    assert any("no Chinese for" in p and "largest |kernel" in p for p in found), found
    assert any("unused" in p and "max |kernel" in p for p in found), found
    with pytest.raises(ValueError, match="no Chinese for"):
        edition.build(copy)


def test_a_new_comment_is_reported(tmp_path, monkeypatch):
    copy = _changed_copy(tmp_path, monkeypatch, EN[0], "fd3de2c8", "kh = 3\n", "kh = 3  # the fourth kv head\n")
    found = edition.problems(copy)
    assert any("no Chinese for # the fourth kv head" in p for p in found), found


def test_a_skeleton_lists_each_code_cells_prose(tmp_path, monkeypatch):
    """skeleton writes a TODO block for every markdown cell and every code cell with prose, each prose
    literal paired with itself to translate; such a file does not build until it is translated."""
    monkeypatch.setattr(edition, "SOURCES_DIR", tmp_path)
    monkeypatch.setattr(edition, "REPO_DIR", tmp_path.parent)
    blocks = {(b.kind, b.cell_id): b for b in edition.read_blocks(edition.skeleton(EN[0]))}
    code = blocks[("code", "fd3de2c8")]
    assert code.todo and code.sha == edition.prose_sha(edition.cell_text(next(
        c for c in load(EN[0])["cells"] if c["id"] == "fd3de2c8")))
    assert ["# the compiled kernel", "# the compiled kernel"] in [[p.en, p.zh] for p in edition.read_pairs(code)]
    assert ("code", "6368315b") not in blocks   # a cell without prose has no block
    assert any("not translated yet" in p for p in edition.problems(EN[0]))


def test_which_literals_are_prose():
    prose = ['"max error:"', 'f"kv head {kh}"', '# the compiled kernel', '"rows of 64, not 128"', "f'{n} checks passed'"]
    # a single word is prose where it labels a table or a plot, and only there
    cell = 'show(Table(rows, header=["tokens", "ns"], caption="time"))\nx = d["tokens"]\nax.set_xlabel("seq_len")\n'
    assert [lit.text for lit in edition.prose(cell)] == ['"tokens"', '"ns"', '"time"', '"seq_len"']
    assert edition.prose('Table([(v, d[v]) for v in names], header=["name", "value"])') != []
    assert edition.prose('Table([[m[k] for k in ("k", "scales")] for m in ms])') == []   # keys it runs over
    assert [lit.text for lit in edition.prose('Table([(k, m["loads"]) for k in ks], header=["k"])')] == []
    code = ['"neon"', '"k"', '".3f"', '"-O3"', '"kv_head"', 'f"T={T}"', '"upper left"', '"kscale[(size_t)t * nkv]"',
            '"/* pass 2 */"', '"#define KVQ_INV"', '"float M = -1e9f"', 'b"two words"', '"  "', 'f"{x:.2f} {y}"']
    assert [t for t in prose if not edition.is_prose(t)] == []
    assert [t for t in code if edition.is_prose(t)] == []


def test_literals_of_a_cell():
    src = 'x = f"{a:>3} of {b}"  # note\n%time y = "two words"\nprint("one", \'two\')\n'
    # an IPython % line is not Python: its text is left alone
    assert [lit.text for lit in edition.literals(src)] == ['f"{a:>3} of {b}"', "# note", '"one"', "'two'"]
    pairs = [edition.Pair('f"{a:>3} of {b}"', 'f"{a} 共 {b}"', 1), edition.Pair("# note", "# 注", 2)]
    assert edition.fill(src, pairs).startswith('x = f"{a} 共 {b}"  # 注\n%time y = "two words"')


@pytest.mark.parametrize("en,zh,why", [
    ('"two words"', '"两个词', "is not one"),
    ('"two words"', '"two words"', "no Chinese"),
    ('f"{n} words"', 'f"{m} 个词"', "same {expressions}"),
    ('"two words"', "# 两个词", "a comment translates to a comment"),
    ('"two words"', '"两个" + "词"', "not one string literal"),
])
def test_a_pair_that_cannot_stand_in_the_code_is_refused(en, zh, why):
    assert why in edition.pair_problem(edition.Pair(en, zh, 1))


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


# ----------------------------------------------------------------------------- plot text in the student's language

TEXT_CALLS = {"set_title": (0,), "set_xlabel": (0,), "set_ylabel": (0,), "suptitle": (0,),
              "labelled": (1, 3, 5)}  # plotstyle.labelled(ax, xlabel, xunit, ylabel, yunit, title)
TEXT_KEYWORDS = {"title", "xlabel", "ylabel"}


def _literal_labels(tree: ast.AST):
    """Titles and axis labels given as literal words: (line, call name, the literal's text)."""
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
                yield a.lineno, name, ast.unparse(a)


def _cells_code(nb: Path) -> str:
    cells = [edition.cell_text(c) for c in load(nb)["cells"] if c["cell_type"] == "code"]
    # IPython's % and ! lines are not Python: blanked, so that line numbers stay
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in "\n".join(cells).split("\n"))


def _modules():
    for py in sorted((REPO / "lessonkit").rglob("*.py")):
        yield py.relative_to(REPO).as_posix(), py.read_text(encoding="utf-8")


@pytest.mark.parametrize("name,code", list(_modules()), ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_lessonkit_plot_titles_and_axis_labels_go_through_the_catalog(name, code):
    """Every literal plot title and axis label of lessonkit is a message (``_()``, ``N_()``, or the
    old ``tr``/``Text``), so the Chinese lessons' plots are labelled in Chinese."""
    found = [f"line {n}: {call}({text[:60]})" for n, call, text in _literal_labels(ast.parse(code))]
    assert not found, f"{name}: make these messages, _(...): " + "; ".join(found)


@pytest.mark.parametrize("en", EN, ids=IDS)
def test_chinese_lessons_label_their_plots_in_chinese(en):
    """A lesson's literal titles and axis labels are filled in by the edition build: the Chinese
    lesson's are Chinese (the English lesson's are English: tests/test_code_cells.py)."""
    zh = edition.zh_path(en)
    found = [f"line {n}: {call}({text[:60]})" for n, call, text in _literal_labels(ast.parse(_cells_code(zh)))
             if not edition.is_chinese(text)]
    assert not found, f"{zh.name}: labels left in English (translate them in {edition.source_path(en).name}): " + "; ".join(found)


MATH_AND_HAN = re.compile(r"\$[^$]+\$.*[\u4e00-\u9fff]|[\u4e00-\u9fff].*\$[^$]+\$", re.S)


def _math_with_chinese(texts) -> list[str]:
    return [t[:60] for t in texts if MATH_AND_HAN.search(t)]


def _chinese_halves(code: str) -> list[str]:
    """The Chinese halves of lessonkit's remaining tr()/Text() calls."""
    return [ast.unparse(node.args[1]) for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Call) and len(node.args) >= 2
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("tr", "Text")]


@pytest.mark.parametrize("name,code", [*_modules(), *((p.name, "") for p in EN)],
                         ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_no_chinese_text_inside_a_mathtext_label(name, code):
    """matplotlib draws a label holding $...$ entirely with its mathtext fonts, which have no Chinese:
    the Chinese becomes boxes, with only a log line, no warning. Chinese labels write Sₜ, not $S_t$.
    Checked in lessonkit's Chinese halves and in every literal of the Chinese lessons' code."""
    if name.endswith(".ipynb"):
        texts = [lit.text for lit in edition.literals(_cells_code(edition.ZH_DIR / name))]
    else:
        texts = _chinese_halves(code)
    found = _math_with_chinese(texts)
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
