"""Graded mode (LESSONKIT_GRADED) and python -m workbench grade: the class's notebooks graded by
otter-grader tests generated from the exercise registry (workbench/grade.py, grade_notebook.py)."""
from __future__ import annotations

import pytest

import lessonkit as lk
from lessonkit import exercises as E
from lessonkit.exercises import core


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_graded_mode_hides_solution_and_answer(monkeypatch, capsys, lang):
    ex = E.lesson01.ex2
    monkeypatch.setenv(core.GRADED_ENV, "1")
    before = lk.set_language(lang)
    try:
        assert ex.answer() is None
        ex.solution()
        said = capsys.readouterr().out.splitlines()
        assert said == [str(core.SOLUTIONS_OFF)] * 2
        assert ("老师" in said[0]) == (lang == "zh") and "distinct" not in said[0]
        assert ex.check({"distinct_with_outlier": 1, "distinct_without": 1}).status == E.INCORRECT  # checks still work
    finally:
        lk.set_language(before)
    for off in ("", "0", "off"):
        monkeypatch.setenv(core.GRADED_ENV, off)
        assert set(ex.answer()) == {"distinct_with_outlier", "distinct_without"}


# ----------------------------------------------------------------------------- one graded run, shared

import ast  # noqa: E402
import copy  # noqa: E402
import csv  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
needs_otter = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("otter", "nbclient")),
                                 reason="needs otter-grader (pip install -e '.[grade]'; make grade installs it)")
CELL_TIMEOUT = 15   # the hanging cell's; every cell of these short notebooks takes a few seconds at most


def cheap(lesson: str, edition: str, answers: dict | None = None, before: dict | None = None,
          drop: tuple = ()) -> dict:
    """The shipped lesson cut to what its exercises need: its language cell, the cell that imports the
    exercises, the answer cells as shipped (``...``). ``answers``: {exercise index: {variable: value}}
    set in that answer cell just before its check line; ``before``: {exercise index: a cell's source}
    put before that answer cell; ``drop``: the exercises whose answer cell is deleted."""
    from workbench import grade, grade_notebook as gn
    nb = json.loads(grade.shipped(lesson, edition).read_text("utf-8"))
    calls = gn.check_calls(nb, lesson)
    roots = {site.text.split(".")[0] for unused, site in calls.values()}

    def binds(cell) -> set:
        tree = gn._code(cell) if cell["cell_type"] == "code" else None
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] if tree else []
        return {(a.asname or a.name).split(".")[0] for n in imports for a in n.names}

    keep = {c for c, cell in enumerate(nb["cells"])
            if cell["cell_type"] == "code" and "set_language" in "".join(cell["source"])}
    keep |= {next(c for c, cell in enumerate(nb["cells"]) if root in binds(cell)) for root in roots}
    answer_cell = {c: i for i, (c, unused) in calls.items()}
    cells = []
    for c, cell in enumerate(nb["cells"]):
        if c not in keep and c not in answer_cell or answer_cell.get(c) in drop:
            continue
        cell = copy.deepcopy(cell)
        i = answer_cell.get(c)
        if i is not None and answers and i in answers:
            lines = "".join(cell["source"]).splitlines()
            at = next(k for k, line in enumerate(lines) if ".check(" in line)
            lines[at:at] = [f"{name} = {value}" for name, value in answers[i].items()]
            cell["source"] = "\n".join(lines)
        if i is not None and before and i in before:
            cells.append({"cell_type": "code", "id": f"grade-test-{i}", "metadata": {}, "outputs": [],
                          "execution_count": None, "source": before[i]})
        cells.append(cell)
    return {**nb, "cells": cells}


def right_answers(lesson: str, solutions: dict, transcript: bool = True) -> dict:
    """{exercise index: {variable: Python source}}: each exercise's own solution in its answer variable;
    tier A's session is the student's debugger log in my-work/."""
    from workbench import grade_notebook as gn
    calls = gn.lesson_calls(next((ROOT / "notebooks").glob(f"{lesson}_*.ipynb")), lesson)
    right = {}
    for i, ex in enumerate(E.REGISTRY[lesson]):
        if ex.marker == "ex06_tier_a":
            right[i] = {"transcript": 'debug.tier_a_log("gdb")', "answers": repr(solutions[ex.marker]["answers"])}
        else:
            right[i] = {calls[i].names[0]: repr(solutions[ex.marker])}
    return right


