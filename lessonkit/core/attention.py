"""Every call of a compiled attention kernel over a KVCacheQ8, written once.

``attend`` (lesson 00): one query head through flash_attn_single_q_q8_neon, its scalar reference or
article section 3's two-pass variants; ``attend_group`` and ``time_group`` (lesson 08): GQA in one
scan. Under grouped-query attention G query heads share one kv head (Qwen3-8B: 32 query heads over 8
kv heads, G = 4); the engine runs one kernel call per query head, so each of the G calls reads the
kv head's whole KV again, while ``flash_attn_group_q8_neon`` (native/flash_attn_q8_group.c) reads
each K and V row once for all G query heads, each keeping its own M, S and VKQ. Split-KV is in
``lessonkit.kernels.split``.

The public functions check their arguments before any call into C; ``kernel_inputs`` turns the
checked (q, cache, kv_head) into the pointers and sizes every kernel takes."""
from __future__ import annotations

import numpy as np

from . import env, header, native
from . import validate as check
from .cache import KVCacheQ8, attention_args, attention_call
from .header import GQA_MAX
from .language import _
from .reference import kernel_math
from .timing import median_calls
from .trace import Trace  # the traced call, without the checks attend has made
from .trace import traced as _traced
from .variants import VARIANTS

# backend name -> the C function it calls ("numpy" is computed in numpy): the registry's entries
# (native/fa_variants.h) whose function flash_attn_q8.h declares, i.e. those cffi can call by name.
# The other numbered versions are timed through the registry (lessonkit.timing.time_kernel).
_DECLARED = header.declared()
KERNELS = {v.name: v.function for v in VARIANTS if v.function in _DECLARED}
BACKENDS = (*KERNELS, "numpy")
# fa_time_group_calls: per_head runs the article kernel G times, per_head_fast the fast one,
# group_lowp the grouped kernel with lowp's accumulation
GROUP_VARIANTS = {"group": 0, "per_head": 1, "per_head_fast": 2, "group_lowp": 3}
# attend_group's backends: the exact grouped kernel (the default) and lowp's (lesson 09)
GROUP_BACKENDS = {"neon": "flash_attn_group_q8_neon", "lowp": "flash_attn_group_q8_lowp"}


def kernel_inputs(ffi, q: np.ndarray, cache: KVCacheQ8, kv_head: int, lib=None) -> tuple:
    """(q's buffer, k_cache_q8, v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv, kh_off): the
    arguments after the output that every attention kernel takes, for an already checked q (one
    query float32 ``[hd]`` or a group ``[G, hd]``) over kv head ``kv_head`` of ``cache``, for a call
    of ``lib`` (checked on a cache this long first: ``KVCacheQ8.kernel_args``)."""
    return (ffi.from_buffer("float[]", q), *cache.kernel_args(kv_head, ffi, lib))


def out_buffer(ffi, out: np.ndarray):
    """The cffi view of a writable float32 output array."""
    return ffi.from_buffer("float[]", out, require_writable=True)


def call_kernel(ffi, lib, out: np.ndarray, q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float,
                name: str = KERNELS["neon"], seq_len: int | None = None) -> np.ndarray:
    """One call of the single-query kernel ``name`` of ``lib`` (the workbook's library, or a build
    of an edited copy), writing ``out``; arguments already checked. ``seq_len`` (default the
    cache's) lets a caller read only the first tokens. Returns ``out``."""
    qbuf, k, v, ks, vs, n_tokens, *layout = kernel_inputs(ffi, q, cache, kv_head, lib)
    getattr(lib, name)(out_buffer(ffi, out), qbuf, k, v, ks, vs, n_tokens if seq_len is None else seq_len,
                       *layout, cache.head_dim, scale)
    return out


def attend(q: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None,
           backend: str = "neon", trace: bool = False) -> np.ndarray | tuple[np.ndarray, Trace]:
    """Attention output float32 ``[head_dim]`` of query ``q`` (float32 ``[head_dim]``) over
    kv head ``kv_head`` of ``cache``.

    backend: "neon" calls flash_attn_single_q_q8_neon, the article's kernel (SIMDe's NEON off ARM),
    "scalar" the plain C reference, "numpy" the same quantized math written in numpy;
    "two_pass_scores" and "two_pass_recompute" the article's section-3 alternatives (lesson 05);
    "fast" flash_attn_single_q_q8_fast, the fastest numbered version (lesson 09); "lowp" version 14,
    v10 (prefetch) with V accumulated by int8 dot products (weights as 14-bit codes per 16 tokens: NOT
    the article's fp32 weights; lessonkit.lowp_error measures its error); ``KERNELS`` lists them all.
    scale defaults to 1/sqrt(head_dim).
    trace=True (backend "neon" only) runs the traced build of the same kernel and returns
    ``(out, lessonkit.trace.Trace)``: Q's codes, the block dots, and s, M, S, VKQ after every token."""
    q, kv_head, scale = attention_args(q, cache, kv_head, scale)
    check.one_of("backend", backend, BACKENDS)
    out = np.empty(cache.head_dim, np.float32)
    if check.flag("trace", trace):
        if backend != "neon":
            raise ValueError(_("trace=True records the compiled kernel: use backend='neon', not {backend!r}").format(
                               backend=backend))
        return out, _traced(out, q, cache, kv_head, scale)
    if backend == "numpy":
        return kernel_math(q, cache, kv_head, scale)
    return call_kernel(*native.load(), out, q, cache, kv_head, scale, KERNELS[backend])



