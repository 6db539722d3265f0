"""The exercises of lesson 02."""
from __future__ import annotations

import functools

import numpy as np

from ..lessons import rescales, softmax
from ..display import source
from ..core.attention import attend
from ..core.language import N_, _
from ..lessons.synthetic import cache_with_scores
from .core import Exercise, Field, Wrong, field_of, register

ORDERS = {"ascending": "increasing", "rising": "increasing", "sorted": "increasing", "increasing": "increasing",
          "descending": "decreasing", "falling": "decreasing", "decreasing": "decreasing", "random": "random",
          "shuffled": "random"}


@functools.lru_cache(maxsize=None)
def _worst_facts():
    n = 256
    orders = {"increasing": np.arange(n, dtype=np.float32), "decreasing": np.arange(n, dtype=np.float32)[::-1],
              "random": np.random.default_rng(0).permutation(n).astype(np.float32)}
    counts = {k: rescales.count_rescales(v) for k, v in orders.items()}
    # the multiplies of segment 3's rescale branch, read from the source: S *= ms, and the vmulq_f32
    # loop over VKQ (hd = 128 lanes)
    seg = source.kernel_segments()[3]
    lines = source.KERNEL_FILE.read_text().splitlines()[seg.begin - 1:seg.end]
    mult = sum(1 for l in lines if "*=" in l and "ms" in l) + (128 if any("vmulq_f32" in l and "msv" in l
                                                                          for l in lines) else 0)
    return {"order": next(k for k, c in counts.items() if c == n), "counts": counts, "extra_multiplies": mult,
            "extra_expf": 0}


ex1 = Exercise(
    "worst_case", N_("exercise 1: the worst case and its price"),
    N_("Which order of scores ('increasing', 'decreasing', 'random') makes the kernel rescale at every token? For "
       "hd = 128, how many scalar float multiplies (count each lane of a vector multiply) and how many expf calls "
       "does a rescaling token cost on top of a token that does not raise M?"),
    facts=_worst_facts,
    fields={"order": Field(ORDERS, lambda got, counts, **unused: _("{got} scores rescale at {counts_got} of 256 tokens "
            "in the kernel's trace, not at every token").format(got=got, counts_got=counts[got])),
            "extra_multiplies": Field(int, N_("not {got} extra multiplies for hd = 128: count S *= ms and the "
                                              "multiplies of the loop over VKQ")),
            "extra_expf": Field(int, N_("not {got} extra expf: the rescale branch calls expf(M - s) once, the "
                                        "other branch expf(s - M) once"))},
    correct=N_("{order} scores rescale at every token; each rescale costs {extra_multiplies} extra multiplies and "
               "no extra expf"),
    hint=N_("rescales.count_rescales(np.arange(256.0)); in segment 3 the if-branch has S *= ms and a loop of "
            "vmulq_f32 over hd values; both branches call expf once."))


def l02_descending(n: int = 64) -> np.ndarray:
    return (np.arange(n)[::-1] * 5.0).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _descending_facts():
    cache, q, scale = cache_with_scores(l02_descending(), head_dim=128, block_size=16, seed=3)
    out, trace = attend(q, cache, 0, scale=scale, trace=True)
    w = softmax.kernel_exp((trace.s - trace.M).astype(np.float32))   # the exp this build's kernel calls
    ref = softmax.three_pass(trace.s, cache.dequantized(0)[1])
    return {"rescales": trace.n_rescales, "first_zero_weight_token": int(np.flatnonzero(w == 0)[0]),
            "output_correct": bool(np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()),
            "exp_name": softmax.kernel_exp_name()}


ex2 = Exercise(
    "descending", N_("exercise 2: sorted descending"),
    N_("Scores exercises.l02_descending() = np.arange(64)[::-1] * 5.0, in a cache_with_scores(..., head_dim=128). "
       "How many rescales? From which token on is the kernel's weight expf(s - M) exactly 0? (The kernel's build "
       "decides: an x86 build with FMA and SSE4.1 calls the inline expf of native/q8_simd.h, others (every ARM "
       "build) libm's expf; "
       "softmax.kernel_exp_name() says which, softmax.kernel_exp(...) computes it, for an array of float32.) Is the kernel's output still "
       "correct (within 1e-5 of max|out| of softmax.three_pass on the trace's scores)?"),
    facts=_descending_facts,
    fields={"rescales": Field(int, lambda got, want, **unused: _("the kernel's trace counts {want_got} than {got} "
            "rescales").format(want_got=_('more') if want > got else _('fewer'), got=got)),
            "first_zero_weight_token": Field(int, lambda got, want, exp_name, **unused: _("token {got} is too "
                    "{got_want}: find the first t where softmax.kernel_exp(s_t - M) is exactly 0 (the exp of this "
                    "build: {exp_name})").format(
                    got=got, got_want=_('early') if got < want else _('late'), exp_name=exp_name)),
            "output_correct": Field(bool, N_("compare the kernel's output with softmax.three_pass(trace.s, V) again"))},
    correct=lambda rescales, first_zero_weight_token, output_correct, **unused: _("{rescales} rescale (the first "
            "token), weights underflow to 0 from token {first_zero_weight_token} on, and the output "
            "{output_correct} the three-pass softmax: those weights are negligible anyway").format(
            rescales=rescales, first_zero_weight_token=first_zero_weight_token,
            output_correct=_('still matches') if output_correct else _('does not match')),
    hint=N_("M stays at the first score; s_t - M = -5 t. The inline expf of q8_simd.h returns 0 below -87; libm's "
            "expf underflows to 0 only below about -103.97."))


