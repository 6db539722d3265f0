"""lessonkit.kernels (lesson 08): the grouped kernel against G calls of the per-head kernel, the
partial kernel's chunks merged against the single pass, and every bad argument rejected before C.

Tolerances, and why:
- grouped vs per-head: every query head goes through the per-head kernel's arithmetic in the same
  order; only a multiply-add fused by the compiler in one build and not in the other could differ.
  1e-5 relative to the largest output (the C tests' NEON-vs-scalar bound).
- split and merged vs single pass: the per-token work is the kernel's; what differs is the order
  of the float32 sums (each chunk starts its own M, S and VKQ) and the merge, in float64.
  2e-5 relative to the largest output.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import kernels, streaming
from lessonkit.kernels import split

from conftest import make_case

GROUP_RTOL = 1e-5
SPLIT_RTOL = 2e-5


def close(got, want, rtol, what):
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * float(np.abs(want).max()), err_msg=what)


def queries(G, head_dim, seed):
    return np.random.default_rng(seed).standard_normal((G, head_dim), dtype=np.float32)


# ----------------------------------------------------------------------------- the merge of partial states

def _state_by_hand(s: np.ndarray, V: np.ndarray) -> split.Partial:
    """(M, S, acc) of scores s and value rows V, in float64, straight from the definition."""
    s = np.asarray(s, np.float64)
    M = s.max()
    w = np.exp(s - M)
    return split.Partial(float(M), float(w.sum()), w @ np.asarray(V, np.float64), len(s))


def test_merge_equals_softmax_by_hand():
    """The merge formula alone, on states computed by hand: the softmax of the concatenation."""
    rng = np.random.default_rng(0)
    s = rng.normal(0, 3, 200)
    s[150] = 40.0  # the max in the second part: the first part's weights must shrink
    V = rng.standard_normal((200, 8))
    merged = split.merge(_state_by_hand(s[:120], V[:120]), _state_by_hand(s[120:], V[120:]))
    p = np.exp(s - s.max())
    want = p @ V / p.sum()
    assert merged.M == 40.0 and merged.n_tokens == 200
    assert math.isclose(merged.S, p.sum(), rel_tol=1e-12)
    np.testing.assert_allclose(split.finish(merged), want.astype(np.float32), rtol=1e-6, atol=1e-7)


def test_merge_order_and_empty_state():
    rng = np.random.default_rng(1)
    V = rng.standard_normal((30, 4))
    a, b = _state_by_hand(rng.normal(size=10), V[:10]), _state_by_hand(rng.normal(size=20) + 5, V[10:])
    ab, ba = split.merge(a, b), split.merge(b, a)
    assert ab.M == ba.M and math.isclose(ab.S, ba.S, rel_tol=1e-14)
    np.testing.assert_allclose(ab.acc, ba.acc, rtol=1e-14)
    e = split.empty(4)
    for got in (split.merge(e, a), split.merge(a, e)):
        assert got.M == a.M and got.S == a.S and np.array_equal(got.acc, a.acc)
    both_empty = split.merge(e, e)
    assert both_empty.S == 0 and not np.isnan(both_empty.acc).any()
    assert np.array_equal(split.finish(both_empty), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="head_dim"):
        split.merge(a, split.empty(8))



# ----------------------------------------------------------------------------- GQA in one scan

@pytest.mark.parametrize("G", [1, 2, 4, 8])
@pytest.mark.parametrize("head_dim,block_size,seq_len,n_kv_heads", [
    (128, 16, 1001, 2),   # odd seq_len, blocks of 16 do not divide it
    (32, 7, 33, 3),       # smallest head_dim, block size 7
    (256, 64, 257, 1),    # largest head_dim
    (96, 1, 5, 8),        # one token per block, Qwen3-8B's 8 kv heads
    (64, 5, 1, 2),        # a single token
])
def test_group_equals_per_head_calls(G, head_dim, block_size, seq_len, n_kv_heads):
    cache, _, _, _ = make_case(G + seq_len, seq_len, n_kv_heads, head_dim, block_size)
    qs = queries(G, head_dim, seed=seq_len)
    for kv_head in range(n_kv_heads):          # kv_head != 0 too
        got = lk.attend_group(qs, cache, kv_head)
        assert got.shape == (G, head_dim) and got.dtype == np.float32
        for g in range(G):
            close(got[g], lk.attend(qs[g], cache, kv_head), GROUP_RTOL, f"query head {g}, kv head {kv_head}")


def test_group_against_independent_numpy():
    """Against the quantized math written in numpy (not the C kernel), and against float64 on
    dequantized K and V: the group's heads must not be mixed up."""
    cache, q, K, V = make_case(11, 300, 2, 64, 16)
    qs = queries(4, 64, seed=12)
    qs[2] *= 0.0  # a zero query head: uniform weights over the tokens
    got = lk.attend_group(qs, cache, 1)
    for g in range(4):
        close(got[g], lk.attend(qs[g], cache, 1, backend="numpy"), 2e-5, f"head {g} vs numpy")
    Kd, Vd = cache.dequantized(1)
    np.testing.assert_allclose(got[2], Vd.mean(axis=0), atol=1e-5)
    assert not np.allclose(got[0], got[1])


