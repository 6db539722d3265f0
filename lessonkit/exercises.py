"""Auto-checked exercises of lessons 00 to 04 and 06 (introduced in lesson 06).

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
``ex03_address``): ``pytest -m ex03_address tests/test_exercises.py`` runs the tests of that one.

An answer is read without ever building something its size asks for: at most MAX_ANSWER_ITEMS
values in all (nested lists and dicts included, MAX_ANSWER_DEPTH levels deep), whole numbers
below 2**63 in magnitude, and line ranges cut to the lines the file has; a larger answer is
incorrect, with a message that says so.
"""
from __future__ import annotations

import functools
import math
import numbers
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import debug, layout, native, rescales, rounding, softmax, source
from .kernels.attention import attend
from .cache import KVCacheQ8
from .quant import quantize_kv_rows, quantize_q
from .synthetic import cache_with_scores
from .validate import short

MAX_ANSWER_ITEMS = 10_000   # values in one answer; the longest right answer has a few hundred
MAX_ANSWER_DEPTH = 16       # nesting of lists and dicts in one answer
MAX_WHOLE = 2**63           # |whole number| of any answer: line numbers, counts, bytes

# ============================================================================ verdicts and the base class

CORRECT, INCORRECT, NOT_ATTEMPTED = "correct", "incorrect", "not attempted"


@dataclass(frozen=True)
class Verdict:
    """The result of a check: ``status`` is "correct", "incorrect" or "not attempted"."""
    status: str
    message: str

    def __bool__(self) -> bool:
        return self.status == CORRECT

    def __str__(self) -> str:
        return f"{self.status.capitalize()}: {self.message}"

    __repr__ = __str__

    def _ipython_display_(self):
        pass  # check() has printed the line already; do not print it twice in a notebook


class Wrong(Exception):
    """Raised inside a checker: the answer is incorrect, for the reason given."""


class Blank(Exception):
    """Raised inside a checker: part of the answer is still ``...``."""


def _filled(value) -> bool:
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
            raise Wrong(f"your answer is nested more than {MAX_ANSWER_DEPTH} levels deep; no answer here is")
        budget -= len(children)
        if budget < 0:
            raise Wrong(f"your answer holds more than {MAX_ANSWER_ITEMS} values; no answer here is that large")
        stack.extend((c, depth + 1) for c in children)
    return found


def items_of(answer: Mapping, key, most: int) -> list:
    """answer[key] as a list of at most ``most`` values (a list, tuple, set, range or 1-D array;
    its length is checked before anything is read from it)."""
    v = field_of(answer, key)
    if isinstance(v, np.ndarray):
        v = v.ravel() if v.ndim <= 1 else v
    if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, (list, tuple, set, frozenset, range, np.ndarray)):
        raise Wrong(f"{key!r} is a list; got {type(v).__name__} {short(v)}")
    if len(v) > most:
        raise Wrong(f"{key!r} holds {len(v)} values; the answer has at most {most}")
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
        raise Wrong(f"{what} = {short(value)} cannot be read ({e})") from None
    if abs(n) >= MAX_WHOLE:
        raise Wrong(f"{what} = {short(n)} is far too large: no answer here reaches 2**63")
    return n


def field_of(answer: Mapping, key, kind=None):
    """answer[key], converted with ``kind``; Blank if it is still ``...``, Wrong if missing or
    unreadable."""
    if key not in answer:
        raise Wrong(f"your answer has no {key!r}")
    v = answer[key]
    if not _filled(v):
        raise Blank(f"fill in {key!r}")
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
        raise Wrong(f"{key!r} = {short(v)} cannot be read ({e})") from None


def close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(b), 1e-300)


@dataclass(frozen=True)
class Choice:
    text: str
    why: str   # the explanation shown when this choice is picked (right or wrong)


def shown(template) -> str:
    """An answer template as the student types it: ``...`` rather than ``Ellipsis``."""
    return repr(template).replace("Ellipsis", "...")


class Exercise:
    """One exercise: ``question()``, ``check(answer)``, ``hint()``, ``solution()``, ``answer()``."""

    def __init__(self, lesson: str, slug: str, title: str, text: str, template: dict,
                 checker: Callable, answer: Callable, hint: str, explain: str = "",
                 choices: dict[str, Choice] | None = None):
        self.lesson, self.slug, self.title = lesson, slug, title
        self.marker = f"ex{lesson}_{slug}"
        self._text, self.template, self._checker, self._answer = text, template, checker, answer
        self._hint, self._explain, self.choices = hint, explain, choices or {}

    def __repr__(self) -> str:
        return f"<Exercise {self.marker}: {self.title}>"

    def question(self) -> None:
        lines = [f"Lesson {self.lesson}, {self.title}  (pytest marker: {self.marker})", self._text]
        for key, c in self.choices.items():
            lines.append(f"  ({key}) {c.text}")
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
        elif not _filled(answer) or (isinstance(answer, Mapping) and answer
                                     and not any(_filled(v) for v in answer.values())):
            v = Verdict(NOT_ATTEMPTED, f"give your answer as {shown(self.template)}")
        else:
            try:
                if _has_blank(answer):
                    raise Blank(f"replace every ... in {shown(self.template)} by your answer")
                if isinstance(self.template, Mapping) and not isinstance(answer, Mapping):
                    raise Wrong(f"give a dict like {shown(self.template)}; got {type(answer).__name__}")
                v = Verdict(CORRECT, self._checker(answer, **context))
            except Blank as e:
                v = Verdict(NOT_ATTEMPTED, str(e))
            except Wrong as e:
                v = Verdict(INCORRECT, str(e))
            except (TypeError, ValueError, OverflowError, IndexError, KeyError) as e:  # an unexpected shape
                v = Verdict(INCORRECT, f"your answer could not be read: {short(str(e), 200)}")
        print(v)
        return v

    def hint(self) -> None:
        print(f"Hint: {self._hint}")

    def answer(self, **context):
        """The right answer, computed now from the code and data. A tuple from the answer function
        is read in the order of the template's keys (extra trailing values are ignored)."""
        value = self._answer(**context)
        if isinstance(value, tuple) and isinstance(self.template, Mapping):
            value = dict(zip(self.template, value))
        return value

    def solution(self, **context) -> None:
        print(f"Solution: answer = {self.answer(**context)!r}")
        if self._explain:
            print(self._explain)


class Lesson:
    """The exercises of one lesson, as attributes ex1, ex2, ... (and by slug)."""

    def __init__(self, number: str, exercises: list[Exercise]):
        self.number = number
        self.exercises = exercises
        for i, ex in enumerate(exercises, start=1):
            setattr(self, f"ex{i}", ex)
            setattr(self, ex.slug, ex)

    def __iter__(self):
        return iter(self.exercises)

    def __repr__(self) -> str:
        return f"<Lesson {self.number}: {', '.join(e.marker for e in self.exercises)}>"


def pick(answer: Mapping, key: str, choices: dict[str, Choice], right: str) -> str:
    """Check a multiple-choice field; return the explanation of the right choice."""
    value = field_of(answer, key)
    got = (value if isinstance(value, str) else short(value, 20)).strip().strip("()").lower()
    if got not in choices:
        raise Wrong(f"{key!r} must be one of {', '.join(map(repr, choices))}; got {short(answer[key])}")
    if got != right:
        raise Wrong(f"({got}) {choices[got].why}")
    return f"({got}) {choices[got].why}"


# ============================================================================ shared data (cached)

@functools.lru_cache(maxsize=None)
def lesson00_data():
    """Lesson 00's cache: seed 0, 8 kv heads of 128, 1000 tokens; the query; kv head 3."""
    rng = np.random.default_rng(0)
    K = rng.standard_normal((1000, 8, 128), dtype=np.float32)
    V = rng.standard_normal((1000, 8, 128), dtype=np.float32)
    q = rng.standard_normal(128, dtype=np.float32)
    return K, V, q, 3


def _cache(K, V, block_size):
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
    cache = _cache(K, V, 16)
    scale = float(np.float32(1 / np.sqrt(128)))
    out, tr = attend(q, cache, 1, scale=scale, trace=True)
    return cache, q, 1, scale, out, tr


