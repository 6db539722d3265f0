"""The check every new build of native/ passes before it is loaded into a student's process.

``lessonkit.native`` runs this file in a child process (``python -I smoke.py``, the request as
JSON on stdin: the library's path and the header it was compiled with). It calls every function
of the library on a few small caches, the awkward cases among them (one token, a block boundary,
a kv head other than 0, every token a new maximum, head_dim 256), and compares each result with
the engine's quantized math recomputed here in numpy (float64). It prints one JSON line:
``{"failures": ["<function> on <case>: ...", ...]}``.

If an edited kernel crashes or hangs, it does so here, in the child: the parent names the signal
or the timeout and the step that was running (each step is announced on stderr first).
It imports only numpy and cffi, never lessonkit, so that nothing in the child builds anything.
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np
import cffi

QBLK = 32
# Tolerance of a kernel's output against the float64 reference, relative to max|reference|.
# The intact kernels agree to about 1e-6 (float32 sums, fused or unfused multiply-adds); a
# student's rewrite that keeps the math (scale folded into the Q scales, another summation
# order) stays far below 1e-4; a real mistake (a dropped rescale, a wrong row) is off by 1e-2 or more.
TOL = 1e-4

CASES = (
    # name, seq_len, n_kv_heads, head_dim, block_size, kv_head, kind of data
    ("1 token, head_dim 32", 1, 1, 32, 4, 0, "random"),
    ("33 tokens across two block boundaries, kv head 1 of 2", 33, 2, 64, 16, 1, "random"),
    ("70 rising scores (a new max at every token), kv head 2 of 3", 70, 3, 128, 8, 2, "rising"),
    ("9 tokens, head_dim 256", 9, 1, 256, 64, 0, "random"),
)


# The language of the failure lines: the request's "lang" ("en" or "zh", lessonkit.language's at
# build time). This file imports no lessonkit, so it carries its own two halves of each text.
LANG = "en"
CASE_NAMES_ZH = {
    "1 token, head_dim 32": "1 个 token，head_dim 32",
    "33 tokens across two block boundaries, kv head 1 of 2": "33 个 token，跨两个块边界，2 个 kv 头中的第 1 个",
    "70 rising scores (a new max at every token), kv head 2 of 3":
        "70 个递增的分数（每个 token 都是新最大值），3 个 kv 头中的第 2 个",
    "9 tokens, head_dim 256": "9 个 token，head_dim 256",
}


def _t(en: str, zh: str) -> str:
    return zh if LANG == "zh" else en


def _what(what: str) -> str:
    """A failure's subject ("<function> on case '<name>'") in the language of the request; the
    function's name stays first, followed by " (", as lessonkit.native groups failures by it."""
    if LANG != "zh":
        return what
    for en, zh in CASE_NAMES_ZH.items():
        what = what.replace(f"case '{en}'", f"case '{zh}'")
    what = re.sub(r" on tokens \[(\d+), (\d+)\) of case '([^']*)'", r" (token [\1, \2)，用例 '\3')", what)
    what = re.sub(r" on case '([^']*)'", r" (用例 '\1')", what)
    for en, zh in (("(recording)", "(记录中)"), ("(not recording)", "(不记录)"), ("(chunks merged)", "(各区间合并)"),
                   ("(two ranges)", "(两个区间)")):
        what = what.replace(en, zh)
    return re.sub(r"\(query head (\d+) of 3\)", r"(查询头 \1，共 3 个)", re.sub(r"\(variant (\d+)", r"(变体 \1", what))


def step(what: str) -> None:
    print(f"running {_what(what)}", file=sys.stderr, flush=True)


def quantize_q(q: np.ndarray):
    """Segment 1 of the kernel in numpy float32 (as lessonkit.quant.quantize_q)."""
    blocks = q.reshape(-1, QBLK)
    qm = np.abs(blocks).max(axis=1)
    qm = np.where(qm < np.float32(1e-6), np.float32(1.0), qm).astype(np.float32)
    scales = (qm * (np.float32(1.0) / np.float32(127.0))).astype(np.float32)
    v = blocks * (np.float32(127.0) / qm)[:, None]
    r = np.trunc(v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5)))
    return np.clip(r, -128, 127).astype(np.int8).reshape(-1), scales


