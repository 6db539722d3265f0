"""llama.cpp's own CPU flash attention, measured for ``make bench``: ``ggml_flash_attn_ext`` of ggml
through the ggml-python bindings (``pip install -e '.[bench]'``).

One graph: F32 query rows ``[G, head_dim]`` (G query heads of one kv head) over that kv head's K
and V in ggml's q8_0 (32 int8 values and one fp16 scale a block; the workbook's cache has one fp32
scale per row), quantized by ggml itself, so ggml gets the kernel's data in its own format. ggml
converts the query rows to q8_0 too; a decode over a q8_0 cache is parallel over query heads, not
tokens (docs/references.md). The graph and its work buffers are built once; ``compute()`` runs
``ggml_graph_compute`` only. Inputs are checked here: ggml aborts the process on a failed assertion."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from lessonkit.core import validate as check
from lessonkit.core.language import _
from lessonkit.lessons.precision import QK8_0, dequantize_q8_0, quantize_q8_0

INSTALL_HINT = "pip install -e '.[bench]'"
MAX_TOKENS = 1 << 20       # as lessonkit.bench.MAX_LENGTH
MAX_HEADS, MAX_HEAD_DIM, MAX_THREADS = 64, 512, 64
_CONTEXT_SLACK = 1 << 20   # tensor and graph headers, alignment: far above what one graph needs
# ggml against float64 attention over its own q8_0 rounding of q, K, V: 1.7e-6 of max|out| measured
# at 3K tokens, float32 sums over 256K tokens can grow it ~10x; a wrong layout misses by ~max|out|
CHECK_RTOL = 2e-4


def load():
    """(the ggml module, None), or (None, why) without the optional ggml-python."""
    try:
        import ggml
    except ImportError as e:
        return None, _("skipped: {INSTALL_HINT} ({e})").format(INSTALL_HINT=INSTALL_HINT, e=e)
    return ggml, None


def version() -> str:
    """'ggml-python X' of the installed package, '' when missing."""
    ggml, unused = load()
    if ggml is None:
        return ""
    from importlib import metadata
    try:
        return f"ggml-python {metadata.version('ggml_python')}"
    except metadata.PackageNotFoundError:
        return f"ggml-python {getattr(ggml, '__version__', '?')}"


class FlashAttnQ8:
    """``ggml_flash_attn_ext`` of ``qs [G, head_dim]`` over float ``K, V [T, head_dim]`` (quantized
    to q8_0 by ggml), one plan per thread count of ``threads``; a context manager."""

    def __init__(self, qs, K, V, scale: float | None = None, threads=(1,)):
        ggml, why = load()
        if ggml is None:
            raise ImportError(why)
        qs = np.asarray(qs)
        qs = qs[None] if qs.ndim == 1 else qs
        if qs.ndim != 2:
            raise ValueError(_("qs must have shape [G, head_dim] or [head_dim]; got {shape_qs}").format(
                               shape_qs=list(qs.shape)))
        G, hd = qs.shape
        check.at_most("G (query heads)", G, MAX_HEADS, _("query heads of one ggml graph"))
        check.at_most("head_dim", hd, MAX_HEAD_DIM, _("head_dim of one ggml graph"))
        if hd < QK8_0 or hd % QK8_0:
            raise ValueError(_("head_dim must be a multiple of {QK8_0} (ggml's q8_0 block); got {hd}").format(
                               QK8_0=QK8_0, hd=hd))
        K, V = np.ascontiguousarray(K, dtype=np.float32), np.ascontiguousarray(V, dtype=np.float32)
        if K.ndim != 2 or K.shape[1] != hd or V.shape != K.shape:
            raise ValueError(_("K and V must both have shape [seq_len, {hd}]; got {shape_k} and {shape_v}").format(
                               hd=hd, shape_k=list(K.shape), shape_v=list(V.shape)))
        T = K.shape[0]
        if T < 1:
            raise ValueError(_("seq_len must be at least 1"))
        check.at_most("seq_len", T, MAX_TOKENS, _("tokens of one ggml graph"))
        qs = np.ascontiguousarray(qs, dtype=np.float32)
        for name, a in (("qs", qs), ("K", K), ("V", V)):
            if not np.isfinite(a).all():
                raise ValueError(_("{name} must be finite (ggml's quantizer and exp do not check)").format(
                                   name=name))
        threads = (threads,) if isinstance(threads, (int, np.integer)) else threads
        self.threads = tuple(check.integer("n_threads", n, minimum=1) for n in threads)
        if not self.threads:
            raise ValueError(_("threads must name at least one thread count"))
        for n in self.threads:
            check.at_most("n_threads", n, min(MAX_THREADS, os.cpu_count() or 1),
                          _("threads of this machine"))
        self.scale = float(1 / np.sqrt(hd) if scale is None else scale)
        if not np.isfinite(self.scale) or self.scale <= 0:
            raise ValueError(_("scale must be a positive finite number; got {scale!r}").format(scale=scale))
        self.G, self.head_dim, self.seq_len, self._g = G, hd, T, ggml
        mem = (2 * ggml.ggml_row_size(ggml.GGML_TYPE_Q8_0, hd) * T + 2 * G * hd * 4 + 8 * ggml.ggml_tensor_overhead()
               + ggml.ggml_graph_overhead() + _CONTEXT_SLACK)
        self._ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
        if not self._ctx:
            raise MemoryError(f"ggml_init could not allocate {mem} bytes")
        try:
            self._build(qs, K, V)
        except BaseException:
            self.close()
            raise

    def _build(self, qs, K, V):
        g, ctx, hd, T = self._g, self._ctx, self.head_dim, self.seq_len
        # ggml's shapes, innermost first: q [hd, 1, G, 1], k and v [hd, T, 1, 1]
        self._q = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, hd, 1, self.G, 1)
        ctypes.memmove(g.ggml_get_data(self._q), qs.ctypes.data, qs.nbytes)
        kv = []
        for x in (K, V):
            t = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_Q8_0, hd, T, 1, 1)
            g.ggml_quantize_chunk(g.GGML_TYPE_Q8_0, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                  g.ggml_get_data(t), 0, T, hd, None)
            kv.append(t)
        # no mask (every token is attended), no ALiBi (max_bias 0), no logit softcap (0)
        self._out = g.ggml_flash_attn_ext(ctx, self._q, *kv, None, self.scale, 0.0, 0.0)
        self._graph = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(self._graph, self._out)
        self._plans, self._work = {}, []  # ggml keeps only the work buffers' addresses
        for n in self.threads:
            plan = g.ggml_graph_plan(self._graph, n, None)
            self._work.append(np.zeros(max(int(plan.work_size), 1), np.uint8))
            plan.work_data = ctypes.cast(self._work[-1].ctypes.data, ctypes.POINTER(ctypes.c_uint8))
            self._plans[n] = plan

    def _open(self):
        if self._ctx is None:
            raise RuntimeError(_("this FlashAttnQ8 is closed"))

    def compute(self, n_threads: int | None = None) -> None:
        """One ``ggml_graph_compute`` on ``n_threads`` (one of ``threads``; default the first)."""
        self._open()
        n = self.threads[0] if n_threads is None else n_threads
        if n not in self._plans:
            raise ValueError(_("n_threads must be one of {threads} (the plans built); got {short_n_check}").format(
                               threads=self.threads, short_n_check=check.short(n)))
        status = self._g.ggml_graph_compute(self._graph, ctypes.byref(self._plans[n]))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned status {status}")

    def output(self) -> np.ndarray:
        """A copy of the last compute's result, float32 ``[G, head_dim]``."""
        self._open()
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

    __del__ = close


def expected(qs, K, V, scale: float | None = None) -> np.ndarray:
    """What ggml computes: float64 attention of q8_0-rounded ``qs [G, hd]`` over q8_0-rounded K, V."""
    from lessonkit.core import reference
    Kd, Vd, Qd = (dequantize_q8_0(*quantize_q8_0(np.atleast_2d(x))) for x in (K, V, qs))
    return np.stack([reference.attention(q, Kd, Vd, scale) for q in Qd])


def check_output(got, want, what: str = "ggml_flash_attn_ext") -> float:
    """max |got - want| / max |want|; AssertionError above CHECK_RTOL (or NaN)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise AssertionError(_("{what}: shape {shape_got}, expected {shape_want}").format(
                               what=what, shape_got=list(got.shape), shape_want=list(want.shape)))
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    if not err <= CHECK_RTOL:
        raise AssertionError(_("{what}: max error {err:.2e} of max|out| is above {CHECK_RTOL:g}").format(
                               what=what, err=err, CHECK_RTOL=CHECK_RTOL))
    return err
