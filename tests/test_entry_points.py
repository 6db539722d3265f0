"""Every entry point that reaches C, or runs long, refuses what would crash, hang or exhaust the
notebook's process, before any call into C.

Cases that could crash (a wrong buffer handed to C, an ndarray subclass that lies about its shape)
and cases that could hang (a stalled producer, an absurd exercise answer) run in a child Python:
a segfault or a hang there fails one test instead of killing pytest. Each child runs one group of
cases and reports, per case, the exception (type and message) or the repr of the result."""
from __future__ import annotations

import json
import os
import re
import textwrap
import threading
import time

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import bench, debug, env, kernels, precision, rescales, rounding, streaming, timing, toy, trace
from lessonkit.kernels import split
from lessonkit import validate as check

from childproc import assert_clean, run_python
from conftest import make_case


# ============================================================================ the child runner

SETUP = """
import json, sys, tempfile, time
import numpy as np
import lessonkit as lk
from lessonkit import (bench, debug, env, exercises, kernels, layout, native, quant, rescales, softmax,
                       streaming, synthetic, timing, toy, trace)
from lessonkit import validate as check
from lessonkit.kernels import split
from workbench import bench as bench_tool
ffi, lib = native.load()
rng = np.random.default_rng(1)
cache = lk.KVCacheQ8(2, 64, 16)
cache.append(rng.standard_normal((40, 2, 64), dtype=np.float32), rng.standard_normal((40, 2, 64), dtype=np.float32))
empty = lk.KVCacheQ8(2, 64, 16)
q = rng.standard_normal(64, dtype=np.float32)
qs = rng.standard_normal((4, 64), dtype=np.float32)
x = rng.standard_normal((4, 64), dtype=np.float32)
codes, scales = np.empty((4, 64), np.int8), np.empty(4, np.float32)
ro_codes = np.empty((4, 64), np.int8); ro_codes.flags.writeable = False
out64 = np.empty(64, np.float32)
ro_out = np.empty(64, np.float32); ro_out.flags.writeable = False
unaligned = np.zeros(4 * 64 + 1, np.uint8)[1:].view(np.float32)
masked_q = np.ma.masked_invalid(np.where(np.arange(64) == 3, np.nan, q).astype(np.float32))
masked_x = np.ma.masked_invalid(np.where(np.arange(256).reshape(4, 64) == 7, np.inf, x).astype(np.float32))

class Liar(np.ndarray):      # claims the shape the kernel wants; its memory holds 32 floats
    shape = property(lambda self: (64,))
    ndim = property(lambda self: 1)

class AllFinite(np.ndarray):  # every ufunc answers True: isfinite() would pass NaN
    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        return np.ones(64, bool)

liar = np.ones(32, np.float32).view(Liar)
nan_all_finite = np.full(64, np.nan, np.float32).view(AllFinite)
mm_fd, mm_path = tempfile.mkstemp(suffix=".f32"); import os; os.close(mm_fd)
mm = np.memmap(mm_path, dtype=np.float32, mode="w+", shape=(64,)); mm[:] = q; mm.flush()
mm_ro = np.memmap(mm_path, dtype=np.float32, mode="r", shape=(64,))
import cffi
other_ffi = cffi.FFI()
other_ffi.cdef("void flash_attn_single_q_q8_neon(float *out, int n);")  # a changed signature
other_lib = other_ffi.dlopen(str(native.library_path()))

results = {}
for name, expr in json.loads(sys.stdin.read()):
    print("case", name, file=sys.stderr, flush=True)   # the last one printed is the one that crashed
    try:
        results[name] = ["ok", repr(eval(expr))[:300]]
    except Exception as e:  # noqa: BLE001
        results[name] = [type(e).__name__, str(e)]
del mm, mm_ro
import os; os.unlink(mm_path)
print(json.dumps(results))
"""


