"""lessonkit.streaming: partial states of the traced kernel merged against the single pass, the
streaming experiment, and the saved simulations."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import streaming, traffic
from lessonkit.reference import scores_numpy

HD = 64


def _kv(seed: int, n: int, hd: int = HD):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, hd), dtype=np.float32), rng.standard_normal((n, hd), dtype=np.float32),
            rng.standard_normal(hd, dtype=np.float32))


def _close(a, b, rtol=1e-5):
    return np.abs(a - b).max() <= rtol * np.abs(b).max()


def test_the_merge_is_the_cores():
    """Lesson 05's names for the partial state and its merge are those of lessonkit.kernels.split
    (tested in tests/test_kernels_split.py)."""
    from lessonkit.kernels import split
    assert (streaming.Partial, streaming.merge, streaming.merge_all, streaming.finish, streaming.empty) == \
        (split.Partial, split.merge, split.merge_all, split.finish, split.empty)


def test_partial_state_is_the_kernels_unnormalized_state():
    """M is the largest score, S the sum of exp(s - M), acc the weighted int8 V: computed in numpy."""
    K, V, q = _kv(2, 300)
    cache = streaming.cache_of(K, V, block_size=16)
    part = streaming.partial_state(q, cache)
    s = scores_numpy(q, cache, 0, 1 / math.sqrt(HD)).astype(np.float64)
    w = np.exp(s - s.max())
    acc = (w * cache.v_scales(0) / 127.0) @ cache.v_codes(0).astype(np.float64)
    assert part.n_tokens == 300
    assert math.isclose(part.M, s.max(), rel_tol=1e-6)
    assert math.isclose(part.S, w.sum(), rel_tol=1e-5)
    assert _close(part.acc, acc, 1e-5)


@pytest.mark.parametrize("bounds", [[1], [999], [500], [7, 8, 9, 640], [100, 333, 334, 900, 998],
                                    list(range(64, 1000, 64))])
def test_merged_chunks_equal_the_single_pass(bounds):
    K, V, q = _kv(3, 1000)
    ref = lk.attend(q, streaming.cache_of(K, V), 0)
    out, parts = streaming.attend_in_chunks(q, K, V, bounds)
    assert len(parts) == len(set(bounds)) + 1 and sum(p.n_tokens for p in parts) == 1000
    assert _close(out, ref), np.abs(out - ref).max()


def test_one_token_chunks():
    K, V, q = _kv(4, 40)
    ref = lk.attend(q, streaming.cache_of(K, V), 0)
    out, parts = streaming.attend_in_chunks(q, K, V, range(1, 40))
    assert len(parts) == 40 and all(p.n_tokens == 1 and p.S == 1.0 for p in parts)
    assert _close(out, ref)


def test_bad_split_points():
    K, V, q = _kv(5, 10)
    for bad in ([0], [10], [3, 12]):
        with pytest.raises(ValueError, match="split points"):
            streaming.attend_in_chunks(q, K, V, bad)


@pytest.mark.parametrize("mode", streaming.MODES)
def test_run_stream(mode, tmp_path):
    K, V, q = _kv(6, 1000, 128)
    ref = lk.attend(q, streaming.cache_of(K, V), 0)
    run = streaming.run_stream(q, K, V, mode, chunk=256, interval_s=0.001, directory=str(tmp_path))
    assert run.mode == mode and run.seq_len == 1000 and run.chunk == 256
    assert 0 < run.ingest_s and 0 < run.work_s and run.ingest_s + run.work_s <= run.latency_s
    assert _close(run.out, ref)
    assert list(tmp_path.iterdir()) == []  # the memory-mapped file is gone
    with pytest.raises(ValueError, match="mode must be one of"):
        streaming.run_stream(q, K, V, "three_pass")


# ----------------------------------------------------------------------------- the compiled passes over chunks

WHOLE = {"single": "neon", "two_pass_scores": "two_pass_scores", "two_pass_recompute": "two_pass_recompute"}


@pytest.mark.parametrize("variant", streaming.PASSES)
@pytest.mark.parametrize("seq_len, cuts, block", [(1, [], 64), (65, [64], 64), (3000, [1, 2, 777, 2999], 100),
                                                  (40, list(range(1, 40)), 8)])
def test_chunked_passes_equal_the_whole_kernel(variant, seq_len, cuts, block):
    """Each variant's first pass folded chunk by chunk while the cache grows, then finish(), against
    the whole kernel on the whole cache: the same operations in the same order, so the tolerance is
    the lesson's 1e-5 of max|out| (a wrong range or a lost rescale is off by far more)."""
    rng = np.random.default_rng(seq_len)
    K = rng.standard_normal((seq_len, 2, 128), dtype=np.float32)
    V = rng.standard_normal((seq_len, 2, 128), dtype=np.float32)
    q = rng.standard_normal(128, dtype=np.float32)
    whole = lk.KVCacheQ8(2, 128, block)
    whole.append(K, V)
    growing = lk.KVCacheQ8(2, 128, block)
    passes = streaming.ChunkedAttention(variant, q, growing, kv_head=1)
    for a, b in zip([0, *cuts], [*cuts, seq_len]):
        growing.append(K[a:b], V[a:b])
        passes.fold(b)
    out = passes.finish()
    ref = lk.attend(q, whole, 1, backend=WHOLE[variant])
    assert _close(out, ref)
    # and not equal to the result over the first chunk alone: finish() really used every token
    if cuts:
        first = lk.KVCacheQ8(2, 128, block)
        first.append(K[:cuts[0]], V[:cuts[0]])
        assert not _close(out, lk.attend(q, first, 1, backend=WHOLE[variant]))


