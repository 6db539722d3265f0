"""The machinery of the exercises: ``Exercise`` (built with keyword arguments), ``Verdict``, the
registry of every lesson's exercises, and the helpers the checks share (reading answers, the
lessons' cached data). The exercises themselves are in ``lessonNN.py``, one module per lesson."""
from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..kernels.attention import attend
from ..cache import KVCacheQ8
from ..language import Text, text, tr
from ..validate import short

MAX_ANSWER_ITEMS = 10_000   # values in one answer; the longest right answer has a few hundred
MAX_ANSWER_DEPTH = 16       # nesting of lists and dicts in one answer
MAX_WHOLE = 2**63           # |whole number| of any answer: line numbers, counts, bytes

# ============================================================================ verdicts and the base class

CORRECT, INCORRECT, NOT_ATTEMPTED = "correct", "incorrect", "not attempted"
# how a verdict starts its line, in the language of the moment (lessonkit.language)
STATUS_LABELS = {CORRECT: Text("Correct", "正确"), INCORRECT: Text("Incorrect", "不对"),
                 NOT_ATTEMPTED: Text("Not attempted", "还没作答")}


@dataclass(frozen=True)
class Verdict:
    """The result of a check: ``status`` is "correct", "incorrect" or "not attempted"."""
    status: str
    message: str

    def __bool__(self) -> bool:
        return self.status == CORRECT

    def __str__(self) -> str:
        return f"{STATUS_LABELS[self.status]}{tr(': ', '：')}{self.message}"

    __repr__ = __str__

    def _ipython_display_(self):
        pass  # check() has printed the line already; do not print it twice in a notebook


class Wrong(Exception):
    """Raised inside a checker: the answer is incorrect, for the reason given."""


class Blank(Exception):
    """Raised inside a checker: part of the answer is still ``...``."""


def filled(value) -> bool:
    return value is not None and value is not Ellipsis


def _has_blank(value) -> bool:
    """Is a ``...`` left anywhere in the answer (in a dict, list or tuple, at any depth)? Raises
    Wrong for an answer of more than MAX_ANSWER_ITEMS values or MAX_ANSWER_DEPTH levels, before
    walking it: no answer here is that large, and walking a huge one would stall the notebook."""
    budget = MAX_ANSWER_ITEMS
    stack = [(value, 0)]
    found = False
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
            raise Wrong(tr(f"your answer is nested more than {MAX_ANSWER_DEPTH} levels deep; no answer here is",
                           f"你的答案嵌套超过 {MAX_ANSWER_DEPTH} 层；这里没有哪个答案这么深"))
        budget -= len(children)
        if budget < 0:
            raise Wrong(tr(f"your answer holds more than {MAX_ANSWER_ITEMS} values; no answer here is that large",
                           f"你的答案超过 {MAX_ANSWER_ITEMS} 个值；这里没有哪个答案这么大"))
        stack.extend((c, depth + 1) for c in children)
    return found


def items_of(answer: Mapping, key, most: int) -> list:
    """answer[key] as a list of at most ``most`` values (a list, tuple, set, range or 1-D array;
    its length is checked before anything is read from it)."""
    v = field_of(answer, key)
    if isinstance(v, np.ndarray):
        v = v.ravel() if v.ndim <= 1 else v
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, (list, tuple, set, frozenset, range, np.ndarray)):
        raise Wrong(tr(f"{key!r} is a list; got {type(v).__name__} {short(v)}",
                       f"{key!r} 应是一个 list；你给的是 {type(v).__name__} {short(v)}"))
    if len(v) > most:
        raise Wrong(tr(f"{key!r} holds {len(v)} values; the answer has at most {most}",
                       f"{key!r} 有 {len(v)} 个值；答案最多 {most} 个"))
    return list(v)


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
            n = int(f) if not isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise Wrong(tr(f"{what} = {short(value)} cannot be read ({e})",
                       f"{what} = {short(value)} 读不成整数（{e}）")) from None
    if abs(n) >= MAX_WHOLE:
        raise Wrong(tr(f"{what} = {short(n)} is far too large: no answer here reaches 2**63",
                       f"{what} = {short(n)} 太大了：这里没有哪个答案达到 2**63"))
    return n