def test_group_scale_argument():
    cache, _, _, _ = make_case(3, 100, 1, 128, 16)
    qs = queries(4, 128, seed=4)
    got = lk.attend_group(qs, cache, 0, scale=0.3)
    for g in range(4):
        close(got[g], lk.attend(qs[g], cache, 0, scale=0.3), GROUP_RTOL, f"head {g}")


# ----------------------------------------------------------------------------- split-KV

@pytest.mark.parametrize("head_dim,block_size,seq_len,n_kv_heads,kv_head", [
    (128, 16, 1001, 2, 1),
    (32, 7, 50, 1, 0),
    (256, 64, 300, 3, 2),
])
@pytest.mark.parametrize("n_chunks,n_threads", [(1, 1), (1, 4), (2, 1), (2, 2), (2, 3), (3, 2), (7, 3)])
def test_split_equals_single_pass(head_dim, block_size, seq_len, n_kv_heads, kv_head, n_chunks, n_threads):
    cache, q, _, _ = make_case(seq_len + n_chunks, seq_len, n_kv_heads, head_dim, block_size)
    got = lk.attend_split(q, cache, kv_head, n_chunks, n_threads)
    assert got.shape == (head_dim,) and got.dtype == np.float32
    close(got, lk.attend(q, cache, kv_head), SPLIT_RTOL, f"{n_chunks} chunks on {n_threads} threads")


def test_split_one_chunk_per_token():
    cache, q, _, _ = make_case(5, 97, 2, 64, 16)
    close(lk.attend_split(q, cache, 1, 97, 2), lk.attend(q, cache, 1), SPLIT_RTOL, "n_chunks == seq_len")


@pytest.mark.parametrize("bounds", [
    [5],                 # inside the first block of 16
    [1],                 # a chunk of one token first
    [999],               # ... and last (seq_len 1000)
    [16, 17, 500],       # a one-token chunk on a block boundary
    [7, 8, 9, 31, 33],   # several small chunks across blocks
])
def test_awkward_split_points(bounds):
    cache, q, _, _ = make_case(8, 1000, 2, 128, 16)
    got, parts = split.attend_chunks(q, cache, 1, bounds, n_threads=2)
    close(got, lk.attend(q, cache, 1), SPLIT_RTOL, f"split at {bounds}")
    assert [p.n_tokens for p in parts] == list(np.diff([0, *bounds, 1000]))


