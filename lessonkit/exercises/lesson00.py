"""The exercises of lesson 00."""
from __future__ import annotations

import functools

import numpy as np

from .. import native
from ..kernels.attention import attend
from ..validate import short
from .core import (register, Wrong, items_of, field_of, close, Choice, Exercise, pick, lesson00_data, make_cache, kernel_q_codes)

L00_BLOCK_SIZES = (1, 7, 1000)
ARG_NAMES = ("k_cache_q8", "v_cache_q8", "kscale", "vscale", "seq_len", "kv_dim", "kv_bs", "nkv", "kh_off")


@functools.lru_cache(maxsize=None)
def _l00_block_size_truth():
    K, V, q, kh = lesson00_data()
    ffi, _ = native.load()
    caches = [make_cache(K, V, bs) for bs in (64, *L00_BLOCK_SIZES)]
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
    lesson="00", name="block_size", title="exercise 1: does the block size matter?",
    question="Lesson 00's cache (seed 0, 1000 tokens, kv head 3) built with block_size 1, 7 and 1000: are the "
    "kernel's outputs equal bit for bit to the block_size-64 output? Which kernel arguments changed "
    f"(names from {', '.join(ARG_NAMES)})? Fields: bit_identical is True or False; changed is a list of "
    "argument names (strings).",
    template={"bit_identical": ..., "changed": ...}, check=_l00_block_size,
    solution=lambda: {"bit_identical": _l00_block_size_truth()[0], "changed": sorted(_l00_block_size_truth()[1])},
    hint="compare out.tobytes() of the calls; then print cache.kernel_args(3, ffi) for two block sizes: the "
    "pointer tables have a different number of entries, kv_bs differs, the scales sit at the same indices.",
    explain="The kernel computes token t's score and weight from its K/V row and scales only; kv_bs and the "
    "tables only say where that row is. The token order, and so every float32 rounding, stays the same.")

L00_BACKENDS = ("neon", "scalar", "numpy")


@functools.lru_cache(maxsize=None)
def _l00_backends_truth():
    K, V, q, kh = lesson00_data()
    cache = make_cache(K, V, 64)
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
    lesson="00", name="backends", title="exercise 2: three backends",
    question="Lesson 00's cache and query: which pairs of lk.attend(q, cache, 3, backend=b) for b in "
    "'neon', 'scalar', 'numpy' agree bit for bit on your machine, and what is the largest |difference| "
    "between any two of them (order of magnitude is enough)? Fields: exact_pairs is a list of tuples of two "
    "backend names, like [('numpy', 'scalar')], or [] if none; largest_difference is a number, like 1e-3.",
    template={"exact_pairs": ..., "largest_difference": ...}, check=_l00_backends,
    solution=lambda: {"exact_pairs": [tuple(sorted(p)) for p in _l00_backends_truth()[0]],
             "largest_difference": float(f"{_l00_backends_truth()[1]:.2g}")},
    hint="np.array_equal(a, b) for each of the 3 pairs; np.abs(a - b).max() for the size. The numpy backend "
    "sums the softmax in float64, the C ones in float32; SIMDe may fuse multiply and add.")

L00_GUARD_CHOICES = {
    "a": Choice("iq = 127/0 = inf, and 0 * inf = NaN: C's cast of NaN to int is undefined",
                "right: IEEE float division by zero gives inf, 0 * inf gives NaN, and C leaves the cast of NaN "
                "to int undefined (x86 gives INT_MIN, AArch64 gives 0)"),
    "b": Choice("nothing: every value is 0, so every code is 0 with or without the guard",
                "no: 0 * 127/0 is not 0 but NaN in IEEE arithmetic; the guard is what makes the codes 0"),
    "c": Choice("the program stops at once: dividing by zero raises the signal SIGFPE",
                "no: float division by zero does not trap by default; it returns inf (only integer division traps)"),
    "d": Choice("qsc[0] = 0, so the block adds 0 to every score, which is harmless",
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
    lesson="00", name="silent_block", title="exercise 3: a silent block",
    question="The kernel's first step (segment 1) cuts q into blocks of 32 values. For each block it takes "
    "qm = max|q_i|, stores the block scale qsc = qm / 127, and multiplies every value by iq = 127 / qm. The line "
    "`if (qm < 1e-6f) qm = 1.0f;` (the guard) runs before that. Set q[:32] = 0 in lesson 00's query. "
    "(1) What qsc[0] does the kernel store? The traced build records it: run "
    "`_, tr = lk.attend(q, cache, 3, trace=True)` and read tr.q_scales[0]. (2) Without the guard, what would "
    "happen in that block? Fields: qsc0 is a number; without_guard is a letter.",
    template={"qsc0": ..., "without_guard": ...}, check=_l00_guard,
    solution=lambda: {"qsc0": _l00_guard_truth()[0], "without_guard": _l00_guard_truth()[2]},
    hint="trace.q_scales[0]; for the second part, do the float32 arithmetic of segment 1 with qm = 0 in numpy "
    "(np.float32(127) / np.float32(0), then times 0).",
    choices=L00_GUARD_CHOICES)

register(__name__, [ex00_1, ex00_2, ex00_3])
