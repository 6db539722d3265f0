"""The exercises of lesson 00."""
from __future__ import annotations

import functools

import numpy as np

from ..core import native
from ..core.attention import attend
from ..core.language import N_, _
from ..core.validate import short
from .core import (Choice, Exercise, Field, Wrong, field_of, items_of, kernel_q_codes, lesson00_data, make_cache,
                   register)

ARG_NAMES = ("k_cache_q8", "v_cache_q8", "kscale", "vscale", "seq_len", "kv_dim", "kv_bs", "nkv", "kh_off")
BACKENDS = ("neon", "scalar", "numpy")


@functools.lru_cache(maxsize=None)
def _block_size_facts():
    K, V, q, kh = lesson00_data()
    ffi, unused = native.load()
    caches = [make_cache(K, V, bs) for bs in (64, 1, 7, 1000)]
    outs = [attend(q, c, kh).tobytes() for c in caches]
    changed, base = set(), caches[0].kernel_args(kh, ffi)
    for c in caches[1:]:
        for name, a, b in zip(ARG_NAMES, base, c.kernel_args(kh, ffi)):
            if name in ("k_cache_q8", "v_cache_q8"):
                if caches[0].n_blocks != c.n_blocks:
                    changed.add(name)   # another number of blocks behind the table
            elif name in ("kscale", "vscale"):
                if any(a[t * c.n_kv_heads] != b[t * c.n_kv_heads] for t in range(0, c.seq_len, 97)):
                    changed.add(name)   # what the kernel reads through the pointer
            elif a != b:
                changed.add(name)
    return {"bit_identical": all(o == outs[0] for o in outs), "changed": sorted(changed)}


def _block_size(answer, facts):
    names = {(n if isinstance(n, str) else short(n)).strip() for n in items_of(answer, "changed", 4 * len(ARG_NAMES))}
    changed = set(facts["changed"])
    if names - set(ARG_NAMES):
        raise Wrong(_("{names_set_arg_names} are not arguments of the kernel; its cache arguments are {arg_names}").format(
                      names_set_arg_names=sorted(names - set(ARG_NAMES)), arg_names=', '.join(ARG_NAMES)))
    extra = sorted(names - changed)
    if extra and set(extra) & {"kscale", "vscale"}:
        raise Wrong(_("{extra} did not change: the kernel reads the same values through them (the scale of token "
                      "t, head kh is still at kscale[t * nkv])").format(extra=extra))
    if extra:
        raise Wrong(_("{extra} did not change: the kernel reads the same values through them in every cache").format(
                      extra=extra))
    if changed - names:
        raise Wrong(_("you missed {changed_names}: compare cache.kernel_args(kh, ffi) of two caches").format(
                      changed_names=sorted(changed - names)))
    same = facts["bit_identical"]
    return _("the outputs are {same}; only {changed} changed: which block a token sits in changes where it is "
             "read, not what is computed with it").format(
             same=_('bit-identical') if same else _('not identical'), changed=sorted(changed))


ex1 = Exercise(
    "block_size", N_("exercise 1: does the block size matter?"),
    N_("Lesson 00's cache (seed 0, 1000 tokens, kv head 3) built with block_size 1, 7 and 1000: are the kernel's "
       "outputs equal bit for bit to the block_size-64 output? Which kernel arguments changed (names from "
       "{arg_names})? A pointer table counts as changed when its number of entries does, a scale when the values the "
       "kernel reads do: the addresses of a new cache always differ. Fields: bit_identical is True or False; changed is a list of argument names (strings).", arg_names=', '.join(ARG_NAMES)),
    facts=_block_size_facts, template={"bit_identical": ..., "changed": ...}, check=_block_size,
    fields={"bit_identical": Field(bool, (  # (the truth is True, the truth is False)
        N_("run it: the outputs with block sizes 1, 7 and 1000 are equal bit for bit on this machine"),
        N_("run it: the outputs with block sizes 1, 7 and 1000 are not all equal bit for bit on this machine")))},
    hint=N_("compare out.tobytes() of the calls; then print cache.kernel_args(3, ffi) for two block sizes: the "
            "pointer tables have a different number of entries, kv_bs differs, the scales sit at the same indices."),
    explain=N_("The kernel computes token t's score and weight from its K/V row and scales only; kv_bs and the "
               "tables only say where that row is. The token order, and so every float32 rounding, stays the same."))


@functools.lru_cache(maxsize=None)
def _backends_facts():
    K, V, q, kh = lesson00_data()
    cache = make_cache(K, V, 64)
    outs = {b: attend(q, cache, kh, backend=b) for b in BACKENDS}
    pairs = [(a, b) for i, a in enumerate(BACKENDS) for b in BACKENDS[i + 1:]]
    return {"exact_pairs": [tuple(sorted(p)) for p in pairs if outs[p[0]].tobytes() == outs[p[1]].tobytes()],
            "largest_difference": max(float(np.abs(outs[a] - outs[b]).max()) for a, b in pairs)}