@functools.lru_cache(maxsize=None)
def small_cache(n_kv_heads=1, head_dim=128, block_size=16, seq_len=8, seed=5):
    rng = np.random.default_rng(seed)
    return _cache(rng.standard_normal((seq_len, n_kv_heads, head_dim), dtype=np.float32),
                  rng.standard_normal((seq_len, n_kv_heads, head_dim), dtype=np.float32), block_size)


def kernel_q_codes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segment 1's codes and scales for q, read from the compiled kernel's trace."""
    from .validate import float32_like, head_dim
    q = float32_like("q", q, (None,))
    _, tr = attend(q, small_cache(head_dim=head_dim(q.shape[0])), 0, trace=True)
    return tr.q_codes, tr.q_scales


# ============================================================================ lesson 00

L00_BLOCK_SIZES = (1, 7, 1000)
ARG_NAMES = ("k_cache_q8", "v_cache_q8", "kscale", "vscale", "seq_len", "kv_dim", "kv_bs", "nkv", "kh_off")


@functools.lru_cache(maxsize=None)
def _l00_block_size_truth():
    K, V, q, kh = lesson00_data()
    ffi, _ = native.load()
    caches = [_cache(K, V, bs) for bs in (64, *L00_BLOCK_SIZES)]
    outs = [attend(q, c, kh).tobytes() for c in caches]
    bit_identical = all(o == outs[0] for o in outs)
    changed = set()
    base = caches[0].kernel_args(kh, ffi)
    for c in caches[1:]:
        args = c.kernel_args(kh, ffi)
        for name, a, b in zip(ARG_NAMES, base, args):
            if name in ("k_cache_q8", "v_cache_q8"):
                if caches[0].n_blocks != c.n_blocks:
                    changed.add(name)   # another number of blocks behind the table
            elif name in ("kscale", "vscale"):
                T, nkv = c.seq_len, c.n_kv_heads
                if any(a[t * nkv] != b[t * nkv] for t in range(0, T, 97)):
                    changed.add(name)   # what the kernel reads through the pointer
            elif a != b:
                changed.add(name)
    return bit_identical, frozenset(changed)


def _l00_block_size(answer):
    same, changed = _l00_block_size_truth()
    got = field_of(answer, "bit_identical", bool)
    if got != same:
        raise Wrong("run it: the outputs with block sizes 1, 7 and 1000 are "
                    + ("equal bit for bit" if same else "not all equal bit for bit")
                    + " on this machine")
    names = {(n if isinstance(n, str) else short(n)).strip() for n in items_of(answer, "changed", 4 * len(ARG_NAMES))}
    unknown = names - set(ARG_NAMES)
    if unknown:
        raise Wrong(f"{sorted(unknown)} are not arguments of the kernel; its cache arguments are {', '.join(ARG_NAMES)}")
    if names - changed:
        extra = sorted(names - changed)
        raise Wrong(f"{extra} did not change: the kernel reads the same values through "
                    + ("them (the scale of token t, head kh is still at kscale[t * nkv])" if set(extra) & {"kscale", "vscale"}
                       else "them in every cache"))
    if changed - names:
        raise Wrong(f"you missed {sorted(changed - names)}: compare cache.kernel_args(kh, ffi) of two caches")
    return (f"the outputs are {'bit-identical' if same else 'not identical'}; only {sorted(changed)} changed: "
            "which block a token sits in changes where it is read, not what is computed with it")


ex00_1 = Exercise(
    "00", "block_size", "exercise 1: block size does not change the math",
    "Lesson 00's cache (seed 0, 1000 tokens, kv head 3) built with block_size 1, 7 and 1000: are the "
    "kernel's outputs equal bit for bit to the block_size-64 output? Which kernel arguments changed "
    f"(names from {', '.join(ARG_NAMES)})?",
    {"bit_identical": ..., "changed": ...}, _l00_block_size,
    lambda: {"bit_identical": _l00_block_size_truth()[0], "changed": sorted(_l00_block_size_truth()[1])},
    "compare out.tobytes() of the calls; then print cache.kernel_args(3, ffi) for two block sizes: the "
    "pointer tables have a different number of entries, kv_bs differs, the scales sit at the same indices.",
    "The kernel computes token t's score and weight from its K/V row and scales only; kv_bs and the "
    "tables only say where that row is. The token order, and so every float32 rounding, stays the same.")

L00_BACKENDS = ("neon", "scalar", "numpy")


@functools.lru_cache(maxsize=None)
def _l00_backends_truth():
    K, V, q, kh = lesson00_data()
    cache = _cache(K, V, 64)
    outs = {b: attend(q, cache, kh, backend=b) for b in L00_BACKENDS}
    exact = frozenset(frozenset((a, b)) for i, a in enumerate(L00_BACKENDS) for b in L00_BACKENDS[i + 1:]
                      if outs[a].tobytes() == outs[b].tobytes())
    largest = max(float(np.abs(outs[a] - outs[b]).max()) for i, a in enumerate(L00_BACKENDS)
                  for b in L00_BACKENDS[i + 1:])
    return exact, largest


def _l00_backends(answer):
    exact, largest = _l00_backends_truth()
    pairs = items_of(answer, "exact_pairs", 16)
    if not all(isinstance(p, (list, tuple, set, frozenset)) and len(p) <= 4 for p in pairs):
        raise Wrong("'exact_pairs' is a list of pairs such as [('neon', 'scalar')] (or [] if none)")
    got = {frozenset(x if isinstance(x, str) else short(x) for x in p) for p in pairs}
    bad = [sorted(p) for p in got if len(p) != 2 or not p <= set(L00_BACKENDS)]
    if bad:
        raise Wrong(f"{bad}: each pair names two different backends of {L00_BACKENDS}")
    if got - exact:
        raise Wrong(f"{[sorted(p) for p in got - exact]} differ on this machine: compare with np.array_equal")
    if exact - got:
        raise Wrong(f"{[sorted(p) for p in exact - got]} agree bit for bit on this machine too")
    d = field_of(answer, "largest_difference", float)
    if not (largest / 3 <= d <= largest * 3):
        raise Wrong(f"the largest |difference| between two backends is not {d:.1e}: it is within a factor 3 of "
                    "something else (print np.abs(a - b).max() for the three pairs)")
    return (f"bit-identical pairs here: {[sorted(p) for p in exact] or 'none'}; the others differ by up to "
            f"{largest:.1e}, float32 rounding (fused multiply-add, order of the sums)")


ex00_2 = Exercise(
    "00", "backends", "exercise 2: three backends",
    "Lesson 00's cache and query: which pairs of lk.attend(q, cache, 3, backend=b) for b in "
    "'neon', 'scalar', 'numpy' agree bit for bit on your machine, and what is the largest |difference| "
    "between any two of them (order of magnitude is enough)?",
    {"exact_pairs": ..., "largest_difference": ...}, _l00_backends,
    lambda: {"exact_pairs": [tuple(sorted(p)) for p in _l00_backends_truth()[0]],
             "largest_difference": float(f"{_l00_backends_truth()[1]:.2g}")},
    "np.array_equal(a, b) for each of the 3 pairs; np.abs(a - b).max() for the size. The numpy backend "
    "sums the softmax in float64, the C ones in float32; SIMDe may fuse multiply and add.")

L00_GUARD_CHOICES = {
    "a": Choice("qm = 0, so iq = 127/0 = inf, and 0 * inf = NaN: the cast (int)NaN is undefined behaviour, "
                "the codes depend on the CPU and the compiler",
                "right: IEEE float division by zero gives inf, 0 * inf gives NaN, and C leaves the cast of NaN "
                "to int undefined (x86 gives INT_MIN, AArch64 gives 0)"),
    "b": Choice("nothing changes: the values are 0, so their codes are 0 anyway",
                "no: 0 * 127/0 is not 0 but NaN in IEEE arithmetic; the guard is what makes the codes 0"),
    "c": Choice("the program stops with a division-by-zero signal (SIGFPE)",
                "no: float division by zero does not trap by default; it returns inf (only integer division traps)"),
    "d": Choice("qsc[b] becomes 0, so the block simply adds nothing to the score",
                "no: qsc[b] = 0 would be harmless, but the codes are computed with iq = 127/qm = inf first"),
}


def _l00_guard_truth():
    with np.errstate(divide="ignore", invalid="ignore"):
        nan_without_guard = bool(np.isnan(np.float32(0) * (np.float32(127) / np.float32(0))))
    q = lesson00_data()[2].copy()
    q[:32] = 0
    codes, scales = kernel_q_codes(q)
    return float(scales[0]), bool((codes[:32] == 0).all()), "a" if nan_without_guard else "b"


def _l00_guard(answer):
    qsc0, zeros, right = _l00_guard_truth()
    got = field_of(answer, "qsc0", float)
    if not close(got, qsc0, 1e-6):
        raise Wrong(f"the kernel's qsc[0] for the zero block is not {got!r}: read it from "
                    "lk.attend(q, cache, kh, trace=True)[1].q_scales[0] (the guard sets qm to 1)")
    return f"qsc[0] = 1/127 = {qsc0:.6f}, codes all 0: {zeros}. " + pick(answer, "without_guard", L00_GUARD_CHOICES, right)


ex00_3 = Exercise(
    "00", "silent_block", "exercise 3: a silent block",
    "Lesson 00's query with q[:32] = 0: what block scale qsc[0] does the kernel store (read it from the trace)? "
    "And what would happen in that block without the guard `if (qm < 1e-6f) qm = 1.0f;`?",
    {"qsc0": ..., "without_guard": ...}, _l00_guard,
    lambda: {"qsc0": _l00_guard_truth()[0], "without_guard": _l00_guard_truth()[2]},
    "trace.q_scales[0]; for the second part, do the float32 arithmetic of segment 1 with qm = 0 in numpy "
    "(np.float32(127) / np.float32(0), then times 0).",
    choices=L00_GUARD_CHOICES)

# ============================================================================ lesson 01

def l01_predict_q() -> np.ndarray:
    """Lesson 01 exercise 1's query: block 0 is zero except 4 values, the other blocks are zero."""
    q = np.zeros(128, np.float32)
    q[:4] = [1.27, -0.635, 0.005, 0.0149]
    return q