def put(students: Path, who: str, rel: str, nb) -> None:
    path = students / who / "my-work" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb), encoding="utf-8")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One graded run of five students: right, blank, known mistakes (and a patched check), a crash and
    a hang, a notebook that is not JSON. {(student, lesson, exercise): (points, verdict)}, the out folder."""
    from test_debug import typed_tier_a_session   # tier A's session as a student types it, under the real gdb
    from workbench import grade, grade_capture, grade_notebook as gn
    base = tmp_path_factory.mktemp("grade")
    cache, students, out = base / "cache", base / "students", base / "out"
    with ThreadPoolExecutor(1) as pool:   # the right answers (and the builds they need) while gdb runs
        solving = pool.submit(grade.warm_cache, ["01", "06"], cache)
        unused, log = typed_tier_a_session("gdb", base)
        solutions = {m: grade_capture.decode(v) for m, v in solving.result().items()}
    assert set(solutions) == {ex.marker for n in ("01", "06") for ex in E.REGISTRY[n]}, solutions
    right01, right06 = right_answers("01", solutions), right_answers("06", solutions)
    put(students, "alice", "01_quantize_q.ipynb", cheap("01", "en", right01))
    put(students, "alice", "zh/06_debug_exercises.ipynb", cheap("06", "zh", right06))
    # bob's Chinese lesson 01 crashes its kernel after two answers
    put(students, "bob", "zh/01_quantize_q.ipynb", cheap("01", "zh", right01, {2: "import os\nos.abort()"}))
    put(students, "bob", "06_debug_exercises.ipynb", cheap("06", "en", right06))
    for who in ("alice", "bob"):
        (students / who / "my-work" / "06_tier_a_gdb.txt").write_text(log)
    put(students, "carol", "zh/01_quantize_q.ipynb", cheap("01", "zh"))
    put(students, "carol", "06_debug_exercises.ipynb", cheap("06", "en"))
    # dan replaces check in his kernel and tries to leave a file in lessonkit, answers exercise 1 with a
    # known mistake, then hangs. In his Chinese lesson 06 he would answer right if he could see alice's folder
    wrong_codes = {**solutions["ex01_predict_codes"], "codes": [127, -63, 1, 1]}
    patch = ("from lessonkit.exercises import core\n"
             "core.Exercise.check = lambda self, *a, **k: core.Verdict('correct', 'patched')\n"
             "import pathlib\ntry:\n    pathlib.Path(core.__file__).with_name('planted.py').write_text('')\n"
             "except OSError as e:\n    print(e)")
    put(students, "dan", "01_quantize_q.ipynb", cheap("01", "en", {0: {"answer1": repr(wrong_codes)}},
                                                      {0: patch, 1: "while True:\n    pass"}))
    alice = str(students / "alice")
    peek = f'"a" if __import__("os").path.exists({alice!r}) else "b"' if gn.available_sandbox() else '"b"'
    put(students, "dan", "zh/06_debug_exercises.ipynb", cheap("06", "zh", {2: {"answer_3": f'{{"choice": {peek}}}'}},
                                                              drop=(3,)))   # and deletes exercise 4's cell
    put(students, "frank", "01_quantize_q.ipynb", '{"cells": [ this is not JSON')
    assert grade.main([str(students), "--out", str(out), "--cache", str(cache), "--jobs", "2",
                       "--cell-timeout", str(CELL_TIMEOUT), "--timeout", "300"]) == 0
    assert not (ROOT / "lessonkit" / "exercises" / "planted.py").exists()   # the teacher's lessonkit is read-only
    with open(out / "grades.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student", "lesson", "exercise", "points", "verdict"]
    return {(r["student"], r["lesson"], r["exercise"]): (float(r["points"]), r["verdict"]) for r in rows}, out


def label(status: str, lang: str) -> str:
    before = lk.set_language(lang)
    try:
        return str(core.STATUS_LABELS[status]) + str(lk.language._(": "))
    finally:
        lk.set_language(before)


def lesson_rows(graded, student: str, lesson: str) -> dict:
    found = {ex: v for (s, ln, ex), v in graded[0].items() if (s, ln) == (student, lesson)}
    number = lesson.split("/")[-1]
    assert set(found) == {ex.marker for ex in E.REGISTRY[number]}, found
    return found


@needs_otter
@pytest.mark.parametrize("student, lesson", [("alice", "01"), ("alice", "zh/06"), ("bob", "zh/01"), ("bob", "06")])
def test_the_right_answers_score_full_marks(graded, student, lesson):
    """Slow once (about 70 s here, in its fixture): the class is graded once for the tests of this file, each
    notebook run whole in its sandbox."""
    lang = "zh" if lesson.startswith("zh/") else "en"
    for ex, (points, verdict) in lesson_rows(graded, student, lesson).items():
        if (student, ex) != ("bob", "ex01_per128"):   # bob's kernel crashed before that answer
            assert points == 1 and verdict.startswith(label(E.CORRECT, lang)), (ex, verdict)


@needs_otter
@pytest.mark.parametrize("student, lesson", [("carol", "zh/01"), ("carol", "06")])
def test_a_blank_notebook_scores_zero(graded, student, lesson):
    lang = "zh" if lesson.startswith("zh/") else "en"
    for ex, (points, verdict) in lesson_rows(graded, student, lesson).items():
        assert points == 0 and verdict.startswith(label(E.NOT_ATTEMPTED, lang)), (ex, verdict)


@needs_otter
def test_a_known_mistake_gets_its_message_in_the_students_language(graded):
    from lessonkit.exercises import lesson06
    en = lesson_rows(graded, "dan", "01")
    # the notebook replaced Exercise.check in its kernel: the grade is the teacher's check all the same
    points, verdict = en["ex01_predict_codes"]
    assert points == 0 and verdict.startswith(label(E.INCORRECT, "en")) and "code 1 is not -63" in verdict, verdict
    zh = lesson_rows(graded, "dan", "zh/06")   # (in bubblewrap, it cannot see alice's folder: else it answers a)
    points, verdict = zh["ex06_tier_b_why"]
    before = lk.set_language("zh")
    try:
        why = str(lesson06.WHY_CHOICES["b"].why)
    finally:
        lk.set_language(before)
    assert points == 0 and verdict.startswith(label(E.INCORRECT, "zh")) and why in verdict, verdict
    assert zh["ex06_tier_a"][1].startswith(label(E.NOT_ATTEMPTED, "zh"))
    points, verdict = zh["ex06_break_rescale"]   # its answer cell deleted
    assert points == 0 and verdict.startswith(label(core.NOT_RUN, "zh")), verdict
    assert "没有运行 ex.lesson06.ex4.check(answer_4) 的单元" in verdict, verdict


@needs_otter
def test_a_crash_or_a_hang_gets_zero_with_the_reason_and_the_others_are_graded(graded):
    points, verdict = lesson_rows(graded, "bob", "zh/01")["ex01_per128"]   # the answers before count
    assert points == 0 and verdict.startswith(label(core.NOT_RUN, "zh")) and "SIGABRT" in verdict, verdict
    assert "内核在第" in verdict, verdict
    hung = lesson_rows(graded, "dan", "01")
    for ex in ("ex01_outlier", "ex01_per128"):
        points, verdict = hung[ex]
        assert points == 0 and verdict.startswith(label(core.NOT_RUN, "en")), verdict
        assert f"ran longer than {CELL_TIMEOUT} s" in verdict, verdict
    for ex, (points, verdict) in lesson_rows(graded, "frank", "01").items():
        assert points == 0 and "could not be read" in verdict, verdict
    assert {s for s, unused, unused2 in graded[0]} == {"alice", "bob", "carol", "dan", "frank"}


@needs_otter
def test_one_self_contained_feedback_page_per_student_in_their_language(graded):
    out = graded[1]
    pages = {p.stem: p.read_text("utf-8") for p in (out / "feedback").glob("*.html")}
    assert set(pages) == {"alice", "bob", "carol", "dan", "frank"}
    for page in pages.values():
        assert not any(s in page for s in ("http:", "https:", "<script", "<link", "src=", "url(")), page
    assert '<html lang="zh-CN">' in pages["alice"] and "的练习评分" in pages["alice"]   # 4 of 7 exercises Chinese
    assert '<html lang="en">' in pages["frank"] and "could not be read" in pages["frank"]
    assert '<html lang="en">' in pages["bob"] and "SIGABRT" in pages["bob"] and "第 01 课" in pages["bob"]
    for (student, unused, exercise), (unused2, verdict) in graded[0].items():
        assert exercise in pages[student]
    tests = sorted(p.relative_to(out / ".tests").as_posix() for p in (out / ".tests").rglob("*.py"))
    assert tests == sorted(f"{e}/{n}/{ex.marker}.py" for e in ("en", "zh") for n in ("01", "06")
                           for ex in E.REGISTRY[n])   # one otter test per exercise, from the registry


def test_hand_ins_are_found_in_a_class_hubs_homes_and_never_through_a_link(tmp_path):
    from workbench import grade
    homes = tmp_path / "home"
    work = homes / "jupyter-ann" / "flash-attn-q8" / "my-work"
    for rel in ("01_quantize_q.ipynb", "zh/06_debug_exercises.ipynb", "old/01_quantize_q.ipynb", "notes.ipynb"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("{}")
    (homes / "jupyter-bea").mkdir()
    (homes / "jupyter-bea" / "01_quantize_q.ipynb").symlink_to(work / "01_quantize_q.ipynb")   # ann's notebook
    (homes / "jupyter-cy").symlink_to(homes / "jupyter-ann")
    found = [(h.student, h.lesson, h.edition, h.path.relative_to(homes).as_posix()) for h in grade.find_hand_ins(homes)]
    assert found == [("jupyter-ann", "01", "en", "jupyter-ann/flash-attn-q8/my-work/01_quantize_q.ipynb"),
                     ("jupyter-ann", "06", "zh", "jupyter-ann/flash-attn-q8/my-work/zh/06_debug_exercises.ipynb")]


@pytest.mark.parametrize("data", [b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}',   # no cells
                                  b'{"cells": 3, "nbformat": 4, "nbformat_minor": 5, "metadata": {}}', b"\xff\xfe",
                                  b"[]", b'{"cells": [ not JSON'])
def test_a_notebook_edited_into_nonsense_is_refused_with_the_reason(data):
    from workbench import grade
    with pytest.raises(ValueError, match=r"^\w+Error: "):
        grade.read_notebook(data)
