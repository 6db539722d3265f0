"""The check every new build of native/ passes before it is loaded into a student's process.

``lessonkit.native`` runs this file in a child process (``python -I smoke.py``, the request as JSON
on stdin: the library's path, the header it was compiled with, the report file, and the cache length).
It calls every function of the library on a few caches, the awkward cases among them (one token, a
block boundary, a kv head other than 0, every token a new maximum, head_dim 256, thousands of tokens
over many blocks), and compares each result with the engine's quantized math recomputed here in numpy
(float64). Asked for a ``shape`` (a student's call on a cache larger than any the build was checked on:
``[seq_len, n_kv_heads, head_dim, block_size]``), it runs that one case, on the last kv head.

It reports codes and numbers, never words (``lessonkit.native`` words them in the student's language),
on its own channel, the report file, so that a ``printf`` in the kernel (the kernel's stdout and
stderr are the child's own) can never be taken for the report: each step before it runs
(``running [function, case, part]``: a crash or a hang names the step), then one line
``report {"failures": [[function, case, part, [code, numbers...]], ...], "covered": [shape, ...]}`` (the
cache shapes it ran on, ``[seq_len, n_kv_heads, head_dim, block_size]``: what the library's record keeps).

It imports numpy, cffi, lessonkit.header and lessonkit.quant (for Q's codes) only: nothing in the child
builds anything."""
from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path

import cffi
import numpy as np

# Tolerance of a kernel's output against the float64 reference, relative to max|reference|.
# The intact kernels agree to about 1e-6 (float32 sums, fused or unfused multiply-adds); a
# student's rewrite that keeps the math (scale folded into the Q scales, another summation
# order) stays far below 1e-4; a real mistake (a dropped rescale, a wrong row) is off by 1e-2 or more.
TOL = 1e-4
# On long caches the float32 running sums S and VKQ (one term per token) carry a rounding error that
# grows about as sqrt(seq_len) * 2**-24 (float32's unit roundoff, each rounding a step of a random
# walk): 1.1e-4 of the intact kernel at 2M tokens. The tolerance grows with it, four times over; it stays
# far below a real mistake's 1e-2 up to caches larger than memory holds (2e-3 at 64M tokens).
def tolerance(seq_len: int) -> float:
    return max(TOL, 4 * seq_len ** 0.5 * 2.0 ** -24)


QBLK = 32

CASES = (  # seq_len, n_kv_heads, head_dim, block_size, kv_head, every token a new maximum
    (1, 1, 32, 4, 0, 0),
    (33, 2, 64, 16, 1, 0),   # across two block boundaries
    (70, 3, 128, 8, 2, 1),
    (9, 1, 256, 64, 0, 0),
    # thousands of tokens over 257 blocks, in the lessons' shape (Qwen3's 8 kv heads of head_dim 128):
    # a buffer sized for a short cache, or by tokens x head_dim or tokens x kv heads, overflows here
    (4100, 8, 128, 16, 7, 0),
)
# The kernel's own output (printf) goes to files; each may grow to this size, the rest is dropped
# (RLIMIT_FSIZE, with SIGXFSZ ignored: a write past it fails quietly instead of killing the check).
OUTPUT_LIMIT = 1 << 20
# The traced build records VKQ (seq_len * head_dim floats) only up to this many values: a long case
# checks the traced kernel's other records, without 100 MB of VKQ.
TRACE_VKQ_MAX = 1 << 22

_report = sys.stderr  # main() opens the report file


def step(fn: str, case=None, part=None) -> list:
    print("running " + json.dumps([fn, case, part]), file=_report, flush=True)
    return [fn, case, part]


def quantize_rows(x: np.ndarray):
    """K/V rows as the engine writes them: raw max|x| per row, floor(x * 127 / max + 0.5) in double."""
    amax = np.abs(x).max(axis=1).astype(np.float32)
    safe = np.where(amax > 0, amax, 1).astype(np.float64)
    codes = np.floor(x.astype(np.float64) * 127.0 / safe[:, None] + 0.5)
    codes[amax == 0] = 0
    return codes.astype(np.int8), amax