def run_child(cases: dict, timeout: float = 120.0) -> dict:
    """Run the cases {name: (expression, ...)} in one child Python; return {name: [kind, text]}."""
    proc = run_python(SETUP, timeout, input=json.dumps([(n, c[0]) for n, c in cases.items()]))
    last = [l for l in proc.stderr.splitlines() if l.startswith("case ")][-1:]
    assert proc.returncode == 0, (f"the child died with code {proc.returncode} (negative: killed by that signal, "
                                  f"-11 is a segfault) during {last}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def expect(results: dict, name: str, kind: str, words: str) -> None:
    got_kind, text = results[name]
    assert got_kind == kind, f"{name}: expected {kind} ({words!r}), got {got_kind}: {text}"
    assert words in text, f"{name}: {words!r} not in {text!r}"


# ============================================================================ 1. buffers and sizes, before C

BUFFER_CASES = {
    # the K/V quantizer
    "kv_rows float64": ("quant.quantize_kv_rows(x.astype(np.float64))", "TypeError", "dtype float32"),
    "kv_rows 1-D": ("quant.quantize_kv_rows(q)", "ValueError", "shape [n, n]"),
    # the trace
    "traced out short": ("trace.run_traced(np.empty(32, np.float32), q, cache, 0)", "ValueError", "out must have shape [64]"),
    "traced out read-only": ("trace.run_traced(ro_out, q, cache, 0)", "ValueError", "out must be writable"),
    "traced q short": ("trace.run_traced(out64, q[:32].copy(), cache, 0)", "ValueError", "q must have shape [64]"),
    "traced no cache": ("trace.run_traced(out64, q, 'cache', 0)", "TypeError", "KVCacheQ8"),
    "traced kv_head": ("trace.run_traced(out64, q, cache, 2)", "ValueError", "kv_head must be below 2"),
    "traced empty": ("trace.run_traced(out64, q, empty, 0)", "ValueError", "empty"),
    "traced fields": ("trace.run_traced(out64, q, cache, 0, fields=('s', 'vkq2'))", "ValueError", "not Trace fields"),
    "traced other lib": ("trace.run_traced(out64, q, cache, 0, None, ffi, object())", "TypeError", "no C function"),
    "traced subset": ("(lambda t: (t.vkq is None, t.s.shape))(trace.run_traced(out64, q, cache, 0, fields=('s',)))",
                      "ok", "(True, (40,))"),
    # the debugger helpers (an edited copy's ffi, lib and a raw q)
    "call q short": ("debug.call_kernel(ffi, lib, np.ones(32), cache, 0, 0.1)", "ValueError", "q must have shape [64]"),
    "call q list": ("debug.call_kernel(ffi, lib, list(map(float, q)), cache, 0, 0.125).shape", "ok", "(64,)"),
    "call q words": ("debug.call_kernel(ffi, lib, ['a'] * 64, cache, 0, 0.1)", "TypeError", "real numbers"),
    "call kv_head": ("debug.call_kernel(ffi, lib, q, cache, 2, 0.1)", "ValueError", "kv_head must be below 2"),
    "call scale nan": ("debug.call_kernel(ffi, lib, q, cache, 0, float('nan'))", "ValueError", "scale must be finite"),
    "call no cache": ("debug.call_kernel(ffi, lib, q, [cache], 0, 0.1)", "TypeError", "KVCacheQ8"),
    "call empty": ("debug.call_kernel(ffi, lib, q, empty, 0, 0.1)", "ValueError", "empty"),
    "call nan q": ("debug.call_kernel(ffi, lib, np.full(64, np.nan), cache, 0, 0.1)", "ValueError", "NaN or Inf"),
    "call lib alone": ("debug.call_kernel(None, lib, q, cache, 0, 0.1)", "TypeError", "pass both"),
    "call changed signature": ("debug.call_kernel(other_ffi, other_lib, q, cache, 0, 0.1)", "TypeError",
                               "changed its signature"),
    "trace_with q": ("debug.trace_with(ffi, lib, np.ones(96, np.float32), cache, 0, 0.1)", "ValueError", "shape [64]"),
    "trace_with lib": ("debug.trace_with(ffi, object(), q, cache, 0, 0.1)", "TypeError", "no C function"),
    "weights none": ("debug.kernel_weights(ffi, lib, [])", "ValueError", "1 to 256"),
    "weights many": ("debug.kernel_weights(ffi, lib, np.ones(300))", "ValueError", "1 to 256"),
    "weights inf": ("debug.kernel_weights(ffi, lib, [1.0, float('inf')])", "ValueError", "NaN or Inf"),
    "weights 2-D": ("debug.kernel_weights(ffi, lib, [[1.0, 2.0]])", "ValueError", "shape [n]"),
    "weights ok": ("round(float(debug.kernel_weights(ffi, lib, [0.0, 0.0]).sum()), 4)", "ok", "1.0"),
    # timing
    "time q": ("timing.time_kernel(q[:32].copy(), cache)", "ValueError", "shape [64]"),
    "time kv_head": ("timing.time_kernel(q, cache, kv_head=2)", "ValueError", "kv_head must be below 2"),
    "time seq_len": ("timing.time_kernel(q, cache, seq_len=10**9)", "ValueError", "seq_len must be below 41"),
    "time define name": ("timing.time_kernel(q, cache, defines={'size_t': 'char'})", "ValueError",
                         "unknown build define"),
    "time define tile 0": ("timing.time_kernel(q, cache, defines={'FA_TILE': 0})", "ValueError",
                           "FA_TILE must be between 1 and 256"),
    "time define huge": ("timing.time_kernel(q, cache, defines={'FA_TILE': 10**7})", "ValueError", "FA_TILE must be between 1 and 256"),
    "time cold flag": ("timing.time_kernel(q, cache, cold='yes')", "TypeError", "cold must be True or False"),
    "median repeats": ("timing.median_calls(lambda n: 1.0, 0, None, 0.02)", "ValueError", "repeats must be at least 1"),
    "group qs": ("kernels.time_group(qs[:, :32].copy(), cache)", "ValueError", "shape"),
    "group out dtype": ("kernels.time_group(qs, cache, out=np.empty((4, 64)))", "TypeError", "out must have dtype float32"),
    "group out shape": ("kernels.time_group(qs, cache, out=np.empty((3, 64), np.float32))", "ValueError",
                        "out must have shape [4, 64]"),
    "group out read-only": ("kernels.time_group(qs, cache, out=np.broadcast_to(np.float32(0), (4, 64)))",
                            "ValueError", "C-contiguous"),
    "group out ro": ("kernels.time_group(qs, cache, out=(lambda a: (a.setflags(write=False), a)[1])(np.empty((4, 64), "
                     "np.float32)))", "ValueError", "out must be writable"),
    "capacity threads": ("split.parallel_capacity(q, cache, 0, 65)", "ValueError", "cap of 64"),
    "capacity number": ("split.parallel_capacity(q, cache, 0, 2, number=0)", "ValueError", "number must be at least 1"),
    # split-KV and GQA
    "partial end": ("split.partial(q, cache, 0, 0, 10**9)", "ValueError", "t_end must be below 41"),
    "partial begin": ("split.partial(q, cache, 0, -1, 5)", "ValueError", "t_begin must be at least 0"),
    "partial empty range": ("split.partial(q, cache, 0, 9, 3)", "ValueError", "holds no token"),
    "chunks past end": ("split.attend_chunks(q, cache, 0, [5, 10**12])", "ValueError", "would be empty"),
    "chunks endless": ("split.attend_chunks(q, cache, 0, iter(range(1, 10**12)))", "ValueError", "cap of 65536"),
    "chunks str": ("split.attend_chunks(q, cache, 0, '12')", "TypeError", "bounds must be a sequence"),
    "split chunks cap": ("lk.attend_split(q, cache, 0, 10**6, 1)", "ValueError", "cap of 65536"),
    "group G": ("lk.attend_group(np.ones((9, 64), np.float32), cache, 0)", "ValueError", "between 1 and 8"),
    # the benchmark's read-bandwidth probe
    "read small": ("bench.read_bandwidth_gbps(ffi, lib, nbytes=63)", "ValueError", "nbytes must be at least 64"),
    "read odd": ("bench.read_bandwidth_gbps(ffi, lib, nbytes=100)", "ValueError", "multiple of 64"),
    "read huge": ("bench.read_bandwidth_gbps(ffi, lib, nbytes=2 << 30)", "ValueError", "cap of 1073741824"),
    "read lib": ("bench.read_bandwidth_gbps(ffi, object(), nbytes=1 << 20)", "TypeError", "no C function fa_read_gbps"),
    "read ok": ("bench.read_bandwidth_gbps(nbytes=1 << 20) > 0", "ok", "True"),
    # the other direct kernel calls
    "first kv_head": ("rescales.attend_first(q, cache, 2, 3, 0.1)", "ValueError", "kv_head must be below 2"),
    "first seq_len": ("rescales.attend_first(q, cache, 0, 41, 0.1)", "ValueError", "seq_len must be below 41"),
    "first no cache": ("rescales.attend_first(q, 'cache', 0, 3, 0.1)", "TypeError", "KVCacheQ8"),
    "read_token t": ("layout.read_token(cache, 40, 0)", "ValueError", "t must be below 40"),
    "read_token head": ("layout.read_token(cache, 0, 2)", "ValueError", "kv_head must be below 2"),
    "read_token ffi": ("layout.read_token(cache, 0, 0, ffi='ffi')", "TypeError", "cffi.FFI"),
    "grow huge": ("layout.grow_layer(8, 128, 64, [10**9])", "ValueError", "MiB"),
    "grow heads": ("layout.grow_layer(10**9, 128, 64, [10])", "ValueError", "MiB"),
}


@pytest.fixture(scope="module")
def buffer_results():
    return run_child(BUFFER_CASES)


@pytest.mark.parametrize("name", list(BUFFER_CASES))
def test_buffers_checked_before_c(buffer_results, name):
    expect(buffer_results, name, *BUFFER_CASES[name][1:])


# ============================================================================ 2. ndarray subclasses

SUBCLASS_CASES = {
    "attend masked": ("lk.attend(masked_q, cache, 0)", "TypeError", "pass q.filled(value)"),
    "attend masked, nothing masked": ("lk.attend(np.ma.masked_array(q), cache, 0)", "TypeError", "masked array"),
    "attend filled": ("lk.attend(masked_q.filled(0), cache, 0).shape", "ok", "(64,)"),
    "append masked": ("lk.KVCacheQ8(1, 64, 16).append(masked_x[:, None, :], x[:, None, :])", "TypeError", "k.filled"),
    "kv_rows masked": ("quant.quantize_kv_rows(masked_x)", "TypeError", "x.filled"),
    "quantize_q masked": ("quant.quantize_q(masked_q)", "TypeError", "masked"),
    "split masked": ("lk.attend_split(masked_q, cache, 0, 2, 2)", "TypeError", "masked"),
    "group masked": ("lk.attend_group(np.ma.masked_array(qs), cache, 0)", "TypeError", "masked"),
    "partial masked": ("split.partial(masked_q, cache, 0, 0, 9)", "TypeError", "masked"),
    "time masked": ("timing.time_kernel(masked_q, cache)", "TypeError", "masked"),
    "traced masked": ("trace.run_traced(out64, masked_q, cache, 0)", "TypeError", "masked"),
    "call masked": ("debug.call_kernel(ffi, lib, masked_q, cache, 0, 0.1)", "TypeError", "masked"),
    "scores masked": ("synthetic.cache_with_scores(np.ma.masked_invalid([1.0, np.nan]))", "TypeError", "masked"),
    "online masked": ("softmax.online(np.ma.masked_invalid([1.0, np.nan]))", "TypeError", "filled"),
    "memmap q": ("np.array_equal(lk.attend(mm, cache, 0), lk.attend(q, cache, 0))", "ok", "True"),
    "memmap read-only q": ("np.array_equal(lk.attend(mm_ro, cache, 0), lk.attend(q, cache, 0))", "ok", "True"),
    "memmap split": ("np.allclose(lk.attend_split(mm, cache, 0, 2, 2), lk.attend(q, cache, 0), atol=1e-5)", "ok", "True"),
    "matrix q": ("lk.attend(np.matrix(q), cache, 0)", "ValueError", "q must have shape [64]; got [1, 64]"),
    "matrix rows": ("[np.array_equal(a, b) for a, b in zip(quant.quantize_kv_rows(np.matrix(x)), quant.quantize_kv_rows(x))]",
                    "ok", "[True, True]"),
    "lying shape": ("lk.attend(liar, cache, 0)", "ValueError", "q must have shape [64]; got [32]"),
    "lying shape, split": ("lk.attend_split(liar, cache, 0, 2, 1)", "ValueError", "got [32]"),
    "lying shape, traced": ("trace.run_traced(out64, liar, cache, 0)", "ValueError", "got [32]"),
    "lying isfinite": ("lk.attend(nan_all_finite, cache, 0)", "ValueError", "NaN or Inf"),
    "big-endian": ("lk.attend(q.astype('>f4'), cache, 0)", "TypeError", "got >f4"),
    "unaligned q": ("lk.attend(unaligned[:64], cache, 0)", "ValueError", "not aligned"),
}


@pytest.fixture(scope="module")
def subclass_results():
    return run_child(SUBCLASS_CASES)


@pytest.mark.parametrize("name", list(SUBCLASS_CASES))
def test_subclasses_viewed_or_refused(subclass_results, name):
    expect(subclass_results, name, *SUBCLASS_CASES[name][1:])


# ============================================================================ 3. scale: finite in float32

@pytest.fixture(scope="module")
def case():
    return make_case(3, 40, 2, 64, 16)


def scale_calls(case):
    cache, q, _, _ = case
    qs = np.stack([q, -q])
    ffi, lib = lk.native.load()
    out = np.empty(64, np.float32)
    K, V = cache.dequantized(0)
    return {
        "attend": lambda s: lk.attend(q, cache, 0, scale=s),
        "attend numpy": lambda s: lk.attend(q, cache, 0, scale=s, backend="numpy"),
        "attend traced": lambda s: lk.attend(q, cache, 0, scale=s, trace=True)[0],
        "attend_group": lambda s: lk.attend_group(qs, cache, 0, scale=s),
        "attend_split": lambda s: lk.attend_split(q, cache, 0, 2, 2, scale=s),
        "attend_chunks": lambda s: split.attend_chunks(q, cache, 0, [7], scale=s)[0],
        "partial": lambda s: split.partial(q, cache, 0, 0, 40, scale=s).acc,
        "run_traced": lambda s: (trace.run_traced(out, q, cache, 0, s), out.copy())[1],
        "call_kernel": lambda s: debug.call_kernel(ffi, lib, q, cache, 0, s),
        "trace_with": lambda s: debug.trace_with(ffi, lib, q, cache, 0, s).s,
        "attend_first": lambda s: rescales.attend_first(q, cache, 0, 40, s),
        "time_kernel": lambda s: timing.time_kernel(q, cache, scale=s, repeats=1, number=1),
        "time_group": lambda s: kernels.time_group(qs, cache, scale=s, repeats=1, number=1),
        "partial_state": lambda s: streaming.partial_state(q, cache, 0, s).acc,
        "run_stream": lambda s: streaming.run_stream(q, K, V, "neon", chunk=20, interval_s=0.0, scale=s).out,
        "scores_numpy": lambda s: lk.reference.scores_numpy(q, cache, 0, s),
        "precision split": lambda s: precision.split_error(q, cache, 0, K, V, s).kernel,
        "rounding float q": lambda s: rounding.attend_float_q(q, cache, 0, s),
    }


@pytest.mark.parametrize("bad,exc,words", [
    (1e39, ValueError, "at most 3.402823e+38"),
    (-1e39, ValueError, "the largest float32"),
    (np.float64(4e38), ValueError, "float32"),
    (10**400, ValueError, "beyond the range of a float"),
    (float("inf"), ValueError, "finite"),
    (np.array([0.1]), TypeError, "one number"),
    ("0.1", TypeError, "real number"),
    (True, TypeError, "real number"),
])
def test_scale_refused_everywhere(case, bad, exc, words):
    for name, call in scale_calls(case).items():
        with pytest.raises(exc, match=re.escape(words)):
            call(bad)
            pytest.fail(f"{name} accepted scale {bad!r}")


def test_scale_as_numpy_scalar_or_0d_array(case):
    calls = scale_calls(case)
    for name in ("attend", "attend_split", "call_kernel", "partial", "run_traced"):
        want = calls[name](0.125)
        for s in (np.float32(0.125), np.float64(0.125), np.array(0.125), np.array(0.125, np.float32)):
            np.testing.assert_array_equal(calls[name](s), want, err_msg=f"{name} with {type(s).__name__}")
    # the largest float32 itself is finite in C: accepted
    assert check.scale(float(np.finfo(np.float32).max)) == float(np.finfo(np.float32).max)
    assert check.scale(None, 64) == 0.125


# ============================================================================ 4. long helpers are bounded

def test_timing_caps_refused_before_the_loops(case):
    cache, q, _, _ = case
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=f"cap of {timing.MAX_CALLS}"):
        timing.time_kernel(q, cache, number=timing.MAX_CALLS + 1)
    with pytest.raises(ValueError, match=f"cap of {timing.MAX_REPEATS}"):
        timing.time_kernel(q, cache, repeats=timing.MAX_REPEATS + 1)
    with pytest.raises(ValueError, match=r"cap of 60 s per timing call; use (repeats <= \d+ or )?number <= \d+$"):
        timing.time_kernel(q, cache, repeats=1000, number=timing.MAX_CALLS)
    with pytest.raises(ValueError, match="min_repeat_s"):
        timing.time_kernel(q, cache, min_repeat_s=-1.0)
    with pytest.raises(ValueError, match="min_repeat_s must be finite"):
        timing.time_kernel(q, cache, min_repeat_s=float("nan"))
    with pytest.raises(ValueError, match="cap of 60 s"):
        kernels.time_group(np.stack([q, q]), cache, repeats=1000, number=timing.MAX_CALLS)
    with pytest.raises(ValueError, match="cap of 60 s"):
        split.parallel_capacity(q, cache, 0, 64, number=timing.MAX_CALLS, repeats=1000)
    assert time.perf_counter() - t0 < 10  # refused after a probe call, not after the loops


