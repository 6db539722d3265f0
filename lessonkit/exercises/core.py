"""The machinery of the exercises, in the manner of Kaggle learntools' problem classes.

An exercise is declared as data: its question, ``facts`` (a function computing the right answer now,
from the code and data, with whatever its messages quote), one ``Field`` per value of the answer
(its kind, the tolerance it is compared with, what a wrong value means, known mistakes), the message
of a right answer, hint and explanation. Only a check that fields cannot express has a ``check``
function of its own. ``Exercise.check`` reads the answer once, at the edge: its size, its ``...``,
its shape, then each field by its kind; whatever an answer holds, it gets a verdict.
"""
from __future__ import annotations

import functools
import math
import numbers
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core.cache import KVCacheQ8
from ..core.attention import attend
from ..core.language import N_, _, text
from ..core.validate import short

MAX_ANSWER_ITEMS = 10_000   # values in one answer; the longest right answer has a few hundred
MAX_ANSWER_DEPTH = 16       # nesting of lists and dicts in one answer
MAX_WHOLE = 2**63           # |whole number| of any answer: line numbers, counts, bytes

CORRECT, INCORRECT, NOT_ATTEMPTED = "correct", "incorrect", "not attempted"
# NOT_RUN: the grader's verdict on an exercise whose answer cell never ran (python -m workbench grade)
NOT_RUN = "not run"
STATUS_LABELS = {CORRECT: N_("Correct"), INCORRECT: N_("Incorrect"),
                 NOT_ATTEMPTED: N_("Not attempted"), NOT_RUN: N_("Not run")}

# Graded mode: set by the teacher or the class hub (LESSONKIT_GRADED=1 in the environment of the
# students' servers), solution() and answer() say that solutions are off instead of showing them.
# Read at each call, so that a hub's setting reaches a kernel without a restart of anything else.
GRADED_ENV = "LESSONKIT_GRADED"
SOLUTIONS_OFF = N_("Your teacher has turned solutions off for graded work; check(answer) still says what is off.")