def quantize_rows(x: np.ndarray):
    """K/V rows as the engine writes them: raw max|x| per row, floor(x * 127 / max + 0.5) in double."""
    amax = np.abs(x).max(axis=1).astype(np.float32)
    safe = np.where(amax > 0, amax, 1).astype(np.float64)
    codes = np.floor(x.astype(np.float64) * 127.0 / safe[:, None] + 0.5)
    codes[amax == 0] = 0
    return codes.astype(np.int8), amax


class Cache:
    """A q8 cache in the kernel's layout, built with the library's own quantizer."""

    def __init__(self, ffi, lib, T, nkv, hd, bs, K, V):
        self.T, self.nkv, self.hd, self.bs = T, nkv, hd, bs
        nblocks = -(-T // bs)
        self.k_blocks = [np.zeros((bs, nkv * hd), np.int8) for _ in range(nblocks)]
        self.v_blocks = [np.zeros((bs, nkv * hd), np.int8) for _ in range(nblocks)]
        self.k_scale = np.zeros((T, nkv), np.float32)
        self.v_scale = np.zeros((T, nkv), np.float32)
        for t in range(T):
            b, r = divmod(t, bs)
            for X, blocks, scales in ((K, self.k_blocks, self.k_scale), (V, self.v_blocks, self.v_scale)):
                rows = np.ascontiguousarray(X[t])
                lib.kvq8_quantize_rows(ffi.from_buffer("float[]", rows), nkv, hd, hd,
                                       ffi.from_buffer("int8_t[]", blocks[b][r]), hd,
                                       ffi.from_buffer("float[]", scales[t]), 1)
        self.k_ptrs = ffi.new("int8_t *[]", [ffi.from_buffer("int8_t[]", b) for b in self.k_blocks])
        self.v_ptrs = ffi.new("int8_t *[]", [ffi.from_buffer("int8_t[]", b) for b in self.v_blocks])

    def codes(self, blocks, kh):
        rows = np.concatenate(blocks)[:self.T]
        return rows[:, kh * self.hd:(kh + 1) * self.hd].astype(np.float64)

    def args(self, ffi, kh):
        return (self.k_ptrs, self.v_ptrs,
                ffi.from_buffer("float[]", self.k_scale) + kh, ffi.from_buffer("float[]", self.v_scale) + kh)


def reference_state(cache: Cache, kh: int, q: np.ndarray, scale: float, t0: int, t1: int):
    """(M, S, VKQ) of tokens [t0, t1) in float64, from the cache's int8 codes and Q's codes."""
    qi, qsc = quantize_q(q)
    K = cache.codes(cache.k_blocks, kh)[t0:t1]
    V = cache.codes(cache.v_blocks, kh)[t0:t1]
    dots = (K.reshape(t1 - t0, -1, QBLK) * qi.astype(np.float64).reshape(-1, QBLK)).sum(axis=2)
    s = (dots * qsc.astype(np.float64)).sum(axis=1) * cache.k_scale[t0:t1, kh] / 127.0 * scale
    M = max(-1e9, s.max())
    w = np.exp(s - M)
    return M, w.sum(), (w * cache.v_scale[t0:t1, kh] / 127.0) @ V


def reference(cache, kh, q, scale):
    M, S, vkq = reference_state(cache, kh, q, scale, 0, cache.T)
    return vkq / S


def compare(failures: list, what: str, got: np.ndarray, want: np.ndarray, tol: float = TOL) -> None:
    got = np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        failures.append(_what(what) + _t(": the output holds NaN or Inf", "：输出里有 NaN 或 Inf"))
        return
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    if err > tol:
        failures.append(_what(what) + _t(f": off by {err:.1e} of max|reference| (tolerance {tol:.0e})",
                                         f"：与参考值相差 {err:.1e} 倍 max|reference|（容差 {tol:.0e}）"))


def make_case(ffi, lib, T, nkv, hd, bs, kh, kind, rng):
    K = rng.standard_normal((T, nkv, hd)).astype(np.float32)
    V = rng.standard_normal((T, nkv, hd)).astype(np.float32)
    q = rng.standard_normal(hd).astype(np.float32)
    if kind == "rising":  # token t's K leans more and more towards q: each score beats the last
        for t in range(T):
            K[t, kh] = (0.2 * K[t, kh] + (1.0 + 0.5 * t) * q / np.abs(q).max()).astype(np.float32)
    return Cache(ffi, lib, T, nkv, hd, bs, K, V), q


def check_quantizer(ffi, lib, failures, rng) -> None:
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[1] = 0.0                      # a row of zeros: scale 0, codes 0
    x[2, 3] = 3e38                  # huge and tiny values must not leave the int8 range
    x[3] *= np.float32(1e-30)
    codes = np.full((5, 64), 99, np.int8)
    scales = np.full(5, -1.0, np.float32)
    step("kvq8_quantize_rows on 5 rows (zeros, huge, tiny)")
    lib.kvq8_quantize_rows(ffi.from_buffer("float[]", x), 5, 64, 64, ffi.from_buffer("int8_t[]", codes), 64,
                           ffi.from_buffer("float[]", scales), 1)
    want_codes, want_scales = quantize_rows(x)
    if not np.array_equal(scales, want_scales):
        failures.append(_t("kvq8_quantize_rows: the scales are not the raw max|x| of each row",
                           "kvq8_quantize_rows：scale 不是每行原始的 max|x|"))
    bad = int((codes != want_codes).sum())
    if bad:
        failures.append(_t(f"kvq8_quantize_rows: {bad} of {codes.size} codes differ from floor(x * 127 / max + 0.5)",
                           f"kvq8_quantize_rows：{codes.size} 个编码中有 {bad} 个与 floor(x * 127 / max + 0.5) 不同"))


def check_kernels(ffi, lib, failures, rng) -> None:
    # the kernels flash_attn_q8.h declares, called by name; every registry entry (fa_variants.h, read
    # from this library's own table) is called through fa_time_calls below
    kernels = ("flash_attn_single_q_q8_neon", "flash_attn_single_q_q8_scalar",
               "flash_attn_two_pass_scores_q8", "flash_attn_two_pass_recompute_q8", "flash_attn_single_q_q8_fast")
    step("fa_variant_count, fa_variant_name (the registry of native/fa_variants.h)")
    registry = [ffi.string(lib.fa_variant_name(i)).decode() for i in range(lib.fa_variant_count())]
    for name, T, nkv, hd, bs, kh, kind in CASES:
        cache, q = make_case(ffi, lib, T, nkv, hd, bs, kh, kind, rng)
        scale = float(1.0 / np.sqrt(hd))
        want = reference(cache, kh, q, scale)
        tail = (T, nkv * hd, bs, nkv, kh * hd, hd, scale)
        for fn in kernels:
            out = np.full(hd, np.nan, np.float32)
            step(f"{fn} on case '{name}'")
            getattr(lib, fn)(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                             *cache.args(ffi, kh), *tail)
            compare(failures, f"{fn} on case '{name}'", out, want)

        # the traced build: recording on (buffers sized for this call), then off
        tr = {f: np.zeros(n, dt) for f, n, dt in (
            ("q_codes", hd, np.int8), ("q_scales", hd // QBLK, np.float32), ("dots", T * hd // QBLK, np.int32),
            ("k_rows", T, np.uint64), ("v_rows", T, np.uint64), ("s", T, np.float32), ("M", T, np.float32),
            ("S", T, np.float32), ("ms", T, np.float32), ("vkq", T * hd, np.float32))}
        c = ffi.new("fa_trace *")
        keep = []
        for field, arr in tr.items():
            ctype = {np.int8: "int8_t[]", np.int32: "int32_t[]", np.uint64: "uint64_t[]"}.get(arr.dtype.type, "float[]")
            keep.append(ffi.from_buffer(ctype, arr))
            setattr(c, field, keep[-1])
        for recording in (c, ffi.NULL):
            out = np.full(hd, np.nan, np.float32)
            step(f"flash_attn_single_q_q8_neon_traced ({'recording' if recording else 'not recording'}) "
                 f"on case '{name}'")
            lib.fa_trace_set(recording)
            lib.flash_attn_single_q_q8_neon_traced(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                                   *cache.args(ffi, kh), *tail)
            lib.fa_trace_set(ffi.NULL)
            compare(failures, f"flash_attn_single_q_q8_neon_traced ({'recording' if recording else 'not recording'}) "
                              f"on case '{name}'", out, want)

        # GQA in one scan: G = 3 query heads over this kv head
        qs = rng.standard_normal((3, hd)).astype(np.float32)
        outs = np.full((3, hd), np.nan, np.float32)
        step(f"flash_attn_group_q8_neon (G = 3) on case '{name}'")
        lib.flash_attn_group_q8_neon(ffi.from_buffer("float[]", outs), ffi.from_buffer("float[]", qs),
                                     *cache.args(ffi, kh), *tail, 3)
        for g in range(3):
            compare(failures, f"flash_attn_group_q8_neon (query head {g} of 3) on case '{name}'", outs[g],
                    reference(cache, kh, qs[g], scale))

        # split-KV: two chunks' states, merged here
        cut = max(1, T // 3) if T > 1 else 1
        states = []
        for t0, t1 in ((0, cut), (cut, T)) if T > 1 else ((0, 1),):
            vkq = np.full(hd, np.nan, np.float32)
            m, s = ffi.new("float *"), ffi.new("float *")
            step(f"flash_attn_partial_q8_neon on tokens [{t0}, {t1}) of case '{name}'")
            lib.flash_attn_partial_q8_neon(ffi.from_buffer("float[]", vkq), m, s, ffi.from_buffer("float[]", q),
                                           *cache.args(ffi, kh), t0, t1, nkv * hd, bs, nkv, kh * hd, hd, scale)
            states.append((float(m[0]), float(s[0]), vkq.astype(np.float64)))
        M = max(st[0] for st in states)
        S = sum(st[1] * np.exp(st[0] - M) for st in states)
        acc = sum(st[2] * np.exp(st[0] - M) for st in states)
        compare(failures, f"flash_attn_partial_q8_neon (chunks merged) on case '{name}'", acc / S, want)

        # lesson 05b's passes over token ranges (flash_attn_q8_two_pass_parts.c): the first pass on
        # two consecutive ranges, then what waits for the last one
        ranges = ((0, cut), (cut, T)) if T > 1 else ((0, 1),)
        qb, ptrs = ffi.from_buffer("float[]", q), cache.args(ffi, kh)
        layout = (nkv * hd, bs, nkv, kh * hd, hd)
        vkq = np.zeros(hd, np.float32)
        m, s = ffi.new("float *", -1e9), ffi.new("float *", 0.0)
        for t0, t1 in ranges:
            step(f"flash_attn_single_pass_fold_q8 on tokens [{t0}, {t1}) of case '{name}'")
            lib.flash_attn_single_pass_fold_q8(ffi.from_buffer("float[]", vkq), m, s, qb, *ptrs, t0, t1, *layout, scale)
        compare(failures, f"flash_attn_single_pass_fold_q8 (two ranges) on case '{name}'", vkq / float(s[0]), want)
        scores = np.full(T, np.nan, np.float32)
        m = ffi.new("float *", -1e9)
        for t0, t1 in ranges:
            step(f"flash_attn_two_pass_scores_pass1_q8 on tokens [{t0}, {t1}) of case '{name}'")
            lib.flash_attn_two_pass_scores_pass1_q8(ffi.from_buffer("float[]", scores), m, qb, ptrs[0], ptrs[2],
                                                    t0, t1, *layout, scale)
        out = np.full(hd, np.nan, np.float32)
        step(f"flash_attn_two_pass_scores_rest_q8 on case '{name}'")
        lib.flash_attn_two_pass_scores_rest_q8(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", scores),
                                               m[0], ptrs[1], ptrs[3], T, *layout)
        compare(failures, f"flash_attn_two_pass_scores_pass1_q8 + _rest_q8 on case '{name}'", out, want)
        m, s = ffi.new("float *", -1e9), ffi.new("float *", 0.0)
        for t0, t1 in ranges:
            step(f"flash_attn_two_pass_recompute_pass1_q8 on tokens [{t0}, {t1}) of case '{name}'")
            lib.flash_attn_two_pass_recompute_pass1_q8(m, s, qb, ptrs[0], ptrs[2], t0, t1, *layout, scale)
        out = np.full(hd, np.nan, np.float32)
        step(f"flash_attn_two_pass_recompute_pass2_q8 on case '{name}'")
        lib.flash_attn_two_pass_recompute_pass2_q8(ffi.from_buffer("float[]", out), qb, *ptrs, m[0], s[0], T,
                                                   *layout, scale)
        compare(failures, f"flash_attn_two_pass_recompute_pass1_q8 + _pass2_q8 on case '{name}'", out, want)

        # the timing loops compute what the kernels compute: every registry entry
        for variant, fn in enumerate(registry):
            out = np.full(hd, np.nan, np.float32)
            step(f"fa_time_calls (variant {variant}, {fn}) on case '{name}'")
            ns = lib.fa_time_calls(variant, 2, ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                   *cache.args(ffi, kh), *tail)
            if not ns >= 0:
                failures.append(_what(f"fa_time_calls (variant {variant}) on case '{name}'")
                                + _t(f": returned {ns}", f"：返回了 {ns}"))
            compare(failures, f"fa_time_calls (variant {variant}) on case '{name}'", out, want)
        for variant in (0, 1):
            outs = np.full((3, hd), np.nan, np.float32)
            step(f"fa_time_group_calls (variant {variant}) on case '{name}'")
            lib.fa_time_group_calls(variant, 1, ffi.from_buffer("float[]", outs), ffi.from_buffer("float[]", qs),
                                    *cache.args(ffi, kh), *tail, 3)
            compare(failures, f"fa_time_group_calls (variant {variant}) on case '{name}'", outs[2],
                    reference(cache, kh, qs[2], scale))
        flush = np.zeros(1 << 16, np.uint8)
        out = np.full(hd, np.nan, np.float32)
        step(f"fa_time_call_cold on case '{name}'")
        lib.fa_time_call_cold(0, ffi.from_buffer("unsigned char[]", flush), flush.nbytes,
                              ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q), *cache.args(ffi, kh), *tail)
        compare(failures, f"fa_time_call_cold on case '{name}'", out, want)


def check_helpers(ffi, lib, failures, rng) -> None:
    x = (3 * rng.standard_normal(100)).astype(np.float32)
    want = np.exp(x.astype(np.float64) - x.max())
    want /= want.sum()
    for fn in ("softmax_naive", "softmax_safe", "softmax_online"):
        y = np.full(100, np.nan, np.float32)
        step(fn)
        getattr(lib, fn)(ffi.from_buffer("float[]", x), ffi.from_buffer("float[]", y), 100)
        compare(failures, fn, y, want, tol=1e-5)
    buf = np.ones(1 << 12, np.uint8)
    step("fa_read_gbps")
    if not lib.fa_read_gbps(ffi.from_buffer("unsigned char[]", buf), buf.nbytes, 1) > 0:
        failures.append(_t("fa_read_gbps: did not return a positive bandwidth", "fa_read_gbps：没有返回正的带宽"))
    for fn in ("fa_backend", "fa_simd_paths"):
        step(fn)
        if not ffi.string(getattr(lib, fn)()):
            failures.append(fn + _t(": returned an empty string", "：返回了空字符串"))


def main() -> int:
    global LANG
    request = json.loads(sys.stdin.read())
    LANG = "zh" if request.get("lang") == "zh" else "en"
    ffi = cffi.FFI()
    ffi.cdef("\n".join(l for l in request["header"].splitlines() if not l.lstrip().startswith("#")))
    step("dlopen of the new library")
    lib = ffi.dlopen(request["library"])
    failures: list[str] = []
    rng = np.random.default_rng(20240902)
    for part in (check_quantizer, check_kernels, check_helpers):
        try:
            part(ffi, lib, failures, rng)
        except AttributeError as e:  # a function the header no longer declares
            failures.append(_t(f"missing function: {e}", f"缺少函数：{e}"))
    print(json.dumps({"failures": failures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