class Cache:
    """A q8 cache in the kernel's layout, built with the library's own quantizer. Only kv head ``kh``, the
    one every call reads, holds data; the other heads' codes and scales are zero, so a kernel that reads
    another head's row is off at once, and a large case costs the time of one head, not of all."""

    def __init__(self, ffi, lib, T, nkv, hd, bs, kh, rows):
        """``rows(t0, t1)``: head kh's float32 K and V rows ``[t1 - t0, hd]`` of tokens t0 ... t1 - 1."""
        self.T, self.hd = T, hd
        nblocks = -(-T // bs)
        self.k_blocks = [np.zeros((bs, nkv * hd), np.int8) for unused in range(nblocks)]
        self.v_blocks = [np.zeros((bs, nkv * hd), np.int8) for unused in range(nblocks)]
        self.k_scale = np.zeros((T, nkv), np.float32)
        self.v_scale = np.zeros((T, nkv), np.float32)
        for b in range(nblocks):  # one call per block: head kh's rows lie kv_dim apart, its scales nkv apart
            t0, t1 = b * bs, min(T, (b + 1) * bs)
            for X, blocks, scales in zip(rows(t0, t1), (self.k_blocks, self.v_blocks), (self.k_scale, self.v_scale)):
                lib.kvq8_quantize_rows(ffi.from_buffer("float[]", np.ascontiguousarray(X)), t1 - t0, hd, hd,
                                       ffi.from_buffer("int8_t[]", blocks[b]) + kh * hd, nkv * hd,
                                       ffi.from_buffer("float[]", scales[t0:t1]) + kh, nkv)
        self.k_ptrs = ffi.new("int8_t *[]", [ffi.from_buffer("int8_t[]", b) for b in self.k_blocks])
        self.v_ptrs = ffi.new("int8_t *[]", [ffi.from_buffer("int8_t[]", b) for b in self.v_blocks])

    def codes(self, kh):
        """Kv head kh's int8 K and V codes, ``[T, hd]`` each (gathered once per case: every reference
        of the case reads them)."""
        if getattr(self, "_codes", (None,))[0] != kh:
            cols = slice(kh * self.hd, (kh + 1) * self.hd)
            self._codes = (kh, *(np.concatenate([b[:, cols] for b in blocks])[:self.T]
                                 for blocks in (self.k_blocks, self.v_blocks)))
        return self._codes[1:]

    def args(self, ffi, kh):
        return (self.k_ptrs, self.v_ptrs,
                ffi.from_buffer("float[]", self.k_scale) + kh, ffi.from_buffer("float[]", self.v_scale) + kh)


def scores(cache: Cache, kh: int, q: np.ndarray, scale: float, chunk: int = 1 << 16) -> np.ndarray:
    """The kernel's scores in float64, from the cache's int8 codes and Q's codes (segment 1 as the
    kernel); ``chunk`` tokens at a time, so that a long case stays small."""
    from lessonkit.quant import q_codes
    K8 = cache.codes(kh)[0]
    qi, qsc = q_codes(q)
    qblocks = qi.astype(np.float64).reshape(-1, QBLK)
    s = np.empty(cache.T)
    for t0 in range(0, cache.T, chunk):
        K = K8[t0:t0 + chunk].astype(np.float64)
        dots = (K.reshape(len(K), -1, QBLK) * qblocks).sum(axis=2)
        s[t0:t0 + len(K)] = (dots * qsc.astype(np.float64)).sum(axis=1)
    return s * (cache.k_scale[:, kh] / 127.0 * scale)


# lowp (flash_attn_q8_v14_lowp, flash_attn_group_q8_lowp) gives each weight u_j = exp(s_j - M) * vstep_j
# as a code C_j * d, d = (largest u of its group of 16 tokens) / 16256, off by at most 0.51 d (half a
# step and float rounding; native/tests/test_kernel.c derives it). Output i is then off by at most
# sum_j 0.51 d_j |V_j[i]| / S. A group lies within 15 tokens of each of its tokens, whatever FA_TILE
# is, so d_j <= (largest u within 15 tokens of j) / 16256: the bound below, from this case's data.
LOWP_CMAX, LOWP_GROUP = 16256, 16


def lowp_bound(cache: Cache, kh: int, q: np.ndarray, scale: float, chunk: int = 1 << 16) -> np.ndarray:
    """float64 ``[hd]``: the most lowp's output may differ from the reference by, per value."""
    s = scores(cache, kh, q, scale)
    e = np.exp(s - max(-1e9, s.max()))
    u = e * cache.v_scale[:, kh] / 127.0
    pad = np.pad(u, LOWP_GROUP - 1)
    near = np.lib.stride_tricks.sliding_window_view(pad, 2 * LOWP_GROUP - 1).max(axis=1)
    step = 0.51 * near / LOWP_CMAX
    V8 = cache.codes(kh)[1]
    return sum(step[t0:t0 + chunk] @ np.abs(V8[t0:t0 + chunk].astype(np.float64))
               for t0 in range(0, cache.T, chunk)) / e.sum()


def reference(cache: Cache, kh: int, q: np.ndarray, scale: float, chunk: int = 1 << 16) -> np.ndarray:
    """The output in float64, from the cache's int8 codes and Q's codes (segment 1 as the kernel);
    ``chunk`` tokens at a time in float64, so that a long case stays small."""
    V8 = cache.codes(kh)[1]
    s = scores(cache, kh, q, scale, chunk)
    w = np.exp(s - max(-1e9, s.max())) * cache.v_scale[:, kh] / 127.0
    out = sum(w[t0:t0 + chunk] @ V8[t0:t0 + chunk].astype(np.float64) for t0 in range(0, cache.T, chunk))
    return out / np.exp(s - max(-1e9, s.max())).sum()


def compare(failures: list, what: list, got: np.ndarray, want: np.ndarray, tol: float = TOL,
            extra: float = 0.0) -> None:
    """``extra``: what a kernel may differ by beyond the tolerance (lowp's bound), relative to max|want|."""
    got = np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        failures.append([*what, ["nan"]])
        return
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    tol = (max(tol, tolerance(what[1][0])) if what[1] else tol) + extra
    if err > tol:
        failures.append([*what, ["off", err, tol]])


def check_quantizer(ffi, lib, failures, rng) -> None:
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[1] = 0.0                      # a row of zeros: scale 0, codes 0
    x[2, 3] = 3e38                  # huge and tiny values must not leave the int8 range
    x[3] *= np.float32(1e-30)
    codes = np.full((5, 64), 99, np.int8)
    scales = np.full(5, -1.0, np.float32)
    what = step("kvq8_quantize_rows", None, ["rows"])
    lib.kvq8_quantize_rows(ffi.from_buffer("float[]", x), 5, 64, 64, ffi.from_buffer("int8_t[]", codes), 64,
                           ffi.from_buffer("float[]", scales), 1)
    want_codes, want_scales = quantize_rows(x)
    if not np.array_equal(scales, want_scales):
        failures.append([*what, ["scales"]])
    bad = int((codes != want_codes).sum())
    if bad:
        failures.append([*what, ["codes", bad, codes.size]])


def check_kernels(ffi, lib, failures, rng, cases=CASES) -> None:
    # the kernels flash_attn_q8.h declares, called by name; every registry entry (fa_variants.h, read
    # from this library's own table) is called through fa_time_calls below
    kernels = ("flash_attn_single_q_q8_neon", "flash_attn_single_q_q8_scalar",
               "flash_attn_two_pass_scores_q8", "flash_attn_two_pass_recompute_q8", "flash_attn_single_q_q8_fast",
               "flash_attn_q8_v14_lowp")
    lowp = {"flash_attn_q8_v14_lowp", "lowp"}  # held to lowp_bound on top of the tolerance
    step("fa_variant_name")
    registry = [ffi.string(lib.fa_variant_name(i)).decode() for i in range(lib.fa_variant_count())]
    for case in cases:
        T, nkv, hd, bs, kh, rising = case
        case = list(case)
        q = rng.standard_normal(hd).astype(np.float32)

        def rows(t0, t1):
            K = rng.standard_normal((t1 - t0, hd)).astype(np.float32)
            if rising:  # token t's K leans more and more towards q: each score beats the last
                lean = (1.0 + 0.5 * np.arange(t0, t1))[:, None] * (q / np.abs(q).max())
                K = (0.2 * K + lean).astype(np.float32)
            return K, rng.standard_normal((t1 - t0, hd)).astype(np.float32)

        cache = Cache(ffi, lib, T, nkv, hd, bs, kh, rows)
        scale = float(1.0 / np.sqrt(hd))
        want = reference(cache, kh, q, scale)
        qb, ptrs = ffi.from_buffer("float[]", q), cache.args(ffi, kh)
        layout = (nkv * hd, bs, nkv, kh * hd, hd)
        tail = (T, *layout, scale)

        def run(fn, *args, part=None, out_shape=(hd,), want=want, call=None, bound=None):
            out = np.full(out_shape, np.nan, np.float32)
            what = step(fn, case, part)
            (call or getattr(lib, fn))(ffi.from_buffer("float[]", out), *args)
            # lowp: its bound, relative to max|want| like the tolerance, on top of it
            extra = 0.0 if bound is None else float(np.max(bound) / max(np.abs(want).max(), 1e-30))
            compare(failures, what, out.reshape(-1), want.reshape(-1), extra=extra)
            return what

        bound = lowp_bound(cache, kh, q, scale)
        for fn in kernels:
            run(fn, qb, *ptrs, *tail, bound=bound if fn in lowp else None)

        # the traced build: recording on (buffers sized for this call), then off
        tr = {f: np.zeros(n, dt) for f, n, dt in (
            ("q_codes", hd, np.int8), ("q_scales", hd // QBLK, np.float32), ("dots", T * hd // QBLK, np.int32),
            ("k_rows", T, np.uint64), ("v_rows", T, np.uint64), ("s", T, np.float32), ("M", T, np.float32),
            ("S", T, np.float32), ("ms", T, np.float32), ("vkq", T * hd, np.float32)) if f != "vkq" or n <= TRACE_VKQ_MAX}
        c = ffi.new("fa_trace *")
        keep = []
        for field, arr in tr.items():
            ctype = {np.int8: "int8_t[]", np.int32: "int32_t[]", np.uint64: "uint64_t[]"}.get(arr.dtype.type, "float[]")
            keep.append(ffi.from_buffer(ctype, arr))
            setattr(c, field, keep[-1])
        for recording in (c, ffi.NULL):
            lib.fa_trace_set(recording)
            run("flash_attn_single_q_q8_neon_traced", qb, *ptrs, *tail,
                part=["recording" if recording else "not_recording"])
            lib.fa_trace_set(ffi.NULL)

        # GQA in one scan: G = 3 query heads over this kv head
        qs = rng.standard_normal((3, hd)).astype(np.float32)
        want_g = np.stack([reference(cache, kh, qs[g], scale) for g in range(3)])
        run("flash_attn_group_q8_neon", ffi.from_buffer("float[]", qs), *ptrs, *tail, 3, part=["group", 3],
            out_shape=(3, hd), want=want_g)
        bound_g = np.stack([lowp_bound(cache, kh, qs[g], scale) for g in range(3)])
        run("flash_attn_group_q8_lowp", ffi.from_buffer("float[]", qs), *ptrs, *tail, 3, part=["group", 3],
            out_shape=(3, hd), want=want_g, bound=bound_g)

        # split-KV: two chunks' states, merged here
        ranges = ((0, max(1, T // 3)), (max(1, T // 3), T)) if T > 1 else ((0, 1),)
        states = []
        for t0, t1 in ranges:
            vkq, m, s = np.full(hd, np.nan, np.float32), ffi.new("float *"), ffi.new("float *")
            what = step("flash_attn_partial_q8_neon", case, ["tokens", t0, t1])
            lib.flash_attn_partial_q8_neon(ffi.from_buffer("float[]", vkq), m, s, qb, *ptrs, t0, t1, *layout, scale)
            states.append((float(m[0]), float(s[0]), vkq.astype(np.float64)))
        M = max(st[0] for st in states)
        S = sum(st[1] * np.exp(st[0] - M) for st in states)
        compare(failures, [what[0], case, ["merged"]], sum(st[2] * np.exp(st[0] - M) for st in states) / S, want)

        # lesson 05b's passes over token ranges (flash_attn_q8_two_pass_parts.c): the first pass on
        # two consecutive ranges, then what waits for the last one
        vkq, m, s = np.zeros(hd, np.float32), ffi.new("float *", -1e9), ffi.new("float *", 0.0)
        for t0, t1 in ranges:
            what = step("flash_attn_single_pass_fold_q8", case, ["tokens", t0, t1])
            lib.flash_attn_single_pass_fold_q8(ffi.from_buffer("float[]", vkq), m, s, qb, *ptrs, t0, t1, *layout, scale)
        compare(failures, [what[0], case, ["two_ranges"]], vkq / float(s[0]), want)
        scores, m = np.full(T, np.nan, np.float32), ffi.new("float *", -1e9)
        for t0, t1 in ranges:
            step("flash_attn_two_pass_scores_pass1_q8", case, ["tokens", t0, t1])
            lib.flash_attn_two_pass_scores_pass1_q8(ffi.from_buffer("float[]", scores), m, qb, ptrs[0], ptrs[2],
                                                    t0, t1, *layout, scale)
        run("flash_attn_two_pass_scores_rest_q8", ffi.from_buffer("float[]", scores), m[0], ptrs[1], ptrs[3], T,
            *layout)
        m, s = ffi.new("float *", -1e9), ffi.new("float *", 0.0)
        for t0, t1 in ranges:
            step("flash_attn_two_pass_recompute_pass1_q8", case, ["tokens", t0, t1])
            lib.flash_attn_two_pass_recompute_pass1_q8(m, s, qb, ptrs[0], ptrs[2], t0, t1, *layout, scale)
        run("flash_attn_two_pass_recompute_pass2_q8", qb, *ptrs, m[0], s[0], T, *layout, scale)

        # the timing loops compute what the kernels compute: every registry entry
        for variant, fn in enumerate(registry):
            ns = []
            run("fa_time_calls", qb, *ptrs, *tail, part=["variant", variant],
                call=lambda out, *a: ns.append(lib.fa_time_calls(variant, 2, out, *a)),
                bound=bound if fn in lowp else None)
            if not ns[0] >= 0:
                failures.append(["fa_time_calls", case, ["variant", variant], ["returned", ns[0]]])
        for variant in (0, 1, 2, 3):  # 3: the grouped lowp kernel
            run("fa_time_group_calls", ffi.from_buffer("float[]", qs), *ptrs, *tail, 3, part=["variant", variant],
                out_shape=(3, hd), want=want_g, bound=bound_g if variant == 3 else None,
                call=lambda out, *a: lib.fa_time_group_calls(variant, 1, out, *a))
        flush = np.zeros(1 << 16, np.uint8)
        run("fa_time_call_cold", qb, *ptrs, *tail, call=lambda out, *a: lib.fa_time_call_cold(
            0, ffi.from_buffer("unsigned char[]", flush), flush.nbytes, out, *a))
        what = step("fa_read_cache_gbps", case)  # the layout probe: this cache's rows, whole 64-byte lines
        got = lib.fa_read_cache_gbps(*ptrs, T, *layout, 1)
        if not (got > 0 if hd % 64 == 0 else got == -1):
            failures.append([*what, ["not_positive"]])


def check_helpers(ffi, lib, failures, rng) -> None:
    x = (3 * rng.standard_normal(100)).astype(np.float32)
    want = np.exp(x.astype(np.float64) - x.max())
    want /= want.sum()
    for fn in ("softmax_naive", "softmax_safe", "softmax_online"):
        y = np.full(100, np.nan, np.float32)
        what = step(fn)
        getattr(lib, fn)(ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y), 100)
        compare(failures, what, y, want, tol=1e-5)
    buf = np.ones(1 << 12, np.uint8)
    what = step("fa_read_gbps")
    if not lib.fa_read_gbps(ffi.from_buffer("unsigned char[]", buf), buf.nbytes, 1) > 0:
        failures.append([*what, ["not_positive"]])
    for fn in ("fa_backend", "fa_simd_paths"):
        what = step(fn)
        if not ffi.string(getattr(lib, fn)()):
            failures.append([*what, ["empty_string"]])


def main() -> int:
    global _report
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's lessonkit
    from lessonkit.core.header import cdef
    request = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _report = open(request["report"], "w", encoding="utf-8")  # noqa: SIM115 (open until the process ends)
    ffi = cffi.FFI()
    ffi.cdef(cdef(request["header"]))
    step("dlopen")
    lib = ffi.dlopen(request["library"])
    failures: list = []
    rng = np.random.default_rng(20240902)
    shape = request.get("shape")  # a call's (seq_len, n_kv_heads, head_dim, block_size): that case alone
    cases = [(*shape, shape[1] - 1, 0)] if shape else CASES
    parts = ([lambda *a: check_kernels(*a, cases=cases)] if shape else
             [check_quantizer, check_kernels, check_helpers])
    for part in parts:
        try:
            part(ffi, lib, failures, rng)
        except AttributeError as e:  # a function the header no longer declares
            failures.append(["", None, None, ["missing", str(e)]])
    covered = [list(case[:4]) for case in cases]  # the cache shapes the kernels ran on, for native's record
    print("report " + json.dumps({"failures": failures, "covered": covered}), file=_report, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
