"""Softmax-weighted sums written out in numpy, to set beside the kernel's trace (introduced in
lesson 02, used in lesson 04): the three-pass textbook version and the online one-pass update."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import validate as check

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
        raise TypeError("online() takes plain arrays: pass s.filled(value) (and V.filled(value))")
    s = np.asarray(s, dtype)
    if s.ndim != 1:
        raise ValueError(f"s must be a 1-D array of scores; got shape {list(s.shape)}")
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