def _l01_predict_truth():
    q = l01_predict_q()
    codes, scales = kernel_q_codes(q)
    ties = rounding.quantize_q_rule(q, "ties_even")[0]
    return float(scales[0]), [int(c) for c in codes[:4]], [i for i in range(4) if ties[i] != codes[i]]


def _l01_predict(answer):
    qsc, codes, ties = _l01_predict_truth()
    got = field_of(answer, "qsc", float)
    if not close(got, qsc, 1e-5):
        raise Wrong(f"qsc[0] = {got!r} is not the block's step: it is max|q_b| / 127")
    got_codes = [whole(c, "a code") for c in items_of(answer, "codes", 64)]
    if len(got_codes) != 4:
        raise Wrong("give the four codes of q[0..3]")
    wrong = [i for i in range(4) if got_codes[i] != codes[i]]
    if wrong:
        i = wrong[0]
        raise Wrong(f"code {i} is not {got_codes[i]} (q[{i}] * 127 / qm in float32 is "
                    f"{rounding.q_block_scaled(l01_predict_q())[0][i]:.7f}; the engine adds ±0.5, then truncates)")
    got_ties = sorted(whole(t, "an index") for t in items_of(answer, "ties_even_changes", 64))
    if got_ties != ties:
        raise Wrong(f"ties-to-even changes the codes at indices {ties if ties else 'none'}, not {got_ties}: "
                    "it differs from the engine only on an exact .5")
    return f"qsc = {qsc:.6f}, codes {codes}; ties-to-even changes index {ties}"


ex01_1 = Exercise(
    "01", "predict_codes", "exercise 1: predict the codes",
    "q = exercises.l01_predict_q(): block 0 is zero except q[0] = 1.27, q[1] = -0.635, q[2] = 0.005, "
    "q[3] = 0.0149. Predict qsc[0] and the four codes, check with the kernel's trace; which of the four "
    "codes (indices) would ties-to-even change?",
    {"qsc": ..., "codes": [..., ..., ..., ...], "ties_even_changes": [...]}, _l01_predict,
    _l01_predict_truth,
    "127 / 1.27 in float32 is not exactly 100: compute np.float32(127) / np.float32(1.27) and multiply. "
    "A value landing on k + 0.5 exactly is where the rules differ.")


def l01_outlier_q() -> tuple[np.ndarray, np.ndarray]:
    """Lesson 01 exercise 2's queries: Gaussian (seed 1), and the same with channel 5 set to
    50 times the RMS of block 0."""
    q = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    q_out = q.copy()
    q_out[5] = np.float32(50 * np.sqrt(np.mean(q[:32].astype(np.float64) ** 2)))
    return q, q_out


def _l01_outlier_truth():
    q, q_out = l01_outlier_q()
    others = [i for i in range(32) if i != 5]
    with_o = len(np.unique(kernel_q_codes(q_out)[0][others]))
    without = len(np.unique(kernel_q_codes(q)[0][others]))
    return with_o, without


def _l01_outlier(answer):
    with_o, without = _l01_outlier_truth()
    a = field_of(answer, "distinct_with_outlier", int)
    b = field_of(answer, "distinct_without", int)
    if a != with_o:
        raise Wrong(f"with the outlier the other 31 values of block 0 use {'more' if with_o > a else 'fewer'} "
                    f"than {a} distinct codes (np.unique of the trace's q_codes[:32] without index 5)")
    if b != without:
        raise Wrong(f"without the outlier they use {'more' if without > b else 'fewer'} than {b} distinct codes")
    return (f"{with_o} distinct codes with the outlier against {without} without: the outlier sets qm, "
            "so the step is about 50x coarser for the rest of its block")


ex01_2 = Exercise(
    "01", "outlier", "exercise 2: a 50x outlier",
    "q, q_out = exercises.l01_outlier_q() (q_out has channel 5 at 50 x the RMS of block 0). How many "
    "distinct codes do the other 31 values of block 0 use in the kernel's trace, with and without the outlier?",
    {"distinct_with_outlier": ..., "distinct_without": ...}, _l01_outlier,
    _l01_outlier_truth,
    "codes = lk.attend(q_out, cache, 0, trace=True)[1].q_codes; np.unique(np.delete(codes[:32], 5)).")


def _qblk() -> int:
    """QBLK as the kernel's header defines it (``#define QBLK 32``)."""
    n = source.find_line("#define QBLK", path=source.SIMD_HEADER)
    return int(source.SIMD_HEADER.read_text().splitlines()[n - 1].split()[2])


@functools.lru_cache(maxsize=None)
def _l01_per128_truth():
    hd = 128
    saved = hd // _qblk() - 1   # one `s += dot32 * qsc[b]` multiply per block, against one for the whole head
    err32, err128 = [], []
    for seed in range(6):
        q = rounding.outlier_q(hd, np.random.default_rng(100 + seed))
        codes, sc = quantize_q(q)
        err32.append(np.sqrt(np.mean((codes * np.repeat(sc, 32) - q) ** 2)))
        qm = np.abs(q).max()
        c128 = rounding.round_codes(q * np.float32(127 / qm), "engine")
        err128.append(np.sqrt(np.mean((c128 * (qm / 127) - q) ** 2)))
    return saved, "per128" if np.mean(err128) > np.mean(err32) else "per32", float(np.mean(err128) / np.mean(err32))


