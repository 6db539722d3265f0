"""What a student reads and types outside the lessons' cells: the submodules the text names are
attributes of ``lk`` in a fresh process; compiler messages name the file the student edited
(my-work/native/, never native/); an exercise's question shows no pytest marker and, in Chinese, a
tip on English punctuation; a full-width mark in a Chinese student's code gets a line that names it."""
from __future__ import annotations

import contextlib
import io
import re
import json
import warnings

import pytest

from childproc import assert_clean, run_python
from lessonkit import exercises, native, punctuation, toolchain, workspace
from lessonkit.language import set_language

BROKEN = ("float M = -1e9f, S = 0.0f;", "float M = -1e9f S = 0.0f;")  # a missing comma


# ----------------------------------------------------------------------------- lk.<submodule>

def test_a_fresh_process_reaches_the_submodules_the_lessons_name():
    out = assert_clean(run_python("""
        import sys
        import lessonkit as lk
        assert not {"lessonkit.workspace", "lessonkit.lessons.workspace"} & set(sys.modules)  # import stays light
        print(lk.workspace.student_native.__name__, lk.table.Table.__name__, lk.variants.__name__)
        assert lk.variants is sys.modules["lessonkit.core.variants"]  # the old name reaches the layer's module
        assert "workspace" in dir(lk)
        try:
            lk.no_such_module
        except AttributeError as e:
            print("AttributeError:", e)
    """))
    assert "student_native Table lessonkit.core.variants" in out
    assert "AttributeError: module 'lessonkit' has no attribute 'no_such_module'" in out


# ----------------------------------------------------------------------------- compiler messages

@pytest.fixture
def student_copy(tmp_path, monkeypatch):
    """A workbook root in tmp_path whose my-work/native/ workspace.student_native() makes, as a
    student's (native/ itself stays the real one: only where the copy lives is moved)."""
    monkeypatch.setattr(toolchain, "REPO_DIR", tmp_path)
    monkeypatch.setattr(workspace, "WORK_DIR", tmp_path / "my-work")
    monkeypatch.setattr(workspace, "OLD_DIR", tmp_path / "my-work" / "old")
    monkeypatch.setattr(workspace, "MANIFEST", tmp_path / "my-work" / ".copied.json")
    src = workspace.student_native()
    assert src == tmp_path / "my-work" / "native"
    return src


def test_shown_dir_is_relative_to_the_workbook(tmp_path):
    assert toolchain.shown_dir(toolchain.REPO_DIR / "my-work" / "native") == "my-work/native"
    assert toolchain.shown_dir(toolchain.NATIVE_DIR) == "native"
    assert toolchain.shown_dir(tmp_path / "copy" / "native") == "native"   # a lesson's temporary copy


def test_a_syntax_error_in_the_students_copy_names_my_work_first(student_copy):
    kernel = student_copy / "flash_attn_q8_neon.c"
    text = kernel.read_text()
    line = text[:text.index(BROKEN[0])].count("\n") + 1
    kernel.write_text(text.replace(*BROKEN))
    with pytest.raises(native.BuildError) as err:
        native.load(src_dir=student_copy)
    shown = err.value._render_traceback_()
    assert shown[0].startswith(f"my-work/native/flash_attn_q8_neon.c:{line}:") and "error" in shown[0], shown[:3]
    assert not any(re.match(r"\s*native/", l) for l in shown), shown   # nothing points at the shipped native/
    assert str(student_copy) not in "\n".join(shown)