def _backends(answer, facts):
    exact, largest = {frozenset(p) for p in facts["exact_pairs"]}, facts["largest_difference"]
    pairs = items_of(answer, "exact_pairs", 16)
    if not all(isinstance(p, (list, tuple, set, frozenset)) and len(p) <= 4 for p in pairs):
        raise Wrong(_("'exact_pairs' is a list of pairs such as [('neon', 'scalar')] (or [] if none)"))
    got = {frozenset(x if isinstance(x, str) else short(x) for x in p) for p in pairs}
    bad = sorted(sorted(p) for p in got if len(p) != 2 or not p <= set(BACKENDS))
    if bad:
        raise Wrong(_("{bad}: each pair names two different backends of {BACKENDS}").format(
                      bad=bad, BACKENDS=BACKENDS))
    if got - exact:
        raise Wrong(_("{p_got_exact} differ on this machine: compare with np.array_equal").format(
                      p_got_exact=sorted((sorted(p) for p in got - exact))))
    if exact - got:
        raise Wrong(_("{p_exact_got} agree bit for bit on this machine too").format(
                      p_exact_got=sorted((sorted(p) for p in exact - got))))
    d = field_of(answer, "largest_difference", float)
    if not (largest / 3 <= d <= largest * 3):
        raise Wrong(_("the largest |difference| between two backends is not {d:.1e}: it is within a factor 3 of "
                      "something else (print np.abs(a - b).max() for the three pairs)").format(d=d))
    return _("bit-identical pairs here: {p_exact}; the others differ by up to {largest:.1e}, float32 rounding "
             "(fused multiply-add, order of the sums)").format(
             p_exact=sorted((sorted(p) for p in exact)) or _('none'), largest=largest)


ex2 = Exercise(
    "backends", N_("exercise 2: three backends"),
    N_("Lesson 00's cache and query: which pairs of lk.attend(q, cache, 3, backend=b) for b in 'neon', 'scalar', "
       "'numpy' agree bit for bit on your machine, and what is the largest |difference| between any two of them "
       "(order of magnitude is enough)? Fields: exact_pairs is a list of tuples of two backend names, like "
       "[('numpy', 'scalar')], or [] if none; largest_difference is a number, like 1e-3."),
    facts=_backends_facts, template={"exact_pairs": ..., "largest_difference": ...}, check=_backends,
    solution=lambda f: {**f, "largest_difference": float(f"{f['largest_difference']:.2g}")},
    hint=N_("np.array_equal(a, b) for each of the 3 pairs; np.abs(a - b).max() for the size. The numpy backend "
            "sums the softmax in float64, the C ones in float32; SIMDe may fuse multiply and add."))

GUARD_CHOICES = {
    "a": Choice(N_("iq = 127/0 = inf, and 0 * inf = NaN: C's cast of NaN to int is undefined"),
                N_("right: IEEE float division by zero gives inf, 0 * inf gives NaN, and C leaves the cast of NaN "
                   "to int undefined (x86 gives INT_MIN, AArch64 gives 0)")),
    "b": Choice(N_("nothing: every value is 0, so every code is 0 with or without the guard"),
                N_("no: 0 * 127/0 is not 0 but NaN in IEEE arithmetic; the guard is what makes the codes 0")),
    "c": Choice(N_("the program stops at once: dividing by zero raises the signal SIGFPE"),
                N_("no: float division by zero does not trap by default; it returns inf (only integer division "
                   "traps)")),
    "d": Choice(N_("qsc[0] = 0, so the block adds 0 to every score, which is harmless"),
                N_("no: qsc[b] = 0 would be harmless, but the codes are computed with iq = 127/qm = inf first")),
}


def _guard_facts():
    with np.errstate(divide="ignore", invalid="ignore"):
        nan = bool(np.isnan(np.float32(0) * (np.float32(127) / np.float32(0))))
    q = lesson00_data()[2].copy()
    q[:32] = 0
    codes, scales = kernel_q_codes(q)
    return {"qsc0": float(scales[0]), "zeros": bool((codes[:32] == 0).all()), "without_guard": "a" if nan else "b"}


ex3 = Exercise(
    "silent_block", N_("exercise 3: a silent block"),
    N_("The kernel's first step (segment 1) cuts q into blocks of 32 values. For each block it takes qm = "
       "max|q_i|, stores the block scale qsc = qm / 127, and multiplies every value by iq = 127 / qm. The line `if "
       "(qm < 1e-6f) qm = 1.0f;` (the guard) runs before that. Set q[:32] = 0 in lesson 00's query. (1) What "
       "qsc[0] does the kernel store? The traced build records it: run `_, tr = lk.attend(q, cache, 3, "
       "trace=True)` and read tr.q_scales[0]. (2) Without the guard, what would happen in that block? Fields: qsc0 "
       "is a number; without_guard is a letter."),
    facts=_guard_facts,
    fields={"qsc0": Field(float, N_("the kernel's qsc[0] for the zero block is not {got!r}: read it from "
                                    "lk.attend(q, cache, kh, trace=True)[1].q_scales[0] (the guard sets qm to 1)"),
                          rtol=1e-4),  # 0.007874, as printed with six decimals, is 2e-6 off 1/127; a wrong qm far more
            "without_guard": Field(GUARD_CHOICES)},
    correct=N_("qsc[0] = 1/127 = {qsc0:.6f}, codes all 0: {zeros}. {why}"),
    hint=N_("trace.q_scales[0]; for the second part, do the float32 arithmetic of segment 1 with qm = 0 in numpy "
            "(np.float32(127) / np.float32(0), then times 0)."))

register(__name__, [ex1, ex2, ex3])
