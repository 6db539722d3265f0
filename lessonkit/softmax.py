"""Softmax-weighted sums written out in numpy, to set beside the kernel's trace (introduced in
lesson 02, used in lesson 04): the three-pass textbook version and the online one-pass update."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import validate as check
from .language import tr

MAX_ONLINE = 1 << 20  # scores online() replays one by one in Python (about a second per 10^6)
M_START = -1e9  # the kernel's start value of M (llama.cpp starts at -INFINITY)


def three_pass(s, V) -> np.ndarray:
    """The textbook decode attention over given scores, in float64: pass 1 finds max(s), pass 2
    sums exp(s - max), pass 3 weights the rows of V. s ``[n]``, V ``[n, hd]``."""
    s = np.asarray(s, np.float64)
    V = np.asarray(V, np.float64)
    m = s.max()                     # pass 1
    w = np.exp(s - m)               # pass 2
    return (w @ V) / w.sum()        # pass 3


@dataclass
class OnlineRun:
    M: np.ndarray         # [n] running max after each score
    S: np.ndarray         # [n] running sum of exp(s - M) after each score
    rescaled: np.ndarray  # [n] bool: did this score raise M?
    acc: np.ndarray | None  # [n, hd] running sum of exp(s - M) * V, or None without V
    out: np.ndarray | None  # [hd] acc / S at the end (0 where S == 0), or None without V


def online(s, V=None, m_start: float = M_START, dtype=np.float64) -> OnlineRun:
    """The kernel's online softmax, one score at a time, in ``dtype`` (float64 to replay exactly
    in higher precision, float32 to mimic the kernel's arithmetic): on a new max, S and acc are
    multiplied by exp(M_old - s) and the new score weighs 1; otherwise it weighs exp(s - M)."""
    if isinstance(s, np.ma.MaskedArray) or isinstance(V, np.ma.MaskedArray):
        raise TypeError(tr("online() takes plain arrays: pass s.filled(value) (and V.filled(value))",
                           "online() 只收普通数组：请传入 s.filled(value)（以及 V.filled(value)）"))
    s = np.asarray(s, dtype)
    if s.ndim != 1:
        raise ValueError(tr(f"s must be a 1-D array of scores; got shape {list(s.shape)}",
                            f"s 应是一维的分数数组；收到的形状是 {list(s.shape)}"))
    n = check.at_most("len(s)", s.shape[0], MAX_ONLINE, "scores replayed one by one in Python")
    V = None if V is None else np.asarray(V, dtype)
    M, S = dtype(m_start), dtype(0)
    acc = None if V is None else np.zeros(V.shape[1], dtype)
    Ms, Ss, flags = np.empty(n, dtype), np.empty(n, dtype), np.zeros(n, bool)
    accs = None if V is None else np.empty((n, V.shape[1]), dtype)
    with np.errstate(over="ignore", under="ignore"):
        for t in range(n):
            if s[t] > M:
                ms = np.exp(M - s[t])
                M = s[t]
                S = S * ms
                if acc is not None:
                    acc = acc * ms
                w = dtype(1)
                flags[t] = True
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
    if n > 1 << 24:  # no array of n values: H_n = ln n + gamma + 1/(2n) - 1/(12n^2), exact to float64 here
        return float(np.log(n) + np.euler_gamma + 1 / (2 * n) - 1 / (12 * n * n))
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def _inline_expf_floor(header=None) -> float:
    """The argument below which q8_simd.h's inline expf returns 0, read from its
    ``if (!(x >= <floor>f)) return 0.0f;`` line (so it follows an edit of the header)."""
    import re
    from .source import SIMD_HEADER
    text = (header or SIMD_HEADER).read_text()
    m = re.search(r"if \(!\(x >= (-?[0-9.]+)f\)\) return 0\.0f;", text)
    if m is None:
        raise ValueError("q8_simd.h has no 'if (!(x >= ...f)) return 0.0f;' line in its inline expf")
    return float(m.group(1))


def kernel_exp_name() -> str:
    """Which exp the compiled kernel's build calls: "inline" (x86 with FMA and SSE4.1: q8_simd.h's
    own expf) or "libm" (ARM, and x86 builds without those), read from ``fa_simd_paths()``."""
    from . import native
    ffi, lib = native.load()
    paths = ffi.string(lib.fa_simd_paths()).decode()
    return "inline" if "exp=inline" in paths else "libm"


def kernel_exp(x) -> np.ndarray:
    """float32 exp(x) for x <= 0 as far as the kernel's build decides where a weight becomes exactly
    0: the inline expf of q8_simd.h returns 0 below its floor (-87: the result would be under
    FLT_MIN); libm's expf underflows to 0 only below about -103.97 (under half the smallest
    subnormal), as numpy's float32 exp does. Above the floor both are within 2 ulp of each other."""
    x = np.asarray(x, np.float32)
    with np.errstate(under="ignore"):
        e = np.exp(x)
    if kernel_exp_name() == "inline":
        e = np.where(x >= np.float32(_inline_expf_floor()), e, np.float32(0))
    return e.astype(np.float32)