def field_of(answer: Mapping, key, kind=None):
    """answer[key], converted with ``kind``; Blank if it is still ``...``, Wrong if missing or
    unreadable."""
    if key not in answer:
        raise Wrong(tr(f"your answer has no {key!r}", f"你的答案里没有 {key!r}"))
    v = answer[key]
    if not filled(v):
        raise Blank(tr(f"fill in {key!r}", f"请填写 {key!r}"))
    if kind is None:
        return v
    if kind is int:
        return whole(v, repr(key))
    try:
        if kind is bool:
            if not isinstance(v, (bool, np.bool_)):
                raise TypeError("expected True or False")
            return bool(v)
        return kind(v)
    except (TypeError, ValueError, OverflowError) as e:  # float(10**400) overflows
        raise Wrong(tr(f"{key!r} = {short(v)} cannot be read ({e})",
                       f"{key!r} = {short(v)} 读不懂（{e}）")) from None


def close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(b), 1e-300)


@dataclass(frozen=True)
class Choice:
    text: str | Text
    why: str | Text   # the explanation shown when this choice is picked (right or wrong)


def shown(template) -> str:
    """An answer template as the student types it: ``...`` rather than ``Ellipsis``."""
    return repr(template).replace("Ellipsis", "...")


class Exercise:
    """One exercise: ``question()``, ``check(answer)``, ``hint()``, ``solution()``, ``answer()``.

    Built with keyword arguments: ``lesson`` ("00" ...), ``name`` (its slug: the pytest marker is
    ``ex<lesson>_<name>``), ``title``, ``question`` (the text, shown only by ``question()``),
    ``template`` (the answer's shape, ``...`` where the student fills in), ``check`` (the
    function that reads an answer: returns the message of a right answer, raises Wrong or Blank),
    ``solution`` (computes the right answer now), ``hint``, optional ``explain`` (shown with the
    solution) and ``choices`` (multiple choice)."""

    def __init__(self, *, lesson: str, name: str, title: str | Text, question: str | Text, template,
                 check: Callable, solution: Callable, hint: str | Text, explain: str | Text = "",
                 choices: dict[str, Choice] | None = None):
        self.lesson, self.slug, self.title = lesson, name, title
        self.marker = f"ex{lesson}_{name}"
        self._text, self.template, self._checker, self._answer = question, template, check, solution
        self._hint, self._explain, self.choices = hint, explain, choices or {}

    def __repr__(self) -> str:
        return f"<Exercise {self.marker}: {text(self.title)}>"

    def question(self) -> None:
        lines = [tr(f"Lesson {self.lesson}, {text(self.title)}  (pytest marker: {self.marker})",
                    f"第 {self.lesson} 课，{text(self.title)}（pytest 标记：{self.marker}）"), text(self._text)]
        for key, c in self.choices.items():
            lines.append(f"  ({key}) {text(c.text)}")
        lines.append(f"answer = {shown(self.template)}")
        print("\n".join(lines))

    def check(self, answer=None, **context) -> Verdict:
        """Print and return the verdict on ``answer`` (None or ... means not attempted)."""
        try:
            _has_blank(answer)  # first of all: an answer too large to read is incorrect, unread
            too_large = None
        except Wrong as e:
            too_large = e
        if too_large is not None:
            v = Verdict(INCORRECT, str(too_large))
        elif not filled(answer) or (isinstance(answer, Mapping) and answer
                                     and not any(filled(v) for v in answer.values())):
            v = Verdict(NOT_ATTEMPTED, tr(f"give your answer as {shown(self.template)}",
                                          f"答案的格式是 {shown(self.template)}"))
        else:
            try:
                if _has_blank(answer):
                    raise Blank(tr(f"replace every ... in {shown(self.template)} by your answer",
                                   f"把 {shown(self.template)} 里的每个 ... 换成你的答案"))
                if isinstance(self.template, Mapping) and not isinstance(answer, Mapping):
                    raise Wrong(tr(f"give a dict like {shown(self.template)}; got {type(answer).__name__}",
                                   f"答案应是像 {shown(self.template)} 这样的 dict，你给的是 {type(answer).__name__}"))
                v = Verdict(CORRECT, self._checker(answer, **context))
            except Blank as e:
                v = Verdict(NOT_ATTEMPTED, str(e))
            except Wrong as e:
                v = Verdict(INCORRECT, str(e))
            except (TypeError, ValueError, OverflowError, IndexError, KeyError) as e:  # an unexpected shape
                v = Verdict(INCORRECT, tr(f"your answer could not be read: {short(str(e), 200)}",
                                          f"读不懂你的答案：{short(str(e), 200)}"))
        print(v)
        return v

    def hint(self) -> None:
        print(tr("Hint: ", "提示：") + text(self._hint))

    def answer(self, **context):
        """The right answer, computed now from the code and data. A tuple from the answer function
        is read in the order of the template's keys (extra trailing values are ignored)."""
        value = self._answer(**context)
        if isinstance(value, tuple) and isinstance(self.template, Mapping):
            value = dict(zip(self.template, value))
        return value

    def solution(self, **context) -> None:
        print(tr("Solution: ", "参考答案：") + f"answer = {self.answer(**context)!r}")
        if self._explain:
            print(text(self._explain))


