"""Nothing a student does with KVCacheQ8 from Python may crash, corrupt or hang the notebook's kernel:
read-only shape, limits, appends that are all-or-nothing under interrupts and MemoryError, kernels
running while another thread appends, concurrent appends, copies and pickles.

Whatever could crash runs in a child process, so that a crash fails its test instead of pytest."""
from __future__ import annotations

import copy
import functools
import inspect
import pickle
import sys
import threading
import time

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import cache as cache_mod
from childproc import assert_clean, run_python



def tokens(seed, n, nkv, hd):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, nkv, hd), dtype=np.float32),
            rng.standard_normal((n, nkv, hd), dtype=np.float32))


def filled(K, V, block_size):
    c = lk.KVCacheQ8(K.shape[1], K.shape[2], block_size)
    c.append(K, V)
    return c


def visible(c):
    """Everything a reader can see of a cache (not the unused rows past seq_len)."""
    heads = range(c.n_kv_heads)
    return (c.seq_len, c.n_blocks, len(c.k_blocks), len(c.v_blocks),
            tuple(c.k_codes(h).tobytes() for h in heads), tuple(c.v_codes(h).tobytes() for h in heads),
            tuple(c.k_scales(h).tobytes() for h in heads), tuple(c.v_scales(h).tobytes() for h in heads),
            c.pointer_table("k").shape[0], c.pointer_table("v").shape[0])


def same_as_fresh(c, K, V, q):
    """c holds exactly K, V: same codes and scales as a cache built in one append, and the kernel
    gives the same output bit for bit on every kv head."""
    fresh = filled(K, V, c.block_size)
    assert visible(c)[:1] + visible(c)[4:8] == visible(fresh)[:1] + visible(fresh)[4:8]
    for kh in range(c.n_kv_heads):
        assert lk.attend(q, c, kh).tobytes() == lk.attend(q, fresh, kh).tobytes()
    # the pointer tables point at the blocks, which are still there
    assert [b.ctypes.data for b in c.k_blocks] == c.pointer_table("k").tolist()
    assert [b.ctypes.data for b in c.v_blocks] == c.pointer_table("v").tolist()


def run_child(code: str, timeout: float = 120) -> str:
    """Run a Python script in a new process (this checkout's lessonkit); fail on any exit code but 0
    (a segfault is -11), with its output."""
    return assert_clean(run_python(code, timeout))


# ============================================================================ 1. read-only shape

