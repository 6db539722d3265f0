"""Auto-checked exercises, one module per lesson (``lesson00`` ... ``lesson09``, ``lesson05b``; introduced in
lesson 06).

In the style of Kaggle's learntools: every exercise is an object with ``question()``, ``check(answer)``,
``hint()`` and ``solution()``. ``check`` prints one line, "Correct: ...", "Incorrect: <the specific
reason>" or "Not attempted: ...", and returns a Verdict (true only when correct)::

    from lessonkit import exercises
    ex = exercises.lesson03.ex1
    ex.question()                       # the question, and the shape of the answer
    ex.check({"block": 2, "offset": 5760, "kscale_index": 296, "k_scale_index": 301})
    ex.hint(); ex.solution()

Checks compute the right answer from the code and data every time they run (segment lines from the
kernel's markers, codes and scores from the compiled kernel or its trace, sizes from a real cache),
never from a typed constant, so they stay right when the kernel changes. Answers are dicts; a value
left as ``...`` counts as not attempted. Each exercise has a pytest marker (``ex.marker``, e.g.
``ex03_address``), registered from the exercises themselves (tests/conftest.py reads ``ALL``):
``pytest -m ex03_address tests/test_exercises.py`` runs the tests of that one.

``core`` holds ``Exercise`` and ``Field`` (an exercise is declared as data), ``Verdict`` and the registry.
An answer is read without ever building something its size asks for: at most MAX_ANSWER_ITEMS values in
all (nested lists and dicts included, MAX_ANSWER_DEPTH levels deep), whole numbers below 2**63 in
magnitude, and line ranges cut to the lines the file has; a larger answer is incorrect, with a message
that says so.
"""
from __future__ import annotations

from ..core.language import _
from . import core, lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, lesson05b, lesson06, lesson07, lesson08, lesson09
from .core import CORRECT, INCORRECT, NOT_ATTEMPTED, REGISTRY, Exercise, Field, Verdict
from .lesson01 import l01_outlier_q, l01_per128_queries, l01_predict_q  # the questions name them exercises.l01_...
from .lesson02 import invariant_reference, l02_descending

#: every lesson's exercises (a list each), in lesson order
LESSONS = tuple(REGISTRY[n] for n in sorted(REGISTRY))
ALL = tuple(ex for lesson in LESSONS for ex in lesson)

__all__ = ["core", "lesson00", "lesson01", "lesson02", "lesson03", "lesson04", "lesson05", "lesson05b", "lesson06",
           "lesson07", "lesson08", "lesson09", "CORRECT", "INCORRECT", "NOT_ATTEMPTED", "Exercise", "Field", "Verdict",
           "LESSONS", "ALL", "overview", "l01_predict_q", "l01_outlier_q", "l01_per128_queries", "l02_descending", "invariant_reference"]


def overview():
    """A table of every exercise: lesson, attribute, pytest marker, title."""
    from ..display.table import Table
    rows = [(ex.lesson, f"lesson{ex.lesson}.ex{i}", ex.marker, str(ex.title))
            for lesson in LESSONS for i, ex in enumerate(lesson, start=1)]
    return Table(rows, header=[_("lesson"), _("object"), _("pytest marker"),
                               _("title")])