def test_a_warning_in_the_students_copy_names_my_work(student_copy):
    kernel = student_copy / "flash_attn_q8_neon.c"
    text = kernel.read_text()
    anchor = "const int nblk = hd / QBLK;"   # as tests/test_sandbox.py's warning
    kernel.write_text(text.replace(anchor, anchor + "\n    float never_set; if (seq_len < 0) scale += never_set;", 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        native.load(src_dir=student_copy)
    built = [w for w in caught if issubclass(w.category, native.BuildWarning)]
    assert built and "never_set" in str(built[0].message), [str(w.message) for w in caught]
    assert built[0].filename == "my-work/native/flash_attn_q8_neon.c"
    assert "my-work/native/flash_attn_q8_neon.c:" in str(built[0].message)


# ----------------------------------------------------------------------------- questions

def question_text(ex) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ex.question()
    return buf.getvalue()


@pytest.fixture
def chinese():
    before = set_language("zh")
    yield
    set_language(before)




@pytest.mark.parametrize("lang", ["en", "zh"])
def test_questions_show_no_pytest_marker(lang):
    before = set_language(lang)
    try:
        for ex in exercises.ALL:
            shown = question_text(ex)
            assert ex.marker not in shown and "pytest" not in shown, shown
            first = shown.splitlines()[0]
            assert first.startswith(("Lesson ", "第 ")) and str(ex.title) in first, first
    finally:
        set_language(before)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_question_paragraphs_are_not_cut_to_a_width(lang):
    """Jupyter wraps each output line to the page (pre-wrap); a line break typed into a paragraph
    would break it again at a width that is wrong for Chinese. Lines are paragraphs, list items
    or choices, none ends in a space, and no line holds a tab (its width is the browser's)."""
    before = set_language(lang)
    try:
        for ex in exercises.ALL:
            for line in question_text(ex).splitlines():
                assert line == line.rstrip() and "\t" not in line, (ex.marker, line)
            body = str(ex._text)
            for a, b in zip(body.splitlines(), body.splitlines()[1:]):
                # a paragraph goes on only as a list item ("  1.") or an indented field line
                assert not b or b.startswith((" ", "(")) or a.endswith((".", ":", "?", ";", "：", "。", "？", "；", "）", ")")), (ex.marker, a, b)
    finally:
        set_language(before)


def test_each_chinese_lesson_tips_english_punctuation_once():
    """The tip is in each Chinese lesson's exercise section, once (not repeated by every question)."""
    for path in sorted((native.REPO_DIR / "notebooks" / "zh").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        tips = [c for c in cells if c["cell_type"] == "markdown" and "invalid character" in "".join(c["source"])]
        assert len(tips) == 1, (path.name, len(tips))
    assert all("punctuation" not in question_text(ex) for ex in exercises.ALL)


# ----------------------------------------------------------------------------- full-width punctuation

@pytest.mark.parametrize("code, char, ascii", [
    ("f(1，2)", "，", ","), ("print（1)", "（", "("), ("a：int = 1", "：", ":"), ("print(“hi”)", "“", '"'),
    ("x = [1、2]", "、", ","), ("x = 1\u3000+ 2", "\u3000", " "), ("d = {1：2}", "：", ":")])
def test_a_full_width_mark_in_code_is_named_with_its_ascii(code, char, ascii):
    with pytest.raises(SyntaxError) as err:
        compile(code, "<cell>", "exec")
    assert punctuation.fullwidth_in(err.value) == (1, char, ascii)


@pytest.mark.parametrize("code", ["def f(:", "x = (1,", "print(1))"])
def test_other_syntax_errors_get_no_tip(code):
    with pytest.raises(SyntaxError) as err:
        compile(code, "<cell>", "exec")
    assert punctuation.tip(err.value) is None


def test_full_width_marks_in_strings_and_comments_are_code_that_runs():
    compile('s = "你好，世界（1）"  # 注释：没问题\n', "<cell>", "exec")   # nothing to name: it compiles


SHELL = """
    import sys
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance(colors="NoColor")
    def cell(code):
        print("=== cell")
        sys.stdout.flush()
        shell.run_cell(code)
        sys.stdout.flush()
    shell.run_cell("import lessonkit")
"""


def test_in_ipython_the_chinese_edition_adds_one_line_under_the_syntax_error():
    out = assert_clean(run_python(SHELL + """
    cell("lessonkit.set_language('zh')")
    cell("x = max(1，2)")
    cell("s = '中文，在字符串里'; print(s)")
    cell("y = (1,")
    cell("lessonkit.set_language('zh')")     # twice: still one line
    cell("z = [1，2]")
    cell("lessonkit.set_language('en')")
    cell("w = max(1，2)")
    """))
    cells = out.split("=== cell\n")[1:]
    assert "invalid character" in cells[1] and "第 1 行的 '，' 是中文（全角）字符" in cells[1], cells[1]
    assert cells[1].count("全角") == 1
    assert cells[1].index("invalid character") < cells[1].index("全角")   # under the error, not above
    assert cells[2].strip() == "中文，在字符串里"
    assert "SyntaxError" in cells[3] and "全角" not in cells[3]
    assert cells[5].count("全角") == 1
    assert "invalid character" in cells[7] and "全角" not in cells[7]   # English: Python's message alone


def test_lessonkit_lang_zh_switches_the_check_on_at_import():
    out = assert_clean(run_python(SHELL + """
    cell("x = max(1，2)")
    """, env={"LESSONKIT_LANG": "zh"}))
    assert "全角" in out


@pytest.mark.parametrize("readme", ["README.md", "README.zh-CN.md"])
def test_the_readmes_list_every_exercise_marker(readme):
    """The teachers' list of markers (the questions no longer show them) is the registry's, in order."""
    from childproc import REPO
    text = (REPO / readme).read_text(encoding="utf-8")
    for lesson in exercises.LESSONS:
        row = f"| {lesson[0].lesson} | " + ", ".join(f"`{ex.marker}`" for ex in lesson) + " |"
        assert row in text, f"{readme} lacks the row {row}"
    assert "exercises.overview()" in text and "pytest -m ex03_address tests/test_exercises.py" in text
