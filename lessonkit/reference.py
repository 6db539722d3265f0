"""Float64 attention on unquantized K and V: the ground truth every kernel is measured against
(introduced in lesson 00)."""
from __future__ import annotations

import math

import numpy as np


def attention(q, K, V, scale: float | None = None) -> np.ndarray:
    """softmax(scale * K q) V in float64. q ``[hd]``, K and V ``[seq_len, hd]``; scale defaults
    to 1/sqrt(hd). Any real dtype is accepted and converted to float64."""
    q, K, V = (np.asarray(x, dtype=np.float64) for x in (q, K, V))
    if q.ndim != 1:
        raise ValueError(f"q must have shape [hd]; got {list(q.shape)}")
    hd = q.shape[0]
    for name, x in (("K", K), ("V", V)):
        if x.ndim != 2 or x.shape[1] != hd:
            raise ValueError(f"{name} must have shape [seq_len, {hd}]; got {list(x.shape)}")
    if K.shape[0] != V.shape[0] or K.shape[0] == 0:
        raise ValueError(f"K and V must hold the same number (>= 1) of tokens; got "
                         f"{K.shape[0]} and {V.shape[0]}")
    scale = 1.0 / math.sqrt(hd) if scale is None else float(scale)
    s = scale * (K @ q)
    w = np.exp(s - s.max())
    return (w @ V) / w.sum()