def test_median_calls_calibration_is_capped():
    asked = []

    def fake(n):  # a call that claims 1 ns and costs nothing: calibration would run away
        asked.append(n)
        return 1.0
    assert timing.median_calls(fake, 3, None, 1.0) == 1.0
    assert max(asked) == timing.MAX_CALLS and asked[-3:] == [timing.MAX_CALLS] * 3

    def slow(n):  # claims one second per call
        return 1e9
    with pytest.raises(ValueError, match=r"7 repeats x 100 calls of about 1e\+03 ms would take about 700 s, above the "
                                         r"cap of 60 s per timing call; use number <= 8$"):
        timing.median_calls(slow, 7, 100, 0.0)
    with pytest.raises(ValueError, match=r"use repeats <= 6 or number <= 85$"):
        timing.median_calls(lambda n: 1e8, 7, 100, 0.0)  # 0.1 s per call: 10 s per repeat


def test_median_calls_stops_at_the_deadline(monkeypatch):
    monkeypatch.setattr(timing, "MAX_SECONDS", 0.3)
    calls = []

    def lying(n):  # the probe says 1 us, every later loop takes 0.1 s
        calls.append(n)
        if len(calls) > 1:
            time.sleep(0.1)
        return 1000.0
    with pytest.warns(RuntimeWarning, match="stopped after"):
        timing.median_calls(lying, 50, 1, 0.0)
    assert len(calls) < 10