def test_partial_states_equal_traced_kernel_states():
    """Each chunk's (M, S, acc) from the C partial kernel equals the traced kernel's state after the
    same tokens, run on a cache that holds that chunk alone (lesson 05's way)."""
    rng = np.random.default_rng(9)
    K = rng.standard_normal((200, 64), dtype=np.float32)
    V = rng.standard_normal((200, 64), dtype=np.float32)
    q = rng.standard_normal(64, dtype=np.float32)
    cache = streaming.cache_of(K, V, block_size=16)
    for a, b in [(0, 1), (0, 37), (37, 38), (38, 200)]:
        mine = split.partial(q, cache, 0, a, b)
        ref = streaming.partial_state(q, streaming.cache_of(K[a:b], V[a:b], 16), 0)
        assert mine.n_tokens == ref.n_tokens == b - a
        assert math.isclose(mine.M, ref.M, rel_tol=1e-6, abs_tol=1e-6)
        assert math.isclose(mine.S, ref.S, rel_tol=1e-5)
        np.testing.assert_allclose(mine.acc, ref.acc, rtol=0, atol=1e-5 * np.abs(ref.acc).max())


def test_partial_state_by_hand():
    """The state of a range from its definition: M = max s, S = sum exp(s - M), acc = sum exp(s - M) v,
    with the kernel's scores recomputed in numpy (lessonkit.reference.scores_numpy)."""
    from lessonkit.reference import scores_numpy
    cache, q, _, _ = make_case(2, 120, 2, 64, 8)
    s = scores_numpy(q, cache, 1, 1 / 8).astype(np.float64)[30:90]
    v = cache.v_codes(1)[30:90].astype(np.float64) * (cache.v_scales(1)[30:90, None] / 127.0)
    st = split.partial(q, cache, 1, 30, 90)
    w = np.exp(s - s.max())
    assert math.isclose(st.M, s.max(), rel_tol=1e-6)
    assert math.isclose(st.S, w.sum(), rel_tol=1e-5)
    np.testing.assert_allclose(st.acc, w @ v, rtol=0, atol=2e-5 * np.abs(w @ v).max())


def test_split_points():
    assert split.split_points(10, 3) == [0, 3, 6, 10]
    assert split.split_points(5, 5) == [0, 1, 2, 3, 4, 5]
    assert split.split_points(7, 1) == [0, 7]


# ----------------------------------------------------------------------------- bad inputs
# (bad q, kv_head and cache of every call: tests/test_bad_inputs.py)

@pytest.fixture
def case():
    return make_case(1, 40, 2, 64, 16)


def test_empty_chunks_rejected(case):
    cache, q, _, _ = case
    with pytest.raises(ValueError, match="some chunk would be empty"):
        lk.attend_split(q, cache, 0, 41, 1)
    for bounds in ([0], [40], [5, 5], [9, 3], [-1], [41]):
        with pytest.raises(ValueError, match="would be empty"):
            split.attend_chunks(q, cache, 0, bounds)
    with pytest.raises(ValueError, match="holds no token"):
        split.partial(q, cache, 0, 7, 7)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(n_chunks=0), ValueError, "n_chunks must be at least 1"),
    (dict(n_chunks=2.0), TypeError, "n_chunks must be an int"),
    (dict(n_threads=0), ValueError, "n_threads must be at least 1"),
    (dict(n_threads="2"), TypeError, "n_threads must be an int"),
    (dict(kv_head=2), ValueError, "kv_head must be below 2"),
    (dict(kv_head=-1), ValueError, "kv_head must be at least 0"),
    (dict(scale=float("nan")), ValueError, "scale must be finite"),
])
def test_split_bad_arguments(case, kwargs, error, match):
    cache, q, _, _ = case
    args = dict(kv_head=0, n_chunks=2, n_threads=2) | kwargs
    with pytest.raises(error, match=match):
        lk.attend_split(q, cache, **args)


@pytest.mark.parametrize("bad_qs,error,match", [
    (np.zeros((4, 64), np.float64), TypeError, "dtype float32"),
    (np.zeros((0, 64), np.float32), ValueError, "between 1 and 8"),
    (np.zeros((9, 64), np.float32), ValueError, "between 1 and 8"),
    (np.zeros((4, 32), np.float32), ValueError, "shape"),
    (np.zeros(64, np.float32), ValueError, r"shape \[G, 64\]"),
    (np.zeros((4, 128), np.float32)[:, ::2], ValueError, "C-contiguous"),
    (np.full((2, 64), np.nan, np.float32), ValueError, "NaN or Inf"),
])
def test_group_bad_qs(case, bad_qs, error, match):
    cache, _, _, _ = case
    with pytest.raises(error, match=match):
        lk.attend_group(bad_qs, cache, 0)


