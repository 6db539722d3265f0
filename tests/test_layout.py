"""lessonkit.layout (lesson 03): the article's arithmetic, read-back through the raw pointer table,
the kernel's own row addresses, byte counts of a growing cache, kernel lines, the drawing."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import lessonkit as lk  # noqa: E402
from lessonkit import layout  # noqa: E402
from lessonkit.quant import quantize_kv_rows  # noqa: E402

from conftest import make_case  # noqa: E402


def test_locate_worked_example():
    # token 37, kv head 5, kv_bs 16, 8 kv heads of 128: block 2, row 5, 5 * 1024 + 5 * 128 bytes in
    w = layout.locate(37, 5, 16, 8, 128)
    assert (w.block, w.row, w.kh_off, w.offset) == (2, 5, 640, 5760)
    assert (w.scale_index, w.flat_scale_index) == (296, 301)


@pytest.mark.parametrize("kv_bs,nkv,hd", [(1, 1, 32), (4, 3, 32), (7, 2, 64), (64, 8, 128)])
def test_locate_matches_one_long_array(kv_bs, nkv, hd):
    """Independent check: if the blocks were laid end to end, token t of head kh would start at
    t * kv_dim + kh * hd; cut that long array into blocks of kv_bs * kv_dim bytes."""
    kv_dim = nkv * hd
    for t in range(3 * kv_bs + 2):
        for kh in range(nkv):
            pos = t * kv_dim + kh * hd
            w = layout.locate(t, kh, kv_bs, nkv, hd)
            assert (w.block, w.offset) == divmod(pos, kv_bs * kv_dim)
            assert w.flat_scale_index == np.ravel_multi_index((t, kh), (t + 1, nkv))


def test_locate_rejects_bad_head():
    with pytest.raises(ValueError, match="kv_head"):
        layout.locate(0, 3, 4, 3, 32)


@pytest.mark.parametrize("seq_len,nkv,hd,bs", [(10, 3, 32, 4), (37, 2, 64, 7), (5, 1, 32, 1)])
def test_read_token_equals_independent_quantization(seq_len, nkv, hd, bs):
    cache, _, K, V = make_case(2, seq_len, nkv, hd, bs)
    for kh in range(nkv):
        for which, X in (("k", K), ("v", V)):
            codes, scales = quantize_kv_rows(np.ascontiguousarray(X[:, kh]))
            for t in range(seq_len):
                c, s = layout.read_token(cache, t, kh, which)
                np.testing.assert_array_equal(c, codes[t])
                assert s == scales[t] == np.abs(X[t, kh]).max()


def test_read_token_checks_arguments(small_case):
    cache = small_case[0]
    with pytest.raises(ValueError, match="which"):
        layout.read_token(cache, 0, 0, "q")
    with pytest.raises(ValueError, match="t must be below"):
        layout.read_token(cache, cache.seq_len, 0)


def test_kernel_reads_are_the_article_arithmetic():
    cache, q, _, _ = make_case(4, 23, 3, 32, 4)
    for kh in range(3):
        _, tr = lk.attend(q, cache, kh, trace=True)
        for which, rows in (("k", tr.k_rows), ("v", tr.v_rows)):
            blocks, offsets = layout.kernel_reads(rows, cache, which)
            t = np.arange(23)
            np.testing.assert_array_equal(blocks, t // 4)
            np.testing.assert_array_equal(offsets, (t % 4) * 96 + kh * 32)
    # an address in no block is reported as -1, not attributed to a neighbour
    outside = int(cache.pointer_table("k").max()) + 10**9
    b, o = layout.kernel_reads([outside], cache)
    assert b.tolist() == [-1] and o.tolist() == [-1]


def test_grow_layer_byte_counts():
    nkv, hd, bs = 2, 64, 16
    cache, rows = layout.grow_layer(nkv, hd, bs, [1, 16, 17, 100], chunk=7)
    assert cache.seq_len == 100
    for r in rows:
        T = r["seq_len"]
        assert r["n_blocks"] == -(-T // bs)
        assert r["nbytes"] == T * (2 * nkv * hd + 2 * 4 * nkv)      # codes + one fp32 per (token, head), K and V
        assert r["block_bytes"] == 2 * r["n_blocks"] * bs * nkv * hd  # whole blocks of int8
        assert r["allocated_nbytes"] >= r["block_bytes"] + 2 * 4 * nkv * T
    assert [r["seq_len"] for r in rows] == [1, 16, 17, 100]
    with pytest.raises(ValueError, match="increasing"):
        layout.grow_layer(nkv, hd, bs, [10, 10])


def test_draw_cache_frames_the_highlighted_token():
    cache, _, _, _ = make_case(3, 10, 3, 32, 4)
    fig = layout.draw_cache(cache, highlight=(6, 1))
    try:
        ax_p, ax_b, ax_s, ax_f = fig.axes[:4]
        frames = [p for p in ax_b.patches
                  if matplotlib.colors.same_color(p.get_edgecolor(), "#d62728") and not p.get_fill()]
        assert [(p.get_x(), p.get_width()) for p in frames] == [(32, 32)]   # kh_off = 32, one head wide
        # block 1 starts below block 0 and a gap; row 6 % 4 = 2 of block 1
        assert frames[0].get_y() == pytest.approx(1 * (4 + 0.8) + 2)
        # the 2 unused rows of the last block are drawn
        assert sum(t.get_text() == "allocated, unused" for t in ax_b.texts) == 2
        # every scale cell shows its value; the memory strip numbers all 30 floats and marks 6 * 3 + 1 in red
        assert len(ax_s.texts) == 30 and all(t.get_text().replace(".", "").isdigit() for t in ax_s.texts)
        red = [t.get_text() for t in ax_f.texts if matplotlib.colors.same_color(t.get_color(), "#d62728")]
        assert red == ["19"] and [t.get_text() for t in ax_f.texts if t.get_text()] == [str(i) for i in range(30)]
    finally:
        plt.close(fig)


def test_draw_cache_refuses_big_or_empty_caches():
    big = make_case(0, 100, 1, 32, 4)[0]
    with pytest.raises(ValueError, match="small caches"):
        layout.draw_cache(big)
    with pytest.raises(ValueError, match="empty"):
        layout.draw_cache(lk.KVCacheQ8(1, 32, 4))


def test_check_layout_passes_and_can_fail(monkeypatch):
    """Lesson 03's one-line check passes on the real kernel, and reports a failure when the
    pointer-table read is wrong (a check that cannot fail would be worth nothing)."""
    assert layout.check_layout(), str(layout.check_layout())
    real = layout.read_token
    monkeypatch.setattr(layout, "read_token", lambda *a, **k: (real(*a, **k)[0] + 1, real(*a, **k)[1]))
    bad = layout.check_layout()
    assert not bad and "FAILED" in str(bad) and "pointer table" in str(bad)
