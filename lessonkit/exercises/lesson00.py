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
        raise Wrong(_("your list leaves out arguments that changed ({n} of them): compare cache.kernel_args(kh, ffi) "
                      "of two caches").format(n=len(changed - names)))
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
    fields={"bit_identical": Field(bool, N_("run it rather than guess: compare the bytes (out.tobytes()) of the "
                                            "outputs with block sizes 1, 7 and 1000 with those of the block_size-64 "
                                            "output, on this machine"))},
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
        raise Wrong(_("your list leaves out pairs that agree bit for bit on this machine: compare each of the 3 "
                      "pairs with np.array_equal"))
    d = field_of(answer, "largest_difference", float)
    if not (largest / 3 <= d <= largest * 3):
        raise Wrong(_("the largest |difference| between two backends is {larger_smaller} than {d:.1e}, by more "
                      "than a factor of 3 (print np.abs(a - b).max() for each of the three pairs)").format(
                      d=d, larger_smaller=_("larger") if largest > d else _("smaller")))
    return _("bit-identical pairs here: {p_exact}; the others differ by up to {largest:.1e}, float32 rounding "
             "(fused multiply-add, order of the sums)").format(
             p_exact=sorted((sorted(p) for p in exact)) or _('none'), largest=largest)


ex2 = Exercise(
    "backends", N_("exercise 2: three backends"),
    N_("Lesson 00's cache and query: which pairs of lk.attend(q, cache, 3, backend=b) for b in 'neon', 'scalar', "
       "'numpy' agree bit for bit on your machine, and what is the largest |difference| between any two of them "
       "(within a factor of 3 is enough)? Fields: exact_pairs is a list of tuples of two backend names, like "
       "[('numpy', 'scalar')], or [] if none; largest_difference is a number, like 1e-3."),
    facts=_backends_facts, template={"exact_pairs": ..., "largest_difference": ...}, check=_backends,
    solution=lambda f: {**f, "largest_difference": float(f"{f['largest_difference']:.2g}")},
    hint=N_("np.array_equal(a, b) for each of the 3 pairs; np.abs(a - b).max() for the size. The numpy backend "
            "sums the softmax in float64, the C ones in float32; the two C kernels can differ in their exp (see exp= "
            "in the simd paths line of section 1) and where a multiply and an add are fused into one rounding."))

GUARD_CHOICES = {
    "a": Choice(N_("iq = 127/0 = inf, and 0 * inf = NaN: C's cast of NaN to int is undefined behaviour"),
                N_("right: IEEE float division by zero gives inf, 0 * inf gives NaN, and casting NaN to int is "
                   "undefined behaviour in C (x86's conversion gives INT_MIN, AArch64's gives 0, and the compiler "
                   "may assume the case never happens)")),
    "b": Choice(N_("nothing: every value is 0, so every code is 0 with or without the guard"),
                N_("no: 0 * 127/0 is not 0 but NaN in IEEE arithmetic; the guard is what makes the codes 0")),
    "c": Choice(N_("the program stops at once: dividing by zero raises the signal SIGFPE"),
                N_("no: float division by zero does not trap by default; it returns inf (only integer division "
                   "traps)")),
    "d": Choice(N_("qsc[0] = 0, so the block adds 0 to every score, which is harmless"),
                N_("no: the block's dot would indeed be multiplied by qsc[0] = 0, but its codes come first, from "
                   "NaN (iq = 127/0 = inf, 0 * inf = NaN), and casting NaN to int is undefined behaviour in C: "
                   "nothing about the program is guaranteed any more, even where the zero scale hides the codes")),
}


def _guard_facts():
    with np.errstate(divide="ignore", invalid="ignore"):
        nan = bool(np.isnan(np.float32(0) * (np.float32(127) / np.float32(0))))
    q0 = lesson00_data()[2].copy()   # the question's q0: lesson 00's query, first block zeroed
    q0[:32] = 0
    codes, scales = kernel_q_codes(q0)
    return {"qsc0": float(scales[0]), "zeros": bool((codes[:32] == 0).all()), "without_guard": "a" if nan else "b"}


ex3 = Exercise(
    "silent_block", N_("exercise 3: a silent block"),
    N_("The kernel's first step (segment 1) cuts q into blocks of 32 values. For each block it takes qm = "
       "max|q_i|, stores the block scale qsc = qm / 127, and multiplies every value by iq = 127 / qm. The line `if "
       "(qm < 1e-6f) qm = 1.0f;` (the guard) runs before that. Take a copy of lesson 00's query with its first "
       "block zeroed, `q0 = q.copy(); q0[:32] = 0` (q itself stays as it is, for the cells above). (1) What "
       "qsc[0] does the kernel store for q0? The traced build records it: run `_, tr = lk.attend(q0, cache, 3, "
       "trace=True)` and read tr.q_scales[0]. (2) Without the guard, what would happen in that block? Fields: qsc0 "
       "is a number; without_guard is a letter."),
    facts=_guard_facts,
    fields={"qsc0": Field(float, N_("the kernel's qsc[0] for the zero block is not {got!r}: read it from "
                                    "lk.attend(q0, cache, 3, trace=True)[1].q_scales[0], or work it out from the "
                                    "guard's line and qsc = qm / 127"),
                          rtol=1e-2),  # 0.0079 (1/127 to two digits) is 3e-3 off; a wrong qm (0, 1e-6/127, 1) far more
            "without_guard": Field(GUARD_CHOICES)},
    correct=N_("qsc[0] = 1/127 = {qsc0:.6f}, codes all 0: {zeros}. {why}"),
    hint=N_("trace.q_scales[0]; for the second part, do the float32 arithmetic of segment 1 with qm = 0 in numpy "
            "(np.float32(127) / np.float32(0), then times 0)."))

register(__name__, [ex1, ex2, ex3])
