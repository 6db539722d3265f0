"""The benchmark's own numpy variants compute attention (they are not just timed), and a tiny
run produces every row and the report. Speed is never asserted here."""
from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import kernels
from workbench import bench, llama_ggml

needs_ggml = pytest.mark.skipif(llama_ggml.load()[0] is None, reason=str(llama_ggml.load()[1]))


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
    want = {*bench.KERNELS, "numpy_f32", "numpy_int8"} | ({"fast"} if bench.fast_built() else set())
    want |= {"lowp"} if "lowp" in bench.timing.VARIANTS else set()
    if llama_ggml.load()[0] is not None:
        want |= set(bench.GGML_ROWS)
    else:
        assert result["skipped"]["ggml"].startswith("skipped: pip install -e '.[bench]'")
    assert set(row) == want
    assert all(r["ns_per_token"] > 0 and r["gbps"] > 0 for r in row.values())
    assert result["read_gbps"] > 0 and result["read_gbps_2t"] > 0
    text = bench.report(result)
    assert "read bandwidth (this run)" in text and "targets" in text
    assert "llama.cpp's cited" not in text


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
    assert any("grouped call vs 4 calls of fast" in w for w in whats)
    assert any("2 threads vs 1 thread" in w for w in whats)
    assert bench.run([600], repeats=1)["rows"][600].keys().isdisjoint(bench.BEYOND)  # not below 8K by default


def _ggml(qs, K, V, scale):
    """One ggml flash attention, [G, head_dim] ([head_dim] for one query)."""
    with llama_ggml.FlashAttnQ8(qs, K, V, scale) as fa:
        fa.compute()
        return fa.output()[0] if np.ndim(qs) == 1 else fa.output()


@needs_ggml
def test_ggml_rows_compute_attention_and_the_check_can_fail():
    """llama.cpp's graph computes attention over ggml's q8_0 of the same K/V: within the stated
    CHECK_RTOL of the float64 reference over the q8_0-rounded inputs, on 1 and 2 threads, 1 and 4
    heads; and the check rejects a wrong answer (another head's output, a wrong scale)."""
    cache, kv_head, q, K, V = bench.make_inputs(700)
    scale = 1 / np.sqrt(bench.HEAD_DIM)
    for qs in (q[None], bench.group_queries()):
        want = llama_ggml.expected(qs, K, V, scale)
        with llama_ggml.FlashAttnQ8(qs, K, V, scale, (1, 2)) as fa:
            for t in (1, 2):
                fa.compute(t)
                assert llama_ggml.check_output(fa.output(), want) <= llama_ggml.CHECK_RTOL
        # against the float reference (no rounding of q, K, V) it is only close: q8_0's own error
        float_ref = np.stack([lk.reference.attention(x, K, V, scale) for x in qs])
        assert np.abs(_ggml(qs, K, V, scale) - float_ref).max() < 0.05 * np.abs(float_ref).max()
    wrong_scale = _ggml(q, K, V, 2 * scale)
    with pytest.raises(AssertionError, match="above"):
        llama_ggml.check_output(wrong_scale[None], llama_ggml.expected(q, K, V, scale))
    qs = bench.group_queries()
    got = _ggml(qs, K, V, scale)
    with pytest.raises(AssertionError, match="above"):
        llama_ggml.check_output(got[::-1], llama_ggml.expected(qs, K, V, scale))  # heads swapped


@needs_ggml
def test_ggml_refuses_bad_inputs_before_c():
    K = np.zeros((10, 128), np.float32)
    with pytest.raises(ValueError, match="multiple of 32"):
        llama_ggml.FlashAttnQ8(np.zeros(100, np.float32), K[:, :100], K[:, :100])
    with pytest.raises(ValueError, match="finite"):
        llama_ggml.FlashAttnQ8(np.full(128, np.nan, np.float32), K, K)
    with pytest.raises(ValueError, match="shape"):
        llama_ggml.FlashAttnQ8(np.zeros(128, np.float32), K, K[:5])
    with pytest.raises(ValueError, match="cap"):
        llama_ggml.FlashAttnQ8(np.zeros(128, np.float32), K, K, threads=(10_000,))
    with llama_ggml.FlashAttnQ8(np.zeros(128, np.float32), K, K, threads=(1,)) as fa:
        with pytest.raises(ValueError, match="plans built"):
            fa.compute(2)
    with pytest.raises(RuntimeError, match="closed"):
        fa.compute()