class Lesson:
    """The exercises of one lesson, in order (``lessonkit.exercises.LESSONS``)."""

    def __init__(self, number: str, exercises: list[Exercise]):
        self.number = number
        self.exercises = list(exercises)

    def __iter__(self):
        return iter(self.exercises)

    def __repr__(self) -> str:
        return f"<Lesson {self.number}: {', '.join(e.marker for e in self.exercises)}>"


#: lesson number -> its Lesson, filled by ``register`` as the lesson modules are imported
REGISTRY: dict[str, Lesson] = {}


def register(module_name: str, exercises: list[Exercise]) -> Lesson:
    """Make ``exercises`` the lesson's, in order: the module of lesson NN (``module_name``, its
    ``__name__``) gets them as attributes ex1, ex2, ... and by name (``ex.slug``), and the registry
    lists them (the pytest markers and ``overview()`` are read from it)."""
    import sys
    module = sys.modules[module_name]
    number = module_name.rsplit("lesson", 1)[1]
    for i, ex in enumerate(exercises, start=1):
        if ex.lesson != number:
            raise ValueError(f"{ex!r} says lesson {ex.lesson} but is registered by lesson {number}")
        for attr in (f"ex{i}", ex.slug):
            if getattr(module, attr, ex) is not ex:
                raise ValueError(f"lesson {number}: the name {attr!r} of {ex!r} is taken in its module")
            setattr(module, attr, ex)
    REGISTRY[number] = Lesson(number, exercises)
    return REGISTRY[number]


def pick(answer: Mapping, key: str, choices: dict[str, Choice], right: str) -> str:
    """Check a multiple-choice field; return the explanation of the right choice."""
    value = field_of(answer, key)
    got = (value if isinstance(value, str) else short(value, 20)).strip().strip("()").lower()
    if got not in choices:
        raise Wrong(tr(f"{key!r} must be one of {', '.join(map(repr, choices))}; got {short(answer[key])}",
                       f"{key!r} 只能是 {', '.join(map(repr, choices))} 之一；你给的是 {short(answer[key])}"))
    if got != right:
        raise Wrong(f"({got}) {text(choices[got].why)}")
    return f"({got}) {text(choices[got].why)}"


# ============================================================================ shared data (cached)

@functools.lru_cache(maxsize=None)
def lesson00_data():
    """Lesson 00's cache: seed 0, 8 kv heads of 128, 1000 tokens; the query; kv head 3."""
    rng = np.random.default_rng(0)
    K = rng.standard_normal((1000, 8, 128), dtype=np.float32)
    V = rng.standard_normal((1000, 8, 128), dtype=np.float32)
    q = rng.standard_normal(128, dtype=np.float32)
    return K, V, q, 3


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
    cache = make_cache(K, V, 16)
    scale = float(np.float32(1 / np.sqrt(128)))
    out, tr = attend(q, cache, 1, scale=scale, trace=True)
    return cache, q, 1, scale, out, tr


@functools.lru_cache(maxsize=None)
def small_cache(n_kv_heads=1, head_dim=128, block_size=16, seq_len=8, seed=5):
    rng = np.random.default_rng(seed)
    return make_cache(rng.standard_normal((seq_len, n_kv_heads, head_dim), dtype=np.float32),
                  rng.standard_normal((seq_len, n_kv_heads, head_dim), dtype=np.float32), block_size)


def kernel_q_codes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment 1's codes and scales for q, read from the compiled kernel's trace."""
    from ..validate import float32_like, head_dim
    q = float32_like("q", q, (None,))
    _, tr = attend(q, small_cache(head_dim=head_dim(q.shape[0])), 0, trace=True)
    return tr.q_codes, tr.q_scales