BOUNDED_CASES = {
    # the streaming experiment
    "stream negative interval": ("streaming.run_stream(q, x, x, 'neon', chunk=2, interval_s=-0.1)", "ValueError",
                                 "interval_s must be at least 0"),
    "stream nan interval": ("streaming.run_stream(q, x, x, 'neon', chunk=2, interval_s=float('nan'))", "ValueError",
                            "interval_s must be finite"),
    "stream long interval": ("streaming.run_stream(q, x, x, 'neon', chunk=2, interval_s=5)", "ValueError",
                             "at most 1"),
    "stream chunk 0": ("streaming.run_stream(q, x, x, 'neon', chunk=0)", "ValueError", "chunk must be at least 1"),
    "stream chunk past end": ("streaming.run_stream(q, x, x, 'neon', chunk=10**9)", "ValueError", "chunk must be below 5"),
    "stream many chunks": ("streaming.run_stream(q, np.zeros((5000, 64), np.float32), np.zeros((5000, 64), np.float32), "
                           "'neon', chunk=1)", "ValueError", "cap of 4096"),
    "stream long run": ("streaming.run_stream(q, np.zeros((4000, 64), np.float32), np.zeros((4000, 64), np.float32), "
                        "'neon', chunk=1, interval_s=0.5)", "ValueError", "above the cap of 120 s"),
    "stream block": ("streaming.run_stream(q, x, x, 'neon', chunk=2, block_size=10**9)", "ValueError", "block_size must be below"),
    "stream q": ("streaming.run_stream(q[:32].copy(), x, x, 'neon', chunk=2)", "ValueError", "q must have shape [64]"),
    "stream head_dim": ("streaming.run_stream(q[:48].copy(), x[:, :48].copy(), x[:, :48].copy(), 'neon', chunk=2)",
                        "ValueError", "multiple of 32"),
    "stream ok": ("np.allclose(streaming.run_stream(q, x, x, 'streaming', chunk=2, interval_s=0.001).out, "
                  "lk.attend(q, streaming.cache_of(x, x), 0), atol=1e-5)", "ok", "True"),
    # exercise checks: absurd answers, refused without building them
    "lines range 10**9": ("(lambda t0, v: (v.status, time.perf_counter() - t0 < 2))(time.perf_counter(), "
                          "exercises.lesson04.ex1.check({'lines': [(1, 10**9)]}))", "ok", "('incorrect', True)"),
    "lines as a range": ("exercises.lesson04.ex1.check({'lines': range(10**9)}).message", "ok", "holds 1000000000 values"),
    "lines huge int": ("exercises.lesson04.ex1.check({'lines': [10**10000]}).message", "ok", "far too large"),
    "int field huge": ("exercises.lesson03.ex1.check({'block': 10**5000, 'offset': 1, 'kscale_index': 1, "
                       "'k_scale_index': 1}).message", "ok", "far too large"),
    "float field huge": ("exercises.lesson01.ex2.check({'distinct_with_outlier': 1e400, 'distinct_without': 3}).status",
                         "ok", "'incorrect'"),
    "float overflow": ("exercises.lesson03.ex2.check({'bytes_saved_per_token': 56, 'quiet_error_ratio': 10**400, "
                       "'lines': [1, 2]}).message", "ok", "cannot be read"),
    "giant list": ("exercises.lesson01.ex1.check({'qsc': 0.01, 'codes': [0] * 10**6, 'ties_even_changes': []}).message",
                   "ok", "more than 10000 values"),
    "deep list": ("(lambda a: [a.append([a[-1]]) for _ in range(100)] and "
                  "exercises.lesson03.ex2.check({'bytes_saved_per_token': 1, 'quiet_error_ratio': 1, 'lines': a[-1]}).message)([[]])",
                  "ok", "nested more than 16 levels"),
    "pairs of ranges": ("exercises.lesson00.ex2.check({'exact_pairs': [range(10**9)], 'largest_difference': 1e-6}).status",
                        "ok", "'incorrect'"),
    "segments huge": ("exercises.lesson06.ex2.check({1: range(10**9), 2: (1, 2), 3: (1, 2), 4: (1, 2)}).message", "ok",
                      "give (start line, end line)"),
    "choice huge": ("exercises.lesson06.ex3.check({'choice': 10**10000}).message", "ok", "must be one of"),
    "zero key list": ("exercises.lesson03.ex3.check({'stored_scale': 0, 'score': 0, 'weight_share': [0] * 10**6}).status",
                      "ok", "'incorrect'"),
    # generations and their traces
    "observe too long": ("debug.observe_generation(10**6)", "ValueError", "cap of 256"),
    "records too long": ("debug.records_from_trace(10**6)", "ValueError", "cap of 256"),
    "observe timeout": ("debug.observe_generation(4, timeout=float('inf'))", "ValueError", "timeout must be finite"),
    "generate too long": ("toy.generate(10**9, verbose=False)", "ValueError", "cap of 4096"),
    "generate prompt": ("toy.generate(4, prompt=range(10**9), verbose=False)", "ValueError", "len(prompt)"),
    "generate traces": ("toy.generate(4000, trace=True, verbose=False)", "ValueError", "MiB, above the cap of 512 MiB"),
    "toy model huge": ("toy.ToyConfig(vocab=10**9)", "ValueError", "cap of 67108864"),
    "rescale counts": ("rescales.random_order_counts([10**6], trials=10**3)", "ValueError", "cap of 16777216"),
    "harmonic huge": ("round(softmax.harmonic(10**12), 6)", "ok", "28.208"),
    "online long": ("softmax.online(np.zeros(1 << 21))", "ValueError", "cap of 1048576"),
    "synthetic huge": ("synthetic.cache_with_scores(np.zeros(1 << 24, np.float32), head_dim=256)", "ValueError", "MiB"),
    "bench length": ("bench_tool.run([10**9], 1)", "ValueError", "cap of 1048576"),
    "bench heads": ("bench.make_inputs(262144, n_kv_heads=64)", "ValueError", "MiB"),
}


