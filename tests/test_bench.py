"""The benchmark's own numpy variants compute attention (they are not just timed), and a tiny
run produces every row and the report. Speed is never asserted here."""
from __future__ import annotations

import numpy as np

import lessonkit as lk
from lessonkit import bench


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
