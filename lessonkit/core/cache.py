"""The q8 KV cache in exactly the kernel's layout (introduced in lesson 00, drawn in lesson 03).

Blocks of ``block_size`` tokens, each ``kv_dim = n_kv_heads * head_dim`` int8 values per token;
a table of block pointers (``int8_t *const *``); one raw max|x| scale per (token, kv head),
stored ``[token][kv_head]`` so that the kernel, handed ``k_scale + kh``, reads ``kscale[t * nkv]``.

How it stays safe in a notebook (a crash would lose the student's kernel): blocks never move, so
pointers handed to C stay valid; everything a reader sees sits in one immutable ``_State`` that
``append`` publishes with one assignment at its very end, so an interrupt or a MemoryError leaves the
cache as it was or fully appended; a table or scale array that is too small is replaced by a copy
twice as large, while ``kernel_args``' cffi buffers keep the old one alive for a running call;
appends are serialized by a lock; ``copy``, ``deepcopy`` and ``pickle`` store codes and scales, never
an address. Its codes and scales live in private anonymous mappings of their own (``mapped_zeros``),
2 MiB-aligned and marked for transparent huge pages, or for 4 KiB pages only (``huge_pages=False``,
the board's case).
The cache checks its own arguments, and ``kv_cache``, ``attention_call`` and
``attention_args`` check those of every attention call over it."""
from __future__ import annotations

import mmap
import os
from typing import NamedTuple

import numpy as np

from . import native
from . import validate as check
from .header import KVQ_INV
from .language import _
from .processes import fork_safe_lock

N_KV_HEADS_MAX = 256        # kv heads per cache
BLOCK_SIZE_MAX = 65536      # tokens per block
BLOCK_BYTES_MAX = 1 << 26   # int8 bytes per K (or V) block: block_size * kv_dim
C_INT_MAX = 2**31 - 1       # the kernel's int arguments and indices
HUGE_PAGE = 2 << 20         # a transparent huge page on x86-64 and on arm64 with 4 KiB pages (one PMD)


class _State(NamedTuple):
    """What readers see, published by one assignment. Rows past seq_len (of the blocks, the tables'
    entries past n_blocks, the scale arrays' rows) belong to no reader: append writes there."""
    seq_len: int
    n_blocks: int
    k_table: np.ndarray    # uintp [capacity] block addresses (a _BlockTable), n_blocks in use
    v_table: np.ndarray
    k_scale: np.ndarray    # float32 [capacity, n_kv_heads]
    v_scale: np.ndarray
    k_flat: np.ndarray     # the same arrays flat, for the kernel's kscale + kh
    v_flat: np.ndarray


class _BlockTable(np.ndarray):
    """A pointer table that keeps its blocks alive: ``blocks`` is the cache's list of every block
    it allocated (it only grows), so a cffi buffer over the table (and so a running kernel call)
    never holds an address of freed memory, even after the cache itself is gone."""
    blocks: list


def _new_table(capacity: int, blocks: list) -> _BlockTable:
    # The table owns its memory, so every view of it (the kernel's buffer) has it as its base.
    table = np.ndarray.__new__(_BlockTable, (capacity,), np.uintp)
    table.fill(0)
    table.blocks = blocks
    return table


