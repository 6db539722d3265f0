"""Every exercise check of lessons 00-04 and 06-08 is fed one right and one wrong answer, and must
say "correct" to the first and "incorrect" (with its reason) to the second. Right answers are
worked out here independently of the checks where that is possible (formulas, numpy).

Run one exercise's tests by its marker, e.g. ``pytest -m ex06_tier_a tests/test_exercises.py``."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import debug, exercises as E, rounding, source
from lessonkit.quant import quantize_q

# exercises whose right and wrong answers are tested by a test of their own below, not by CASES
OWN_TESTS = {"ex06_tier_a": "test_tier_a"}


# ----------------------------------------------------------------------------- right answers

def right_ex00_backends():
    K, V, q, kh = E.core.lesson00_data()
    cache = lk.KVCacheQ8(8, 128, 64)
    cache.append(K, V)
    outs = {b: lk.attend(q, cache, kh, backend=b) for b in ("neon", "scalar", "numpy")}
    names = list(outs)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    exact = [p for p in pairs if np.array_equal(outs[p[0]], outs[p[1]])]
    largest = max(float(np.abs(outs[a] - outs[b]).max()) for a, b in pairs)
    return {"exact_pairs": exact, "largest_difference": largest}


def right_ex01_outlier():
    q, q_out = E.lesson01.l01_outlier_q()
    distinct = lambda v: len(np.unique(np.delete(quantize_q(v)[0][:32], 5)))  # noqa: E731 (numpy segment 1)
    return {"distinct_with_outlier": distinct(q_out), "distinct_without": distinct(q)}


def right_ex01_per128():
    """Per 32 from numpy's segment 1, per 128 rounded half away from zero in float64 (independent of
    the kernel's trace and of rounding.round_codes); RMS over the 12 queries' values pooled."""
    gaussian, outliers = E.lesson01.l01_per128_queries()

    def err(q, per128):
        if per128:
            qm = float(np.abs(q).max())
            v = q.astype(np.float64) * 127 / qm
            return np.sign(v) * np.floor(np.abs(v) + 0.5) * qm / 127 - q
        codes, scales = quantize_q(q)
        return codes * np.repeat(scales, 32) - q

    def ratio(qs, sl):
        rms = lambda k: np.sqrt(np.mean(np.concatenate([err(q, k)[sl] for q in qs]) ** 2))  # noqa: E731
        return rms(True) / rms(False)

    clean = np.r_[32:64, 96:128]
    return {"multiplies_saved_per_token": 128 // 32 - 1, "ratio_gaussian": ratio(gaussian, np.s_[:]),
            "ratio_clean_blocks": ratio(outliers, clean)}


def first_float32_exp_zero(step=5.0):
    """First t with exp(-step t) == 0 in the kernel's build: x86's inline expf (q8_simd.h) returns
    0 below -87; libm's expf underflows like numpy's float32 exp."""
    ffi, lib = lk.native.load()
    inline = "exp=inline" in ffi.string(lib.fa_simd_paths()).decode()
    t = 0
    with np.errstate(under="ignore"):
        while (-step * t >= -87.0) if inline else (np.exp(np.float32(-step * t)) != 0):
            t += 1
    return t


def invariant_loop(s, M, V):
    """The invariant, written as plain loops (independent of lessonkit's vectorized one)."""
    T = len(s)
    S, VKQ = np.zeros(T), np.zeros((T, V.shape[1]))
    for t in range(T):
        for j in range(t + 1):
            w = math.exp(float(s[j]) - float(M[t]))
            S[t] += w
            VKQ[t] += w * V[j]
    return S, VKQ


def invariant_final_max(s, M, V):
    """Wrong: every exponent relative to the final max instead of the max after token t."""
    s, V = np.asarray(s, float), np.asarray(V, float)
    w = np.exp(s - float(M[-1]))
    return np.cumsum(w), np.cumsum(w[:, None] * V, axis=0)


def right_ex03_zero_key():
    """As the student would: the zero row's scale and score are 0; its share from the kernel's own trace."""
    K, V, q = E.lesson03.l03_zero_key_data()
    c = lk.KVCacheQ8(2, 32, 16)
    c.append(K, V)
    unused, tr = lk.attend(q, c, 1, trace=True)
    return {"stored_scale": 0.0, "score": 0.0, "weight_share": math.exp(float(tr.s[5]) - float(tr.M[-1])) / float(tr.S[-1])}


def right_ex03_per_head():
    K = E.lesson03.l03_loud_head_K()
    T, nkv, hd = K.shape
    x = K.astype(np.float64)

    def q8(rows):  # the engine's rule in numpy: raw max scale, floor(x * 127 / max + 0.5)
        m = np.abs(rows).max(axis=-1, keepdims=True)
        return np.floor(rows * 127 / m + 0.5) * m / 127

    quiet = [h for h in range(nkv) if h != 3]
    per_head = q8(x)[:, quiet] - x[:, quiet]
    single = q8(x.reshape(T, -1)).reshape(T, nkv, hd)[:, quiet] - x[:, quiet]
    ratio = np.sqrt(np.mean(single ** 2)) / np.sqrt(np.mean(per_head ** 2))
    lines = [source.find_line("ks = kscale", segment=2), source.find_line("vs = vscale", segment=3)]
    return {"bytes_saved_per_token": 2 * 4 * nkv - 2 * 4, "quiet_error_ratio": ratio, "lines": lines}


def right_ex04_outside():
    first, last = source.function_lines("flash_attn_single_q_q8_neon")
    lines = source.KERNEL_FILE.read_text().splitlines()
    segs = source.kernel_segments().values()
    return {"lines": [n for n in range(first, last + 1)
                      if lines[n - 1].strip() and not any(s.begin <= n <= s.end for s in segs)]}


def right_ex06_segments(path=source.KERNEL_FILE):
    """The four parts in the numbering of the copy without markers, worked out here independently
    of lessonkit: each marker line removed shifts the lines below it up by one."""
    text = Path(path).read_text().splitlines()
    marker = [i + 1 for i, l in enumerate(text) if re.search(r"/\* == (end )?segment \d", l)]
    header = [i + 1 for i, l in enumerate(text) if "segment N ==" in l or "line ranges through them" in l]
    removed = sorted(marker + header + [header[-1] + 1])   # the header's sentence and its paragraph break
    new = lambda n: n - sum(1 for r in removed if r < n)
    begin = {int(m.group(1)): i + 1 for i, l in enumerate(text) if (m := re.search(r"== segment (\d):", l))}
    end = {int(m.group(1)): i + 1 for i, l in enumerate(text) if (m := re.search(r"== end segment (\d) ==", l))}
    return {n: (new(begin[n] + 1), new(end[n] - 1)) for n in begin}


def right_ex07_zero_codes():
    """Code 0 where |x| * 127 / max rounds to 0: the engine's max over the row, q8_0's over each block
    of 32 (numpy, independent of the C quantizer and of precision.quantize_q8_0)."""
    row = E.lesson07.l07_outlier_row().astype(np.float64)
    ordinary = np.delete(np.arange(128), 7)
    engine = np.floor(row * 127 / np.abs(row).max() + 0.5)
    blocks = row.reshape(4, 32)
    q8 = np.round(blocks / (np.abs(blocks).max(axis=1, keepdims=True) / 127)).ravel()  # no ties in this row
    return {"engine_zero_codes": int(np.sum(engine[ordinary] == 0)), "q8_0_zero_codes": int(np.sum(q8[ordinary] == 0))}


# (exercise, right answer or a function making it, wrong answer, words the wrong verdict must contain)
CASES = [
    (E.lesson00.ex1, {"bit_identical": True, "changed": ["kv_bs", "k_cache_q8", "v_cache_q8"]},
     {"bit_identical": True, "changed": ["kv_bs", "kscale"]}, "did not change"),
    (E.lesson00.ex2, right_ex00_backends,
     {"exact_pairs": [("neon", "scalar"), ("neon", "numpy"), ("scalar", "numpy")], "largest_difference": 0.0},
     "differ on this machine"),
    (E.lesson00.ex3, {"qsc0": 1 / 127, "without_guard": "a"}, {"qsc0": 1 / 127, "without_guard": "c"},
     "does not trap"),
    (E.lesson01.ex1, {"qsc": 1.27 / 127, "codes": [127, -64, 1, 1], "ties_even_changes": [2]},
     {"qsc": 1.27 / 127, "codes": [127, -63, 0, 1], "ties_even_changes": [2]}, "code 1"),
    (E.lesson01.ex2, right_ex01_outlier, {"distinct_with_outlier": 29, "distinct_without": 12}, "with the outlier"),
    (E.lesson01.ex3, right_ex01_per128, lambda: {**right_ex01_per128(), "ratio_clean_blocks": 1.41},
     "blocks 1 and 3"),
    (E.lesson02.ex1, {"order": "increasing", "extra_multiplies": 128 + 1, "extra_expf": 0},
     {"order": "random", "extra_multiplies": 129, "extra_expf": 0}, "random scores rescale"),
    (E.lesson02.ex2,
     lambda: {"rescales": 1, "first_zero_weight_token": first_float32_exp_zero(), "output_correct": True},
     {"rescales": 1, "first_zero_weight_token": first_float32_exp_zero() - 1, "output_correct": True}, "too early"),
    (E.lesson02.ex3, {"invariant": invariant_loop}, {"invariant": invariant_final_max}, "relative to M_t"),
    (E.lesson03.ex1, {"block": 37 // 16, "offset": (37 % 16) * 8 * 128 + 5 * 128, "kscale_index": 37 * 8,
                      "k_scale_index": 37 * 8 + 5},
     {"block": 2, "offset": (37 % 16) * 8 * 128, "kscale_index": 296, "k_scale_index": 301},
     "offset = 5120 is too small"),
    (E.lesson03.ex2, right_ex03_per_head,
     lambda: {**right_ex03_per_head(), "bytes_saved_per_token": 64}, "would store 8"),  # only the bytes wrong
    (E.lesson03.ex3, right_ex03_zero_key, lambda: {**right_ex03_zero_key(), "weight_share": 0.0},
     "not an absent key"),
    (E.lesson04.ex1, right_ex04_outside, lambda: {"lines": right_ex04_outside()["lines"][:-1]}, "missing"),
    (E.lesson04.ex2,
     {"distinct_k_scales": 1000, "distinct_q_scales": 128 // 32, "q_code_calls_if_per_token": 1000 * 128},
     {"distinct_k_scales": 4, "distinct_q_scales": 4, "q_code_calls_if_per_token": 128000}, "more than 4"),
    pytest.param(E.lesson04.ex3, {"multiplies_saved_per_token": 1, "scores_change_only_in_last_bits": True},
                 {"multiplies_saved_per_token": 4, "scores_change_only_in_last_bits": True}, "not 4",
                 marks=pytest.mark.slow, id="ex04_fold_scale"),
    # lesson 05: right answers by hand (bytes of lines per token: K row 128 + 8 heads' scales 32 = 160)
    # (ex1 at head_dim 64: K row 64 + 8 heads' scales 32 = 96 bytes of lines; ex2 at head_dim 256: 256 + 32)
    (E.lesson05.ex1, {"tokens_512k": (512 << 10) // 96, "tokens_3m": (3 << 20) // 96},
     {"tokens_512k": (512 << 10) // 68, "tokens_3m": (3 << 20) // 68}, "one head alone"),
    (E.lesson05.ex2, {"k_twice_extra_per_token": 288, "scores_extra_per_token": 4 * 4},
     {"k_twice_extra_per_token": 260, "scores_extra_per_token": 16}, "one head alone"),
    (E.lesson05.ex2, {"k_twice_extra_per_token": 288, "scores_extra_per_token": 16},
     {"k_twice_extra_per_token": 288, "scores_extra_per_token": 4}, "counts the array once"),
    # lesson 05b: bytes by hand as for lesson 05
    (E.lesson05b.ex1, {"bytes_after_last_chunk": (512 + 32768) * 160 + 32768 * 160},
     {"bytes_after_last_chunk": 2 * 32768 * 160 + 32768 * 160}, "pass 1 (M and S) runs as the chunks arrive"),
    (E.lesson05b.ex2, {"choice": "a"}, {"choice": "c"}, "missed every level"),
    (E.lesson06.ex2, right_ex06_segments, lambda: right_ex06_segments(source.KERNEL_FILE) | {2: (
        right_ex06_segments()[2][0] - 1, right_ex06_segments()[2][1])}, "segment 2"),
    (E.lesson06.ex3, {"choice": "a"}, {"choice": "b"}, "cannot be taken out"),
    pytest.param(E.lesson06.ex4, {"too_heavy": "a", "factor_token0": sum(math.exp(k) for k in range(4)) / 4},
                 {"too_heavy": "a", "factor_token0": 1.0}, "token 0", marks=pytest.mark.slow, id="ex06_break_rescale"),
    # lesson 07: right answers recomputed here with numpy only (the C quantizer's rule, q8_0's per-32 max)
    (E.lesson07.ex1, lambda: right_ex07_zero_codes(), {"engine_zero_codes": 0, "q8_0_zero_codes": 0}, "too low"),
    (E.lesson07.ex2, {"engine_bytes": 128 + 4, "q8_0_bytes": 128 + 2 * 128 // 32, "same_cost_hd": 64},
     {"engine_bytes": 128, "q8_0_bytes": 136, "same_cost_hd": 64}, "codes only"),
    (E.lesson07.ex3, {"choice": "a"}, {"choice": "b"}, "outliers are in K"),
    # lesson 08: bytes from the formula (hd + hd + 4 + 4 per token and kv head), the merge by hand
    (E.lesson08.ex1, {"grouped_gib": 36 * 8 * 32768 * (128 + 128 + 4 + 4) / 2**30,
                      "per_head_gib": 4 * 36 * 8 * 32768 * (128 + 128 + 4 + 4) / 2**30},
     {"grouped_gib": 36 * 8 * 32768 * 256 / 2**30, "per_head_gib": 9.28}, "left out the two 4-byte scales"),
    (E.lesson08.ex2, {"M": 5.0, "S": 3.0 * math.exp(2.0 - 5.0) + 1.5, "empty_changes_S": False},
     {"M": 5.0, "S": 4.5, "empty_changes_S": False}, "without moving A's"),
    (E.lesson08.ex3, {"choice": "a"}, {"choice": "b"}, "waits for the same memory"),
    # lesson 09: right answers worked out here by hand (head_dim 256: 520 bytes = 2 x 256 int8 + 2 fp32 scales)
    (E.lesson09.ex1, {"bytes_per_token": 520, "floor_ns": 520 / 20.0}, {"bytes_per_token": 512, "floor_ns": 25.6},
     "fp32 K scale"),
    (E.lesson09.ex1, {"bytes_per_token": 520, "floor_ns": 520 / 20.0}, {"bytes_per_token": 264, "floor_ns": 13.2},
     "head_dim 128"),
    (E.lesson09.ex2, {"one_core_gbps": 264 / (100 / 2.4), "four_cores_gbps": 4 * 264 / (100 / 2.4), "verdict": "a"},
     {"one_core_gbps": 2.64, "four_cores_gbps": 10.56, "verdict": "b"}, "cycles into ns"),
    # 6.3 GB/s per core is below one thread's 10.8 (b is true of one core alone), 25.3 for four is above 17
    (E.lesson09.ex2, {"one_core_gbps": 264 / (100 / 2.4), "four_cores_gbps": 4 * 264 / (100 / 2.4), "verdict": "a"},
     {"one_core_gbps": 264 / (100 / 2.4), "four_cores_gbps": 4 * 264 / (100 / 2.4), "verdict": "b"},
     "four share one DRAM"),
    # the floor: 264 bytes / 33 GB/s = 8 ns, above the new version's 6 ns in cache: 8 ns at best from DRAM
    (E.lesson09.ex3, {"best_ns": 8.0, "choice": "a"}, {"best_ns": 6.0, "choice": "a"}, "its time in cache"),
    (E.lesson09.ex3, {"best_ns": 8.0, "choice": "a"}, {"best_ns": 8.0, "choice": "b"}, "no loop goes below"),
    # 4 heads x 512 operations on 264 bytes = 2048 / 264 = 7.76 op/B; ridge 60 Gop/s / 10 GB/s = 6 op/B
    (E.lesson09.ex4, {"ops_per_byte": 2048 / 264, "ridge": 6.0, "roof": "a"},
     {"ops_per_byte": 512 / 264, "ridge": 6.0, "roof": "a"}, "one head's intensity"),
    (E.lesson09.ex4, {"ops_per_byte": 2048 / 264, "ridge": 6.0, "roof": "a"},
     {"ops_per_byte": 2048 / 264, "ridge": 10 / 60, "roof": "b"}, "peak / bandwidth"),
]


def _exercise_of(case):
    return case.values[0] if hasattr(case, "values") else case[0]


BY_MARKER: dict[str, list] = {}   # marker -> every case of that exercise, in CASES' order
for _c in CASES:
    BY_MARKER.setdefault(_exercise_of(_c).marker, []).append(_c)


def _registry_cases():
    """One test per registered exercise (lessonkit.exercises.ALL, every lesson module), with its
    marker (pytest -m ex03_address) and id; an exercise without a case in CASES still gets one,
    which fails: every exercise added to a lesson module needs a right and a wrong answer here."""
    for ex in E.ALL:
        if ex.marker in OWN_TESTS:
            continue
        cases = BY_MARKER.get(ex.marker, [])
        marks = [getattr(pytest.mark, ex.marker)]
        if not cases:
            yield pytest.param(ex, None, None, None, marks=marks, id=ex.marker)
        for i, case in enumerate(cases):  # a second case of one exercise gets its own id: ex05_bytes-2
            name = ex.marker if i == 0 else f"{ex.marker}-{i + 1}"
            if hasattr(case, "values"):
                yield pytest.param(*case.values, marks=[*case.marks, *marks], id=name)
            else:
                yield pytest.param(*case, marks=marks, id=name)


def _verdict(out: str) -> str:
    """What a check printed, without the new-build check's progress lines (a check that builds a copy
    of the kernel prints one before its verdict)."""
    return re.sub(r"^Checking (?:the new build|this build on a cache of \d+ tokens) in a separate process .*\n", "", out,
                  flags=re.MULTILINE)


@pytest.mark.parametrize("ex,right,wrong,words", list(_registry_cases()))
def test_right_and_wrong_answer(ex, right, wrong, words, capsys):
    assert right is not None, f"{ex.marker} has no case: add its right and wrong answer to CASES"
    right = right() if callable(right) else right
    ok = ex.check(right)
    assert ok.status == E.CORRECT, ok.message
    assert bool(ok) and _verdict(capsys.readouterr().out).startswith("Correct: ")
    bad = ex.check(wrong() if callable(wrong) else wrong)
    assert bad.status == E.INCORRECT and not bad, bad
    assert words in bad.message, bad.message
    assert _verdict(capsys.readouterr().out).startswith("Incorrect: ")


@pytest.mark.ex06_tier_a
def test_tier_a(tmp_path):
    """Tier A's answer is the student's own debugger session: a real gdb session typed as the lesson
    teaches (tests/test_debug.py runs lldb's too, and the doctored ones), then the same with one M
    typed in by hand."""
    from test_debug import typed_tier_a_session   # the session as a student types it, under the real gdb
    ex = E.lesson06.tier_a
    unused, logged = typed_tier_a_session("gdb", tmp_path)
    right = {"seq_len_first": 1, "calls_per_step": 4, "loop_runs_seq_len": True, "M_ever_decreases": False}
    assert ex.check(logged, answers=right)
    wrong = ex.check(logged, answers=right | {"loop_runs_seq_len": False})
    assert wrong.status == E.INCORRECT and "1 answer(s)" in wrong.message and "loop_runs_seq_len" in wrong.message
    m = re.search(r"^(\d+: M = )(\S+)$", logged, flags=re.M)
    typed = logged[:m.start(2)] + f"{float(m.group(2)) + 0.01:.3f}" + logged[m.end(2):]
    bad = ex.check(typed)
    assert bad.status == E.INCORRECT and "typed by hand" in bad.message
    assert "call 1, t=0:" in bad.message   # calls are counted from 1, in every verdict
    assert ex.check("").status == E.INCORRECT
    # pasted from a terminal that broke each long line at its width (the frame lines are over 300 characters)
    for width in (80, 41):
        wrapped = "\n".join(line[i:i + width] for line in logged.splitlines() for i in range(0, len(line) or 1, width))
        assert wrapped.count("\n") > logged.count("\n") and ex.check(wrapped, answers=right), width


@pytest.mark.ex06_tier_b_segments
def test_tier_b_reads_the_unmarked_copy(tmp_path):
    """The copy has no markers and other line numbers: the marker lines of native/ are a wrong
    answer, the trace hook at a part's edge may be in or out, and the check follows the file."""
    ex = E.lesson06.tier_b_segments
    copy = debug.unmarked_kernel(tmp_path / "k.c")
    assert "== segment" not in copy.read_text() and "for (int t = 0; t < seq_len" in copy.read_text()
    assert len(copy.read_text().splitlines()) < len(source.KERNEL_FILE.read_text().splitlines())
    markers = {n: (s.begin, s.end) for n, s in source.kernel_segments().items()}
    bad = ex.check(markers)
    assert bad.status == E.INCORRECT and "too late" in bad.message
    right = right_ex06_segments()
    assert ex.check({**right, 3: (right[3][0], right[3][1] - 1)})       # without TRACE_TOKEN
    assert ex.check({**right, 1: (right[1][0] - 1, right[1][1] + 1), 3: (right[3][0] - 1, right[3][1])})  # blank lines
    v = ex.check({**right, 2: (right[2][0] - 1, right[2][1])})          # the loop's own line is no part's
    assert v.status == E.INCORRECT and "segment 2" in v.message and "1 line(s) too early" in v.message
    v = ex.check({**right, 4: (right[4][0], right[4][1] + 1)})          # the closing brace is not part 4
    assert v.status == E.INCORRECT and "segment 4" in v.message and "1 line(s) too late" in v.message
    shifted = tmp_path / "flash_attn_q8_neon.c"
    shifted.write_text("/* two more lines */\n\n" + source.KERNEL_FILE.read_text())
    assert ex.check(right_ex06_segments(shifted), path=shifted)
    v = ex.check(right, path=shifted)
    assert v.status == E.INCORRECT and "2 line(s) too early" in v.message


@pytest.mark.parametrize("ex", [pytest.param(ex, marks=getattr(pytest.mark, ex.marker), id=ex.marker)
                                for ex in E.ALL])
def test_not_attempted_hint_and_solution(ex, capsys):
    assert ex.check().status == E.NOT_ATTEMPTED
    assert ex.check(ex.template).status == E.NOT_ATTEMPTED
    assert capsys.readouterr().out.startswith("Not attempted: ")
    ex.hint()
    ex.question()
    out = capsys.readouterr().out
    assert out.startswith("Hint: ") and ex.marker not in out   # the marker is for teachers (README), not students


class Evil:
    """An answer value of which every operation raises, its repr and its comparisons included."""
    def _raise(self, *args, **kwargs):
        raise RuntimeError("evil")

    __eq__ = __ne__ = __lt__ = __gt__ = __float__ = __int__ = __index__ = __str__ = __repr__ = _raise
    __len__ = __iter__ = __bool__ = __abs__ = __sub__ = __format__ = __call__ = _raise
    __hash__ = object.__hash__


class EvilMapping(dict):
    def values(self):
        raise RuntimeError("evil values")


HOSTILE = [float("nan"), float("inf"), 10**10000, -10**30, "", "x" * 100_000, True, np.zeros(2_000_000),
           np.array([np.nan]), Evil(), [Evil()], (Evil(), Evil()), {"a": Evil()}, range(10**9),
           lambda *a: Evil(), lambda *a: (np.full(300, np.nan), np.full((300, 32), np.nan))]


@pytest.mark.parametrize("ex", [pytest.param(ex, marks=[getattr(pytest.mark, ex.marker), *(
    [pytest.mark.slow] if ex.marker in ("ex04_fold_scale", "ex06_break_rescale") else [])], id=ex.marker)
    for ex in E.ALL])
def test_hostile_answers_get_a_verdict(ex, capsys):
    """Wrong types, NaN, huge numbers and arrays, objects whose every operation raises, in every field
    and as the whole answer: each gets a verdict, and none is correct (Exercise.check reads the answer
    once, at the edge)."""
    answers = [*HOSTILE, EvilMapping(a=1)]
    if isinstance(ex.template, dict):
        answers += [{k: h for k in ex.template} for h in HOSTILE]
    for answer in answers:
        v = ex.check(answer)
        assert isinstance(v, E.Verdict) and v.status in (E.INCORRECT, E.NOT_ATTEMPTED), (answer, v)
    capsys.readouterr()


def _wrong_values(field, want):
    """Values of a field that are not the fact: one on each side of a number (beyond its tolerance),
    the other choices."""
    kind = field.kind
    if kind is bool:
        return [not want]
    if kind is int:
        return [want + 1 + field.atol, want - 1 - field.atol]
    if kind is float:
        return [want * 1.5 + 1, want * 0.5 - 1]
    if kind in (list, tuple):
        return [[n + 1 for n in want], [*want, 0]]
    return [k for k in kind if k != want] if isinstance(next(iter(kind.values())), E.core.Choice) else \
        sorted({w for w in kind.values() if w != want})


@pytest.mark.parametrize("ex", [pytest.param(ex, marks=[getattr(pytest.mark, ex.marker), *(
    [pytest.mark.slow] if ex.marker in ("ex04_fold_scale", "ex06_break_rescale") else [])], id=ex.marker)
    for ex in E.ALL if ex.fields])
def test_every_field_says_why_a_value_is_wrong(ex, capsys):
    """Each declared field, given wrong values on either side of the fact (or each other choice) in an
    otherwise right answer: incorrect, with a message of its own (its text formats with the facts)."""
    right = ex.answer()
    assert ex.check(right)
    for key, field in ex.fields.items():
        for bad in _wrong_values(field, right[key]):
            v = ex.check({**right, key: bad})
            assert v.status == E.INCORRECT and v.message and "could not be read" not in v.message, (key, bad, v)
    capsys.readouterr()


def test_an_exercise_declared_as_data(capsys):
    """A new exercise needs no check code: facts, one Field per value (kind, tolerance, what a wrong
    value means, known mistakes), the message of a right answer."""
    from lessonkit.exercises.core import Choice, Field
    from lessonkit.language import N_
    pick = {"a": Choice(N_("memory"), N_("right")), "b": Choice(N_("compute"), N_("no: it waits"))}
    ex = E.Exercise("demo", N_("demo"), N_("q"), facts={"n": 520, "ns": 26.0, "c": "a"},
                    fields={"n": Field(int, (N_("{got} is too low"), N_("{got} is too high")),
                                       mistakes=((512, N_("{got}: the scales")),)),
                            "ns": Field(float, N_("not {got:g} but near {want:g}"), rtol=0.01),
                            "c": Field(pick)},
                    correct=N_("{n} bytes, {ns:g} ns: {why}"), hint=N_("h"))
    assert ex.template == {"n": ..., "ns": ..., "c": ...} and ex.choices is pick
    assert ex.check({"n": 520, "ns": 26.2, "c": "(a)"}).message == "520 bytes, 26 ns: (a) right"
    assert ex.check({"n": 512, "ns": 26, "c": "a"}).message == "512: the scales"
    assert ex.check({"n": 600, "ns": 26, "c": "a"}).message == "600 is too high"
    assert ex.check({"n": 500, "ns": 26, "c": "a"}).message == "500 is too low"
    assert ex.check({"n": 520, "ns": 27, "c": "a"}).message == "not 27 but near 26"
    assert ex.check({"n": 520, "ns": 26, "c": "b"}).message == "(b) no: it waits"
    assert ex.check({"n": 520.0, "ns": "26", "c": ...}).status == E.NOT_ATTEMPTED
    assert ex.answer() == {"n": 520, "ns": 26.0, "c": "a"}
    capsys.readouterr()


def test_partial_and_malformed_answers():
    ex = E.lesson03.ex1
    assert ex.check({"block": 2, "offset": ..., "kscale_index": 296, "k_scale_index": 301}).status == E.NOT_ATTEMPTED
    v = ex.check({"block": 2})
    assert v.status == E.INCORRECT and "no 'offset'" in v.message
    v = ex.check([2, 5760])
    assert v.status == E.INCORRECT and "dict" in v.message
    v = ex.check({"block": "two", "offset": 5760, "kscale_index": 296, "k_scale_index": 301})
    assert v.status == E.INCORRECT and "cannot be read" in v.message


def test_solutions_print_a_right_answer(capsys):
    ex = E.lesson03.ex1
    ex.solution()
    assert "5760" in capsys.readouterr().out
    assert ex.check(ex.answer())


def test_every_exercise_has_a_registered_marker_and_a_case(pytestconfig):
    """conftest.py registers each exercise's marker from the registry; every case in CASES belongs
    to a registered exercise, and each exercise is tested by a case or by its own test."""
    registered = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    markers = [ex.marker for ex in E.ALL]
    assert len(set(markers)) == len(markers), "two exercises share a marker"
    assert set(markers) <= registered
    assert set(BY_MARKER) <= set(markers), "a case of CASES is for no registered exercise"
    assert set(BY_MARKER) | set(OWN_TESTS) == set(markers)
    assert all(callable(globals().get(name)) for name in OWN_TESTS.values())