@functools.lru_cache(maxsize=None)
def _invariant_facts():
    s = rescales.realistic_scores(300, seed=9, sink=2.0)   # 6 rescales: M moves several times
    cache, q, scale = cache_with_scores(s, head_dim=32, block_size=16, seed=1)
    unused, trace = attend(q, cache, 0, scale=scale, trace=True)
    return {"trace": trace, "V": cache.dequantized(0)[1], "invariant": invariant_reference}


def invariant_reference(s, M, V):
    """The invariant written out (the right answer of lesson 02 exercise 3), float64:
    S_t = sum_{j<=t} exp(s_j - M_t), VKQ_t = sum_{j<=t} exp(s_j - M_t) v_j."""
    s, M, V = (np.asarray(x, np.float64) for x in (s, M, V))
    E = np.where(np.tri(len(s), dtype=bool), np.exp(np.minimum(s[None, :] - M[:, None], 0.0)), 0.0)   # j <= t
    return E.sum(axis=1), E @ V


def _invariant(answer, facts):
    fn, trace, V = field_of(answer, "invariant"), facts["trace"], facts["V"]
    if not callable(fn):
        raise Wrong(_("'invariant' is a function f(s, M, V) -> (S, VKQ), S [T], VKQ [T, hd]"))
    try:
        S, VKQ = fn(trace.s.copy(), trace.M.copy(), V.copy())
        S, VKQ = np.asarray(S, np.float64), np.asarray(VKQ, np.float64)
    except Exception as e:  # noqa: BLE001 - any error of the student's function is the verdict
        raise Wrong(_("your function raised {e}: {e2}").format(e=type(e).__name__, e2=e)) from None
    if S.shape != trace.S.shape or VKQ.shape != trace.vkq.shape:
        raise Wrong(_("shapes: S must be {shape} and VKQ {shape2}; got {shape3} and {shape4}").format(
                      shape=trace.S.shape, shape2=trace.vkq.shape, shape3=S.shape, shape4=VKQ.shape))
    dS = np.abs(S - trace.S) / trace.S
    if not dS.max() <= 1e-4:
        t = int(np.argmax(~(dS <= 1e-4)))
        raise Wrong(_("S_t differs from the kernel's trace.S from token {t} on (relative {ds_t:.1e}): is every "
                      "exponent relative to M_t, the max after token t?").format(t=t, ds_t=dS[t]))
    dV = np.abs(VKQ - trace.vkq).max(axis=1) / np.abs(trace.vkq).max(axis=1)
    if not dV.max() <= 1e-4:
        t = int(np.argmax(~(dV <= 1e-4)))
        raise Wrong(_("S is right, VKQ_t differs from trace.vkq from token {t} on (relative {dv_t:.1e})").format(
                      t=t, dv_t=dV[t]))
    return _("S_t and VKQ_t follow the invariant at all {s} tokens of the kernel's trace (largest relative gap "
             "{ds_dv:.1e}, float32 rounding)").format(s=len(S), ds_dv=max(dS.max(), dV.max()))


ex3 = Exercise(
    "invariant", N_("exercise 3: the invariant"),
    N_("Section 1.3 says what the running state holds after token t. Write it as a function f(s, M, V) -> (S, "
       "VKQ) that computes the state after every token directly from the scores s, the running max M (M[t] is M "
       "after token t) and V, without replaying the kernel's loop: S has one value per token, VKQ one row of hd "
       "values per token. The check feeds it the kernel's trace of a realistic sequence (s = trace.s, M = "
       "trace.M, V dequantized) and compares with the kernel's own trace.S and trace.vkq, token by token."),
    facts=_invariant_facts, template={"invariant": ...}, check=_invariant,
    hint=N_("For token t: which tokens j are in its sums, and which max is each exponent taken against, M after "
            "token t or the final one? An array indexed [t, j] that is zero where j > t holds every t at once."),
    explain=N_("lessonkit.exercises.invariant_reference is one way to write it."))

register(__name__, [ex1, ex2, ex3])