def test_bad_timing_arguments(case):
    cache, q, _, _ = case
    with pytest.raises(ValueError, match="variant must be one of"):
        kernels.time_group(np.zeros((4, 64), np.float32), cache, 0, variant="fast")


def test_parallel_capacity_runs_and_checks(case):
    """Speed is not asserted (it depends on the machine's load): only that it measures something."""
    cache, q, _, _ = case
    for n in (1, 2):
        c = split.parallel_capacity(q, cache, 0, n, number=3)
        assert math.isfinite(c) and c > 0
    with pytest.raises(ValueError, match="n_threads must be at least 1"):
        split.parallel_capacity(q, cache, 0, 0)
    with pytest.raises(ValueError, match="kv_head must be below 2"):
        split.parallel_capacity(q, cache, 2)


def _split_in_child(q, cache):
    """attend_split's largest difference from attend, relative to max|attend| (SPLIT_RTOL, as above)."""
    want = lk.attend(q, cache, 0)
    return float(np.abs(lk.attend_split(q, cache, 0, 8, 2) - want).max() / np.abs(want).max())


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork (POSIX)")
def test_a_forked_process_splits_after_its_parent_did():
    """The parent has used the split pool; a child made by os.fork, and the workers of a multiprocessing
    pool with the fork start method, inherit the pool without its threads: each must start its own and
    finish (a hang would stop this test at its time-out, not forever)."""
    import multiprocessing
    import os
    import signal
    cache, q, _K, _V = make_case(5, 300, 1, 64, 16)
    lk.attend_split(q, cache, 0, 8, 2)                       # the parent's pool is running
    pid = os.fork()
    if pid == 0:                                             # the child: exit 0 if its split call is right
        signal.alarm(60)                                     # a hang ends the child, not the test run
        try:
            os._exit(0 if _split_in_child(q, cache) <= SPLIT_RTOL else 1)
        except BaseException:
            os._exit(2)
    for _ in range(600):                                     # at most 60 s
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        __import__("time").sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in attend_split")
    assert os.waitstatus_to_exitcode(status) == 0
    with multiprocessing.get_context("fork").Pool(2) as pool:
        errs = pool.starmap_async(_split_in_child, [(q, cache)] * 2).get(timeout=60)
    assert max(errs) <= SPLIT_RTOL, errs


@pytest.mark.skipif(split.usable_cores() < 2, reason="split_times needs 2 usable cores")
def test_split_times_parts(case):
    """Speed is not asserted (it depends on the machine's load). What holds on any machine: every part
    is a finite, non-negative time; the overlap is a fraction; and the span of both halves at once
    contains each half's call in every repeat, so its median is at least each half's median."""
    cache, q, _, _ = case
    t = split.split_times(q, cache, 1, repeats=3)
    assert t.seq_len == cache.seq_len
    for name, value in vars(t).items():
        for x in (value if isinstance(value, tuple) else (value,)):
            assert math.isfinite(x) and x >= 0, (name, x)
    assert 0 <= t.overlap <= 1
    assert t.wall_together >= max(t.together)
    assert min(t.alone) > 0


def test_split_times_refusals(case, monkeypatch):
    cache, q, _, _ = case
    monkeypatch.setattr(split, "usable_cores", lambda: 2)  # the refusals below come before the measurement
    one_token = lk.KVCacheQ8(2, 64, 16)
    one_token.append(np.ones((1, 2, 64), np.float32), np.ones((1, 2, 64), np.float32))
    with pytest.raises(ValueError, match="at least 2 tokens"):
        split.split_times(q, one_token)
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        split.split_times(q, cache, repeats=0)
    with pytest.raises(ValueError, match="kv_head must be below 2"):
        split.split_times(q, cache, 2)
    monkeypatch.setattr(split, "usable_cores", lambda: 1)
    with pytest.raises(ValueError, match="needs 2 cores"):
        split.split_times(q, cache)
