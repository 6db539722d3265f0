"""Timing the compiled kernels (introduced in lesson 01): the call loop runs in C
(native/fa_timing.c), Python takes the median of several repeats. Every timing a lesson shows is
labelled with ``lessonkit.env.machine_label()``: on x86-64 it times SIMDe, not NEON.

A C loop cannot be interrupted (Ctrl-C waits for it), so every timing helper is bounded:
at most ``MAX_CALLS`` calls in one loop, ``MAX_REPEATS`` repeats, and about ``MAX_SECONDS``
seconds per timing call, calibration included. A ``number`` or ``repeats`` that would go past a
cap is refused with a ValueError that names it, after one probe call has measured what a call
costs. On a machine with several core types the timed region runs pinned to one of them
(``lessonkit.env.pinned``; the big cores unless ``cores`` says otherwise)."""
from __future__ import annotations

import time
import warnings

import numpy as np

from . import env, native
from . import validate as check
from .cache import KVCacheQ8, attention_args
from .language import _
from .variants import BY_NAME
from .env import last_level_bytes  # noqa: F401  (lesson 05b calls it timing.last_level_bytes)

# backend name -> fa_time_calls index, from the one registry (native/fa_variants.h)
VARIANTS = {name: v.version for name, v in BY_NAME.items()}


MAX_CALLS = 1 << 24     # calls in one C loop: about 1 s at the fastest call (seq_len 0, ~50 ns)
MAX_REPEATS = 1000      # repeats of one timing
MAX_SECONDS = 60.0      # wall time of one timing call, calibration and probe included
MAX_MIN_REPEAT_S = 5.0  # the calibration target of one repeat


def time_kernel(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, backend: str = "neon",
                seq_len: int | None = None, scale: float | None = None, repeats: int = 7,
                number: int | None = None, min_repeat_s: float = 0.02, cold: bool = False,
                defines: dict | None = None, cores: str | None = None) -> float:
    """Median nanoseconds per kernel call over ``repeats`` repeats of ``number`` back-to-back calls
    (warm: after the first call, whatever fits in the caches is there).

    ``seq_len`` (default: the whole cache) may be smaller than the cache, down to 0: a call with
    seq_len 0 runs only segment 1 (Q to int8) and segment 4. ``number`` defaults to enough calls
    for one repeat to last about ``min_repeat_s`` seconds. ``cold=True`` instead times single
    calls after writing a buffer of 4 x the last-level cache (at least 64 MiB), so that the KV
    comes from DRAM. ``defines`` selects a build, e.g. ``{"FA_PREFETCH": 0}`` (lesson 05): only the
    tunables of ``lessonkit.native.DEFINES``, within their ranges.
    ``backend``: any name of ``lessonkit.variants.VARIANTS`` (the article's kernel "neon", the
    scalar reference, the numbered fast steps, "fast", the two-pass alternatives).
    ``cores``: which core type to time on (``lessonkit.env.timing_cores``; default the big cores).
    Bounded by MAX_CALLS calls per repeat, MAX_REPEATS repeats and about MAX_SECONDS seconds."""
    check.flag("cold", cold)
    plan = env.timing_cores(cores)
    ffi, lib, args = _call_args(q, cache, kv_head, backend, seq_len, scale, defines)
    with env.pinned(plan):
        if cold:
            flush = _flush_buffer()
            fbuf = ffi.from_buffer("unsigned char[]", flush, require_writable=True)
            return median_calls(lambda n: lib.fa_time_call_cold(VARIANTS[backend], fbuf, flush.nbytes, *args),
                                repeats, 1, min_repeat_s)
        return median_calls(lambda n: lib.fa_time_calls(VARIANTS[backend], n, *args), repeats, number,
                            min_repeat_s)