@pytest.fixture(scope="module")
def bounded_results():
    return run_child(BOUNDED_CASES, timeout=60)


@pytest.mark.parametrize("name", list(BOUNDED_CASES))
def test_long_helpers_bounded(bounded_results, name):
    expect(bounded_results, name, *BOUNDED_CASES[name][1:])


def _kv(n=64, hd=64, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(hd, dtype=np.float32), rng.standard_normal((n, hd), dtype=np.float32),
            rng.standard_normal((n, hd), dtype=np.float32))


def test_stream_producer_failure_is_a_clear_error(monkeypatch, tmp_path):
    q, K, V = _kv()
    real = streaming._producer

    class FullDisk:  # the first chunk lands, the second write fails as on a full disk
        def __init__(self, kv):
            self.kv, self.writes = kv, 0

        def __setitem__(self, key, value):
            self.writes += 1
            if self.writes > 2:
                raise OSError(28, "No space left on device")
            self.kv[key] = value

    monkeypatch.setattr(streaming, "_producer", lambda kv, *a: real(FullDisk(kv), *a))
    with pytest.raises(RuntimeError, match=r"failed after writing 1 of 4 chunks: OSError: \[Errno 28\] No space left"):
        streaming.run_stream(q, K, V, "neon", chunk=16, interval_s=0.0, directory=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_stream_producer_that_ends_or_stalls(monkeypatch, tmp_path):
    q, K, V = _kv()

    def ends_early(kv, K, V, chunk, interval_s, announce, stop):
        announce.put(("chunk", 0, time.perf_counter()))

    monkeypatch.setattr(streaming, "_producer", ends_early)
    with pytest.raises(RuntimeError, match="ended after announcing 1 of 4 chunks, without an error"):
        streaming.run_stream(q, K, V, "streaming", chunk=16, interval_s=0.0, directory=str(tmp_path))

    stopped = threading.Event()

    def stalls(kv, K, V, chunk, interval_s, announce, stop):
        stop.wait(30)  # announces nothing until the consumer gives up
        stopped.set()

    monkeypatch.setattr(streaming, "_producer", stalls)
    monkeypatch.setattr(streaming, "STALL_S", 0.5)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"announced no chunk for 0.5 s .*chunk 1 of 4\): it stalled"):
        streaming.run_stream(q, K, V, "neon", chunk=16, interval_s=0.0, directory=str(tmp_path))
    assert time.perf_counter() - t0 < 5 and stopped.wait(2)  # bounded, and the producer was told to stop
    assert list(tmp_path.iterdir()) == []


