"""llama.cpp's own CPU flash attention, measured: ``ggml_flash_attn_ext`` of ggml (the library under
llama.cpp) through the ``ggml-python`` bindings (``pip install -e '.[bench]'``), for ``make bench``.

One graph: F32 query rows ``[G, head_dim]`` (G query heads sharing one kv head: GQA) over K and V
of that kv head in ggml's q8_0 (blocks of 32 int8 values with one fp16 scale each; the workbook's
cache has one fp32 scale per (token, head) row of head_dim values). The float K and V are quantized
by ggml itself (``ggml_quantize_chunk``), so the bench gives ggml the same data as the kernel and
times the same attention at the same shape, each in its own format. On the CPU, ggml converts the
query rows to q8_0 too (the ``vec_dot_type`` of q8_0), takes K.q with its q8_0 dot product, converts
each V row to fp32 and accumulates it; a decode with a q8_0 cache is parallelized over query rows
(heads), not over the tokens (its split over the tokens is for f32/f16 K/V): see docs/references.md.

The graph and its work buffer are built once; ``compute()`` runs ``ggml_graph_compute`` only, which is
what the bench times. Inputs are checked in Python before ggml sees them (ggml aborts the process on a
failed assertion)."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from . import validate as check
from .language import tr

INSTALL_HINT = "pip install -e '.[bench]'"
QK8_0 = 32                 # values per q8_0 block (ggml-common.h, block_q8_0)
MAX_TOKENS = 1 << 20       # as lessonkit.bench.MAX_LENGTH
MAX_HEADS = 64
MAX_HEAD_DIM = 512
MAX_THREADS = 64
_CONTEXT_SLACK = 1 << 20   # tensor and graph headers, alignment: far above what one graph needs


def load():
    """The ggml module, or None with the reason (a string) when ggml-python is not installed."""
    try:
        import ggml  # noqa: F401  (ggml-python)
    except ImportError as e:  # the optional [bench] extra
        return None, tr(f"skipped: {INSTALL_HINT} ({e})", f"已跳过：需要 {INSTALL_HINT}（{e}）")
    return ggml, None


def version() -> str:
    """'ggml-python X (ggml A.B.C)' of the installed package, '' when missing."""
    ggml, _ = load()
    if ggml is None:
        return ""
    from importlib import metadata
    try:
        pkg = metadata.version("ggml_python")
    except metadata.PackageNotFoundError:
        pkg = getattr(ggml, "__version__", "?")
    return f"ggml-python {pkg}"


class FlashAttnQ8:
    """``ggml_flash_attn_ext`` of ``qs [G, head_dim]`` (float32) over ``K, V [T, head_dim]`` (float,
    quantized here to q8_0 by ggml), scale ``scale`` (default 1/sqrt(head_dim)), on ``n_threads``
    threads: one graph, one plan (and work buffer) per thread count of ``threads``. Use as a context
    manager or call ``close()``; ``compute(n_threads)`` then ``output()``."""

    def __init__(self, qs, K, V, scale: float | None = None, threads=(1,)):
        ggml, why = load()
        if ggml is None:
            raise ImportError(why)
        qs = np.asarray(qs)
        if qs.ndim == 1:
            qs = qs[None]
        if qs.ndim != 2:
            raise ValueError(tr(f"qs must have shape [G, head_dim] or [head_dim]; got {list(qs.shape)}",
                                f"qs 的形状必须是 [G, head_dim] 或 [head_dim]；实际是 {list(qs.shape)}"))
        G, hd = qs.shape
        check.at_most("G (query heads)", G, MAX_HEADS, tr("query heads of one ggml graph", "一个 ggml 计算图的查询头数"))
        check.at_most("head_dim", hd, MAX_HEAD_DIM, tr("head_dim of one ggml graph", "一个 ggml 计算图的 head_dim"))
        if hd < QK8_0 or hd % QK8_0:
            raise ValueError(tr(f"head_dim must be a multiple of {QK8_0} (ggml's q8_0 block); got {hd}",
                                f"head_dim 必须是 {QK8_0} 的倍数（ggml 的 q8_0 块）；实际是 {hd}"))
        K = np.ascontiguousarray(K, dtype=np.float32)
        V = np.ascontiguousarray(V, dtype=np.float32)
        if K.ndim != 2 or K.shape[1] != hd or V.shape != K.shape:
            raise ValueError(tr(f"K and V must both have shape [seq_len, {hd}]; got {list(K.shape)} and {list(V.shape)}",
                                f"K 和 V 的形状都必须是 [seq_len, {hd}]；实际是 {list(K.shape)} 和 {list(V.shape)}"))
        T = K.shape[0]
        if T < 1:
            raise ValueError(tr("seq_len must be at least 1", "seq_len 至少是 1"))
        check.at_most("seq_len", T, MAX_TOKENS, tr("tokens of one ggml graph", "一个 ggml 计算图的 token 数"))
        qs = np.ascontiguousarray(qs, dtype=np.float32)
        for name, a in (("qs", qs), ("K", K), ("V", V)):
            if not np.isfinite(a).all():
                raise ValueError(tr(f"{name} must be finite (ggml's quantizer and exp do not check)",
                                    f"{name} 必须是有限值（ggml 的量化和 exp 不做检查）"))
        if isinstance(threads, (int, np.integer)):
            threads = (threads,)
        self.threads = tuple(check.integer("n_threads", n, minimum=1) for n in threads)
        if not self.threads:
            raise ValueError(tr("threads must name at least one thread count", "threads 至少要给出一个线程数"))
        for n in self.threads:
            check.at_most("n_threads", n, min(MAX_THREADS, os.cpu_count() or 1), tr("threads of this machine", "本机的线程数"))
        self.scale = float(1 / np.sqrt(hd) if scale is None else scale)
        if not np.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(tr(f"scale must be a positive finite number; got {scale!r}",
                                f"scale 必须是一个有限的正数；实际是 {scale!r}"))
        self.G, self.head_dim, self.seq_len = G, hd, T
        self._g = ggml
        q8 = ggml.GGML_TYPE_Q8_0
        kv_bytes = ggml.ggml_row_size(q8, hd) * T
        mem = 2 * kv_bytes + 2 * G * hd * 4 + 8 * ggml.ggml_tensor_overhead() + ggml.ggml_graph_overhead() + _CONTEXT_SLACK
        self._ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
        if not self._ctx:
            raise MemoryError(f"ggml_init could not allocate {mem} bytes")
        try:
            self._build(qs, K, V)
        except BaseException:
            self.close()
            raise

    def _build(self, qs, K, V):
        g, ctx, hd, T, G = self._g, self._ctx, self.head_dim, self.seq_len, self.G
        # ggml's shapes, innermost first: q [hd, n_batch=1, n_head=G, 1], k and v [hd, T, n_head_kv=1, 1]
        self._q = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, hd, 1, G, 1)
        self._k = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_Q8_0, hd, T, 1, 1)
        self._v = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_Q8_0, hd, T, 1, 1)
        ctypes.memmove(g.ggml_get_data(self._q), qs.ctypes.data, qs.nbytes)
        fp = ctypes.POINTER(ctypes.c_float)
        for t, x in ((self._k, K), (self._v, V)):
            g.ggml_quantize_chunk(g.GGML_TYPE_Q8_0, x.ctypes.data_as(fp), g.ggml_get_data(t), 0, T, hd, None)
        # no mask (every token is attended), no ALiBi (max_bias 0), no logit softcap (0)
        self._out = g.ggml_flash_attn_ext(ctx, self._q, self._k, self._v, None, self.scale, 0.0, 0.0)
        self._graph = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(self._graph, self._out)
        self._plans, self._work = {}, []
        for n in self.threads:
            plan = g.ggml_graph_plan(self._graph, n, None)
            # the work buffer lives as long as the object: ggml keeps only its address
            work = np.zeros(max(int(plan.work_size), 1), np.uint8)
            plan.work_data = ctypes.cast(work.ctypes.data, ctypes.POINTER(ctypes.c_uint8))
            self._plans[n] = plan
            self._work.append(work)

    def compute(self, n_threads: int | None = None) -> None:
        """One ``ggml_graph_compute`` of the graph built once, on ``n_threads`` (one of ``threads``;
        default the first): what the bench times."""
        if self._ctx is None:
            raise RuntimeError(tr("this FlashAttnQ8 is closed", "这个 FlashAttnQ8 已经关闭"))
        n = self.threads[0] if n_threads is None else n_threads
        if n not in self._plans:
            raise ValueError(tr(f"n_threads must be one of {self.threads} (the plans built); got {check.short(n)}",
                                f"n_threads 必须是 {self.threads} 之一（已建好的计划）；实际是 {check.short(n)}"))
        status = self._g.ggml_graph_compute(self._graph, ctypes.byref(self._plans[n]))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned status {status}")

    def output(self) -> np.ndarray:
        """The last compute's result, float32 ``[G, head_dim]`` (a copy)."""
        if self._ctx is None:
            raise RuntimeError(tr("this FlashAttnQ8 is closed", "这个 FlashAttnQ8 已经关闭"))
        # ggml's result is [hd, n_head, n_batch, 1]: for one query row, head after head
        ptr = ctypes.cast(self._g.ggml_get_data(self._out), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(self.G, self.head_dim)).copy()

    def close(self) -> None:
        if getattr(self, "_ctx", None) is not None:
            self._g.ggml_free(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def attend(qs, K, V, scale: float | None = None, n_threads: int = 1) -> np.ndarray:
    """One ggml flash attention, float32 ``[G, head_dim]`` (``[head_dim]`` for a 1-D ``qs``)."""
    one = np.ndim(qs) == 1
    with FlashAttnQ8(qs, K, V, scale, (n_threads,)) as fa:
        fa.compute()
        out = fa.output()
    return out[0] if one else out


# The check before timing: ggml's output against the float64 reference (lessonkit.reference) over
# the inputs as ggml's q8_0 stores them (lessonkit.precision's q8_0 mirrors ggml's reference
# quantizer: blocks of 32, fp16 scale, roundf), q included (ggml converts it to q8_0 too). What is
# left is ggml's float32 arithmetic: 1.7e-6 of max|out| measured at 3K tokens; float32 sums over
# 256K tokens can grow that by sqrt(T) ~ 10x more, so 2e-4 leaves room, and a wrong layout (the
# wrong head, V transposed, no scale) is off by the order of max|out| itself.
CHECK_RTOL = 2e-4


def expected(qs, K, V, scale: float | None = None) -> np.ndarray:
    """float64 attention of q8_0-rounded ``qs [G, hd]`` over q8_0-rounded K, V: what ggml computes."""
    from . import precision, reference
    qs = np.atleast_2d(np.asarray(qs, np.float32))
    Kd, Vd = precision.dequantized(np.asarray(K, np.float32), "q8_0"), precision.dequantized(np.asarray(V, np.float32), "q8_0")
    Qd = precision.dequantized(qs, "q8_0")
    return np.stack([reference.attention(q, Kd, Vd, scale) for q in Qd])


def check_output(got, want, what: str = "ggml_flash_attn_ext") -> float:
    """max |got - want| / max |want|; raises AssertionError above CHECK_RTOL."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise AssertionError(tr(f"{what}: shape {list(got.shape)}, expected {list(want.shape)}",
                                f"{what}：形状是 {list(got.shape)}，应为 {list(want.shape)}"))
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    if not err <= CHECK_RTOL:  # NaN fails too
        raise AssertionError(tr(f"{what}: max error {err:.2e} of max|out| is above {CHECK_RTOL:g}",
                                f"{what}：最大误差为 max|out| 的 {err:.2e}，超过了 {CHECK_RTOL:g}"))
    return err