# ----------------------------------------------------------------------------- GQA in one scan

def group_queries(qs, cache: KVCacheQ8) -> np.ndarray:
    """qs checked as the G query heads of one grouped call: float32 ``[G, head_dim]``, 1 <= G <= GQA_MAX."""
    if isinstance(qs, np.ndarray) and qs.ndim != 2:
        raise ValueError(_("qs must have shape [G, {head_dim}] (one row per query head of the group); got "
                           "{shape_qs}").format(head_dim=cache.head_dim, shape_qs=list(qs.shape)))
    qs = check.float32_array("qs", qs, (None, cache.head_dim))
    if not 1 <= qs.shape[0] <= GQA_MAX:
        raise ValueError(_("qs must hold between 1 and {GQA_MAX} query heads (G, its first dimension); got G = "
                           "{shape_qs}").format(GQA_MAX=GQA_MAX, shape_qs=qs.shape[0]))
    return qs


def attend_group(qs: np.ndarray, cache: KVCacheQ8, kv_head: int, scale: float | None = None,
                 backend: str = "neon") -> np.ndarray:
    """Attention outputs float32 ``[G, head_dim]`` of the G query heads ``qs`` (float32
    ``[G, head_dim]``, 1 <= G <= 8) that share kv head ``kv_head``, in one call of
    flash_attn_group_q8_neon: each K and V row is read once for all G. Row g equals
    ``lk.attend(qs[g], cache, kv_head)`` up to float rounding.
    backend="lowp" calls flash_attn_group_q8_lowp instead, the same scan with lowp's accumulation
    (lesson 09): row g equals ``lk.attend(qs[g], cache, kv_head, backend="lowp")``."""
    check.one_of("backend", backend, GROUP_BACKENDS)
    kv_head, scale = attention_call(cache, kv_head, scale)
    qs = group_queries(qs, cache)
    ffi, lib = native.load()
    out = np.empty(qs.shape, np.float32)
    getattr(lib, GROUP_BACKENDS[backend])(out_buffer(ffi, out), *kernel_inputs(ffi, qs, cache, kv_head, lib),
                                          cache.head_dim, scale, qs.shape[0])
    return out


def time_group(qs: np.ndarray, cache: KVCacheQ8, kv_head: int = 0, variant: str = "group",
               repeats: int = 7, number: int | None = None, min_repeat_s: float = 0.02,
               scale: float | None = None, out: np.ndarray | None = None, cores: str | None = None) -> float:
    """Median ns for all G query heads of ``qs``: variant "group" one flash_attn_group_q8_neon call,
    "per_head" G calls of flash_attn_single_q_q8_neon (the engine's way), "per_head_fast" G calls of
    flash_attn_single_q_q8_fast (the fair peer of the grouped scan, built on the same steps), "group_lowp" one
    flash_attn_group_q8_lowp call (lesson 09's lowp accumulation). The call
    loop runs in C (native/fa_timing.c) with ``lessonkit.timing``'s caps, pinned to one core type
    (``cores``). ``out`` (float32 ``[G, head_dim]``, optional) receives what the timed calls computed."""
    kv_head, scale = attention_call(cache, kv_head, scale)
    qs = group_queries(qs, cache)
    check.one_of("variant", variant, GROUP_VARIANTS)
    out = np.empty(qs.shape, np.float32) if out is None else check.float32_array("out", out, qs.shape, writable=True)
    plan = env.timing_cores(cores)
    ffi, lib = native.load()
    args = (out_buffer(ffi, out), *kernel_inputs(ffi, qs, cache, kv_head, lib), cache.head_dim, scale, qs.shape[0])
    with env.pinned(plan):
        return median_calls(lambda n: lib.fa_time_group_calls(GROUP_VARIANTS[variant], n, *args), repeats,
                            number, min_repeat_s)