def test_shape_and_seq_len_are_read_only():
    K, V = tokens(0, 5, 2, 32)
    c = filled(K, V, 4)
    for name, value in (("n_kv_heads", 2), ("head_dim", 32), ("block_size", 4), ("seq_len", 5),
                        ("kv_dim", 64), ("n_blocks", 2), ("nbytes", c.nbytes),
                        ("allocated_nbytes", c.allocated_nbytes), ("max_seq_len", (2**31 - 1) // 2)):
        assert getattr(c, name) == value
        with pytest.raises(AttributeError):
            setattr(c, name, 1000)
        with pytest.raises(AttributeError):
            delattr(c, name)
        assert getattr(c, name) == value
    assert len(c) == 5 and repr(c) == "KVCacheQ8(n_kv_heads=2, head_dim=32, block_size=4, seq_len=5, n_blocks=2)"
    with pytest.raises(ValueError, match="read-only"):
        c.k_blocks[0][0, 0] = 1                  # the block views cannot be written either
    same_as_fresh(c, K, V, np.ones(32, np.float32))


# ============================================================================ 6. limits

@pytest.mark.parametrize("args,exc,words", [
    ((257, 32, 16), ValueError, "n_kv_heads must be at most 256"),
    ((np.int64(257), 32, 16), ValueError, "n_kv_heads must be at most 256"),
    ((0, 32, 16), ValueError, "n_kv_heads must be at least 1"),
    ((1, 32, 65537), ValueError, "block_size must be at most 65536"),
    ((1, 32, 2**40), ValueError, "block_size must be at most 65536"),
    ((1, 32, -1), ValueError, "block_size must be at least 1"),
    ((256, 256, 1025), ValueError, r"block_size \* kv_dim = 1025 \* 65536 .* 67108864 bytes \(64 MiB\) "
                                   r"per block; use block_size <= 1024"),
    ((16, 128, 65536), ValueError, "64 MiB"),
    ((True, 32, 16), TypeError, "n_kv_heads must be an int"),
    ((np.bool_(True), 32, 16), TypeError, "n_kv_heads must be an int"),
    ((1, 32, False), TypeError, "block_size must be an int"),
    ((1, 32, 16.0), TypeError, "block_size must be an int"),
    ((1, np.float64(32), 16), TypeError, "head_dim must be an int"),
    ((1, 48, 16), ValueError, "multiple of 32"),
])
def test_sizes_refused_at_construction(args, exc, words):
    with pytest.raises(exc, match=words):
        lk.KVCacheQ8(*args)


@pytest.mark.parametrize("args", [(np.int64(256), np.int32(32), np.uint16(16)), (256, 256, 1024),
                                  (8, 128, 65536), (np.int8(1), 32, np.uint64(65536))])
def test_sizes_at_the_limits_are_accepted(args):
    c = lk.KVCacheQ8(*args)
    assert (c.n_kv_heads, c.head_dim, c.block_size) == tuple(int(a) for a in args)
    assert all(type(x) is int for x in (c.n_kv_heads, c.head_dim, c.block_size))
    assert c.block_size * c.kv_dim <= 2**26


def test_append_refuses_past_the_kernels_int_limit():
    # the real limit: 256 kv heads hold at most (2**31 - 1) // 256 = 8388607 tokens. An input that
    # long is refused from its shape alone (a broadcast array: no memory, no scan of its values).
    c = lk.KVCacheQ8(256, 32, 16)
    assert c.max_seq_len == 8388607
    huge = np.broadcast_to(np.zeros((1, 256, 32), np.float32), (8388608, 256, 32))
    with pytest.raises(ValueError, match=r"at most \(2\*\*31 - 1\) // 256 = 8388607 tokens .*t \* nkv"):
        c.append(huge, huge)
    assert c.seq_len == 0 and c.n_blocks == 0


def test_append_at_the_limit(monkeypatch):
    # the same check on a cache that really reaches its limit: pretend C ints end at 100
    monkeypatch.setattr(cache_mod, "C_INT_MAX", 100)
    c = lk.KVCacheQ8(4, 32, 8)
    assert c.max_seq_len == 25
    K, V = tokens(1, 26, 4, 32)
    c.append(K[:24], V[:24])
    before, allocated = visible(c), c.allocated_nbytes
    for k, v in ((K[24:26], V[24:26]), (K[24:], V[24:])):
        with pytest.raises(ValueError, match="would hold 26: .* at most .* = 25 tokens"):
            c.append(k, v)
        assert visible(c) == before and c.allocated_nbytes == allocated  # refused before allocating
    c.append(K[24], V[24])                                # one token ([nkv, hd]): exactly the limit
    with pytest.raises(ValueError, match="would hold 26"):
        c.append(K[25], V[25])
    # 4 blocks; the scale arrays grew to the limit, not to twice their 24 rows
    assert c.seq_len == 25 and c.n_blocks == 4 and c.allocated_nbytes == 2 * 4 * 8 * 128 + 2 * 25 * 4 * 4
    same_as_fresh(c, K[:25], V[:25], np.ones(32, np.float32))


# ============================================================================ 2. all or nothing

# (n_kv_heads, head_dim, block_size, tokens already in, tokens appended, one token as [nkv, hd])
SCENARIOS = {
    "one token, same block": (2, 32, 4, 5, 1, True),
    "one token, new block, table and scales grow": (2, 32, 2, 8, 1, True),
    "many tokens over several blocks, everything grows": (3, 32, 2, 7, 9, False),
    "first append": (1, 64, 3, 0, 4, False),
}


def interrupted_appends(scenario, arm):
    """For k = 1, 2, ...: a cache with the scenario's first tokens, then an append during which
    ``arm(k)`` makes the k-th event of its kind raise; until an append runs to its end. arm returns
    (disarm, fired): a function that stops the injection, a list that becomes non-empty when it fired. After each,
    the cache must show the state before or after the append, and then take the same tokens and
    one more and equal a fresh cache of them."""
    nkv, hd, bs, n0, n, one = SCENARIOS[scenario]
    K, V = tokens(3, n0 + n + 1, nkv, hd)
    q = np.random.default_rng(4).standard_normal(hd, dtype=np.float32)
    new = (K[n0], V[n0]) if one else (K[n0:n0 + n], V[n0:n0 + n])
    before = visible(filled(K[:n0], V[:n0], bs))
    after = visible(filled(K[:n0 + n], V[:n0 + n], bs))
    seen = {"before": 0, "after": 0}
    for k in range(1, 100000):
        c = filled(K[:n0], V[:n0], bs)
        disarm, fired = arm(k)
        try:
            c.append(*new)
            completed = True
        except (KeyboardInterrupt, MemoryError):
            completed = False
        finally:
            disarm()
        if completed and not fired:
            return k - 1, seen             # events in one append; every one of them was tried
        assert not c._lock.locked(), f"event {k}: the lock is still held"
        state = visible(c)
        assert state in (before, after), f"event {k}: the cache is half-appended"
        seen["before" if state == before else "after"] += 1
        if state == before:
            c.append(*new)                  # the same tokens again, reusing what was allocated
        c.append(K[n0 + n:], V[n0 + n:])
        same_as_fresh(c, K, V, q)
    raise AssertionError("append never completed")


def keyboard_interrupt_at_line(k):
    """Raise KeyboardInterrupt at the k-th line executed inside append (its callees included)."""
    count, fired = [0], []

    def local(frame, event, arg):
        # Not inside a generator's frame: CPython 3.11 can crash (a segmentation fault, seen in CI in a generator
        # expression of core/validate.py) when a trace function raises there. Jupyter's interrupt arrives through the
        # eval loop's signal check, not a trace function, so this limits the test's injector, not what it checks.
        if event == "line" and not frame.f_code.co_flags & inspect.CO_GENERATOR:
            count[0] += 1
            if count[0] == k:
                fired.append(k)
                raise KeyboardInterrupt   # what Jupyter's interrupt does, between two lines
        return local

    sys.settrace(lambda frame, event, arg: local)
    return functools.partial(sys.settrace, None), fired   # C callables: no traced line of their own


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_keyboard_interrupt_anywhere_in_append(scenario):
    n_events, seen = interrupted_appends(scenario, keyboard_interrupt_at_line)
    # the last line of append publishes and releases the lock: no line starts after it
    assert n_events > 20 and seen == {"before": n_events, "after": 0}


ALLOCATORS = ("zeros", "empty", "ones", "full", "zeros_like", "empty_like", "array", "asarray",
              "ascontiguousarray", "concatenate", "isfinite", "copy", "stack")


def memory_error_at_allocation(k):
    """Make the k-th call of a numpy function that allocates an array raise MemoryError."""
    count, fired = [0], []

    def failing(real):
        def f(*args, **kwargs):
            count[0] += 1
            if count[0] == k:
                fired.append(k)
                raise MemoryError("injected by the test")
            return real(*args, **kwargs)
        return f

    mp = pytest.MonkeyPatch()
    for name in ALLOCATORS:
        mp.setattr(np, name, failing(getattr(np, name)))
    return mp.undo, fired


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_memory_error_at_any_numpy_allocation(scenario):
    n_events, seen = interrupted_appends(scenario, memory_error_at_allocation)
    # the checks of k and v allocate, then the cache's new blocks and arrays: all before publishing
    assert n_events >= 2 and seen["before"] == n_events


LOCK_TYPE = type(threading.Lock())


def memory_error_at_c_call(k):
    """Make the k-th call of any C function inside append (numpy, cffi, the quantizer, list.append,
    ...) raise MemoryError instead of running."""
    count, fired = [0], []

    def profile(frame, event, arg):
        # Taking and releasing the append lock allocates nothing and cannot fail: failing its
        # release would simulate the impossible (and leave it held).
        if event == "c_call" and not isinstance(getattr(arg, "__self__", None), LOCK_TYPE):
            count[0] += 1
            if count[0] == k:
                fired.append(k)
                raise MemoryError("injected by the test")

    sys.setprofile(profile)
    return functools.partial(sys.setprofile, None), fired


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_memory_error_at_any_c_call(scenario):
    n_events, seen = interrupted_appends(scenario, memory_error_at_c_call)
    assert n_events > 10 and seen["before"] > 0


# ============================================================================ 5. copies and pickles

def test_copies_are_independent():
    K, V = tokens(5, 60, 2, 64)
    q = np.random.default_rng(6).standard_normal(64, dtype=np.float32)
    orig = filled(K[:41], V[:41], 8)
    before = visible(orig)
    copies = [copy.copy(orig), copy.deepcopy(orig), pickle.loads(pickle.dumps(orig)),
              *(pickle.loads(pickle.dumps(orig, protocol=p)) for p in range(pickle.HIGHEST_PROTOCOL + 1)),
              copy.deepcopy([orig, orig])[0]]
    own = set(orig.pointer_table("k").tolist()) | set(orig.pointer_table("v").tolist())
    for c in copies:
        assert type(c) is lk.KVCacheQ8 and visible(c) == before and c.allocated_nbytes == orig.allocated_nbytes
        assert not own & (set(c.pointer_table("k").tolist()) | set(c.pointer_table("v").tolist()))
        assert c._lock is not orig._lock
        c.append(K[41:], V[41:])               # grows the copy only
        same_as_fresh(c, K, V, q)
        assert visible(orig) == before
    orig.append(K[41:50], V[41:50])            # and the original grows without the copies
    same_as_fresh(orig, K[:50], V[:50], q)
    same_as_fresh(copies[0], K, V, q)
    empty = copy.copy(lk.KVCacheQ8(1, 32, 4))
    assert empty.seq_len == 0 and empty.n_blocks == 0
    empty.append(K[:3, :1, :32].copy(), V[:3, :1, :32].copy())
    same_as_fresh(empty, K[:3, :1, :32].copy(), V[:3, :1, :32].copy(), q[:32].copy())


def test_pickle_stores_codes_not_addresses():
    K, V = tokens(7, 10, 2, 32)
    c = filled(K, V, 4)
    state = c.__getstate__()
    assert state["k_codes"].shape == (10, 64) and state["k_scales"].shape == (10, 2)
    kinds = {k: type(v) for k, v in state.items()}
    assert all(t in (int, np.ndarray) for t in kinds.values())
    assert not set(c.pointer_table("k").tolist()) & {v for v in state.values() if isinstance(v, int)}
    bad = dict(state, k_codes=state["k_codes"][:, :32])
    with pytest.raises(ValueError, match=r"k_codes must be a numpy array of int8, shape \[seq_len, 64\]"):
        pickle.loads(pickle.dumps(c)).__setstate__(bad)
    with pytest.raises(ValueError, match="n_kv_heads must be at most 256"):
        lk.KVCacheQ8.__new__(lk.KVCacheQ8).__setstate__(dict(state, n_kv_heads=1000))
    with pytest.raises(ValueError, match="not a saved KVCacheQ8 state"):
        lk.KVCacheQ8.__new__(lk.KVCacheQ8).__setstate__({"version": 2})


def test_pickle_loaded_in_a_new_process_attends_bit_for_bit(tmp_path):
    K, V = tokens(8, 300, 2, 128)
    q = np.random.default_rng(9).standard_normal(128, dtype=np.float32)
    c = filled(K[:200], V[:200], 16)
    for t in range(200, 300):                         # grown token by token: copies of grown tables
        c.append(K[t], V[t])
    (tmp_path / "cache.pkl").write_bytes(pickle.dumps(c))
    np.save(tmp_path / "q.npy", q)
    out = run_child(f"""
        import pickle, numpy as np, lessonkit as lk
        c = pickle.loads(open({str(tmp_path / "cache.pkl")!r}, "rb").read())
        q = np.load({str(tmp_path / "q.npy")!r})
        print(repr(c))
        print(" ".join(lk.attend(q, c, kh).tobytes().hex() for kh in range(2)))
        print(lk.attend_split(q, c, 1, 3, 2).tobytes().hex())
    """)
    lines = out.splitlines()
    assert lines[0] == repr(c)
    assert lines[1] == " ".join(lk.attend(q, c, kh).tobytes().hex() for kh in range(2))
    assert lines[2] == lk.attend_split(q, c, 1, 3, 2).tobytes().hex()


# ============================================================================ 3. kernels while appending

def test_kernel_args_keep_their_memory_alive():
    """kernel_args taken before growth (the scale arrays and tables replaced since) and after the
    cache itself was deleted still point at live memory holding the same tokens."""
    run_child("""
        import gc, numpy as np, lessonkit as lk
        ffi, lib = lk.native.load()
        rng = np.random.default_rng(10)
        K = rng.standard_normal((3000, 8, 32), dtype=np.float32)
        q = rng.standard_normal(32, dtype=np.float32)

        def call(args):
            out = np.empty(32, np.float32)
            lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out, require_writable=True),
                                            ffi.from_buffer("float[]", q), *args, 32, 0.125)
            return out.tobytes()

        def ref(T):
            c = lk.KVCacheQ8(8, 32, 1)
            c.append(K[:T], K[:T])
            return call(c.kernel_args(5, ffi))

        c = lk.KVCacheQ8(8, 32, 1)
        c.append(K[:10], K[:10])
        old = c.kernel_args(5, ffi)                  # tables and scales sized for 10 tokens
        for t in range(10, 3000):
            c.append(K[t], K[t])                     # replaces both many times over
            junk = np.full((t + 1) * 8, np.nan, np.float32)   # reuse what was freed, if anything was
        assert c.kernel_args(5, ffi)[4] == 3000 and old[4] == 10
        assert call(old) == ref(10)
        last = c.kernel_args(5, ffi)
        del c
        gc.collect()
        junk = [np.full(100_000, -1, np.int8) for _ in range(20)]
        assert call(last) == ref(3000)
        assert len(last[0]) == 3000 and len(last[2]) == 3000 * 8 - 5   # what the kernel reads
        print("ok")
    """)


def test_kernels_run_while_another_thread_appends():
    out = run_child("""
        import collections, threading, numpy as np, lessonkit as lk
        from lessonkit import timing

        nkv, hd, N = 2, 64, 1200
        rng = np.random.default_rng(11)
        K = rng.standard_normal((N, nkv, hd), dtype=np.float32)
        V = rng.standard_normal((N, nkv, hd), dtype=np.float32)
        q = rng.standard_normal(hd, dtype=np.float32)
        qs = rng.standard_normal((4, hd), dtype=np.float32)
        cache = lk.KVCacheQ8(nkv, hd, 1)    # one token per block: the table grows as often as the scales
        cache.append(K[:3], V[:3])
        KINDS = ("attend", "group", "split", "trace", "timing")

        def run(kind):
            if kind == "attend":
                return lk.attend(q, cache, 1), None
            if kind == "group":
                return lk.attend_group(qs, cache, 1), None
            if kind == "split":
                return lk.attend_split(q, cache, 1, 3, 2), None
            if kind == "trace":
                out, tr = lk.attend(q, cache, 1, trace=True)
                return out, tr.seq_len
            ns = timing.time_kernel(q, cache, 1, repeats=1, number=2)
            assert np.isfinite(ns) and ns > 0
            return None, None

        records, errors, stop = [], [], threading.Event()

        def reader(first):
            i = first
            try:
                while not stop.is_set():
                    kind = KINDS[i % len(KINDS)]
                    lo = len(cache)
                    out, seen = run(kind)
                    hi = len(cache)
                    records.append((kind, lo, hi, seen, out))
                    i += 1
            except BaseException as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=reader, args=(j,)) for j in range(2)]
        for th in threads:
            th.start()
        t, growths, cap = 3, 0, None
        while t < N:
            n = 1 if t % 50 else 17                  # mostly one token, now and then a chunk
            cache.append(K[t:t + n], V[t:t + n])
            t = min(N, t + n)
            now = (cache.allocated_nbytes - 2 * cache.n_blocks * cache.kv_dim) // (2 * 4 * nkv)  # scale rows
            growths += now != cap
            cap = now
            junk = np.full(cap * nkv, np.nan, np.float32)   # overwrite whatever was freed
        stop.set()
        for th in threads:
            th.join()
        assert not errors, errors
        assert cache.seq_len == N and growths >= 8, growths

        refs = {}

        def ref(kind, T):
            if (kind, T) not in refs:
                c = lk.KVCacheQ8(nkv, hd, 1)
                c.append(K[:T], V[:T])
                refs[kind, T] = {"attend": lambda: lk.attend(q, c, 1), "trace": lambda: lk.attend(q, c, 1),
                                 "group": lambda: lk.attend_group(qs, c, 1),
                                 "split": lambda: lk.attend_split(q, c, 1, 3, 1)}[kind]().tobytes()
            return refs[kind, T]

        counts, moving = collections.Counter(), 0
        for kind, lo, hi, seen, out in records:
            counts[kind] += 1
            moving += hi > lo
            if out is None:
                continue
            assert np.isfinite(out).all(), kind
            candidates = [seen] if seen is not None else range(lo, hi + 1)
            assert seen is None or lo <= seen <= hi
            assert any(out.tobytes() == ref(kind, T) for T in candidates), (kind, lo, hi)
        assert all(counts[k] >= 5 for k in KINDS), counts
        print(dict(counts), "calls during an append:", moving, "growths:", growths)
    """)
    assert "calls during an append" in out


# ============================================================================ 4. two appenders

def test_two_threads_appending_keep_every_token():
    run_child("""
        import threading, numpy as np, lessonkit as lk
        nkv, hd = 2, 32
        def chunk(ids):
            # token i has max|x| = i + 1 on every head: its scale names it exactly
            x = np.linspace(-1, 1, hd, dtype=np.float32)[None, None, :] * (np.asarray(ids, np.float32) + 1)[:, None, None]
            x = np.repeat(x, nkv, axis=1)
            return np.ascontiguousarray(x), np.ascontiguousarray(-x)

        cache = lk.KVCacheQ8(nkv, hd, 3)
        cache.append(*chunk([0]))

        plans = {0: [], 1: []}
        next_id = 1
        for j in range(400):
            for who in (0, 1):
                n = 1 if j % 3 else 4
                plans[who].append(list(range(next_id, next_id + n)))
                next_id += n
        errors = []

        def appender(who):
            try:
                for ids in plans[who]:
                    k, v = chunk(ids)
                    cache.append(k[0], v[0]) if len(ids) == 1 else cache.append(k, v)
            except BaseException as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=appender, args=(w,)) for w in (0, 1)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors and not any(th.is_alive() for th in threads), errors
        assert cache.seq_len == next_id
        order = (cache.k_scales(1) - 1).astype(np.int64)
        assert (cache.v_scales(0) - 1 == order).all()
        assert sorted(order.tolist()) == list(range(next_id))
        pos = {t: i for i, t in enumerate(order.tolist())}
        for who in (0, 1):
            starts = [pos[ids[0]] for ids in plans[who]]
            assert starts == sorted(starts)           # each thread's appends in its order
            for ids in plans[who]:                    # each append's tokens together
                assert [pos[i] for i in ids] == list(range(pos[ids[0]], pos[ids[0]] + len(ids)))
        k, v = chunk(order)
        fresh = lk.KVCacheQ8(nkv, hd, 3)
        fresh.append(k, v)
        q = np.linspace(-1, 1, hd, dtype=np.float32)
        for kh in range(nkv):
            assert (fresh.k_codes(kh) == cache.k_codes(kh)).all()
            assert lk.attend(q, fresh, kh).tobytes() == lk.attend(q, cache, kh).tobytes()
        print("ok")
    """)


# ============================================================================ 8. cost

def test_kernel_args_is_cheap():
    K, V = tokens(12, 1000, 8, 128)
    c = filled(K, V, 64)
    ffi, _ = lk.native.load()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(200):
            c.kernel_args(3, ffi)
        best = min(best, (time.perf_counter() - t0) / 200)
    assert best < 50e-6, f"kernel_args takes {best * 1e6:.1f} us"


def test_a_child_forked_while_a_lock_is_held_gets_free_locks():
    """A thread of the parent is inside an append (the cache's lock held) or a pinned timing (env's
    lock held) when the process forks: the child, which has no such thread, must still append and
    pin, not wait forever for a lock nobody will release."""
    proc = run_python("""
import os, signal, threading
import numpy as np
import lessonkit as lk
from lessonkit import env
cache = lk.KVCacheQ8(1, 32, 4)
held, release = threading.Event(), threading.Event()
def hold():
    with cache._lock, env._pin_lock:
        held.set()
        release.wait()
t = threading.Thread(target=hold)
t.start()
held.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(30)   # a hang ends the child with SIGALRM
    x = np.ones((3, 1, 32), np.float32)
    cache.append(x, x)
    with env.pinned():
        pass
    os._exit(0 if cache.seq_len == 3 else 1)
release.set()
t.join()
print("CHILD", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")
    assert "CHILD 0" in assert_clean(proc)