def _l01_per128(answer):
    saved, worse, ratio = _l01_per128_truth()
    got = field_of(answer, "multiplies_saved_per_token", int)
    if got != saved:
        raise Wrong(f"not {got}: count the float multiplies by qsc[b] per token in segment 2 (one per block of "
                    f"{_qblk()}) and how many one scale for the whole head needs")
    w = str(field_of(answer, "larger_q_error")).replace("-", "").replace(" ", "").lower()
    if w not in ("per128", "per32"):
        raise Wrong("'larger_q_error' is 'per128' or 'per32'")
    if w != worse:
        raise Wrong(f"measure it: on the outlier queries, the RMS error of the dequantized Q is larger with {worse}")
    return (f"{saved} multiplies per token saved, for an RMS error of Q {ratio:.1f}x larger on outlier queries: "
            "q8_0's 32 keeps an outlier's damage inside its block")


ex01_3 = Exercise(
    "01", "per128", "exercise 3: why not per 128?",
    "For head_dim 128: how many float multiplies per token would one scale for all 128 values save in "
    "segment 2? On lesson 01's outlier queries (rounding.outlier_q), which gives the larger RMS error of the "
    "dequantized Q: one scale per 128 ('per128') or per 32 ('per32')?",
    {"multiplies_saved_per_token": ..., "larger_q_error": ...}, _l01_per128,
    _l01_per128_truth,
    "segment 2 does s += dot32 * qsc[b] once per block; with one block the int32 dots could be summed "
    "first. For the error: codes * step - q, RMS, with qm over the whole vector.")

# ============================================================================ lesson 02

def _rescale_extra_multiplies(hd: int) -> int:
    """Multiplies the rescale branch of segment 3 does on top of a normal token: ``S *= ms`` (1)
    and the vmulq_f32 loop over VKQ (hd), both read from the source."""
    seg = source.kernel_segments()[3]
    text = source.KERNEL_FILE.read_text().splitlines()[seg.begin - 1:seg.end]
    scalar = sum(1 for l in text if "*=" in l and "ms" in l)
    vector = hd if any("vmulq_f32" in l and "msv" in l for l in text) else 0
    return scalar + vector


@functools.lru_cache(maxsize=None)
def _l02_worst_truth():
    n = 256
    orders = {"increasing": np.arange(n, dtype=np.float32), "decreasing": np.arange(n, dtype=np.float32)[::-1],
              "random": np.random.default_rng(0).permutation(n).astype(np.float32)}
    counts = {k: rescales.count_rescales(v) for k, v in orders.items()}
    worst = next(k for k, c in counts.items() if c == n)
    return worst, _rescale_extra_multiplies(128), 0, counts


SYNONYMS = {"ascending": "increasing", "rising": "increasing", "sorted": "increasing",
            "increasing": "increasing", "descending": "decreasing", "falling": "decreasing",
            "decreasing": "decreasing", "random": "random", "shuffled": "random"}


def _l02_worst(answer):
    worst, mult, expf_extra, counts = _l02_worst_truth()
    order = SYNONYMS.get(str(field_of(answer, "order")).strip().lower())
    if order is None:
        raise Wrong("'order' is 'increasing', 'decreasing' or 'random'")
    if order != worst:
        raise Wrong(f"{order} scores rescale {counts[order]} times out of 256 in the kernel's trace, not at every token")
    m = field_of(answer, "extra_multiplies", int)
    if m != mult:
        raise Wrong(f"not {m} extra multiplies for hd = 128: count S *= ms and the multiplies of the loop over VKQ")
    e = field_of(answer, "extra_expf", int)
    if e != expf_extra:
        raise Wrong(f"not {e} extra expf: the rescale branch calls expf(M - s) once, the other branch expf(s - M) once")
    return f"{worst} scores rescale at every token; each rescale costs {mult} extra multiplies and no extra expf"


ex02_1 = Exercise(
    "02", "worst_case", "exercise 1: the worst case and its price",
    "Which order of scores ('increasing', 'decreasing', 'random') makes the kernel rescale at every token? "
    "For hd = 128, how many float multiplies and how many expf calls does a rescaling token cost on top of a "
    "token that does not raise M? (Timing it is part of the exercise, but not of the check.)",
    {"order": ..., "extra_multiplies": ..., "extra_expf": ...}, _l02_worst,
    _l02_worst_truth,
    "rescales.count_rescales(np.arange(256.0)); in segment 3 the if-branch has S *= ms and a loop of "
    "vmulq_f32 over hd values; both branches call expf once.")


def l02_descending(n: int = 64) -> np.ndarray:
    return (np.arange(n)[::-1] * 5.0).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _l02_desc_truth():
    s = l02_descending()
    cache, q, scale = cache_with_scores(s, head_dim=128, block_size=16, seed=3)
    out, tr = attend(q, cache, 0, scale=scale, trace=True)
    w = np.exp((tr.s - tr.M).astype(np.float32))
    first_zero = int(np.flatnonzero(w == 0)[0])
    ref = softmax.three_pass(tr.s, cache.dequantized(0)[1])
    ok = bool(np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max())
    return tr.n_rescales, first_zero, ok


def _l02_desc(answer):
    n_resc, first_zero, ok = _l02_desc_truth()
    r = field_of(answer, "rescales", int)
    if r != n_resc:
        raise Wrong(f"the kernel's trace counts {'more' if n_resc > r else 'fewer'} than {r} rescales")
    f = field_of(answer, "first_zero_weight_token", int)
    if f != first_zero:
        raise Wrong(f"token {f} is too {'early' if f < first_zero else 'late'}: find the first t where "
                    "np.exp(np.float32(s_t - M)) is exactly 0 in float32")
    c = field_of(answer, "output_correct", bool)
    if c != ok:
        raise Wrong("compare the kernel's output with softmax.three_pass(trace.s, V) again")
    return (f"{n_resc} rescale (the first token), weights underflow to 0 from token {first_zero} on, and the "
            f"output {'still matches' if ok else 'does not match'} the three-pass softmax: those weights are negligible anyway")


ex02_2 = Exercise(
    "02", "descending", "exercise 2: sorted descending",
    "Scores exercises.l02_descending() = np.arange(64)[::-1] * 5.0, in a cache_with_scores(..., head_dim=128). "
    "How many rescales? From which token on is expf(s - M) exactly 0 in float32? Is the kernel's output "
    "still correct (within 1e-5 of max|out| of softmax.three_pass on the trace's scores)?",
    {"rescales": ..., "first_zero_weight_token": ..., "output_correct": ...}, _l02_desc,
    _l02_desc_truth,
    "M stays at the first score; s_t - M = -5 t. float32 exp underflows to 0 below about -103.97.")


@functools.lru_cache(maxsize=None)
def _l02_invariant_case():
    s = rescales.realistic_scores(300, seed=9, sink=2.0)   # 6 rescales: M moves several times
    cache, q, scale = cache_with_scores(s, head_dim=32, block_size=16, seed=1)
    _, tr = attend(q, cache, 0, scale=scale, trace=True)
    return tr, cache.dequantized(0)[1]


def invariant_reference(s, M, V):
    """The invariant written out (the right answer of lesson 02 exercise 3), float64:
    S_t = sum_{j<=t} exp(s_j - M_t), VKQ_t = sum_{j<=t} exp(s_j - M_t) v_j."""
    s, M, V = (np.asarray(x, np.float64) for x in (s, M, V))
    below = np.tri(len(s), dtype=bool)                            # j <= t
    E = np.where(below, np.exp(np.minimum(s[None, :] - M[:, None], 0.0)), 0.0)
    return E.sum(axis=1), E @ V


