"""The benchmark's own numpy variants compute attention (they are not just timed), and a tiny
run produces every row and the report. Speed is never asserted here."""
from __future__ import annotations

import numpy as np

import lessonkit as lk
from lessonkit import bench, kernels


def test_numpy_variants_compute_attention():
    cache, kv_head, q, K, V = bench.make_inputs(300, n_kv_heads=2)
    scale = 1 / np.sqrt(bench.HEAD_DIM)
    f32 = bench.numpy_f32(q, K, V, scale)
    np.testing.assert_allclose(f32, lk.reference.attention(q, K, V, scale), rtol=1e-4, atol=1e-6)
    int8 = bench.numpy_int8(q, cache, kv_head, scale)  # float q against the dequantized cache
    Kd, Vd = cache.dequantized(kv_head)
    np.testing.assert_allclose(int8, lk.reference.attention(q, Kd, Vd, scale), rtol=1e-4, atol=1e-6)


def test_tiny_run_reports_every_row():
    result = bench.run([512], repeats=1)
    row = result["rows"][512]
    assert set(row) == {*bench.KERNELS, "numpy_f32", "numpy_int8"}
    assert all(r["ns_per_token"] > 0 and r["gbps"] > 0 for r in row.values())
    assert result["read_gbps"] > 0
    text = bench.report(result)
    assert "single-thread read bandwidth" in text and "targets" in text


def test_beyond_rows_compute_attention():
    """What lesson 08's rows time computes attention: the grouped call's outputs (from the C timing
    loop itself) equal four per-head kernel calls, and the per-head loop's equal them too; the split
    call equals the single pass."""
    cache, kv_head, q, K, V = bench.make_inputs(700, n_kv_heads=2)
    qs = bench.group_queries()
    assert qs.shape == (bench.GQA_G, bench.HEAD_DIM)
    want = np.stack([lk.attend(qs[g], cache, kv_head) for g in range(bench.GQA_G)])
    for variant in ("group", "per_head"):
        out = np.full(qs.shape, np.nan, np.float32)
        assert kernels.time_group(qs, cache, kv_head, variant=variant, repeats=1, number=2, out=out) > 0
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=variant)
    for threads in (1, 2):
        got = lk.attend_split(q, cache, kv_head, bench.SPLIT_CHUNKS, threads)
        np.testing.assert_allclose(got, lk.attend(q, cache, kv_head), rtol=0, atol=2e-5 * np.abs(got).max())


def test_tiny_run_reports_beyond_rows_and_ratios():
    result = bench.run([600], repeats=1, beyond_lengths=[600])
    row = result["rows"][600]
    assert set(bench.BEYOND) <= set(row) and result["parallel_capacity"] > 0
    assert all(row[name]["ns_per_token"] > 0 for name in bench.BEYOND)
    text = bench.report(result)
    assert "lesson 08 at 0K: grouped" in text and "split-KV on 2 threads" in text
    ratios = bench.beyond_ratios(row)
    assert ratios["group"] > 0 and ratios["split"] > 0
    # the 256K targets appear only when 256K was measured; a fake 256K row shows them
    fake = dict(result, rows={262144: row})
    whats = [t[0] for t in bench.targets(fake)]
    assert any("grouped call vs 4 per-head" in w for w in whats)
    assert any("2 threads vs 1 thread" in w for w in whats)
    assert bench.run([600], repeats=1)["rows"][600].keys().isdisjoint(bench.BEYOND)  # not below 8K by default
