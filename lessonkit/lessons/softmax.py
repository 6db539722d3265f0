"""Softmax-weighted sums in numpy, to set beside the kernel's trace (lessons 02 and 04): the three-pass textbook
version and the kernel's online one-pass update."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..core import validate as check
from ..core.language import _
from ..core.reference import M_START

MAX_ONLINE = 1 << 20  # scores online() replays one by one in Python (about a second per 10^6)


def three_pass(s, V) -> np.ndarray:
    """Textbook decode attention over scores ``s [n]`` in float64: max, sum of exp, weighted V."""
    s, V = np.asarray(s, np.float64), np.asarray(V, np.float64)
    w = np.exp(s - s.max())
    return (w @ V) / w.sum()


@dataclass
class OnlineRun:
    M: np.ndarray           # [n] running max after each score
    S: np.ndarray           # [n] running sum of exp(s - M)
    rescaled: np.ndarray    # [n] bool: did this score raise M?
    acc: np.ndarray | None  # [n, hd] running sum of exp(s - M) * V (None without V)
    out: np.ndarray | None  # [hd] acc / S at the end (0 where S == 0)


def online(s, V=None, m_start: float = M_START, dtype=np.float64) -> OnlineRun:
    """The kernel's online softmax, one score at a time in ``dtype``: a new max multiplies S and acc
    by exp(M_old - s) and weighs 1; any other score weighs exp(s - M)."""
    if isinstance(s, np.ma.MaskedArray) or isinstance(V, np.ma.MaskedArray):
        raise TypeError(_("online() takes plain arrays: pass s.filled(value) (and V.filled(value))"))
    s = np.asarray(s, dtype)
    if s.ndim != 1:
        raise ValueError(_("s must be a 1-D array of scores; got shape {shape_s}").format(shape_s=list(s.shape)))
    n = check.at_most("len(s)", s.shape[0], MAX_ONLINE, "scores replayed one by one in Python")
    V = None if V is None else np.asarray(V, dtype)
    M, S = dtype(m_start), dtype(0)
    acc = None if V is None else np.zeros(V.shape[1], dtype)
    Ms, Ss, flags = np.empty(n, dtype), np.empty(n, dtype), np.zeros(n, bool)
    accs = None if V is None else np.empty((n, V.shape[1]), dtype)
    with np.errstate(over="ignore", under="ignore"):
        for t in range(n):
            if s[t] > M:
                ms, M, w, flags[t] = np.exp(M - s[t]), s[t], dtype(1), True
                S = S * ms
                acc = None if acc is None else acc * ms
            else:
                w = np.exp(s[t] - M)
            S = S + w
            if acc is not None:
                acc = acc + V[t] * w
                accs[t] = acc
            Ms[t], Ss[t] = M, S
    out = None if acc is None else (acc / S if S > 0 else np.zeros_like(acc))
    return OnlineRun(Ms, Ss, flags, accs, out)


def harmonic(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n: the expected number of new maxima among n scores in random order."""
    n = check.integer("n", n, minimum=1)
    if n > 1 << 24:  # the asymptotic series, exact to float64 here
        return float(np.log(n) + np.euler_gamma + 1 / (2 * n) - 1 / (12 * n * n))
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def _inline_expf_floor(header=None) -> float:
    """The floor below which q8_simd.h's inline expf returns 0, read from the header."""
    from ..display.source import SIMD_HEADER
    m = re.search(r"if \(!\(x >= (-?[0-9.]+)f\)\) return 0\.0f;", (header or SIMD_HEADER).read_text())
    if m is None:
        raise ValueError("q8_simd.h has no 'if (!(x >= ...f)) return 0.0f;' line in its inline expf")
    return float(m.group(1))


def kernel_exp_name() -> str:
    """The exp this build's kernel calls, from ``fa_simd_paths()``: "inline" (q8_simd.h's) or "libm"."""
    from ..core import native
    return "inline" if native.simd_paths()["exp"] == "inline" else "libm"


def kernel_exp(x) -> np.ndarray:
    """float32 exp(x), x <= 0, zero where this build's exp gives exactly 0: below the inline expf's
    floor (-87), or where libm's underflows (about -103.97, as numpy's float32 exp)."""
    x = np.asarray(x, np.float32)
    with np.errstate(under="ignore"):
        e = np.exp(x)
    if kernel_exp_name() == "inline":
        e = np.where(x >= np.float32(_inline_expf_floor()), e, np.float32(0))
    return e.astype(np.float32)