def test_chunked_passes_refuse_bad_calls_before_c():
    K, V, q = _kv(9, 100, 128)
    cache = streaming.cache_of(K[:50], V[:50])
    with pytest.raises(ValueError, match="variant must be one of"):
        streaming.ChunkedAttention("three_pass", q, cache)
    with pytest.raises(TypeError, match="KVCacheQ8"):
        streaming.ChunkedAttention("single", q, np.zeros((4, 4)))
    with pytest.raises(ValueError, match="kv_head"):
        streaming.ChunkedAttention("single", q, cache, kv_head=1)
    with pytest.raises((ValueError, TypeError), match="q"):
        streaming.ChunkedAttention("single", q[:64], cache)
    for variant in streaming.PASSES:
        passes = streaming.ChunkedAttention(variant, q, cache)
        with pytest.raises(ValueError, match="no token has been folded"):
            passes.finish()
        with pytest.raises(ValueError, match="past the cache"):
            passes.fold(51)  # beyond the tokens the cache holds: C would read rows that are not there
        with pytest.raises(ValueError, match="at least 1"):
            passes.fold(0)
        with pytest.raises(TypeError, match="int"):
            passes.fold(10.0)
        passes.fold(30)
        with pytest.raises(ValueError, match="at least 31"):
            passes.fold(30)  # tokens already folded: folding them twice would count them twice
        passes.finish()
        with pytest.raises(RuntimeError, match="finish"):
            passes.fold(50)
        with pytest.raises(RuntimeError, match="already run"):
            passes.finish()


def _fake(variant, seq_len, preset):
    return traffic.Simulated(variant, seq_len, preset, instructions=10, reads=7, writes=3,
                             d1_misses=5, ll_misses=4, line=64)


def test_saved_simulations_are_loaded_without_valgrind(tmp_path, monkeypatch):
    saved = tmp_path / "data" / "sim.json"
    configs = [("single", 1024, "a76"), ("softmax_safe", 2048, "a76-l2")]
    monkeypatch.setattr(traffic, "valgrind_available", lambda: True)
    monkeypatch.setattr(traffic, "simulate", lambda v, n, preset_name: _fake(v, n, preset_name))
    monkeypatch.delenv(streaming.SAVE_ENV, raising=False)
    got, note = streaming.simulations(configs, saved)
    assert not saved.exists() and "simulated now" in note  # not saved unless asked
    monkeypatch.setenv(streaming.SAVE_ENV, "1")
    got, note = streaming.simulations(configs, saved)
    assert saved.is_file() and "saved" in note
    assert json.loads(saved.read_text())["results"][0]["dram_bytes"] == 4 * 64

    monkeypatch.setattr(traffic, "valgrind_available", lambda: False)
    loaded, note = streaming.simulations(configs[::-1], saved)
    assert "not installed" in note and list(loaded) == configs[::-1]
    assert loaded == got and loaded[configs[0]].dram_bytes == 256
    with pytest.raises(RuntimeError, match="no saved results"):
        streaming.simulations([("single", 4096, "a76")], saved)
    with pytest.raises(RuntimeError, match="not installed"):
        streaming.simulations(configs, tmp_path / "missing.json")


def test_saving_in_several_calls_keeps_every_configuration(tmp_path, monkeypatch):
    """A lesson saves its simulations in batches: each call replaces only what it simulated."""
    saved = tmp_path / "sim.json"
    monkeypatch.setattr(traffic, "valgrind_available", lambda: True)
    monkeypatch.setattr(traffic, "simulate", lambda v, n, preset_name: _fake(v, n, preset_name))
    first, second = [("single", 1024, "a76"), ("single", 2048, "a76")], [("single", 2048, "a76"), ("single", 4096, "a76")]
    streaming.simulations(first, saved, save=True)
    streaming.simulations(second, saved, save=True)
    results = json.loads(saved.read_text())["results"]
    assert sorted(r["seq_len"] for r in results) == [1024, 2048, 4096]  # 2048 once, replaced
    monkeypatch.setattr(traffic, "valgrind_available", lambda: False)
    loaded, _ = streaming.simulations(first + second[1:], saved)
    assert [c[1] for c in loaded] == [1024, 2048, 4096]


def test_saving_simulations_replaces_the_file_whole(tmp_path, monkeypatch, full_disk):
    """The saved simulations are written beside the file and renamed over it: a failed write (here the
    rename) leaves the results saved before and no temporary file."""
    saved = tmp_path / "sim.json"
    monkeypatch.setattr(traffic, "valgrind_available", lambda: True)
    monkeypatch.setattr(traffic, "simulate", lambda v, n, preset_name: _fake(v, n, preset_name))
    streaming.simulations([("single", 1024, "a76")], saved, save=True)
    old = saved.read_text()
    full_disk()
    with pytest.raises(OSError):
        streaming.simulations([("single", 2048, "a76")], saved, save=True)
    assert saved.read_text() == old and [p.name for p in tmp_path.iterdir()] == ["sim.json"]
