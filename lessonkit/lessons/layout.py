"""The q8 KV cache's layout, read and drawn (lesson 03): where the kernel finds each token's codes and scale
(``Where``: article 8-3's layout, used in article 9-2 section 2), read back through the raw pointer table."""
from __future__ import annotations

from dataclasses import dataclass

import cffi
import numpy as np

from ..core import native
from ..display import plotstyle
from ..core import validate as check
from ..core.cache import KVCacheQ8, kv_cache
from ..display.checks import Checks
from ..core.language import _
from .bench import lengths

MAX_GROW_BYTES = 4 << 30  # what grow_layer may allocate: the cache at its last checkpoint and one fp32 chunk
MAX_DRAWN_ROWS = 48
# (n_kv_heads, head_dim, kv_bs, seq_len): a half-filled last block, one token per block, one block larger than the
# context, the largest head the kernel's buffers take (HD_MAX = 256), one kv head
LAYOUT_CASES = ((3, 32, 4, 10), (2, 64, 1, 5), (4, 128, 64, 7), (2, 256, 5, 13), (1, 32, 3, 1))


@dataclass(frozen=True)
class Where:
    """Where the kernel finds token t of kv head kh (counts in int8 values = bytes)."""
    t: int
    kv_head: int
    block: int              # t / kv_bs: which entry of the pointer table
    row: int                # t % kv_bs: which token row inside that block
    kh_off: int             # kh * hd: where this head starts inside the row
    offset: int             # row * kv_dim + kh_off: bytes from the block's start
    scale_index: int        # t * nkv: the index the kernel uses on kscale = k_scale + kh
    flat_scale_index: int   # t * nkv + kh: the same float, counted from k_scale itself


def locate(t: int, kv_head: int, kv_bs: int, n_kv_heads: int, head_dim: int) -> Where:
    """The article's arithmetic for token ``t``, kv head ``kv_head``."""
    t = check.integer("t", t, minimum=0)
    kv_bs = check.integer("kv_bs", kv_bs, minimum=1)
    nkv = check.integer("n_kv_heads", n_kv_heads, minimum=1)
    hd = check.integer("head_dim", head_dim, minimum=1)
    kh = check.integer("kv_head", kv_head, minimum=0, below=nkv)
    block, row = divmod(t, kv_bs)
    return Where(t, kh, block, row, kh * hd, row * nkv * hd + kh * hd, t * nkv, t * nkv + kh)


def read_token(cache: KVCacheQ8, t: int, kv_head: int, which: str = "k", ffi=None):
    """Token ``t`` of ``kv_head`` read through the raw pointer table as the kernel reads it:
    ``(codes int8 [head_dim], raw scale)``, the scale from the pointer the kernel is handed."""
    kv_cache(cache)
    check.one_of("which", which, ("k", "v"))
    t = check.integer("t", t, minimum=0, below=cache.seq_len)
    ffi = native.load()[0] if ffi is None else ffi
    if not isinstance(ffi, cffi.FFI):
        raise TypeError(_("ffi must be the cffi.FFI of lessonkit.native.load(); got {ffi}").format(
                          ffi=type(ffi).__name__))
    w = locate(t, kv_head, cache.block_size, cache.n_kv_heads, cache.head_dim)
    row = ffi.cast("int8_t *", int(cache.pointer_table(which)[w.block])) + w.offset
    codes = np.frombuffer(ffi.unpack(ffi.cast("char *", row), cache.head_dim), np.int8).copy()
    scales = cache.kernel_args(w.kv_head, ffi)[2 if which == "k" else 3]  # kscale = k_scale + kh
    return codes, float(scales[w.scale_index])


