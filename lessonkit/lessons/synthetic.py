"""Inputs with chosen properties for the lessons (introduced in lesson 02): a cache holding given K and V, and
one whose kernel scores are given numbers."""
from __future__ import annotations

import numpy as np

from ..core import validate as check
from ..core.cache import KVCacheQ8
from ..core.language import _

MAX_BYTES = 2 << 30  # K, V and the cache of one synthetic case


def cache_of(K: np.ndarray, V: np.ndarray, block_size: int = 64) -> KVCacheQ8:
    """A cache holding K, V float32 ``[n, n_kv_heads, head_dim]``, or ``[n, head_dim]`` for one kv head (lessons 05b
    and 08: ``streaming.cache_of``)."""
    K = check.float32_array("K", K, (None,) * (3 if getattr(K, "ndim", 2) == 3 else 2))
    V = check.float32_array("V", V, K.shape)
    K, V = (x if x.ndim == 3 else x[:, None, :] for x in (K, V))
    cache = KVCacheQ8(K.shape[1], K.shape[2], block_size)
    cache.append(K, V)
    return cache


def cache_with_scores(scores, head_dim: int = 64, block_size: int = 16, V=None, seed: int = 0):
    """``(cache, q, scale)`` for which the kernel's scores are ``scores`` (to float32 rounding): every K row is a
    multiple c_t of the all-ones vector and q is all ones, so every code is +-127, each K row's scale is |c_t|, and
    with ``scale = 1 / head_dim`` the score is c_t. V: random normal from ``seed`` when not given."""
    head_dim = check.head_dim(head_dim)
    block_size = check.integer("block_size", block_size, minimum=1)
    try:
        c = check.float32_like("scores", scores, (None,))
    except ValueError as e:
        raise ValueError(_("scores must be a non-empty 1-D array of finite numbers: {e}").format(e=e)) from None
    n = c.shape[0]
    if n == 0:
        raise ValueError(_("scores must be a non-empty 1-D array of finite numbers; got none"))
    rows = -(-n // block_size) * block_size  # the cache allocates whole blocks
    check.memory(f"a synthetic cache of {n} tokens of head_dim {head_dim} (blocks of {block_size})",
                 n * head_dim * (4 + 4) + rows * (2 * head_dim + 8), MAX_BYTES,
                 "use fewer scores, a smaller head_dim or a smaller block_size")
    if V is None:
        V = np.random.default_rng(seed).standard_normal((n, head_dim), dtype=np.float32)
    V = check.float32_like("V", V, (n, head_dim))
    return cache_of(np.repeat(c[:, None], head_dim, axis=1), V, block_size), np.ones(head_dim, np.float32), 1 / head_dim