def _call_args(q, cache: KVCacheQ8, kv_head, backend, seq_len, scale, defines) -> tuple:
    """(ffi, lib, the arguments of fa_time_calls after the variant and count), all checked."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    check.one_of("backend", backend, VARIANTS)
    T = cache.seq_len if seq_len is None else check.integer("seq_len", seq_len, minimum=0, below=cache.seq_len + 1)
    defines = native.check_defines(defines)  # before anything else: a bad -D never compiles
    ffi, lib = native.load(defines=defines)
    out = np.empty(cache.head_dim, np.float32)
    k, v, ks, vs, unused, kv_dim, kv_bs, nkv, kh_off = cache.kernel_args(kv_head, ffi, lib)
    return ffi, lib, (ffi.from_buffer("float[]", out, require_writable=True), ffi.from_buffer("float[]", q),
                      k, v, ks, vs, T, kv_dim, kv_bs, nkv, kh_off, cache.head_dim, scale)


def call_loop(q: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, backend: str = "neon",
              scale: float | None = None):
    """``run(n)``: ns per call of ``n`` back-to-back calls of ``backend`` in C (fa_time_calls), with no
    probe or warm-up call before them: ``run(1)`` right after other work times the kernel on whatever
    that work left in the caches (the benchmark's cold figure). Arguments checked once, here; ``n`` is
    capped at MAX_CALLS."""
    ffi, lib, args = _call_args(q, cache, kv_head, backend, None, scale, None)
    variant = VARIANTS[backend]

    def run(n: int) -> float:
        n = check.integer("n", n, minimum=1)
        check.at_most("n", n, MAX_CALLS, "calls in one uninterruptible C loop")
        return float(lib.fa_time_calls(variant, n, *args))
    return run


def check_counts(repeats, number, min_repeat_s) -> tuple[int, int | None, float]:
    """repeats, number (None: calibrated) and min_repeat_s, within the caps."""
    repeats = check.integer("repeats", repeats, minimum=1)
    check.at_most("repeats", repeats, MAX_REPEATS, "repeats of one timing")
    if number is not None:
        number = check.integer("number", number, minimum=1)
        check.at_most("number", number, MAX_CALLS, "calls in one uninterruptible C loop")
    min_repeat_s = check.finite_float("min_repeat_s", min_repeat_s, minimum=0.0, maximum=MAX_MIN_REPEAT_S)
    if repeats * min_repeat_s > MAX_SECONDS:
        raise ValueError(_("repeats x min_repeat_s = {repeats_min_repeat_s:g} s is above the cap of "
                           "{MAX_SECONDS:g} s per timing call; use fewer repeats or a smaller min_repeat_s").format(
                           repeats_min_repeat_s=repeats * min_repeat_s, MAX_SECONDS=MAX_SECONDS))
    return repeats, number, min_repeat_s


def median_calls(run, repeats: int, number: int | None, min_repeat_s: float) -> float:
    """Median of ``repeats`` results of ``run(number)`` (a C loop of ``number`` calls returning ns
    per call); ``number=None`` picks enough calls for one repeat to last ``min_repeat_s``, up to
    MAX_CALLS. One probe call first measures what a call costs: a ``number`` or ``repeats`` whose
    run would take more than MAX_SECONDS is refused (ValueError) before the long loops start; if
    the machine turns slower than the probe said, the repeats stop at MAX_SECONDS and the median of
    those done is returned, with a RuntimeWarning."""
    repeats, number, min_repeat_s = check_counts(repeats, number, min_repeat_s)
    start = time.perf_counter()
    call_s = run(1) * 1e-9  # the probe, and the warm-up call: the caches hold what fits of its data
    # what a repeat costs besides its calls (Python, and a cold call's flush of the caches)
    overhead_s = max(time.perf_counter() - start - call_s, 0.0)
    if number is None:
        number = 1
        while True:
            call_s = run(number) * 1e-9
            if number >= MAX_CALLS or number * call_s >= min_repeat_s:
                break
            if time.perf_counter() - start + 4 * number * call_s > MAX_SECONDS / 2:
                break  # calibration must leave the repeats most of the budget
            number = min(4 * number, MAX_CALLS)
    per_repeat = overhead_s + number * call_s
    need = repeats * per_repeat
    if need > MAX_SECONDS:
        fit_repeats = int(MAX_SECONDS // per_repeat)
        fit_number = int((MAX_SECONDS / repeats - overhead_s) // max(call_s, 1e-12))
        raise ValueError(_("{repeats} repeats x {number} calls of about {call_s:.3g} ms would take about "
                           "{need:.0f} s, above the cap of {MAX_SECONDS:g} s per timing call; use "
                           "{fit_repeats}{fit_number}").format(
                           repeats=repeats, number=number, call_s=call_s * 1000.0, need=need,
                           MAX_SECONDS=MAX_SECONDS,
                           fit_repeats=_('repeats <= {fit_repeats} or ').format(fit_repeats=fit_repeats) if fit_repeats >= 1 else '',
                           fit_number=f'number <= {fit_number}' if fit_number >= 1 else _('a shorter seq_len')))
    results = []
    deadline = start + MAX_SECONDS
    for i in range(repeats):
        results.append(run(number))
        if i + 1 < repeats and time.perf_counter() > deadline:
            stopped_early(i + 1, repeats)
            break
    return float(np.median(results))


def stopped_early(done: int, repeats: int) -> None:
    """The warning of a timing whose repeats stopped at MAX_SECONDS."""
    warnings.warn(_("timing stopped after {done} of {repeats} repeats at the cap of {MAX_SECONDS:g} s: the machine "
                    "ran slower than the probe call said").format(
                    done=done, repeats=repeats, MAX_SECONDS=MAX_SECONDS), RuntimeWarning, stacklevel=3)


# ----------------------------------------------------------------------------- contenders timed in alternation

MAX_ROUNDS = 100  # rounds of one interleaved timing


def median_ns(fn, repeats: int, cores: str | None = None) -> float:
    """Median ns of ``repeats`` calls of ``fn()`` from Python after a warm-up, pinned like the
    kernel timings (``cores``, as in ``lessonkit.env.timing_cores``)."""
    if not callable(fn):
        raise TypeError(_("fn must be a function of no arguments; got {fn}").format(fn=type(fn).__name__))
    repeats = check.integer("repeats", repeats, minimum=1)
    check.at_most("repeats", repeats, MAX_REPEATS, _("repeats of one timing"))
    with env.pinned(cores):
        return _sampled({"fn": per_call(fn, 1)}, repeats, np.median)["fn"]


def interleaved(contenders: dict, rounds: int, stat: str = "median", close=()) -> dict[str, float]:
    """The median (or ``stat="min"``: the least disturbed) of ``rounds`` samples of each contender (a
    function of no arguments returning one sample's ns), after one warm-up call each, sampled in
    alternation with the order rotated every round; then the objects of ``close`` are closed."""
    try:
        if stat not in ("median", "min"):
            raise ValueError(_("stat must be 'median' or 'min'; got {stat!r}").format(stat=stat))
        rounds = check.integer("rounds", rounds, minimum=1)
        check.at_most("rounds", rounds, MAX_ROUNDS, _("rounds of one interleaved timing"))
        for name, fn in contenders.items():
            if not callable(fn):
                raise TypeError(_("contender {name!r} must be a function of no arguments").format(name=name))
        return _sampled(contenders, rounds, np.min if stat == "min" else np.median)
    finally:
        for c in close:
            c.close()


def _sampled(contenders: dict, rounds: int, reduce) -> dict[str, float]:
    return {name: float(reduce(v)) for name, v in _rounds(contenders, rounds).items()}


def _rounds(contenders: dict, rounds: int) -> dict[str, list[float]]:
    """Each contender's samples: one warm-up call each, then ``rounds`` rounds in which every contender
    gives one sample, the order rotated every round (so none always runs right after the same other)."""
    names = list(contenders)
    for name in names:
        contenders[name]()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(float(contenders[name]()))
    return samples


def per_call(fn, number: int):
    """A sample: ns per call of ``number`` back-to-back calls of ``fn`` from Python (warm), after one
    call timed alone (cold: the first after whatever ran before; kept in ``sample.colds``)."""
    def sample():
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        for unused in range(number):
            fn()
        sample.colds.append(float(t1 - t0))
        return (time.perf_counter_ns() - t1) / number
    sample.colds = []
    return sample


def _kernel_sample(q, cache, kv_head, name: str, number: int, cores=None):
    """A registry version's sample in the C loop, pinned as ``time_kernel`` (``cores``): ``number``
    back-to-back calls (warm), after one call timed alone (cold: right after the other contenders; kept
    in ``sample.colds``)."""
    run, plan = call_loop(q, cache, kv_head, backend=name), env.timing_cores(cores)

    def sample():
        with env.pinned(plan):
            sample.colds.append(run(1))
            return run(number)
    sample.colds = []
    return sample


def kernel_contenders(names, q, cache, kv_head, number: int, cores=None) -> dict:
    """Registry versions timed by the C loop (``timing.call_loop``): ``number`` calls a sample (warm), after
    one call alone (cold)."""
    return {n: _kernel_sample(q, cache, kv_head, n, number, cores) for n in names}


def _last_level_bytes() -> int:
    """The last level's bytes; 64 MiB where /sys lists no cache (macOS)."""
    return env.last_level_bytes() or 64 << 20


_flush: list[np.ndarray] = []


def _flush_buffer() -> np.ndarray:
    """The buffer written before a cold call: 4 x the last-level cache, at least 64 MiB (at most
    1 GiB, whatever /sys reports), allocated once per process."""
    if not _flush:
        _flush.append(np.zeros(min(1 << 30, max(64 << 20, 4 * _last_level_bytes())), np.uint8))
    return _flush[0]