def kernel_reads(addresses, cache: KVCacheQ8, which: str = "k"):
    """Row addresses (``trace.k_rows`` / ``v_rows``) as ``(block, byte offset in it)``, -1 outside every block: the
    same on every run, unlike the addresses."""
    size = cache.block_size * cache.kv_dim
    a = np.asarray(addresses, np.uint64).astype(np.int64)
    blocks, offsets = np.full(a.shape, -1, np.int64), np.full(a.shape, -1, np.int64)
    for b, base in enumerate(cache.pointer_table(which).astype(np.int64)):
        inside = (a >= base) & (a < base + size)
        blocks[inside], offsets[inside] = b, a[inside] - base
    return blocks, offsets


def grow_layer(n_kv_heads: int, head_dim: int, block_size: int, checkpoints, chunk: int = 1024, seed: int = 0):
    """``(cache, rows)``: one layer's real ``KVCacheQ8`` grown with random K, V (one chunk appended again and again)
    up to each of the increasing ``checkpoints``, and its sizes at each (``nbytes``: codes and scales held)."""
    points = lengths("checkpoints", checkpoints, 1000, "checkpoints of one growth", longest=None)
    if not points or any(b <= a for a, b in zip(points, points[1:])):
        raise ValueError(_("checkpoints must be a non-empty increasing list of sequence lengths"))
    chunk = check.integer("chunk", chunk, minimum=1)
    nkv = check.integer("n_kv_heads", n_kv_heads, minimum=1)  # before KVCacheQ8 allocates its scales
    hd = check.head_dim(head_dim)
    bs = check.integer("block_size", block_size, minimum=1)
    check.memory(_("a layer of {points} tokens ({nkv} kv heads x {hd}, blocks of {bs})").format(
                   points=points[-1], nkv=nkv, hd=hd, bs=bs),
                 -(-points[-1] // bs) * bs * (2 * nkv * hd + 2 * 4 * nkv) + 2 * chunk * nkv * hd * 4, MAX_GROW_BYTES,
                 _("use a shorter last checkpoint, fewer kv heads or a smaller chunk"))
    cache = KVCacheQ8(nkv, hd, bs)
    rng = np.random.default_rng(seed)
    K, V = (rng.standard_normal((chunk, nkv, hd), dtype=np.float32) for unused in range(2))
    rows = []
    for target in points:
        while cache.seq_len < target:
            n = min(chunk, target - cache.seq_len)
            cache.append(K[:n], V[:n])
        rows.append(dict(seq_len=cache.seq_len, n_blocks=cache.n_blocks, nbytes=cache.nbytes,
                         block_bytes=sum(b.nbytes for b in cache.k_blocks + cache.v_blocks),
                         allocated_nbytes=cache.allocated_nbytes))
    return cache, rows


def draw_cache(cache: KVCacheQ8, highlight=(0, 0), which: str = "k", figsize=(10, 7.6)):
    """A small cache drawn from its own data: the pointer table (by block, never by address), the blocks as rows of
    tokens with the kv heads side by side, the scales ``[token][kv head]`` with their values, and the same scales in
    memory with the kernel's stride nkv; token t of kv head kh (``highlight``) framed everywhere."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import ConnectionPatch, Rectangle
    plotstyle.use()
    check.one_of("which", which, ("k", "v"))
    if cache.seq_len == 0:
        raise ValueError(_("the cache is empty: append at least one token before drawing it"))
    bs, nkv, hd, T, kv_dim, nb = (cache.block_size, cache.n_kv_heads, cache.head_dim, cache.seq_len, cache.kv_dim,
                                  cache.n_blocks)
    if nb * bs > MAX_DRAWN_ROWS:
        raise ValueError(_("draw_cache draws small caches: at most {MAX_DRAWN_ROWS} allocated rows; this one has "
                           "{nb_bs}").format(MAX_DRAWN_ROWS=MAX_DRAWN_ROWS, nb_bs=nb * bs))
    w = locate(check.integer("t", highlight[0], minimum=0, below=T), highlight[1], bs, nkv, hd)
    name, sname = f"{which}_cache_q8", f"{which}scale"
    blocks = cache.k_blocks if which == "k" else cache.v_blocks
    scales = np.stack([(cache.k_scales if which == "k" else cache.v_scales)(kh) for kh in range(nkv)], 1)
    red, pink, pt = "#d62728", "#fde0dd", plotstyle.MIN_PT

    def hot(hit):  # text colour and weight of a highlighted label
        return dict(color=red if hit else "black", fontweight="bold" if hit else "normal")

    fig = plt.figure(figsize=figsize)
    gs = fig.add_gridspec(2, 3, width_ratios=[1.15, 5.0, 2.3], height_ratios=[6.0, 1.0], wspace=0.12, hspace=0.42)
    ax_p, ax_b, ax_s = (fig.add_subplot(gs[0, i]) for i in range(3))
    ax_f = fig.add_subplot(gs[1, :])
    gap = 0.8
    top = lambda b: b * (bs + gap)  # noqa: E731  y of block b's first row
    height = top(nb) - gap

    # the blocks: rows of tokens, kv heads side by side
    for b, blk in enumerate(blocks):
        im = ax_b.imshow(blk, cmap="coolwarm", vmin=-127, vmax=127, aspect="auto", interpolation="nearest",
                         extent=(0, kv_dim, top(b) + bs, top(b)))
        for r in range(bs):
            t, y = b * bs + r, top(b) + r + 0.5
            if t >= T:
                ax_b.add_patch(Rectangle((0, top(b) + r), kv_dim, 1, facecolor="0.85", edgecolor="0.6", hatch="//",
                                         lw=0.5))
                ax_b.text(kv_dim / 2, y, _("allocated, unused"), ha="center", va="center",
                          fontsize=pt, color="0.3", bbox=dict(fc="0.85", ec="none", pad=0.5), zorder=3)
            ax_b.text(kv_dim * 1.02, y, f"t={t}" if t < T else "-", ha="left", va="center", fontsize=pt,
                      **hot(t == w.t))
        ax_b.add_patch(Rectangle((0, top(b)), kv_dim, bs, fill=False, edgecolor="black", lw=1.5))
    for kh in range(nkv):
        if kh:
            ax_b.axvline(kh * hd, color="black", lw=2)
        ax_b.text((kh + 0.5) * hd, -0.35, _("head {kh}").format(kh=kh), ha="center", va="bottom", fontsize=pt,
                  color=red if kh == w.kv_head else "black")
    ax_b.add_patch(Rectangle((w.kh_off, top(w.block) + w.row), hd, 1, fill=False, edgecolor=red, lw=3.5))
    ax_b.set(xlim=(0, kv_dim * 1.17), ylim=(height + 0.2, -1.6), xticks=[kh * hd for kh in range(nkv + 1)], yticks=[])
    ax_b.spines["bottom"].set_bounds(0, kv_dim)
    ax_b.set_xlabel(_("byte offset in a row (kv_dim = {nkv} x {hd} = {kv_dim} bytes)").format(
                      nkv=nkv, hd=hd, kv_dim=kv_dim), fontsize=pt)
    cax = ax_p.inset_axes((0.62, 0.0, 0.1, 0.24))
    cb = fig.colorbar(im, cax=cax, orientation="vertical")
    cax.yaxis.set_ticks_position("left")
    cax.yaxis.set_label_position("left")
    cb.set_label(_("int8 code"), fontsize=pt)
    cb.set_ticks([-127, 0, 127])

    # the pointer table: one labelled entry per block, arrows to the blocks
    y0 = max(0.0, height / 2 - nb / 2)
    for b in range(nb):
        y, hit = y0 + b, b == w.block
        ax_p.add_patch(Rectangle((0.05, y), 0.9, 1.0, facecolor=pink if hit else "white",
                                 edgecolor=red if hit else "black", lw=2.5 if hit else 1.2))
        ax_p.text(0.5, y + 0.5, f"[{b}]", ha="center", va="center", fontsize=pt)
        fig.add_artist(ConnectionPatch((0.95, y + 0.5), (0, top(b)), "data", "data", axesA=ax_p, axesB=ax_b,
                                       arrowstyle="-|>", mutation_scale=14, lw=2 if hit else 1,
                                       color=red if hit else "0.3"))
    ax_p.text(0.5, y0 - 0.3, _("{name}\n(one pointer\nper block)").format(name=name), ha="center",
              va="bottom", fontsize=pt)
    ax_p.set(xlim=(0, 1), ylim=(height + 0.2, -1.6))
    ax_p.axis("off")

    # the scales [token][kv head], values written in plain cells; pink: the kernel's column (kv head kh)
    for t in range(T):
        for kh in range(nkv):
            ax_s.add_patch(Rectangle((kh, t), 1, 1, facecolor=pink if kh == w.kv_head else "white",
                                     edgecolor="0.4", lw=0.8))
            ax_s.text(kh + 0.5, t + 0.5, f"{scales[t, kh]:.2f}", ha="center", va="center", fontsize=pt,
                      **hot((t, kh) == (w.t, w.kv_head)))
    ax_s.add_patch(Rectangle((w.kv_head, w.t), 1, 1, fill=False, edgecolor=red, lw=3.5))
    ax_s.set(xlim=(0, nkv), ylim=(T, 0))
    ax_s.set_xticks(np.arange(nkv) + 0.5, [f"{kh}" for kh in range(nkv)], fontsize=pt)
    ax_s.set_yticks(np.arange(T) + 0.5, [f"t={t}" for t in range(T)], fontsize=pt)
    ax_s.tick_params(axis="y", labelright=True, labelleft=False, right=True, left=False)
    ax_s.set_xlabel(_("kv head"), fontsize=pt)
    ax_s.set_title(_("{which}_scale: raw max|x|").format(which=which), fontsize=pt)

    # the same scales in memory: the kernel hops nkv floats per token
    n = T * nkv
    for i in range(n):
        t, kh = divmod(i, nkv)
        ax_f.add_patch(Rectangle((i, 0), 1, 1, facecolor=pink if kh == w.kv_head else "white", edgecolor="0.4", lw=0.8))
        ax_f.text(i + 0.5, 0.5, f"{i}", ha="center", va="center", fontsize=pt,
                  color=red if i == w.flat_scale_index else "black")
        if kh == w.kv_head and t + 1 < T:
            ax_f.annotate("", xy=(i + nkv + 0.5, 1.0), xytext=(i + 0.5, 1.0),
                          arrowprops=dict(arrowstyle="-|>", color=red, lw=1.2, connectionstyle="arc3,rad=-0.45"))
        if t != (i + 1) // nkv or i + 1 == n:
            ax_f.axvline(i + 1, ymin=0.0, ymax=0.5, color="black", lw=1.5)
    ax_f.add_patch(Rectangle((w.flat_scale_index, 0), 1, 1, fill=False, edgecolor=red, lw=3))
    ax_f.set(xlim=(-0.5, n + 0.5), ylim=(-0.1, 2.1), yticks=[])
    ax_f.set_xticks(np.arange(0, n, nkv) + nkv / 2, [f"t={t}" for t in range(T)], fontsize=pt)
    ax_f.tick_params(axis="x", length=0)
    for ax in (ax_b, ax_f):
        ax.spines[["left", "right", "top"]].set_visible(False)
    for ax in (ax_s, ax_f):
        ax.grid(False)
    ax_f.set_title(_("{which}_scale in memory, by index; red arcs: the kernel's steps of nkv = {nkv} from {sname} "
                     "= {which}_scale + {kv_head}").format(which=which, nkv=nkv, sname=sname, kv_head=w.kv_head),
                   fontsize=pt, pad=12)
    fig.suptitle(_("{T} tokens, {nkv} kv heads x {hd}, kv_bs {bs}: token {t} of kv head {kv_head} in red\n").format(
                   T=T, nkv=nkv, hd=hd, bs=bs, t=w.t, kv_head=w.kv_head)
                 + f"{name}[{w.t} / {bs} = {w.block}] + ({w.t} % {bs} = {w.row}) * {kv_dim} + {w.kh_off}"
                 + _(" = block {block} + {offset} bytes").format(block=w.block, offset=w.offset),
                 fontsize=13, color="black")
    return fig


def check_layout(ffi=None, seed: int = 0) -> Checks:
    """Lesson 03's check on ``LAYOUT_CASES`` through the compiled kernel's trace, item by item as its results name
    them; the scores to rtol 1e-6 (a scale off by 127 misses by 100x)."""
    from ..core.attention import attend
    from ..core.quant import quantize_kv_rows
    from .dataflow import replay_scores
    from .synthetic import cache_of
    ffi = ffi if ffi is not None else native.load()[0]
    rng = np.random.default_rng(seed)
    out = Checks()
    for nkv, hd, kv_bs, T in LAYOUT_CASES:
        case = f"nkv={nkv} hd={hd} kv_bs={kv_bs} T={T}"
        K, V = (rng.standard_normal((T, nkv, hd), dtype=np.float32) for unused in range(2))
        cache, q = cache_of(K, V, kv_bs), rng.standard_normal(hd, dtype=np.float32)
        tt = np.arange(T)
        addr_ok = read_ok = score_ok = True
        for kh in range(nkv):
            unused, trc = attend(q, cache, kh, trace=True)
            for rows, which in ((trc.k_rows, "k"), (trc.v_rows, "v")):
                b, o = kernel_reads(rows, cache, which)
                addr_ok &= bool((b == tt // kv_bs).all() and (o == (tt % kv_bs) * cache.kv_dim + kh * hd).all())
            for which, X in (("k", K), ("v", V)):
                codes, scales = quantize_kv_rows(np.ascontiguousarray(X[:, kh]))
                for t in range(T):
                    c, s = read_token(cache, t, kh, which, ffi)
                    read_ok &= bool((c == codes[t]).all()) and s == scales[t]
            s = replay_scores(trc.dots, trc.q_scales, cache.k_scales(kh), 1 / np.sqrt(hd))
            score_ok &= bool(np.allclose(trc.s, s, rtol=1e-6, atol=1e-7))
        out.add(_("rows read at the layout's address ({case})").format(case=case), addr_ok,
                _("a K or V row was read elsewhere"))
        out.add(_("codes and raw scales through the pointer table ({case})").format(case=case),
                read_ok, _("a row read back differs from the C quantizer's"))
        out.add(_("scores = dots * qsc * (raw max / 127) * scale ({case})").format(case=case), score_ok,
                _("the kernel's scores do not follow the raw-max scale"))
    # an all-zero K row: the quantizer's guard writes scale 0 and codes 0; the kernel needs no guard
    K = rng.standard_normal((6, 2, 32), dtype=np.float32)
    K[2, 1] = 0.0
    zc = cache_of(K, K, 4)
    zout, ztr = attend(rng.standard_normal(32, dtype=np.float32), zc, 1, trace=True)
    out.add(_("all-zero row: scale 0 and codes 0"),
            zc.k_scales(1)[2] == 0 and not zc.k_codes(1)[2].any(), f"scale {float(zc.k_scales(1)[2])}")
    out.add(_("all-zero row: score exactly 0, output finite"),
            ztr.s[2] == 0 and np.isfinite(zout).all(), _("score {s_ztr}").format(s_ztr=float(ztr.s[2])))
    # the error bound, with a channel 20x louder than the rest (it sets every row's step)
    X = rng.standard_normal((256, 1, 128), dtype=np.float32)
    X[:, 0, 7] *= 20
    ec = cache_of(X, X, 16)
    err = np.abs(ec.dequantized(0)[0] - X[:, 0]) / (ec.k_scales(0)[:, None] / 127)
    out.add(_("|error| <= half a step (+1e-5 for float32 rounding)"),
            err.max() <= 0.5 + 1e-5, f"max |error| / step = {err.max():.6f}")
    return out