def _l02_invariant(answer):
    fn = field_of(answer, "invariant")
    if not callable(fn):
        raise Wrong("'invariant' is a function f(s, M, V) -> (S, VKQ), S [T], VKQ [T, hd]")
    tr, V = _l02_invariant_case()
    try:
        S, VKQ = fn(tr.s.copy(), tr.M.copy(), V.copy())
        S, VKQ = np.asarray(S, np.float64), np.asarray(VKQ, np.float64)
    except Exception as e:  # noqa: BLE001 - any error of the student's function is the verdict
        raise Wrong(f"your function raised {type(e).__name__}: {e}") from None
    if S.shape != tr.S.shape or VKQ.shape != tr.vkq.shape:
        raise Wrong(f"shapes: S must be {tr.S.shape} and VKQ {tr.vkq.shape}; got {S.shape} and {VKQ.shape}")
    dS = np.abs(S - tr.S) / tr.S
    if dS.max() > 1e-4:
        t = int(np.argmax(dS > 1e-4))
        raise Wrong(f"S_t differs from the kernel's trace.S from token {t} on (relative {dS[t]:.1e}): "
                    "is every exponent relative to M_t, the max after token t?")
    dV = np.abs(VKQ - tr.vkq).max(axis=1) / np.abs(tr.vkq).max(axis=1)
    if dV.max() > 1e-4:
        t = int(np.argmax(dV > 1e-4))
        raise Wrong(f"S is right, VKQ_t differs from trace.vkq from token {t} on (relative {dV[t]:.1e})")
    return (f"S_t and VKQ_t follow the invariant at all {len(S)} tokens of the kernel's trace "
            f"(largest relative gap {max(dS.max(), dV.max()):.1e}, float32 rounding)")


ex02_3 = Exercise(
    "02", "invariant", "exercise 3: the invariant",
    "After the proof, write the invariant as a function f(s, M, V) -> (S, VKQ): S[t] = sum_{j<=t} "
    "exp(s_j - M_t), VKQ[t] = sum_{j<=t} exp(s_j - M_t) V[j]. The check feeds it the kernel's trace of a "
    "realistic sequence (s = trace.s, M = trace.M, V dequantized) and compares with trace.S and trace.vkq.",
    {"invariant": ...}, _l02_invariant,
    lambda: {"invariant": invariant_reference},
    "a lower-triangular matrix E[t, j] = exp(s_j - M_t) for j <= t, else 0; S = E.sum(1), VKQ = E @ V.",
    "lessonkit.exercises.invariant_reference is one way to write it.")

# ============================================================================ lesson 03

L03_CASE = dict(t=37, kv_head=5, kv_bs=16, n_kv_heads=8, head_dim=128)


@functools.lru_cache(maxsize=None)
def _l03_address_truth():
    """Block and offset from where the compiled kernel read (its trace, on a real 40-token cache);
    the scale indices from the layout arithmetic, checked against that cache's scale array."""
    c = L03_CASE
    t, kh, nkv = c["t"], c["kv_head"], c["n_kv_heads"]
    rng = np.random.default_rng(37)
    cache = _cache(rng.standard_normal((40, nkv, c["head_dim"]), dtype=np.float32),
                   rng.standard_normal((40, nkv, c["head_dim"]), dtype=np.float32), c["kv_bs"])
    q = rng.standard_normal(c["head_dim"]).astype(np.float32)
    _, tr = attend(q, cache, kh, trace=True)
    blocks, offsets = layout.kernel_reads(tr.k_rows, cache, "k")
    w = layout.locate(t, kh, c["kv_bs"], nkv, c["head_dim"])
    ffi = native.load()[0]
    kscale = cache.kernel_args(kh, ffi)[2]                       # the pointer the kernel is handed
    k_scale = ffi.cast("const float *", kscale - kh)             # the caller's k_scale
    if not (kscale[w.scale_index] == k_scale[w.flat_scale_index] == cache.k_scales(kh)[t]):
        raise RuntimeError("the scale indices do not find token 37's scale: layout and cache disagree")
    return {"block": int(blocks[t]), "offset": int(offsets[t]), "kscale_index": w.scale_index,
            "k_scale_index": w.flat_scale_index}


def _l03_address(answer):
    truth = _l03_address_truth()
    for key, what in (("block", "t / kv_bs"), ("offset", "(t % kv_bs) * kv_dim + kh * hd, in bytes"),
                      ("kscale_index", "t * nkv (the caller already added kh)"),
                      ("k_scale_index", "t * nkv + kh, counted from k_scale itself")):
        got = field_of(answer, key, int)
        if got != truth[key]:
            raise Wrong(f"{key} = {got} is too {'small' if got < truth[key] else 'large'}: it is {what}")
    return (f"block {truth['block']}, offset {truth['offset']} bytes, kscale[{truth['kscale_index']}] = "
            f"k_scale[{truth['k_scale_index']}]: the compiled kernel read exactly there")


ex03_1 = Exercise(
    "03", "address", "exercise 1: which address?",
    "Qwen3-8B's layer cache with kv_bs = 16 (8 kv heads, hd = 128): for the K row of token 37, kv head 5, "
    "give the pointer-table entry (block), the byte offset in that block, the index the kernel uses on "
    "kscale, and the index into the caller's k_scale.",
    {"block": ..., "offset": ..., "kscale_index": ..., "k_scale_index": ...}, _l03_address,
    _l03_address_truth,
    "layout.locate(37, 5, 16, 8, 128) gives the arithmetic; the check reads the address the compiled "
    "kernel actually used (trace.k_rows) on a real 40-token cache.")


def l03_loud_head_K(T: int = 256, seed: int = 2, loud: int = 3) -> np.ndarray:
    """K for 8 kv heads of 128 where kv head ``loud`` is ten times larger than the others."""
    K = np.random.default_rng(seed).standard_normal((T, 8, 128)).astype(np.float32)
    K[:, loud] *= 10
    return K


@functools.lru_cache(maxsize=None)
def _l03_per_head_truth():
    K = l03_loud_head_K()
    T, nkv, hd = K.shape
    cache = _cache(K, K, 64)
    quiet = [h for h in range(nkv) if h != 3]
    per_head = np.sqrt(np.mean([(cache.dequantized(h)[0] - K[:, h]) ** 2 for h in quiet]))
    codes, scales = quantize_kv_rows(K.reshape(T, -1))
    single = (codes.astype(np.float32) * (scales[:, None] / 127)).reshape(T, nkv, hd)
    single_err = np.sqrt(np.mean((single[:, quiet] - K[:, quiet]) ** 2))
    per_tok_per_head = 2 * 4 * nkv          # bytes of K and V scales per token, one layer
    saved = per_tok_per_head - 2 * 4
    lines = sorted([source.find_line("kscale[(size_t)t * nkv]", segment=2),
                    source.find_line("vscale[(size_t)t * nkv]", segment=3)])
    return saved, float(single_err / per_head), lines


def _l03_per_head(answer):
    saved, ratio, lines = _l03_per_head_truth()
    b = field_of(answer, "bytes_saved_per_token", int)
    if b != saved:
        raise Wrong(f"not {b}: per (token, kv head) a layer stores {saved + 8} bytes of K and V scales per token; "
                    "with one scale per token row it would store 8")
    r = field_of(answer, "quiet_error_ratio", float)
    if not close(r, ratio, 0.15):
        raise Wrong(f"the quiet heads' error grows by a factor {'larger' if ratio > r else 'smaller'} than {r:.2g} "
                    "(RMS over the 7 quiet heads: one scale per row / one per (token, head))")
    got = sorted(whole(n, "a line number") for n in items_of(answer, "lines", 64))
    if got != lines:
        raise Wrong(f"lines {got} are not the two that would change: the ones that read K's and V's scale "
                    "(their index t * nkv would become t)")
    return (f"{saved} bytes saved per token and layer, for a {ratio:.1f}x larger error on every quiet head; "
            f"lines {lines} would read the scale at index t instead of t * nkv")


ex03_2 = Exercise(
    "03", "per_head", "exercise 2: why per (token, head)?",
    "K = exercises.l03_loud_head_K() (8 kv heads, head 3 ten times larger). How many bytes per token and "
    "layer would one scale per token row save (K and V)? By what factor does the RMS error of the 7 quiet "
    "heads grow with one scale per row (quantize_kv_rows(K.reshape(T, -1))) against the per-(token, head) "
    "cache? Which two kernel lines (numbers) would change?",
    {"bytes_saved_per_token": ..., "quiet_error_ratio": ..., "lines": [..., ...]}, _l03_per_head,
    _l03_per_head_truth,
    "scales: 2 (K, V) x 4 bytes x nkv per token; the loud head sets the max of the whole row; "
    "source.find_line('kscale[(size_t)t * nkv]', segment=2) and its V twin in segment 3.")

