"""Inputs with chosen properties for the lessons (introduced in lesson 02)."""
from __future__ import annotations

import numpy as np

from .cache import KVCacheQ8


def cache_with_scores(scores, head_dim: int = 64, block_size: int = 16, V=None, seed: int = 0):
    """A one-kv-head cache and a query for which the kernel's scores are ``scores`` (to float32
    rounding), with ``scale = 1 / head_dim``. Returns ``(cache, q, scale)``.

    How: every K row is a multiple c_t of the all-ones vector and q is all ones. Then every code
    of K and Q is +-127, each K row's scale is |c_t|, and the score is hd * c_t * scale = c_t.
    V: float32 ``[n, head_dim]``, random normal from ``seed`` when not given."""
    c = np.asarray(scores, np.float32)
    if c.ndim != 1 or c.shape[0] == 0 or not np.isfinite(c).all():
        raise ValueError("scores must be a non-empty 1-D array of finite numbers")
    n = c.shape[0]
    if V is None:
        V = np.random.default_rng(seed).standard_normal((n, head_dim), dtype=np.float32)
    V = np.ascontiguousarray(V, np.float32)
    if V.shape != (n, head_dim):
        raise ValueError(f"V must have shape [{n}, {head_dim}]; got {list(V.shape)}")
    K = np.repeat(c[:, None], head_dim, axis=1)
    cache = KVCacheQ8(1, head_dim, block_size)
    cache.append(np.ascontiguousarray(K[:, None, :]), np.ascontiguousarray(V[:, None, :]))
    return cache, np.ones(head_dim, np.float32), 1.0 / head_dim
