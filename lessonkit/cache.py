"""The q8 KV cache in exactly the kernel's layout (introduced in lesson 00, drawn in lesson 03).

Blocks of ``block_size`` tokens, each ``kv_dim = n_kv_heads * head_dim`` int8 values per token;
a table of block pointers (``int8_t *const *``); one raw max|x| scale per (token, kv head),
stored ``[token][kv_head]`` so that the kernel, handed ``k_scale + kh``, reads ``kscale[t * nkv]``.
The cache grows block by block; blocks never move, so pointers handed to C stay valid."""
from __future__ import annotations

import numpy as np

from . import native
from . import validate as check
from .quant import dequantize, quantize_kv_rows_into


class KVCacheQ8:
    """An int8 K/V cache for one layer: ``append`` tokens, then ``lessonkit.attend`` over it."""

    def __init__(self, n_kv_heads: int, head_dim: int, block_size: int):
        self.n_kv_heads = check.integer("n_kv_heads", n_kv_heads, minimum=1)
        self.head_dim = check.head_dim(head_dim)
        self.block_size = check.integer("block_size", block_size, minimum=1)
        self.seq_len = 0
        self._k_blocks: list[np.ndarray] = []
        self._v_blocks: list[np.ndarray] = []
        self._k_ptrs = np.zeros(4, np.uintp)  # the block pointer tables handed to C
        self._v_ptrs = np.zeros(4, np.uintp)
        self._k_scale = np.zeros((self.block_size, self.n_kv_heads), np.float32)
        self._v_scale = np.zeros((self.block_size, self.n_kv_heads), np.float32)

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_blocks(self) -> int:
        return len(self._k_blocks)

    @property
    def nbytes(self) -> int:
        """Bytes the kernel can read for the tokens held: int8 K and V codes (one byte per value)
        plus one fp32 scale per (token, kv head) for K and for V. Allocated but unused rows of the
        last block are not counted; ``allocated_nbytes`` counts them."""
        return self.seq_len * (2 * self.kv_dim + 2 * 4 * self.n_kv_heads)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes actually allocated: whole blocks of codes, and the scale arrays' capacity."""
        return (sum(b.nbytes for b in self._k_blocks + self._v_blocks)
                + self._k_scale.nbytes + self._v_scale.nbytes)

    def __len__(self) -> int:
        return self.seq_len

    def __repr__(self) -> str:
        return (f"KVCacheQ8(n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"block_size={self.block_size}, seq_len={self.seq_len}, n_blocks={self.n_blocks})")

    # ------------------------------------------------------------------ writing

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Quantize and append one token (``[n_kv_heads, head_dim]`` float32) or many
        (``[n, n_kv_heads, head_dim]``)."""
        per_token = (self.n_kv_heads, self.head_dim)
        if isinstance(k, np.ndarray) and k.ndim == 2:
            k = check.float32_array("k", k, per_token)[None]
            v = check.float32_array("v", v, per_token)[None]
        else:
            k = check.float32_array("k", k, (None, *per_token))
            v = check.float32_array("v", v, (k.shape[0], *per_token))
        n = k.shape[0]
        if n == 0:
            return
        self._reserve(self.seq_len + n)
        ffi, lib = native.load()
        t = self.seq_len
        while t < self.seq_len + n:
            blk, row = divmod(t, self.block_size)
            m = min(self.block_size - row, self.seq_len + n - t)  # tokens that fit in this block
            src = slice(t - self.seq_len, t - self.seq_len + m)
            for x, blocks, scales in ((k, self._k_blocks, self._k_scale),
                                      (v, self._v_blocks, self._v_scale)):
                quantize_kv_rows_into(x[src].reshape(-1, self.head_dim),
                                      blocks[blk][row:row + m].reshape(-1, self.head_dim),
                                      scales[t:t + m].reshape(-1), ffi, lib)
            t += m
        self.seq_len += n

    def _reserve(self, n_tokens: int) -> None:
        """Add blocks (and grow the scale arrays and pointer tables) to hold n_tokens."""
        first_new = self.n_blocks
        while self.n_blocks * self.block_size < n_tokens:
            for blocks in (self._k_blocks, self._v_blocks):
                blocks.append(np.zeros((self.block_size, self.kv_dim), np.int8))
        if self._k_ptrs.shape[0] < self.n_blocks:
            size = max(self.n_blocks, 2 * self._k_ptrs.shape[0])
            for name in ("_k_ptrs", "_v_ptrs"):
                grown = np.zeros(size, np.uintp)
                grown[:first_new] = getattr(self, name)[:first_new]
                setattr(self, name, grown)
        for i in range(first_new, self.n_blocks):  # blocks never move: only new ones need an entry
            self._k_ptrs[i] = self._k_blocks[i].ctypes.data
            self._v_ptrs[i] = self._v_blocks[i].ctypes.data
        if self._k_scale.shape[0] < n_tokens:
            size = max(n_tokens, 2 * self._k_scale.shape[0])
            for name in ("_k_scale", "_v_scale"):
                grown = np.zeros((size, self.n_kv_heads), np.float32)
                old = getattr(self, name)
                grown[:old.shape[0]] = old
                setattr(self, name, grown)

    # ------------------------------------------------------------------ reading

    @property
    def k_blocks(self) -> tuple[np.ndarray, ...]:
        """The int8 K blocks, each ``[block_size, kv_dim]`` (read-only views): block b holds tokens
        b * block_size ... (b + 1) * block_size - 1, all kv heads side by side."""
        return tuple(_read_only(b) for b in self._k_blocks)

    @property
    def v_blocks(self) -> tuple[np.ndarray, ...]:
        return tuple(_read_only(b) for b in self._v_blocks)

    def pointer_table(self, which: str = "k") -> np.ndarray:
        """The block pointer table handed to the kernel as ``k_cache_q8`` (or ``v_cache_q8``):
        the address of each block, uint64 ``[n_blocks]`` (a copy)."""
        if which not in ("k", "v"):
            raise ValueError(f"which must be 'k' or 'v'; got {which!r}")
        table = self._k_ptrs if which == "k" else self._v_ptrs
        return table[:self.n_blocks].astype(np.uint64)

    def _check_head(self, kv_head) -> int:
        return check.integer("kv_head", kv_head, minimum=0, below=self.n_kv_heads)

    def _gather(self, blocks: list[np.ndarray], kv_head: int) -> np.ndarray:
        kh = self._check_head(kv_head)
        if self.seq_len == 0:
            return np.zeros((0, self.head_dim), np.int8)
        rows = np.concatenate(blocks)[:self.seq_len]
        return rows[:, kh * self.head_dim:(kh + 1) * self.head_dim].copy()

    def k_codes(self, kv_head: int) -> np.ndarray:
        """K's int8 codes of one kv head, ``[seq_len, head_dim]`` (a copy)."""
        return self._gather(self._k_blocks, kv_head)

    def v_codes(self, kv_head: int) -> np.ndarray:
        return self._gather(self._v_blocks, kv_head)

    def k_scales(self, kv_head: int) -> np.ndarray:
        """K's raw max|x| per token of one kv head, ``[seq_len]`` (a copy)."""
        return self._k_scale[:self.seq_len, self._check_head(kv_head)].copy()

    def v_scales(self, kv_head: int) -> np.ndarray:
        return self._v_scale[:self.seq_len, self._check_head(kv_head)].copy()

    def dequantized(self, kv_head: int) -> tuple[np.ndarray, np.ndarray]:
        """(K, V) of one kv head as float32 ``[seq_len, head_dim]``, the values the kernel sees."""
        return (dequantize(self.k_codes(kv_head), self.k_scales(kv_head)),
                dequantize(self.v_codes(kv_head), self.v_scales(kv_head)))

    def kernel_args(self, kv_head: int, ffi) -> tuple:
        """The cache's arguments of the kernel for one kv head, in the article's order:
        ``(k_cache_q8, v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv, kh_off)``.
        The pointers are valid while this cache lives and does not grow."""
        kh = self._check_head(kv_head)
        if self.seq_len == 0:
            raise ValueError("the cache is empty: append at least one token before attending")
        return (ffi.cast("int8_t *const *", self._k_ptrs.ctypes.data),
                ffi.cast("int8_t *const *", self._v_ptrs.ctypes.data),
                ffi.cast("const float *", self._k_scale.ctypes.data) + kh,
                ffi.cast("const float *", self._v_scale.ctypes.data) + kh,
                self.seq_len, self.kv_dim, self.block_size, self.n_kv_heads, kh * self.head_dim)


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view