L03_KV_BS = (16, 64, 256, 4096)


@functools.lru_cache(maxsize=None)
def _l03_kv_bs_truth():
    kv_dim, T_max = 8 * 128, 32768
    T = np.arange(1, T_max + 1)
    waste = {bs: float(np.mean((-T) % bs) * 2 * kv_dim) for bs in L03_KV_BS}   # unused rows x K+V codes
    K, V, q, kh = lesson00_data()
    changes = attend(q, _cache(K[:200], V[:200], 1), kh).tobytes() != attend(q, _cache(K[:200], V[:200], 4096), kh).tobytes()
    return waste, math.ceil(T_max / 1), changes   # kv_bs = 1: one block per token


def _l03_kv_bs(answer):
    waste, entries, changes = _l03_kv_bs_truth()
    got = field_of(answer, "avg_waste_bytes")
    if not isinstance(got, Mapping) or len(got) > 4 * len(L03_KV_BS):
        raise Wrong("'avg_waste_bytes' is a dict {16: ..., 64: ..., 256: ..., 4096: ...}")
    by_size = {}
    for k, x in got.items():
        by_size[whole(k, "a kv_bs key") if isinstance(k, str) else k] = x
    for bs in L03_KV_BS:
        v = field_of(by_size, bs, float)
        if not close(v, waste[bs], 0.01):
            raise Wrong(f"kv_bs = {bs}: the average waste is {'more' if waste[bs] > v else 'less'} than {v:.0f} "
                        "bytes (unused rows of the last block x kv_dim x 2 for K and V, averaged over T = 1..32768)")
    e = field_of(answer, "pointer_entries_kv_bs1", int)
    if e != entries:
        raise Wrong(f"with kv_bs = 1 at 32768 tokens a pointer table has one entry per block: not {e}")
    c = field_of(answer, "output_changes", bool)
    if c != changes:
        raise Wrong("run the kernel on the same data with two block sizes and compare the bytes of the outputs")
    return (f"average waste {', '.join(f'{bs}: {waste[bs]:.0f} B' for bs in L03_KV_BS)}; {entries} entries "
            f"(x 8 bytes, per table) with kv_bs = 1; the output {'changes' if changes else 'does not change'}")


ex03_3 = Exercise(
    "03", "kv_bs", "exercise 3: what kv_bs costs",
    "Qwen3-8B (8 kv heads, hd 128), one layer, context length uniform in 1..32768: average bytes of K+V "
    "codes in the unused rows of the last block, for kv_bs = 16, 64, 256, 4096? Entries of a pointer table "
    "with kv_bs = 1 at 32768 tokens? Does kv_bs change the kernel's output?",
    {"avg_waste_bytes": {16: ..., 64: ..., 256: ..., 4096: ...}, "pointer_entries_kv_bs1": ...,
     "output_changes": ...}, _l03_kv_bs,
    _l03_kv_bs_truth,
    "unused rows = (-T) % kv_bs; average over every T with numpy; one byte per value, K and V.")

# ============================================================================ lesson 04

def _lines_outside_segments():
    first, last = source.function_lines(debug.KERNEL)
    segs = source.kernel_segments()
    text = source.KERNEL_FILE.read_text().splitlines()
    inside = {n for s in segs.values() for n in range(s.begin, s.end + 1)}
    return {n for n in range(first, last + 1) if n not in inside and text[n - 1].strip()}


def _as_lines(value, n_lines: int) -> set[int]:
    """The line numbers of an answer's numbers and (first, last) ranges, each range cut to the
    file's lines 1..n_lines (lines beyond them count for nothing, so (1, 10**9) builds no billion
    numbers)."""
    out = set()
    for v in items_of({"lines": value}, "lines", MAX_ANSWER_ITEMS):
        if isinstance(v, (tuple, list, range)):
            if len(v) != 2:
                raise Wrong(f"{short(v)}: give a line number or a (first, last) range")
            first, last = whole(v[0], "a range's first line"), whole(v[1], "a range's last line")
            out |= set(range(max(first, 1), min(last, n_lines) + 1))
        else:
            out.add(whole(v, "a line number"))
    return out


def _l04_outside(answer):
    truth = _lines_outside_segments()
    text = source.KERNEL_FILE.read_text().splitlines()
    got = {n for n in _as_lines(field_of(answer, "lines"), len(text)) if 0 < n <= len(text) and text[n - 1].strip()}
    missing, extra = sorted(truth - got), sorted(got - truth)
    if extra:
        raise Wrong(f"lines {extra[:6]}{' ...' if len(extra) > 6 else ''} are inside a segment or outside the function")
    if missing:
        raise Wrong(f"{len(missing)} non-blank line(s) of the function outside every segment are missing, "
                    f"the first at line {missing[0]}")
    return (f"{len(truth)} non-blank lines belong to no segment: the signature and the argument check, the "
            "running state M, S, VKQ and the tile loop around segments 2-3, and closing braces")


ex04_1 = Exercise(
    "04", "outside_segments", "exercise 1: lines in no segment",
    "List the lines of flash_attn_single_q_q8_neon that lie in no segment (numbers or (first, last) ranges; "
    "blank lines may be left out).",
    {"lines": [...]}, _l04_outside,
    lambda: {"lines": sorted(_lines_outside_segments())},
    "source.function_lines('flash_attn_single_q_q8_neon') and source.kernel_segments(): every line of the "
    "first range that is in none of the second.",
    "They belong to the article's parts as follows: the signature and `if (hd ...)` to the call itself, "
    "M/S/VKQ and the tile loop to the online softmax (the article's segment 2 declares them).")


def _l04_once_truth():
    cache, q, kh, scale, out, tr = lesson04_data()
    return (len(np.unique(cache.k_scales(kh))), len(np.unique(tr.q_scales)), tr.n_q_quantized,
            cache.seq_len * cache.head_dim)


def _l04_once(answer):
    nk, nq, runs, per_token = _l04_once_truth()
    k = field_of(answer, "distinct_k_scales", int)
    if k != nk:
        raise Wrong(f"np.unique(cache.k_scales(1)) has {'more' if nk > k else 'fewer'} than {k} values")
    qn = field_of(answer, "distinct_q_scales", int)
    if qn != nq:
        raise Wrong(f"trace.q_scales holds {'more' if nq > qn else 'fewer'} than {qn} distinct values")
    c = field_of(answer, "q_code_calls_if_per_token", int)
    if c != per_token:
        raise Wrong(f"not {c}: one q_code per value of Q ({lesson04_data()[0].head_dim}) for every token")
    return (f"{nk} K scales (one per token) against {nq} Q scales; segment 1 ran {runs} time; quantizing Q per "
            f"token would call q_code {per_token} times instead of {lesson04_data()[0].head_dim}")


ex04_2 = Exercise(
    "04", "once_per_token", "exercise 2: once versus per token",
    "Lesson 04's traced call (seed 4, 1000 tokens, kv head 1): how many distinct values does "
    "cache.k_scales(1) hold, how many does trace.q_scales hold, and how many q_code calls would one call "
    "make if Q were quantized inside the token loop?",
    {"distinct_k_scales": ..., "distinct_q_scales": ..., "q_code_calls_if_per_token": ...}, _l04_once,
    lambda: (lambda t: (t[0], t[1], t[3]))(_l04_once_truth()),
    "len(np.unique(...)); segment 1 calls q_code once per value of Q.")

FOLD_EDITS = (debug.Edit(source.KERNEL_FILE.name, "qsc[b] = qm * KVQ_INV;", "qsc[b] = qm * KVQ_INV * scale;", 1),
              debug.Edit(source.KERNEL_FILE.name, "s = s * ks * scale;", "s = s * ks;", 2))


