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