def test_trace_fallback_keeps_only_what_the_records_need(monkeypatch):
    seen = []
    real = trace.run_traced

    def spy(*args, fields=None, **kw):
        seen.append(fields)
        return real(*args, fields=fields, **kw)

    monkeypatch.setattr(toy, "run_traced", spy)
    records, tokens = debug.records_from_trace(6)
    assert len(records) == 6 * toy.ToyConfig().n_q_heads and len(tokens) == 6
    assert seen and all(f is not None and "vkq" not in f and "dots" not in f for f in seen)
    # the same records as the full trace gives
    monkeypatch.setattr(toy, "run_traced", real)
    full = toy.generate(6, trace=True, verbose=False)
    for r, tr in zip(records, full.traces):
        assert r.t == list(range(r.seq_len)) and np.allclose(r.M, tr.M) and r.final_S == float(tr.S[-1])
    # bytes of a generation's traces: quadratic in its length with vkq, far less without
    c = toy.ToyConfig()
    assert toy.trace_bytes(256, c) > 8 * toy.trace_bytes(256, c, ("v_rows", "s", "M", "S"))


# ============================================================================ 5. one split pool

def test_one_split_pool_of_fixed_size():
    split.shutdown_pool()
    cache, q, _, _ = make_case(5, 200, 1, 64, 16)
    want = lk.attend(q, cache, 0)
    before = threading.active_count()
    assert split.POOL_WORKERS + 1 <= max(2, os.cpu_count() or 1)  # with the caller: at most the cores
    peak = 0
    for n_threads in range(1, 65):
        got = lk.attend_split(q, cache, 0, 8, n_threads)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max(), err_msg=f"{n_threads} threads")
        peak = max(peak, sum(t.name.startswith("lessonkit-split") for t in threading.enumerate()))
    assert peak <= split.POOL_WORKERS
    assert threading.active_count() <= before + split.POOL_WORKERS
    split.shutdown_pool()
    assert not [t for t in threading.enumerate() if t.name.startswith("lessonkit-split")]
    np.testing.assert_allclose(lk.attend_split(q, cache, 0, 8, 4), want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_pool_shut_down_at_exit():
    """lessonkit registers shutdown_pool with atexit: running the exit handlers ends the pool."""
    code = textwrap.dedent("""
        import atexit, json, threading
        import numpy as np
        import lessonkit as lk
        from lessonkit.kernels import split
        c = lk.KVCacheQ8(1, 64, 16)
        x = np.ones((100, 1, 64), np.float32)
        c.append(x, x)
        lk.attend_split(np.ones(64, np.float32), c, 0, 4, 4)
        started = len(split._pool_now)
        atexit._run_exitfuncs()  # what the interpreter runs at exit
        alive = [t.name for t in threading.enumerate() if t.name.startswith("lessonkit-split")]
        print(json.dumps([started, len(split._pool_now), alive]))
    """)
    started, left, alive = json.loads(assert_clean(run_python(code, 60)).splitlines()[-1])
    assert started == (1 if split.POOL_WORKERS else 0) and left == 0 and alive == []


def test_usable_cores_follow_the_cpu_set(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert split.usable_cores() == 1
    cache, q, _, _ = make_case(6, 50, 1, 64, 16)
    before = sum(t.name.startswith("lessonkit-split") for t in threading.enumerate())
    lk.attend_split(q, cache, 0, 5, 64)  # one usable core: the calling thread alone
    assert sum(t.name.startswith("lessonkit-split") for t in threading.enumerate()) == before


# ============================================================================ 6. big.LITTLE

def rk3588_cpuinfo() -> str:
    """/proc/cpuinfo of an RK3588 (ROCK 5B, Linux 6.1): 4 Cortex-A55 r2p0, then 4 Cortex-A76 r4p0.
    aarch64 Linux prints no model name line."""
    blocks = []
    for cpu in range(8):
        little = cpu < 4
        blocks.append("\n".join([
            f"processor\t: {cpu}",
            "BogoMIPS\t: 48.00",
            "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
            "dcpop asimddp",
            "CPU implementer\t: 0x41",
            "CPU architecture: 8",
            f"CPU variant\t: {'0x2' if little else '0x4'}",
            f"CPU part\t: {'0xd05' if little else '0xd0b'}",
            "CPU revision\t: 0",
        ]))
    return "\n\n".join(blocks) + "\n\n"


@pytest.fixture
def board(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(rk3588_cpuinfo())
    model = tmp_path / "model"
    model.write_bytes(b"Radxa ROCK 5B\0")
    return cpuinfo, model


def test_core_types_and_default_choice(board):
    cpuinfo, model = board
    assert env.core_types(cpuinfo) == {"Cortex-A55": frozenset({0, 1, 2, 3}), "Cortex-A76": frozenset({4, 5, 6, 7})}
    plan = env.timing_cores(cpuinfo_path=cpuinfo)
    assert plan.name == "Cortex-A76" and plan.cpus == {4, 5, 6, 7}
    assert env.timing_cores("Cortex-A55", cpuinfo).cpus == {0, 1, 2, 3}
    assert env.timing_cores("a55", cpuinfo).name == "Cortex-A55"
    assert env.timing_cores("0xd05", cpuinfo).name == "Cortex-A55"
    assert env.timing_cores("any", cpuinfo).cpus == frozenset()
    with pytest.raises(ValueError, match="no 'Cortex-X9' cores.*'Cortex-A55', 'Cortex-A76'"):
        env.timing_cores("Cortex-X9", cpuinfo)
    with pytest.raises(TypeError, match="cores must be"):
        env.timing_cores(4, cpuinfo)
    assert env.cpu_name(cpuinfo, model) == "Radxa ROCK 5B"
    label = env.machine_label(cpuinfo_path=cpuinfo, model_path=model)
    assert label.startswith("Radxa ROCK 5B, timed on the Cortex-A76 cores (CPUs 4-7, pinned); also here: 4x Cortex-A55")
    assert label.endswith(f"kernel backend {lk.native.backend()}")
    assert "Cortex-A55 cores (CPUs 0-3" in env.machine_label("A55", cpuinfo, model)
    assert "not pinned (cores='any'): 4x Cortex-A55; 4x Cortex-A76" in env.machine_label("any", cpuinfo, model)


def test_other_parts_and_one_type(tmp_path):
    text = rk3588_cpuinfo().replace("0xd05", "0xd4f")
    (tmp_path / "c").write_text(text)
    assert set(env.core_types(tmp_path / "c")) == {"0xd4f", "Cortex-A76"}
    (tmp_path / "one").write_text(rk3588_cpuinfo().replace("0xd05", "0xd0b"))
    plan = env.timing_cores(cpuinfo_path=tmp_path / "one")
    assert plan.cpus == frozenset() and "one type" in plan.why
    assert "(Cortex-A76)" in env.machine_label(cpuinfo_path=tmp_path / "one", model_path=tmp_path / "none")
    # this machine: x86, no CPU part lines, nothing pinned, the label as before
    assert env.timing_cores().cpus == frozenset() or env.core_types()
    if not env.core_types():
        assert env.machine_label() == f"{env.cpu_name()}, {__import__('platform').machine()}, kernel backend {lk.native.backend()}"


class FakeAffinity:
    """os.sched_getaffinity / sched_setaffinity on a pretend 8-CPU board, recording every call."""

    def __init__(self, tids=(100, 101)):
        self.masks = {tid: frozenset(range(8)) for tid in tids}
        self.masks[0] = frozenset(range(8))
        self.calls = []
        self.tids = list(tids)

    def get(self, tid):
        return set(self.masks[tid])

    def set(self, tid, cpus):
        self.calls.append((tid, frozenset(cpus)))
        self.masks[tid] = frozenset(cpus)

    def install(self, monkeypatch, cpuinfo):
        monkeypatch.setattr(os, "sched_getaffinity", self.get, raising=False)
        monkeypatch.setattr(os, "sched_setaffinity", self.set, raising=False)
        monkeypatch.setattr(env, "_thread_ids", lambda: list(self.tids))
        monkeypatch.setattr(env, "CPUINFO", cpuinfo)


def test_pinned_sets_and_restores_every_thread(board, monkeypatch):
    fake = FakeAffinity()
    fake.install(monkeypatch, board[0])
    fake.masks[101] = frozenset({0, 1, 2, 3, 4, 5})
    with env.pinned() as plan:
        assert plan.name == "Cortex-A76"
        assert fake.masks[100] == fake.masks[101] == {4, 5, 6, 7}
        fake.tids.append(102)          # a thread started inside inherits the pinned set
        fake.masks[102] = frozenset({4, 5, 6, 7})
    assert fake.masks[100] == set(range(8)) and fake.masks[101] == {0, 1, 2, 3, 4, 5}
    assert fake.masks[102] == set(range(8))  # the caller's set from before
    with pytest.raises(KeyError):
        with env.pinned():
            assert fake.masks[100] == {4, 5, 6, 7}
            raise KeyError("inside")
    assert fake.masks[100] == set(range(8)) and fake.masks[101] == {0, 1, 2, 3, 4, 5}
    fake.calls.clear()
    with env.pinned("any"):
        pass
    assert fake.calls == []
    fake.masks[0] = frozenset({0, 1})  # the process may not use the A76 cores: warned, not forced
    with pytest.warns(RuntimeWarning, match="outside this process's CPU set"):
        with env.pinned():
            pass
    assert fake.calls == []


def test_no_sched_setaffinity_is_a_no_op(board, monkeypatch):
    monkeypatch.delattr(os, "sched_setaffinity", raising=False)
    plan = env.timing_cores(cpuinfo_path=board[0])
    assert plan.cpus == frozenset() and "sched_setaffinity" in plan.why
    with env.pinned(plan):
        pass


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity here")
def test_real_affinity_within_the_current_set():
    mine = frozenset(os.sched_getaffinity(0))
    one = frozenset({min(mine)})
    plan = env.TimingCores("test", one, {"test": one, "rest": mine - one})
    with env.pinned(plan):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == mine
    with pytest.raises(ZeroDivisionError):
        with env.pinned(env.TimingCores("all", mine, {"all": mine, "x": frozenset()})):
            assert os.sched_getaffinity(0) == mine
            1 / 0
    assert os.sched_getaffinity(0) == mine


def test_timing_helpers_run_pinned(board, monkeypatch, case):
    cache, q, _, _ = case
    fake = FakeAffinity(tids=(7,))
    fake.install(monkeypatch, board[0])
    seen = []

    def during(name, fn):
        def wrapped(*a, **k):
            seen.append((name, fake.masks[7]))
            return fn(*a, **k)
        return wrapped

    real_median = timing.median_calls
    monkeypatch.setattr(timing, "median_calls", during("time_kernel", real_median))
    monkeypatch.setattr(kernels.attention, "median_calls", during("time_group", real_median))
    monkeypatch.setattr(split, "_refuse_long", during("parallel_capacity", split._refuse_long))

    timing.time_kernel(q, cache, repeats=1, number=2)
    kernels.time_group(np.stack([q, q]), cache, repeats=1, number=2)
    split.parallel_capacity(q, cache, 0, 2, number=2, repeats=1)
    names = {n for n, mask in seen}
    assert names == {"time_kernel", "time_group", "parallel_capacity"}
    assert all(mask == {4, 5, 6, 7} for _, mask in seen), seen
    assert fake.masks[7] == set(range(8))
    fake.calls.clear()
    assert bench.read_bandwidth_gbps(nbytes=1 << 16) > 0
    assert fake.calls == [(7, frozenset({4, 5, 6, 7})), (7, frozenset(range(8)))]
    timing.time_kernel(q, cache, repeats=1, number=2, cores="Cortex-A55")
    assert (7, frozenset({0, 1, 2, 3})) in fake.calls
    fake.calls.clear()
    bench.median_ns(lambda: seen.append(("median_ns", fake.masks[7])), 2)
    assert seen[-1] == ("median_ns", {4, 5, 6, 7}) and fake.masks[7] == set(range(8))


def test_bench_runs_pinned_once(board, monkeypatch):
    fake = FakeAffinity(tids=(7,))
    fake.install(monkeypatch, board[0])
    from workbench import bench as bench_tool
    result = bench_tool.run([256], repeats=1)
    assert "Cortex-A76 cores (CPUs 4-7, pinned)" in result["machine"]
    assert fake.calls[0] == (7, frozenset({4, 5, 6, 7})) and fake.calls[-1] == (7, frozenset(range(8)))
    assert fake.masks[7] == set(range(8))