@functools.lru_cache(maxsize=None)
def _l04_fold_truth():
    copy = debug.copy_native()
    try:
        changes = [debug.edit_line(copy, e) for e in FOLD_EDITS]
        ffi, lib = native.load(src_dir=copy)
        cache, q, kh, scale, out, tr = lesson04_data()
        folded = debug.trace_with(ffi, lib, q, cache, kh, scale)
    finally:
        shutil.rmtree(copy.parent, ignore_errors=True)
    per_token = next(c for c in changes if c.new.strip().startswith("s ="))
    saved = per_token.old.count("*") - per_token.new.count("*")
    rel = float(np.abs(folded.s - tr.s).max() / np.abs(tr.s).max())
    return saved, bool(rel < 1e-5), rel


def _l04_fold(answer):
    saved, last_bits, rel = _l04_fold_truth()
    s = field_of(answer, "multiplies_saved_per_token", int)
    if s != saved:
        raise Wrong(f"not {s}: compare the per-token line of segment 2 before and after (the per-block line does not change)")
    b = field_of(answer, "scores_change_only_in_last_bits", bool)
    if b != last_bits:
        raise Wrong(f"the folded kernel's scores differ from the original's by at most {rel:.1e} relative")
    return (f"{saved} multiply per token saved; the scores change by at most {rel:.1e} relative: the same "
            "product, rounded in another order")


ex04_3 = Exercise(
    "04", "fold_scale", "exercise 3: fold scale into qsc",
    "With qsc[b] = qm * KVQ_INV * scale in segment 1 and s = s * ks in segment 2: how many multiplies per "
    "token are saved, and do the scores change only in their last bits (less than 1e-5 relative)? The check "
    "makes this edit in a temporary copy of native/ and compares the traced scores of lesson 04's call.",
    {"multiplies_saved_per_token": ..., "scores_change_only_in_last_bits": ...}, _l04_fold,
    _l04_fold_truth,
    "the multiply by scale moves from the token loop into segment 1 (4 blocks, once per call); float32 "
    "multiplication is not associative, so (a * b) * c and a * (b * c) may round differently.")

# ============================================================================ lesson 06

@functools.lru_cache(maxsize=None)
def _default_observation():
    return debug.observe_generation(16)


def _l06_tier_a_truth(observation=None) -> dict:
    """The six answers, read from the records (not from the toy's settings)."""
    obs = observation or _default_observation()
    rs, s = obs.records, obs.summary()
    first = rs[0].seq_len
    per_step = sum(1 for r in rs if r.seq_len == first)
    return {"seq_len_first": first, "seq_len_last": rs[-1].seq_len, "calls_per_step": per_step,
            "grows_by_per_step": (rs[per_step].seq_len - first) if len(rs) > per_step else 0,
            "loop_runs_seq_len": s["token loop ran exactly seq_len times in every call"],
            "M_non_decreasing": s["M never decreased within a call"]}


TIER_A_HINTS = {"seq_len_first": "the first record's seq_len", "seq_len_last": "the last record's seq_len",
                "calls_per_step": "count the records of the first step (one per query head)",
                "grows_by_per_step": "seq_len of the second step minus seq_len of the first",
                "loop_runs_seq_len": "compare each record's iterations (stops in segment 3) with its seq_len",
                "M_non_decreasing": "look at M after each token, within each call"}


def _l06_tier_a(answer, observation=None):
    obs = observation or _default_observation()
    truth = _l06_tier_a_truth(obs)
    for key, kind in (("seq_len_first", int), ("seq_len_last", int), ("calls_per_step", int),
                      ("grows_by_per_step", int), ("loop_runs_seq_len", bool), ("M_non_decreasing", bool)):
        got = field_of(answer, key, kind)
        if got != truth[key]:
            raise Wrong(f"{key} = {got!r} is not what the {obs.source} records show: {TIER_A_HINTS[key]}")
    return (f"{len(obs.records)} calls, seq_len {truth['seq_len_first']} .. {truth['seq_len_last']}, "
            f"+{truth['grows_by_per_step']} per step of {truth['calls_per_step']} calls; the token loop ran "
            f"seq_len times and M never fell (records from {obs.source})")


ex06_a = Exercise(
    "06", "tier_a", "tier A: seq_len, the token loop, M",
    "From the debugger's records of the 16-token generation: seq_len at entry of the first and the last call, "
    "kernel calls per generation step, how much seq_len grows from one step to the next, whether the token "
    "loop ran exactly seq_len times in every call, whether M never decreased within a call. "
    "Pass the observation: check(answer, observation=obs).",
    {"seq_len_first": ..., "seq_len_last": ..., "calls_per_step": ..., "grows_by_per_step": ...,
     "loop_runs_seq_len": ..., "M_non_decreasing": ...}, _l06_tier_a,
    _l06_tier_a_truth,
    "obs.records: r.seq_len, r.iterations, r.M (one value per token); obs.summary() computes the same.")

ARTICLE_PARTS = {1: "Q 量化 (Q quantization)", 2: "打分 (scoring)", 3: "rescale (online softmax)", 4: "归一 (normalization)"}


def _segment_key(k) -> int:
    try:
        n = whole(k, "a segment key")
    except Wrong:
        raise Wrong(f"keys are the segment numbers 1 to 4; got {short(k)}") from None
    if n not in ARTICLE_PARTS:
        raise Wrong(f"keys are the segment numbers 1 to 4; got {short(k)}")
    return n


def _direction(got: int, accepted: tuple[int, int], what: str) -> str:
    lo, hi = accepted
    if got < lo:
        return f"{what} is {lo - got} line(s) too early"
    return f"{what} is {got - hi} line(s) too late"


def _l06_segments(answer, path=None):
    path = path or source.KERNEL_FILE
    segs = source.kernel_segments(path)
    if not isinstance(answer, Mapping):
        if not isinstance(answer, (list, tuple)) or len(answer) > 16:
            raise Wrong("give a dict {1: (start, end), 2: ..., 3: ..., 4: ...}")
        answer = dict(enumerate(answer, start=1))
    if len(answer) > 16:
        raise Wrong("give a dict {1: (start, end), 2: ..., 3: ..., 4: ...}: four segments")
    given = {_segment_key(k): v for k, v in answer.items()}
    problems = []
    for n, seg in segs.items():
        if n not in given:
            raise Wrong(f"segment {n} ({ARTICLE_PARTS[n]}) is missing")
        if not _filled(given[n]) or (isinstance(given[n], (tuple, list)) and not all(map(_filled, given[n]))):
            raise Blank(f"fill in segment {n}")
        if not isinstance(given[n], (tuple, list)) or len(given[n]) != 2:
            raise Wrong(f"segment {n}: give (start line, end line); got {short(given[n])}")
        start, end = (whole(x, f"segment {n}'s line") for x in given[n])
        # the marker lines themselves, or the first and last line between them, both count
        ok_start, ok_end = (seg.begin, seg.begin + 1), (seg.end - 1, seg.end)
        if start not in ok_start:
            problems.append(f"segment {n} ({ARTICLE_PARTS[n]}): " + _direction(start, ok_start, "your start"))
        if end not in ok_end:
            problems.append(f"segment {n} ({ARTICLE_PARTS[n]}): " + _direction(end, ok_end, "your end"))
    if problems:
        raise Wrong("; ".join(problems))
    return ("all four segments match the markers of " + source.KERNEL_FILE.name + ": "
            + ", ".join(f"{n}: {s.begin}-{s.end}" for n, s in segs.items()))


ex06_b1 = Exercise(
    "06", "tier_b_segments", "tier B: the four segments' lines",
    "Read native/flash_attn_q8_neon.c (print it with source.numbered_lines) and give the start and end line of "
    "each part: 1 Q 量化, 2 打分, 3 rescale, 4 归一. The marker comment lines count, and so do the first and "
    "last line between them.",
    {1: (..., ...), 2: (..., ...), 3: (..., ...), 4: (..., ...)}, _l06_segments,
    lambda path=None: {n: (s.begin, s.end) for n, s in source.kernel_segments(path or source.KERNEL_FILE).items()},
    "look for the comments '== segment N: ... ==' and '== end segment N =='; the check reads them from the "
    "current file, so after an edit the right lines move with the code.")