def mapped_zeros(shape: tuple, dtype, huge: bool) -> np.ndarray:
    """``np.zeros(shape, dtype)`` in a private anonymous mapping of its own, so that the cache, not
    malloc, decides its pages. np.zeros asks malloc, which puts arrays below its mmap threshold (which
    grows up to 32 MiB as a process frees large blocks, mallopt(3)) into the heap among other data; numpy
    then calls madvise(MADV_HUGEPAGE) only on arrays of 4 MiB or more, from an address malloc chose
    (indicate_hugepages in numpy/_core/src/multiarray/alloc.c). Huge pages need whole 2 MiB-aligned
    ranges (Documentation/admin-guide/mm/transhuge.rst), so a cache in 2 MiB slabs got a share of them
    that changed from run to run. Here every mapping of ``HUGE_PAGE`` or more starts on a 2 MiB
    boundary and covers whole huge pages, and ``huge`` picks MADV_HUGEPAGE (honoured where THP is
    "always" or "madvise"; each huge page is one TLB entry instead of 512, and the hardware prefetchers,
    which stop at page boundaries, follow the stream across 2 MiB) or MADV_NOHUGEPAGE (4 KiB pages
    only, as on a kernel without THP). madvise is advice: where the kernel has no THP it fails (EINVAL,
    madvise(2)) and the pages stay 4 KiB, and where no free huge page is found the fault falls back to
    4 KiB pages. Anonymous memory reads as zeros (mmap(2)); MAP_PRIVATE keeps np.zeros' semantics for a
    forked child (copy on write, never shared). Without mmap.MAP_PRIVATE (Windows): np.zeros."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if not hasattr(mmap, "MAP_PRIVATE") or nbytes == 0:
        return np.zeros(shape, dtype)
    align = HUGE_PAGE if nbytes >= HUGE_PAGE else mmap.PAGESIZE
    span = -(-nbytes // align) * align          # whole huge pages: the last one too
    try:
        mm = mmap.mmap(-1, span + align - mmap.PAGESIZE, flags=mmap.MAP_PRIVATE)
    except OSError as e:  # ENOMEM: what np.zeros would raise as MemoryError
        raise MemoryError(_("cannot map {nbytes} bytes for the cache: {why}").format(
                          nbytes=span, why=e.strerror)) from e
    whole = np.frombuffer(mm, np.uint8)         # its base is mm: unmapped when the last view goes
    start = -whole.ctypes.data % align
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        try:
            mm.madvise(advice, start, span)
        except OSError:
            pass                                # no THP in this kernel: 4 KiB pages, as asked or not
    return whole[start:start + nbytes].view(dtype).reshape(shape)


def _checked_shape(n_kv_heads, head_dim, block_size) -> tuple[int, int, int]:
    """(n_kv_heads, head_dim, block_size) within the limits of KVCacheQ8's docstring."""
    nkv = check.integer("n_kv_heads", n_kv_heads, minimum=1)
    if nkv > N_KV_HEADS_MAX:
        raise ValueError(_("n_kv_heads must be at most {N_KV_HEADS_MAX}; got {nkv}").format(
                           N_KV_HEADS_MAX=N_KV_HEADS_MAX, nkv=nkv))
    hd = check.head_dim(head_dim)
    bs = check.integer("block_size", block_size, minimum=1)
    if bs > BLOCK_SIZE_MAX:
        raise ValueError(_("block_size must be at most {BLOCK_SIZE_MAX} tokens; got {bs}").format(
                           BLOCK_SIZE_MAX=BLOCK_SIZE_MAX, bs=bs))
    if bs * nkv * hd > BLOCK_BYTES_MAX:
        raise ValueError(_("a block of block_size * kv_dim = {bs} * {nkv_hd} = {hd_bs_nkv} bytes is more than the "
                           "limit of {BLOCK_BYTES_MAX} bytes ({block_bytes_max} MiB) per block; use block_size <= "
                           "{block_bytes_max_nkv_hd} for kv_dim {nkv_hd}").format(
                           bs=bs, nkv_hd=nkv * hd, hd_bs_nkv=bs * nkv * hd, BLOCK_BYTES_MAX=BLOCK_BYTES_MAX,
                           block_bytes_max=BLOCK_BYTES_MAX >> 20,
                           block_bytes_max_nkv_hd=BLOCK_BYTES_MAX // (nkv * hd)))
    return nkv, hd, bs


class KVCacheQ8:
    """An int8 K/V cache for one layer: ``append`` tokens, then ``lessonkit.attend`` over it.

    Limits, checked at construction so that no size can overflow the kernel's C ints:
    n_kv_heads 1 to 256 (models use far fewer: Qwen3-8B has 8), so kv_dim <= 256 * 256;
    head_dim a multiple of 32 from 32 to 256 (the kernel's fixed buffers); block_size 1 to 65536
    tokens (engines use 16 to 256) and at most 64 MiB per block (block_size * kv_dim bytes):
    a block is allocated whole, for K and for V, when its first token arrives, and the kernel's
    offset ``(t % kv_bs) * kv_dim + kh_off`` stays below 2**26, far from 2**31. ``append``
    refuses to go past ``(2**31 - 1) // n_kv_heads`` tokens: the kernel reads the scale of
    token t at the C int index ``t * nkv``.

    ``huge_pages``: the blocks and scales asked for transparent huge pages (True: the scan reads long
    streams the prefetchers follow, one TLB entry per 2 MiB) or kept on 4 KiB pages (False: what a
    kernel without huge pages gives, as the board's may; lesson 09 times both).

    Shape and seq_len are read-only. Appends from several threads are serialized, and a kernel may
    run on the cache in one thread while another appends (it sees the tokens there were when its
    arguments were taken)."""

    def __init__(self, n_kv_heads: int, head_dim: int, block_size: int, huge_pages: bool = True):
        self._setup(*_checked_shape(n_kv_heads, head_dim, block_size), check.flag("huge_pages", huge_pages))

    def _setup(self, nkv: int, hd: int, bs: int, huge: bool = True) -> None:
        """The empty cache of a checked shape (``__init__`` and ``__setstate__``)."""
        self._shape = (nkv, hd, bs)
        self._huge = huge
        self._max_tokens = C_INT_MAX // nkv
        self._lock = fork_safe_lock(self, "_lock")  # serializes appends; readers never take it
        self._k_blocks: list[np.ndarray] = []  # every block allocated, in token order; only grows
        self._v_blocks: list[np.ndarray] = []
        k_scale = np.zeros((bs, nkv), np.float32)
        v_scale = np.zeros((bs, nkv), np.float32)
        self._state = _State(0, 0, _new_table(4, self._k_blocks), _new_table(4, self._v_blocks),
                             k_scale, v_scale, k_scale.reshape(-1), v_scale.reshape(-1))

    # ------------------------------------------------------------------ shape (read-only)

    @property
    def n_kv_heads(self) -> int:
        return self._shape[0]

    @property
    def head_dim(self) -> int:
        return self._shape[1]

    @property
    def block_size(self) -> int:
        return self._shape[2]

    @property
    def huge_pages(self) -> bool:
        """Whether the cache's memory is asked for transparent huge pages (the kernel may still give 4 KiB ones)."""
        return self._huge

    @property
    def seq_len(self) -> int:
        """Tokens held; grows only through ``append``."""
        return self._state.seq_len

    @property
    def max_seq_len(self) -> int:
        """The most tokens this cache can hold: ``(2**31 - 1) // n_kv_heads`` (the kernel's int t * nkv)."""
        return self._max_tokens

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def n_blocks(self) -> int:
        return self._state.n_blocks

    @property
    def nbytes(self) -> int:
        """Bytes the kernel can read for the tokens held: int8 K and V codes (one byte per value)
        plus one fp32 scale per (token, kv head) for K and for V. Allocated but unused rows of the
        last block are not counted; ``allocated_nbytes`` counts them."""
        return self.seq_len * (2 * self.kv_dim + 2 * 4 * self.n_kv_heads)

    @property
    def allocated_nbytes(self) -> int:
        """Bytes actually allocated: whole blocks of codes (a block that an interrupted append
        allocated is kept, and filled by the next append), and the scale arrays' capacity."""
        s = self._state
        return (sum(b.nbytes for b in self._k_blocks) + sum(b.nbytes for b in self._v_blocks)
                + s.k_scale.nbytes + s.v_scale.nbytes)

    def __len__(self) -> int:
        return self.seq_len

    def __repr__(self) -> str:
        s = self._state
        return (f"KVCacheQ8(n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, "
                f"block_size={self.block_size}, seq_len={s.seq_len}, n_blocks={s.n_blocks})")

    # ------------------------------------------------------------------ writing

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Quantize and append one token (``[n_kv_heads, head_dim]`` float32) or many
        (``[n, n_kv_heads, head_dim]``). Either every token is appended or none (an error or an
        interrupt leaves the cache as it was)."""
        per_token = (self.n_kv_heads, self.head_dim)
        if isinstance(k, np.ndarray) and k.ndim == 2:
            k = check.float32_array("k", k, per_token)[None]
            v = check.float32_array("v", v, per_token)[None]
        else:
            if isinstance(k, np.ndarray) and k.ndim == 3:
                self._check_room(self.seq_len, k.shape[0])  # before reading a too-long input
            k = check.float32_array("k", k, (None, *per_token))
            v = check.float32_array("v", v, (k.shape[0], *per_token))
        n = k.shape[0]
        if n == 0:
            return
        ffi, lib = native.load()
        # Row r of x is (token r // nkv, head r % nkv): the same order as the block rows and the
        # [token][kv_head] scales, so one call quantizes a run of tokens of one block. The buffers
        # are sized here, so the C quantizer is called directly, writing into the blocks and scales themselves.
        hd, kv_dim, nkv = self.head_dim, self.kv_dim, self.n_kv_heads
        xk, xv = ffi.from_buffer("float[]", k), ffi.from_buffer("float[]", v)

        def write(src, m, kb, vb, row, t, k_scale, v_scale):
            for x, block, scales in ((xk, kb, k_scale), (xv, vb, v_scale)):
                lib.kvq8_quantize_rows(x + src * kv_dim, m * nkv, hd, hd,
                                       ffi.from_buffer("int8_t[]", block, require_writable=True)
                                       + row * kv_dim, hd,
                                       ffi.from_buffer("float[]", scales, require_writable=True)
                                       + t * nkv, 1)

        # One line on purpose: no line boundary between _grow's end and the lock's release, where
        # an interrupt (raised between lines) could leave the lock held and the next append hung.
        with self._lock: self._grow(n, write)  # noqa: E701

    def _check_room(self, seq_len: int, n: int) -> None:
        if seq_len + n > self._max_tokens:
            raise ValueError(_("appending {n} tokens to {seq_len} would hold {seq_len_n}: a cache of {n_kv_heads} "
                               "kv heads holds at most (2**31 - 1) // {n_kv_heads} = {max_tokens} tokens (the "
                               "kernel reads the scale of token t at the C int index t * nkv)").format(
                               n=n, seq_len=seq_len, seq_len_n=seq_len + n, n_kv_heads=self.n_kv_heads,
                               max_tokens=self._max_tokens))

    def _grow(self, n: int, write) -> None:
        """Append n tokens: allocate, let ``write`` fill rows seq_len ... seq_len + n - 1, publish.
        Called with the lock held. Nothing a reader of the current state looks at is written
        before the last line, which publishes the new state."""
        s = self._state
        self._check_room(s.seq_len, n)  # again: another thread may have appended meanwhile
        bs, kv_dim, nkv = self.block_size, self.kv_dim, self.n_kv_heads
        T = s.seq_len + n
        n_blocks = -(-T // bs)
        # Blocks stay in these lists for the cache's life (an interrupted append's new block is
        # reused by the next one). They are views of slabs of many blocks (up to 64 MiB), K's and V's
        # apart, so that the kernel's scan reads two long streams the prefetchers follow (measured on
        # the workbook's x86 machine at 256K tokens: 12.4-13.2 ns/token over slabs, 14.6-15.9 over
        # one allocation per block). A slab is never freed or moved; each is a mapping of its own
        # (mapped_zeros), on huge pages or 4 KiB ones as the cache was asked.
        for blocks in (self._k_blocks, self._v_blocks):
            if len(blocks) < n_blocks:
                room = max(1, (64 << 20) // (bs * kv_dim))  # blocks per slab at most
                count = min(max(n_blocks - len(blocks), len(blocks)), max(room, n_blocks - len(blocks)),
                            -(-self._max_tokens // bs) - len(blocks))
                slab = mapped_zeros((count, bs, kv_dim), np.int8, self._huge)
                blocks.extend(slab[i] for i in range(count))
        k_table = _table_with(s.k_table, s.n_blocks, n_blocks, self._k_blocks)
        v_table = _table_with(s.v_table, s.n_blocks, n_blocks, self._v_blocks)
        k_scale, v_scale = s.k_scale, s.v_scale
        if k_scale.shape[0] < T:
            # copy-on-grow: the old arrays stay as they are for whoever still reads them
            size = min(max(T, 2 * k_scale.shape[0]), self._max_tokens)
            k_scale = mapped_zeros((size, nkv), np.float32, self._huge)
            v_scale = mapped_zeros((size, nkv), np.float32, self._huge)
            k_scale[:s.seq_len] = s.k_scale[:s.seq_len]
            v_scale[:s.seq_len] = s.v_scale[:s.seq_len]
        t = s.seq_len
        while t < T:
            blk, row = divmod(t, bs)
            m = min(bs - row, T - t)  # tokens that fit in this block
            write(t - s.seq_len, m, self._k_blocks[blk], self._v_blocks[blk], row, t, k_scale, v_scale)
            t += m
        self._state = _State(T, n_blocks, k_table, v_table, k_scale, v_scale,
                             k_scale.reshape(-1), v_scale.reshape(-1))

    # ------------------------------------------------------------------ copies

    def __getstate__(self) -> dict:
        """Shape, and the codes and scales of the tokens held: no address (``pickle``, ``copy``)."""
        s = self._state
        return {"version": 1, "n_kv_heads": self.n_kv_heads, "head_dim": self.head_dim,
                "block_size": self.block_size, "huge_pages": int(self._huge),
                "k_codes": self._rows(self._k_blocks, s), "v_codes": self._rows(self._v_blocks, s),
                "k_scales": s.k_scale[:s.seq_len].copy(), "v_scales": s.v_scale[:s.seq_len].copy()}

    def __setstate__(self, state: dict) -> None:
        """Rebuild blocks and pointer tables from ``__getstate__``'s codes and scales."""
        names = ("n_kv_heads", "head_dim", "block_size", "k_codes", "v_codes", "k_scales", "v_scales")
        if not isinstance(state, dict) or state.get("version") != 1 or not set(names) <= state.keys():
            raise ValueError(_("not a saved KVCacheQ8 state (version 1): expected a dict with 'version': 1 and "
                               "{names}").format(names=', '.join(names)))
        nkv, hd, bs = _checked_shape(state["n_kv_heads"], state["head_dim"], state["block_size"])
        arrays = []
        for name, dtype, width in (("k_codes", np.int8, nkv * hd), ("v_codes", np.int8, nkv * hd),
                                   ("k_scales", np.float32, nkv), ("v_scales", np.float32, nkv)):
            a = state[name]
            if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == 2
                    and a.shape[1] == width and a.shape[0] == state["k_codes"].shape[0]):
                raise ValueError(_("saved KVCacheQ8 state: {name} must be a numpy array of {dtype}, shape "
                                   "[seq_len, {width}] (seq_len that of k_codes)").format(
                                   name=name, dtype=np.dtype(dtype), width=width))
            arrays.append(np.ascontiguousarray(a))
        kc, vc, ks, vs = arrays
        huge = state.get("huge_pages", 1)  # a state saved before the option: huge pages
        self._setup(nkv, hd, bs, not (isinstance(huge, int) and huge == 0))
        if kc.shape[0] == 0:
            return

        def write(src, m, kb, vb, row, t, k_scale, v_scale):
            kb[row:row + m] = kc[src:src + m]
            vb[row:row + m] = vc[src:src + m]
            k_scale[t:t + m] = ks[src:src + m]
            v_scale[t:t + m] = vs[src:src + m]

        with self._lock: self._grow(kc.shape[0], write)  # noqa: E701 (one line: see append)

    def __copy__(self) -> KVCacheQ8:
        """An independent cache with the same tokens (its own blocks: appending to one never
        changes the other)."""
        new = type(self).__new__(type(self))
        new.__setstate__(self.__getstate__())
        return new

    def __deepcopy__(self, memo: dict) -> KVCacheQ8:
        new = self.__copy__()
        memo[id(self)] = new
        return new

    # ------------------------------------------------------------------ reading

    @property
    def k_blocks(self) -> tuple[np.ndarray, ...]:
        """The int8 K blocks, each ``[block_size, kv_dim]`` (read-only views): block b holds tokens
        b * block_size ... (b + 1) * block_size - 1, all kv heads side by side. Rows past seq_len
        are unused: no reader counts them (an interrupted append may have written there)."""
        return tuple(_read_only(b) for b in self._k_blocks[:self._state.n_blocks])

    @property
    def v_blocks(self) -> tuple[np.ndarray, ...]:
        return tuple(_read_only(b) for b in self._v_blocks[:self._state.n_blocks])

    def pointer_table(self, which: str = "k") -> np.ndarray:
        """The block pointer table handed to the kernel as ``k_cache_q8`` (or ``v_cache_q8``):
        the address of each block, uint64 ``[n_blocks]`` (a copy)."""
        if which not in ("k", "v"):
            raise ValueError(_("which must be 'k' or 'v'; got {which!r}").format(which=which))
        s = self._state
        table = s.k_table if which == "k" else s.v_table
        return table[:s.n_blocks].astype(np.uint64, subok=False)

    def check_head(self, kv_head) -> int:
        return check.integer("kv_head", kv_head, minimum=0, below=self.n_kv_heads)

    def _rows(self, blocks: list[np.ndarray], s: _State) -> np.ndarray:
        """Token rows ``[seq_len, kv_dim]`` of state s (a copy)."""
        if s.seq_len == 0:
            return np.zeros((0, self.kv_dim), np.int8)
        return np.concatenate(blocks[:s.n_blocks])[:s.seq_len]

    def _codes(self, blocks: list[np.ndarray], s: _State, kh: int) -> np.ndarray:
        return self._rows(blocks, s)[:, kh * self.head_dim:(kh + 1) * self.head_dim].copy()

    def k_codes(self, kv_head: int) -> np.ndarray:
        """K's int8 codes of one kv head, ``[seq_len, head_dim]`` (a copy)."""
        return self._codes(self._k_blocks, self._state, self.check_head(kv_head))

    def v_codes(self, kv_head: int) -> np.ndarray:
        return self._codes(self._v_blocks, self._state, self.check_head(kv_head))

    def k_scales(self, kv_head: int) -> np.ndarray:
        """K's raw max|x| per token of one kv head, ``[seq_len]`` (a copy)."""
        kh, s = self.check_head(kv_head), self._state
        return s.k_scale[:s.seq_len, kh].copy()

    def v_scales(self, kv_head: int) -> np.ndarray:
        kh, s = self.check_head(kv_head), self._state
        return s.v_scale[:s.seq_len, kh].copy()

    def dequantized(self, kv_head: int) -> tuple[np.ndarray, np.ndarray]:
        """(K, V) of one kv head as float32 ``[seq_len, head_dim]``, the values the kernel sees."""
        kh, s = self.check_head(kv_head), self._state  # one state: codes and scales agree
        return tuple(self._codes(blocks, s, kh).astype(np.float32) * (scales[:s.seq_len, kh] * KVQ_INV)[:, None]
                     for blocks, scales in ((self._k_blocks, s.k_scale), (self._v_blocks, s.v_scale)))

    def kernel_args(self, kv_head: int, ffi, lib=None) -> tuple:
        """The cache's arguments of the kernel for one kv head, in the article's order:
        ``(k_cache_q8, v_cache_q8, kscale, vscale, seq_len, kv_dim, kv_bs, nkv, kh_off)``.
        ``lib``: the library about to be called with them; it is first made sure to have passed its
        check on a cache this large (``native.cover``), so a kernel edit that only works on small
        caches is refused before the call, not found by a crash.

        All from one state of the cache: an append in another thread does not change them. The
        pointers are cffi buffers (``int8_t *[n_blocks]``, ``float[]`` starting at ``k_scale + kh``)
        that keep alive the memory they point into, blocks included, for as long as they are held;
        indexing them from Python is bounds-checked."""
        kh, s = self.check_head(kv_head), self._state
        _not_empty(s.seq_len)
        if lib is not None:
            native.cover(lib, s.seq_len, self.n_kv_heads, self.head_dim, self.block_size)
        nkv = self.n_kv_heads
        end = s.seq_len * nkv  # the kernel reads kscale[t * nkv] for t < seq_len
        return (ffi.from_buffer("int8_t *[]", s.k_table[:s.n_blocks]),
                ffi.from_buffer("int8_t *[]", s.v_table[:s.n_blocks]),
                ffi.from_buffer("float[]", s.k_flat[kh:end]),
                ffi.from_buffer("float[]", s.v_flat[kh:end]),
                s.seq_len, self.kv_dim, self.block_size, nkv, kh * self.head_dim)


# A child forked while another thread of the parent was appending would inherit that cache's lock
# held, by a thread that does not exist in the child: its first append would wait forever.
def _table_with(table: _BlockTable, n_used: int, n_blocks: int, blocks: list) -> _BlockTable:
    """A table with entries for blocks 0 ... n_blocks - 1: ``table`` itself if it has room (entries
    past n_used are read by no one yet), else a copy of twice the size."""
    if table.shape[0] < n_blocks:
        grown = _new_table(max(n_blocks, 2 * table.shape[0]), blocks)
        grown[:n_used] = table[:n_used]
        table = grown
    for i in range(n_used, n_blocks):  # blocks never move: only new ones need an entry
        table[i] = blocks[i].ctypes.data
    return table


def _read_only(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _not_empty(seq_len: int) -> None:
    if seq_len == 0:
        raise ValueError(_("the cache is empty: append at least one token before attending"))


def kv_cache(cache) -> KVCacheQ8:
    """``cache`` itself if it is a KVCacheQ8; TypeError otherwise."""
    if not isinstance(cache, KVCacheQ8):
        raise TypeError(_("cache must be a lessonkit.KVCacheQ8; got {cache}").format(cache=type(cache).__name__))
    return cache


def attention_call(cache, kv_head, scale) -> tuple[int, float]:
    """The checks every attention call over a cache shares: ``cache`` a KVCacheQ8 holding at least
    one token, ``kv_head`` one of its kv heads, ``scale`` a float32-sized number (None: 1/sqrt of
    its head_dim). Returns (kv_head, scale) as the kernel takes them."""
    kv_head = kv_cache(cache).check_head(kv_head)
    scale = check.scale(scale, cache.head_dim)
    _not_empty(cache.seq_len)
    return kv_head, scale


def attention_args(q, cache, kv_head, scale) -> tuple[np.ndarray, int, float]:
    """``attention_call``'s checks, and ``q`` float32 ``[head_dim]``: returns (q, kv_head, scale)."""
    kv_head, scale = attention_call(cache, kv_head, scale)
    return check.float32_array("q", q, (cache.head_dim,)), kv_head, scale