def graded() -> bool:
    """Is graded mode on (LESSONKIT_GRADED set to anything but "", "0", "false", "no" or "off")?"""
    return os.environ.get(GRADED_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Verdict:
    """The result of a check: ``status`` is "correct", "incorrect" or "not attempted"."""
    status: str
    message: str

    def __bool__(self) -> bool:
        return self.status == CORRECT

    def __str__(self) -> str:
        return f"{STATUS_LABELS[self.status]}{_(': ')}{self.message}"

    __repr__ = __str__

    def _ipython_display_(self):
        pass  # check() has printed the line already; do not print it twice in a notebook


class Wrong(Exception):
    """Raised while reading an answer: it is incorrect, for the reason given."""


class Blank(Exception):
    """Raised while reading an answer: part of it is still ``...``."""


def filled(value) -> bool:
    return value is not None and value is not Ellipsis


def _has_blank(value) -> bool:
    """Is a ``...`` left anywhere in the answer? Wrong for an answer of more than MAX_ANSWER_ITEMS
    values or MAX_ANSWER_DEPTH levels, counted before anything is walked."""
    budget, stack, found = MAX_ANSWER_ITEMS, [(value, 0)], False
    while stack:
        v, depth = stack.pop()
        if v is Ellipsis:
            found = True
            continue
        if isinstance(v, Mapping):
            children = v.values()
        elif isinstance(v, (list, tuple, set, frozenset)):
            children = v
        else:
            continue
        if depth >= MAX_ANSWER_DEPTH:
            raise Wrong(_("your answer is nested more than {MAX_ANSWER_DEPTH} levels deep; no answer here is").format(
                          MAX_ANSWER_DEPTH=MAX_ANSWER_DEPTH))
        budget -= len(children)
        if budget < 0:
            raise Wrong(_("your answer holds more than {MAX_ANSWER_ITEMS} values; no answer here is that large").format(
                          MAX_ANSWER_ITEMS=MAX_ANSWER_ITEMS))
        stack.extend((c, depth + 1) for c in children)
    return found


def field_of(answer: Mapping, key, kind=None):
    """answer[key], read as ``kind`` (int: a whole number; bool: True or False; float); Blank if it
    is still ``...``, Wrong if it is missing or unreadable."""
    if key not in answer:
        raise Wrong(_("your answer has no {key!r}").format(key=key))
    v = answer[key]
    if not filled(v):
        raise Blank(_("fill in {key!r}").format(key=key))
    if kind is int:
        return whole(v, repr(key))
    if kind is bool:
        if not isinstance(v, (bool, np.bool_)):
            raise Wrong(_("{key!r} = {short_v} cannot be read (expected True or False)").format(
                          key=key, short_v=short(v)))
        return bool(v)
    if kind is float:
        try:
            return float(v)
        except (TypeError, ValueError, OverflowError) as e:  # float(10**400) overflows
            raise Wrong(_("{key!r} = {short_v} cannot be read ({e})").format(key=key, short_v=short(v), e=e)) from None
    return v


def whole(value, what: str) -> int:
    """A whole number below MAX_WHOLE in magnitude from an int, a float such as 3.0 or a string
    such as "3"; Wrong otherwise."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError("expected a whole number")
        if isinstance(value, numbers.Integral):
            n = int(value)
        else:
            f = float(value)
            if not math.isfinite(f) or f != int(f):
                raise TypeError("expected a whole number")
            n = int(value) if isinstance(value, str) else int(f)
    except (TypeError, ValueError, OverflowError) as e:
        raise Wrong(_("{what} = {short_value} cannot be read ({e})").format(
                      what=what, short_value=short(value), e=e)) from None
    if abs(n) >= MAX_WHOLE:
        raise Wrong(_("{what} = {short_n} is far too large: no answer here reaches 2**63").format(
                      what=what, short_n=short(n)))
    return n


def items_of(answer: Mapping, key, most: int) -> list:
    """answer[key] as a list of at most ``most`` values (a list, tuple, set, range or 1-D array;
    its length is checked before anything is read from it)."""
    v = field_of(answer, key)
    if isinstance(v, np.ndarray):
        v = v.ravel() if v.ndim <= 1 else v
    if not isinstance(v, (list, tuple, set, frozenset, range, np.ndarray)):
        raise Wrong(_("{key!r} is a list; got {v} {short_v}").format(
                      key=key, v=type(v).__name__, short_v=short(v)))
    if len(v) > most:
        raise Wrong(_("{key!r} holds {v} values; the answer has at most {most}").format(
                      key=key, v=len(v), most=most))
    return list(v)


def close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(b), 1e-300)


@dataclass(frozen=True)
class Choice:
    text: N_
    why: N_   # the explanation shown when this choice is picked (right or wrong)


def pick(answer: Mapping, key: str, choices: dict[str, Choice], right: str) -> str:
    """Read a multiple-choice field; Wrong with the picked choice's explanation unless it is ``right``,
    else that explanation."""
    value = field_of(answer, key)
    got = (value if isinstance(value, str) else short(value, 20)).strip().strip("()").lower()
    if got not in choices:
        raise Wrong(_("{key!r} must be one of {map_choices}; got {short_value}").format(
                      key=key, map_choices=', '.join(map(repr, choices)), short_value=short(value)))
    if got != right:
        raise Wrong(f"({got}) {choices[got].why}")
    return f"({got}) {choices[got].why}"


def say(message, facts: Mapping, **values) -> str:
    """A message of a declaration: an N_ message formatted with ``values`` and the facts, or a function of them."""
    if callable(message):
        return message(**values, **facts)
    return text(message).format(**values, **facts)


def _is_choice(kind) -> bool:
    return isinstance(kind, Mapping) and isinstance(next(iter(kind.values())), Choice)


@dataclass(frozen=True)
class Field:
    """How one value of an answer is read and compared with the fact of the same name.

    ``kind``: int, float, bool, list or tuple (whole numbers, in any order or in order), a dict of
    Choice (multiple choice), or a dict of accepted words -> the word they mean. A number matches
    within ``rtol`` of the fact, or ``atol``. ``wrong`` says what a wrong value means: an N_ message
    formatted with ``key``, ``got``, ``want`` and the facts, a (too low, too high) pair of them, or a
    function of those names. ``mistakes``: known wrong values (a value or a function of the facts)
    and what each means, matched with the same tolerance."""
    kind: object = float
    wrong: object = ""
    rtol: float = 0.0
    atol: float = 0.0
    mistakes: tuple = ()

    def same(self, got, want) -> bool:
        if self.kind in (int, float):
            return abs(got - want) <= max(self.atol, self.rtol * abs(want))
        return got == want

    def read(self, answer: Mapping, key, facts: dict) -> None:
        """Wrong unless answer[key] is the fact; a multiple choice puts its explanation in facts["why"]."""
        kind, want = self.kind, facts[key]
        if _is_choice(kind):
            facts["why"] = pick(answer, key, kind, want)
            return
        if isinstance(kind, Mapping):
            got = kind.get(str(field_of(answer, key)).strip().lower().replace("-", "").replace(" ", ""))
            if got is None:
                raise Wrong(_("{key!r} is one of {map_set_values_kind}").format(
                              key=key, map_set_values_kind=', '.join(map(repr, sorted(set(kind.values()))))))
        elif kind in (list, tuple):
            got = [whole(n, _("a whole number")) for n in items_of(answer, key, 64)]
            got, want = (sorted(got), sorted(want)) if kind is list else (got, list(want))
        else:
            got = field_of(answer, key, kind)
        if self.same(got, want):
            return
        for value, message in self.mistakes:
            if self.same(got, value(**facts) if callable(value) else value):
                raise Wrong(say(message, facts, key=key, got=got, want=want))
        wrong = self.wrong
        if isinstance(wrong, tuple):
            wrong = wrong[0] if got < want else wrong[1]
        raise Wrong(say(wrong, facts, key=key, got=got, want=want))


class Exercise:
    """One exercise: ``question()``, ``check(answer)``, ``hint()``, ``solution()``, ``answer()``.

    Declared with ``name`` (its slug: the pytest marker is ``ex<lesson>_<name>``, set by ``register``),
    ``title``, ``question``, ``facts`` (a function of the check's keyword arguments, or a dict: the
    right answer under the template's keys, and whatever the messages quote), ``fields`` (key ->
    Field, read in order), ``check`` (only where fields cannot say it: a function (answer, facts)
    returning the message of a right answer, raising Wrong or Blank), ``correct`` (the message of a
    right answer, an N_ message formatted with the facts, ``why`` the picked choice's explanation),
    ``template`` (the answer's shape, ``...`` where the student fills in; by default one ``...`` per
    field), ``solution`` (facts -> the answer shown; by default the facts of the template's keys),
    ``hint`` and ``explain`` (shown with the solution). A multiple-choice field's choices are shown
    with the question."""

    def __init__(self, name: str, title: N_, question: N_, *, facts, hint: N_, fields=None,
                 check: Callable | None = None, correct="{why}", template=None, solution=None, explain: N_ = ""):
        self.lesson, self.slug, self.marker, self.title = "", name, name, title
        self._text, self._hint, self._explain, self._facts = question, hint, explain, facts
        self.fields, self._check, self._correct, self._solution = fields or {}, check, correct, solution
        self.template = template if template is not None else dict.fromkeys(self.fields, ...)
        self.choices = next((f.kind for f in self.fields.values() if _is_choice(f.kind)), {})

    def __repr__(self) -> str:
        return f"<Exercise {self.marker}: {text(self.title)}>"

    def facts(self, **context) -> dict:
        return dict(self._facts(**context) if callable(self._facts) else self._facts)

    def question(self) -> None:
        """Print the question: its title, its text (one line per paragraph: Jupyter wraps them to the
        output's width, where a fixed width would cut Chinese, whose characters are twice as wide,
        too late), the choices and the answer's shape. The pytest marker is for teachers (the
        README lists them), not in the student's text."""
        lines = [_("Lesson {lesson}, {title}").format(lesson=self.lesson, title=self.title), text(self._text)]
        lines += [f"  ({key}) {c.text}" for key, c in self.choices.items()]
        if self.template is not ...:   # a whole answer of one value (a transcript) has no shape to show
            lines.append(f"answer = {shown(self.template)}")
        print("\n".join(lines))

    def check(self, answer=None, **context) -> Verdict:
        """Print and return the verdict on ``answer`` (None or ... means not attempted)."""
        try:
            v = self._verdict(answer, context)
        except Blank as e:
            v = Verdict(NOT_ATTEMPTED, str(e))
        except Wrong as e:
            v = Verdict(INCORRECT, str(e))
        print(v)
        return v

    def _verdict(self, answer, context) -> Verdict:
        try:
            blank = _has_blank(answer)   # first of all: an answer too large to read is incorrect, unread
            if not filled(answer) or (isinstance(answer, Mapping) and answer
                                      and not any(filled(v) for v in answer.values())):
                return Verdict(NOT_ATTEMPTED, _("give your answer as {shown_template}").format(
                                                shown_template=shown(self.template)))
        except Wrong:
            raise
        except Exception as e:  # noqa: BLE001 - an answer whose objects raise is unreadable, not a crash
            return _unreadable(e)
        if blank:
            raise Blank(_("replace every ... in {shown_template} by your answer").format(
                          shown_template=shown(self.template)))
        if isinstance(self.template, Mapping) and not isinstance(answer, Mapping):
            raise Wrong(_("give a dict like {shown_template}; got {answer}").format(
                          shown_template=shown(self.template), answer=type(answer).__name__))
        facts = self.facts(**context)   # out of the try: a failure here is lessonkit's, not the answer's
        try:
            for key, f in self.fields.items():
                f.read(answer, key, facts)
            return Verdict(CORRECT, self._check(answer, facts) if self._check else say(self._correct, facts))
        except (Wrong, Blank):
            raise
        except Exception as e:  # noqa: BLE001 - as above: whatever the answer's objects raise
            return _unreadable(e)

    def hint(self) -> None:
        print(_("Hint: ") + text(self._hint))

    def answer(self, **context):
        """The right answer, computed now from the code and data (None in graded mode, which says so)."""
        if graded():
            print(SOLUTIONS_OFF)
            return None
        facts = self.facts(**context)
        if self._solution:
            return self._solution(facts)
        return {k: facts[k] for k in self.template}

    def solution(self, **context) -> None:
        if graded():
            print(SOLUTIONS_OFF)
            return
        print(_("Solution: ") + f"answer = {self.answer(**context)!r}")
        if self._explain:
            print(text(self._explain))


def _unreadable(e: Exception) -> Verdict:
    return Verdict(INCORRECT, _("your answer could not be read: {short_e}").format(short_e=short(str(e), 200)))


def shown(template) -> str:
    """An answer template as the student types it: ``...`` rather than ``Ellipsis``."""
    return repr(template).replace("Ellipsis", "...")


#: lesson number -> its exercises in order, filled by ``register`` as the lesson modules are imported
REGISTRY: dict[str, list[Exercise]] = {}


def register(module_name: str, exercises: list[Exercise]) -> list[Exercise]:
    """Make ``exercises`` lesson NN's (``module_name`` ends in lessonNN), in order: each gets its lesson
    and marker, and the module gets them as attributes ex1, ex2, ... and by slug."""
    module, number = sys.modules[module_name], module_name.rsplit("lesson", 1)[1]
    for i, ex in enumerate(exercises, start=1):
        ex.lesson, ex.marker = number, f"ex{number}_{ex.slug}"
        for attr in (f"ex{i}", ex.slug):
            if getattr(module, attr, ex) is not ex:
                raise ValueError(f"lesson {number}: the name {attr!r} of {ex!r} is taken in its module")
            setattr(module, attr, ex)
    REGISTRY[number] = list(exercises)
    return REGISTRY[number]


# ============================================================================ the lessons' data (cached)

@functools.lru_cache(maxsize=None)
def lesson00_data():
    """Lesson 00's cache: seed 0, 8 kv heads of 128, 1000 tokens; the query; kv head 3."""
    rng = np.random.default_rng(0)
    K = rng.standard_normal((1000, 8, 128), dtype=np.float32)
    V = rng.standard_normal((1000, 8, 128), dtype=np.float32)
    return K, V, rng.standard_normal(128, dtype=np.float32), 3


def make_cache(K, V, block_size):
    c = KVCacheQ8(K.shape[1], K.shape[2], block_size)
    c.append(K, V)
    return c


@functools.lru_cache(maxsize=None)
def lesson04_data():
    """Lesson 04's traced call: seed 4, 2 kv heads of 128, blocks of 16, 1000 tokens, kv head 1."""
    rng = np.random.default_rng(4)
    K = rng.standard_normal((1000, 2, 128), dtype=np.float32)
    V = rng.standard_normal((1000, 2, 128), dtype=np.float32)
    q = rng.standard_normal(128, dtype=np.float32)
    cache, scale = make_cache(K, V, 16), float(np.float32(1 / np.sqrt(128)))
    out, trace = attend(q, cache, 1, scale=scale, trace=True)
    return cache, q, 1, scale, out, trace


@functools.lru_cache(maxsize=None)
def small_cache(head_dim=128):
    rng = np.random.default_rng(5)
    return make_cache(rng.standard_normal((8, 1, head_dim), dtype=np.float32),
                      rng.standard_normal((8, 1, head_dim), dtype=np.float32), 16)


def kernel_q_codes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment 1's codes and scales for one of the lessons' queries (float32, head_dim a multiple of
    32), read from the compiled kernel's trace."""
    unused, trace = attend(q, small_cache(q.shape[0]), 0, trace=True)
    return trace.q_codes, trace.q_scales