WHY_CHOICES = {
    "a": Choice("Q is one vector for the whole call: its codes and block scales do not depend on t, so they are "
                "computed once before the loop. Each K row was quantized when it was written, with its own max, "
                "so ks changes with t and is multiplied in for every token",
                "right: the trace shows segment 1 running once and (nearly) as many K scales as tokens"),
    "b": Choice("Quantizing Q is expensive, so it is done once; K's scale could just as well be applied once "
                "at the end, to the output",
                "no: each token's score is multiplied by its own ks before exp(); a factor that differs per token "
                "cannot be taken out of the sum of exponentials"),
    "c": Choice("The K cache holds float32; the kernel quantizes each K row as it reads it, which needs its scale",
                "no: K is already int8 in the cache (quantized once, when written); the kernel only reads its stored scale"),
    "d": Choice("Q changes during the scan, because the online rescale multiplies it by exp(M_old - M_new)",
                "no: the rescale multiplies S and VKQ, never Q; Q's codes stay fixed for the whole call"),
}


def _why_truth():
    cache, q, kh, scale, out, tr = lesson04_data()
    n_k = len(np.unique(cache.k_scales(kh)))
    right = "a" if tr.n_q_quantized == 1 and n_k > 1 else "b"
    return right, tr.n_q_quantized, n_k, cache.seq_len


def _l06_why(answer):
    right, runs, n_k, T = _why_truth()
    if not isinstance(answer, Mapping):
        answer = {"choice": answer}
    return pick(answer, "choice", WHY_CHOICES, right) + f" (segment 1 ran {runs} time; {n_k} distinct K scales over {T} tokens)"


ex06_b2 = Exercise(
    "06", "tier_b_why", "tier B: why Q once, K's scale per token?",
    "Why is Q quantized only once per call, while K's scale is multiplied in for every token?",
    {"choice": ...}, _l06_why, lambda: {"choice": _why_truth()[0]},
    "which of the two depends on the token index t?", choices=WHY_CHOICES)

RESCALE_CHOICES = {
    "a": Choice("the tokens before the last new maximum: against the tokens after it, each is too heavy by "
                "exp(M_final - M_t), M_t being the max when it was added",
                "right: their terms stayed relative to an older, lower M and were never multiplied by ms; after the "
                "division by the inflated sum, the tokens from the last maximum on all come out too light"),
    "b": Choice("only the tokens that raised M", "no: a token that raises M gets weight exp(0) = 1, as in the intact "
                "kernel; it is everything summed before it that is never shrunk"),
    "c": Choice("the tokens after the last new maximum", "no: after the last new max M no longer moves, so those "
                "tokens keep the right weights relative to each other; it is the earlier ones that are too heavy"),
    "d": Choice("none: only the final division by S is off", "no: S and VKQ miss the same factors, and the division "
                "does not repair the mix of weights: the output leans toward the past"),
}
RESCALE_SCORES = (0.0, 1.0, 2.0, 3.0)


@functools.lru_cache(maxsize=None)
def _l06_rescale_truth():
    b = debug.break_kernel("no_rescale")
    wrong = debug.kernel_weights(b.ffi, b.lib, RESCALE_SCORES).astype(np.float64)
    right = debug.softmax_weights(RESCALE_SCORES)
    ratio = wrong / right
    last_max = int(np.flatnonzero(np.array(RESCALE_SCORES) == np.maximum.accumulate(RESCALE_SCORES))[-1])
    heavy = np.flatnonzero(ratio > ratio[last_max] * (1 + 1e-4)).tolist()   # relative to the last maximum
    choice = "a" if heavy == list(range(last_max)) else "b"
    return choice, float(wrong[0] / right[0])


def _l06_rescale(answer):
    choice, factor = _l06_rescale_truth()
    msg = pick(answer, "too_heavy", RESCALE_CHOICES, choice)
    f = field_of(answer, "factor_token0", float)
    if not close(f, factor, 0.02):
        raise Wrong(f"{msg}. But token 0's weight is too large by a factor {'larger' if factor > f else 'smaller'} "
                    f"than {f:.3g}: broken weight / right weight, for scores {list(RESCALE_SCORES)}")
    return f"{msg}. Token 0 is {factor:.2f}x too heavy for scores {list(RESCALE_SCORES)}"


ex06_break1 = Exercise(
    "06", "break_rescale", "break it 1: no online rescale",
    f"In the kernel without the rescale (debug.break_kernel('no_rescale')), with scores {list(RESCALE_SCORES)} "
    "(debug.kernel_weights reads the weights from the kernel's output): which tokens get too much weight, and by "
    "what factor is token 0's (normalized) weight too large (broken / right)?",
    {"too_heavy": ..., "factor_token0": ...}, _l06_rescale,
    _l06_rescale_truth,
    "every score here is a new max, so without the rescale every token keeps weight exp(0) = 1; the right "
    "weights are the softmax of the scores.", choices=RESCALE_CHOICES)

DIRECTION_CHOICES = {
    "a": Choice("toward zero", "right: (int)v drops the fraction, so every code moves toward zero, by up to a whole step"),
    "b": Choice("away from zero", "no: truncation drops the fraction; |code| never grows"),
    "c": Choice("up or down at random, unbiased", "no: look at the sign of (code - v) * sign(v): it is never positive"),
}


def l06_rounding_q() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(128).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _l06_rounding_truth():
    b = debug.break_kernel("truncate")
    q = l06_rounding_q()
    cache = small_cache()
    trunc = debug.trace_with(b.ffi, b.lib, q, cache, 0, 1 / math.sqrt(128)).q_codes.astype(int)
    _, tr = attend(q, cache, 0, trace=True)
    eng = tr.q_codes.astype(int)
    frac = float(np.mean(trunc != eng))
    shift = np.mean((trunc - eng) * np.sign(q))
    return frac, "a" if shift < 0 else ("b" if shift > 0 else "c")


def _l06_rounding(answer):
    frac, direction = _l06_rounding_truth()
    f = field_of(answer, "codes_changed_fraction", float)
    if abs(f - frac) > 0.05:
        raise Wrong(f"the share of Q codes that changed is {'larger' if frac > f else 'smaller'} than {f:.2f} "
                    "(compare the copy's traced q_codes with the intact kernel's)")
    return f"{frac:.0%} of the codes changed; " + pick(answer, "direction", DIRECTION_CHOICES, direction)


ex06_break2 = Exercise(
    "06", "break_rounding", "break it 2: truncation instead of rounding",
    "In the kernel with q_code truncating (debug.break_kernel('truncate')), for q = exercises.l06_rounding_q(): "
    "what share of Q's 128 codes differ from the intact kernel's, and in which direction do they move?",
    {"codes_changed_fraction": ..., "direction": ...}, _l06_rounding,
    _l06_rounding_truth,
    "debug.trace_with(b.ffi, b.lib, q, cache, 0, scale).q_codes against lk.attend(q, cache, 0, trace=True)[1].q_codes; "
    "a value's code changes when its fraction is at least 0.5.", choices=DIRECTION_CHOICES)

# ============================================================================ the lessons

lesson00 = Lesson("00", [ex00_1, ex00_2, ex00_3])
lesson01 = Lesson("01", [ex01_1, ex01_2, ex01_3])
lesson02 = Lesson("02", [ex02_1, ex02_2, ex02_3])
lesson03 = Lesson("03", [ex03_1, ex03_2, ex03_3])
lesson04 = Lesson("04", [ex04_1, ex04_2, ex04_3])
lesson06 = Lesson("06", [ex06_a, ex06_b1, ex06_b2, ex06_break1, ex06_break2])
LESSONS = (lesson00, lesson01, lesson02, lesson03, lesson04, lesson06)
ALL = tuple(ex for lesson in LESSONS for ex in lesson)


def overview() -> str:
    """A table of every exercise: lesson, attribute, pytest marker, title."""
    rows = [f"{'lesson':<7} {'object':<28} {'pytest marker':<22} title"]
    for lesson in LESSONS:
        for i, ex in enumerate(lesson, start=1):
            rows.append(f"{lesson.number:<7} {f'lesson{lesson.number}.ex{i}':<28} {ex.marker:<22} {ex.title}")
    return "\n".join(rows)