def test_interleaved_alternates_and_takes_medians():
    calls = []
    ticks = {"a": itertools.count(10), "b": itertools.count(100)}

    def make(name):
        return lambda: calls.append(name) or next(ticks[name])

    got = bench.interleaved({"a": make("a"), "b": make("b")}, rounds=3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-ups, then rotated rounds
    assert got == {"a": 12.0, "b": 102.0}  # medians of samples 11..13 and 101..103 (after warm-up)


def _fake(fast_why=None, ggml=True, **ns):
    """A result with the given ns/token per row at 8K and 256K (read bandwidth 10 GB/s)."""
    rows = {T: {name: dict(ns_per_token=v, gbps=264 / v) for name, v in ns.items()} for T in (8192, 262144)}
    skipped = {} if fast_why is None else {"fast": fast_why}
    if not ggml:
        skipped["ggml"] = "skipped: pip install -e '.[bench]' (no module named ggml)"
    return dict(rows=rows, skipped=skipped, read_gbps=10.0, read_gbps_2t=15.0)


def test_targets_met_and_miss():
    good = _fake(neon=25.0, fast=10.0, ggml_h1_t1=40.0, numpy_f32=41.0, group4=13.0, per_head_fast4=40.0,
                 split_1t=30.0, split_2t=18.0)
    status = {what: (got, st) for what, got, _, st in bench.targets(good)}
    assert all(st == "met" for _, st in status.values()), status
    assert status["8K: fast vs the article kernel (neon), x faster"][0] == pytest.approx(2.5)
    # 264 bytes / 10 ns = 26.4 GB/s against 10: share 2.64
    assert status["256K: fast bytes/ns as a share of 1-thread read bandwidth"][0] == pytest.approx(2.64)
    assert status["256K: GQA, 1 grouped call vs 4 calls of fast, x faster"][0] == pytest.approx(40 / 13)
    bad = _fake(neon=20.0, fast=10.0, ggml_h1_t1=30.0, numpy_f32=39.0, group4=30.0, per_head_fast4=40.0,
                split_1t=30.0, split_2t=20.0)
    bad["read_gbps"] = 40.0
    assert all(st == "MISS" for *_, st in bench.targets(bad)), bench.targets(bad)


def test_targets_without_fast_or_ggml_say_why():
    r = _fake(fast_why="not built", ggml=False, neon=25.0, numpy_f32=41.0, split_1t=30.0, split_2t=18.0)
    st = {what: s for what, _, _, s in bench.targets(r)}
    assert st["8K: fast vs the article kernel (neon), x faster"] == "not built"
    assert st["256K: split-KV 2 chunks, 2 threads vs 1 thread, x faster"] == "met"
    r["skipped"].pop("fast")
    r["rows"][8192]["fast"] = dict(ns_per_token=5.0, gbps=52.8)
    assert st != (st2 := {what: s for what, _, _, s in bench.targets(r)})
    assert st2["8K: fast vs llama.cpp q8_0, 1 head, 1 thread, x faster"].startswith("skipped: pip install")
    del r["rows"][262144]
    assert bench.targets(r)[-1][3].startswith("not measured")


def _no_run(monkeypatch):
    """bench.main without the (long) run: a fixed result, its report and targets."""
    monkeypatch.setattr(bench, "run", lambda *a, **k: {"rows": {512: {}}})
    monkeypatch.setattr(bench, "report", lambda result: "report")
    monkeypatch.setattr(bench, "targets", lambda result: [])


def test_json_is_written_whole(tmp_path, monkeypatch, full_disk):
    """--json replaces its file in one rename: a failed write leaves the old figures, no temporary."""
    _no_run(monkeypatch)
    out = tmp_path / "bench.json"
    assert bench.main(["--json", str(out)]) == 0
    assert json.loads(out.read_text()) == {"rows": {"512": {}}, "targets": []}
    out.write_text("old")
    full_disk()
    with pytest.raises(OSError):
        bench.main(["--json", str(out)])
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["bench.json"]


@pytest.mark.parametrize("where,why", [
    ("missing/bench.json", "there is no folder"),
    ("a_file/bench.json", "there is no folder"),
    ("", "is a folder"),
    pytest.param("/proc/bench.json", "cannot write a file in /proc",
                 marks=pytest.mark.skipif(not os.path.isdir("/proc"), reason="no /proc here")),
], ids=["no folder", "a file for a folder", "a folder", "/proc"])
def test_an_unwritable_json_path_is_refused_before_the_run(tmp_path, monkeypatch, capsys, where, why):
    """make bench BENCH_ARGS="--json PATH" writes PATH after minutes of timing: a PATH that cannot be
    written is argparse's error (exit 2), naming it, before anything runs."""
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("the run started before --json was checked"))
    (tmp_path / "a_file").write_text("")
    path = tmp_path / where  # /proc/... stays absolute
    with pytest.raises(SystemExit) as stop:
        bench.main(["--json", str(path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"error: --json {path}" in err and why in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # the probe left nothing behind


@pytest.mark.parametrize("empty", ["", " "])
def test_an_empty_json_path_is_refused_before_the_run(monkeypatch, capsys, empty):
    monkeypatch.setattr(bench, "run", lambda *a, **k: pytest.fail("the run started before --json was checked"))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--json", empty])
    assert stop.value.code == 2 and "--json needs a file name" in capsys.readouterr().err


def test_each_python_sample_times_one_cold_call_then_warm_ones():
    calls = []
    sample = bench.per_call(lambda: calls.append(1), 3)
    assert sample() >= 0 and len(calls) == 4 and len(sample.colds) == 1   # 1 alone, then 3 back to back
    sample()
    assert len(calls) == 8 and len(sample.colds) == 2


def test_rows_say_warm_and_cold_and_the_overhead_row_is_printed():
    result = bench.run([512], repeats=1)
    row = result["rows"][512]
    for name in ("neon", "numpy_f32", "numpy_int8"):
        assert row[name]["cold_ns_per_token"] > 0 and row[name]["ns_per_token"] > 0, name
    o = result["attend_overhead"]
    assert o["seq_len"] == bench.OVERHEAD_LENGTH and o["attend_us"] > 0 and o["kernel_us"] > 0
    text = bench.report(result)
    assert "ns/token warm" in text and "ns/token cold" in text and "warm: back-to-back calls" in text
    assert "lk.attend overhead per call beyond the kernel (1K tokens), us" in text


def test_targets_computed_cold_are_printed_where_they_differ():
    r = _fake(neon=25.0, fast=10.0, numpy_f32=41.0, split_1t=30.0, split_2t=18.0)
    for T in r["rows"]:
        for name, v in r["rows"][T].items():
            cold = v["ns_per_token"] * (4 if name == "numpy_f32" else 1)
            v.update(cold_ns_per_token=cold, cold_gbps=264 / cold)
    r["attend_overhead"] = dict(seq_len=1024, attend_us=40.0, kernel_us=15.0, overhead_us=25.0)
    lines = bench.warm_cold_lines(r)
    cold = [l for l in lines if l.startswith("  cold")]
    assert cold == ["  cold  8K: fast vs numpy float32, x faster: 16.40 (warm 4.10; target 4)"], lines
    assert lines[-1].startswith("  MISS  lk.attend overhead") and "25.0 (target <= 20)" in lines[-1]
    r["attend_overhead"]["overhead_us"] = 20.0
    assert bench.overhead_target(r)[3] == "met"


def test_verdicts_from_the_rounds():
    """With every round's figure kept, the middle half of the rounds decides a ratio; a middle half across the
    target is no verdict (the run's spread is too wide), and the report says so. A share of the read bandwidth
    is the fastest round's, whatever the median round did (bench.share)."""
    assert bench.verdict(0.9, 0.85, [0.86, 0.88, 0.9, 0.91, 0.95]) == "met"
    assert bench.verdict(0.8, 0.85, [0.7, 0.8, 0.8, 0.82, 0.9]) == "MISS"
    assert bench.verdict(0.86, 0.85, [0.7, 0.8, 0.86, 0.9, 0.95]).startswith("unclear: the middle half of its 5")
    assert bench.verdict(0.9, 0.85, None) == "met" and bench.verdict(0.8, 0.85, []) == "MISS"
    r = _fake(fast=10.0, lowp=10.0, per_head_fast4=40.0, group4=13.0, group4_lowp=12.0)
    r["rows"][262144]["lowp"]["rounds"] = [9.0, 40.0, 40.0, 40.0, 40.0]   # 264 / ns / 10 GB/s: 2.9, then 0.66
    r["rows"][262144]["fast"]["rounds"] = [36.0, 40.0, 40.0, 40.0, 40.0]  # at best 0.73, below 0.75
    r["rows"][262144]["per_head_fast4"]["rounds"] = [40.0, 40.0, 40.0]
    r["rows"][262144]["group4"]["rounds"] = [13.0, 20.0, 13.0]
    st = {what: s for what, _, _, s in bench.targets(r)}
    assert st["256K: lowp bytes/ns as a share of 1-thread read bandwidth"] == "met"
    assert st["256K: fast bytes/ns as a share of 1-thread read bandwidth"] == "MISS"
    shares = {what: got for what, got, _, _ in bench.targets(r)}
    assert shares["256K: lowp bytes/ns as a share of 1-thread read bandwidth"] == pytest.approx(264 / 9 / 10)
    assert bench.share(r, 262144, "lowp", at="median") == pytest.approx(2.64)  # the row's figure, 10 ns
    assert st["256K: GQA, 1 grouped call vs 4 calls of fast, x faster"].startswith("unclear")
    assert any(line.startswith("  wide  256K: GQA, 1 grouped call vs 4 calls of fast") and "[unclear: " in line
               for line in bench.target_lines(r))


def test_memory_section_names_both_probes_and_pagings():
    r = _fake(fast=12.0, lowp=10.0, fast_4k=18.0, lowp_4k=16.0)
    r.update(read_gbps_4k=8.0, machine="AMD EPYC, x86_64, kernel backend simde-x86_64",
             memory={262144: dict(layout_gbps=9.0, layout_gbps_4k=6.0, huge_share=1.0, huge_share_4k=0.0)})
    r["rows"] = {262144: r["rows"][262144]}
    for name in ("fast", "fast_4k", "lowp_4k"):
        r["rows"][262144][name]["rounds"] = [r["rows"][262144][name]["ns_per_token"]] * 3
    r["rows"][262144]["lowp"]["rounds"] = [9.5, 10.0, 11.0]
    text = "\n".join(bench.memory_lines(r))
    assert "plain (fa_read_gbps" in text and "layout (fa_read_cache_gbps" in text
    assert "100 % (huge_pages=True), 0 % (huge_pages=False)" in text
    assert "9.50 /  10.00 /  11.00 (max/min 1.16)" in text           # lowp's rounds: min / median / max
    assert "3 rounds, too few for a verdict (at least 6)" in text and "faster" not in text
    assert "NEON source built through SIMDe" in text
    # the pages' verdicts come from the rounds, paired: a clear difference, then one inside the rounds' noise
    rows = r["rows"][262144]
    rows["fast"]["rounds"], rows["fast_4k"]["rounds"] = [12.0, 12.5, 11.8, 12.2, 12.1, 30.0, 12.3], \
        [18.0, 18.9, 17.5, 18.4, 18.2, 45.0, 18.1]
    rows["lowp"]["rounds"], rows["lowp_4k"]["rounds"] = [10.0, 14.0, 10.0, 12.0, 10.5, 9.0, 11.0], \
        [11.0, 12.0, 9.0, 13.0, 10.0, 10.0, 10.5]
    r["memory"][262144]["load"] = (0.2, 0.3)
    text = "\n".join(bench.memory_lines(r))
    assert "fast on huge pages vs fast on 4 KiB pages: fast on huge pages faster by 1.5" in text, text
    assert "lowp on huge pages vs lowp on 4 KiB pages: cannot tell here" in text, text
    assert "6.0 on 4 KiB pages" in text and "cost" not in text
    busy = (os.cpu_count() or 1) + 1.5                                # a busy machine: no verdict either way
    r["memory"][262144]["load"] = (busy, busy - 0.5)
    assert "fast on huge pages vs fast on 4 KiB pages: cannot tell here, the machine was busy" in "\n".join(
        bench.memory_lines(r))
    # lowp's fastest round is 9 ns: 264 / 9 / 9 GB/s = 3.26 of the layout probe; its median figure, 10 ns, 2.64
    assert ("of the plain probe (10.0 GB/s, best pass); 3.26 of the layout probe (9.0 GB/s); its median round 2.64"
            in bench.share_detail(r, 262144, "lowp"))


def test_huge_page_share_and_the_layout_probe():
    ffi, lib = lk.native.load()
    cache, kv_head = bench.make_inputs(20000)[:2]
    assert bench.layout_gbps(ffi, lib, cache, kv_head, reps=1) > 0
    share = bench.huge_page_share(cache.k_blocks + cache.v_blocks)
    assert share is None or 0.0 <= share <= 1.0
    assert bench.huge_page_share(bench.make_inputs(20000, huge_pages=False)[0].k_blocks) in (None, 0.0)
