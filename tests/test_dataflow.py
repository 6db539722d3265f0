"""lessonkit.dataflow (lesson 04): source ranges, the segment-2 replay, the counts of one pass."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import dataflow as df
from lessonkit.source import KERNEL_FILE, SIMD_HEADER, function_lines, kernel_segments
from lessonkit.synthetic import cache_with_scores

from conftest import make_case

C_TEXT = """\
int helper(int a);          /* a prototype: not the definition */
/* helper(x) in a comment */
static int helper(int a)
{
#if defined(FAST)
    return a;
#elif defined(SLOW)
#  if 1
    return a + 0;
#  endif
#else
    return -a;
#endif
}
"""


def test_preprocessor_branches_skip_nested_conditionals(tmp_path):
    f = tmp_path / "k.c"
    f.write_text(C_TEXT)
    br = df.preprocessor_branches(3, 14, f)
    assert [(b.condition, b.first, b.last) for b in br] == [
        ("#if defined(FAST)", 5, 6), ("#elif defined(SLOW)", 7, 10), ("#else", 11, 12)]


def test_dot_helper_has_four_paths_and_the_compiled_one_is_found():
    first, last = function_lines("i8x16_dot_s32", SIMD_HEADER)
    lines = SIMD_HEADER.read_text().splitlines()
    assert "i8x16_dot_s32(int32x4_t acc" in lines[first - 1] and lines[last - 1] == "}"
    br = df.preprocessor_branches(first, last)
    body = ["\n".join(lines[b.first - 1:b.last]) for b in br]
    assert len(br) == 4
    assert "__ARM_FEATURE_DOTPROD" in br[0].condition and "vdotq_s32" in body[0]
    assert "vmull_s8" in body[1] and "vpaddlq_s16" in body[1] and "vpaddq_s32" in body[1]
    assert "__AVX2__" in br[2].condition and "_mm256_madd_epi16" in body[2]
    assert br[3].condition == "#else" and "vdotq_s32" in body[3]
    assert [df.compiled_branch(br, p) for p in ("sdot", "widen", "avx2", "simde")] == [0, 1, 2, 3]
    mine = df.compiled_branch(br, lk.native.simd_paths()["dot"])
    expected = {"neon+dotprod": [0], "neon": [1]}.get(lk.native.backend(), [2, 3])  # x86: AVX2 or not
    assert mine in expected
    with pytest.raises(ValueError, match="unknown dot path"):
        df.compiled_branch(br, "avx")


def test_marked_lines_marks_only_the_range():
    shown = df.marked_lines(10, 14, (12, 13), KERNEL_FILE).splitlines()
    assert [l.startswith(">>") for l in shown] == [False, False, True, True, False]
    assert shown[2].split()[1] == "12"


def test_replay_scores_against_float64_and_by_hand():
    dots = np.array([[100, -7], [3, 2 ** 20]], np.int32)
    qsc = np.array([0.5, 0.25], np.float32)
    kraw = np.array([127.0, 254.0], np.float32)
    # by hand: (100*0.5 - 7*0.25) * 1 * 2 = 96.5; (1.5 + 262144) * 2 * 2
    np.testing.assert_allclose(df.replay_scores(dots, qsc, kraw, 2.0), [96.5, 4 * 262145.5], rtol=1e-6)
    # fused and unfused differ only where the product is not exact in float32
    for fused in (False, True):
        assert df.replay_scores(dots, qsc, kraw, 2.0, fused=fused).dtype == np.float32
    mag = df.score_magnitude(dots, qsc, kraw, 2.0)
    np.testing.assert_allclose(mag, [(50 + 1.75) * 2, (1.5 + 262144) * 4])


def test_replay_scores_follow_the_kernel():
    cache, q, _, _ = make_case(5, 300, 2, 128, 16)
    out, tr = lk.attend(q, cache, 1, trace=True)
    scale = 1 / np.sqrt(128)
    for fused in (False, True):
        s = df.replay_scores(tr.dots, tr.q_scales, cache.k_scales(1), scale, fused=fused)
        tol = 1e-6 * df.score_magnitude(tr.dots, tr.q_scales, cache.k_scales(1), scale)
        assert (np.abs(s - tr.s) <= tol).all()
    # one of the two roundings is the compiled one, bit for bit, on most tokens
    best = max((df.replay_scores(tr.dots, tr.q_scales, cache.k_scales(1), scale, fused=f) == tr.s).mean()
               for f in (False, True))
    assert best > 0.9
    table = df.score_steps(7, tr.dots, tr.q_scales, cache.k_scales(1), scale, tr.s[7])
    assert len(table.rows) == 4 + 3 and table.cells()[-1][-1] == f"{tr.s[7]:.6f}"
    assert table.cells()[3][-1] == f"{table.rows[3][-1]:.6f}"  # the running s after the 4 blocks


def test_pass_counts_independent_of_the_trace_fields():
    cache, q, _, _ = make_case(6, 40, 2, 64, 16)
    _, tr = lk.attend(q, cache, 1, trace=True)
    c = df.pass_counts(tr, cache)
    assert (c.seq_len, c.head_dim, c.n_blocks_q, c.n_q_quantized) == (40, 64, 2, 1)
    assert c.k_bytes == c.v_bytes == 40 * 64 and c.k_scale_bytes == 160
    assert c.block_dots == 80 and c.expf_calls == 40 and c.v_fmas == 40 * 64
    assert c.kv_bytes == cache.nbytes // 2  # one kv head of two: half the cache's bytes
    assert c.rescales == int((tr.s > np.maximum.accumulate(np.r_[-1e9, tr.s[:-1]])).sum())


def test_pass_counts_rescales_in_the_extreme_orders():
    up, _, _ = cache_with_scores(np.arange(20, dtype=np.float32), head_dim=32)
    down, _, _ = cache_with_scores(np.arange(20, dtype=np.float32)[::-1].copy(), head_dim=32)
    q = np.ones(32, np.float32)
    assert df.pass_counts(lk.attend(q, up, 0, scale=1 / 32, trace=True)[1], up).rescales == 20
    assert df.pass_counts(lk.attend(q, down, 0, scale=1 / 32, trace=True)[1], down).rescales == 1


def test_cost_table_and_figure_show_the_counts():
    import matplotlib.pyplot as plt
    cache, q, _, _ = make_case(7, 100, 1, 128, 7)
    out, tr = lk.attend(q, cache, 0, trace=True)
    c = df.pass_counts(tr, cache)
    segs = kernel_segments()
    table = str(df.cost_table(c, segs))
    assert f"lines {segs[3].begin}-{segs[3].end}" in table and "12.5 KiB" in table  # 100 x 128 B
    ax = df.draw_dataflow(c, segs, kv_head=0, final_S=float(tr.S[-1]))
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "100 x 128 B = 12.5 KiB" in texts and f"({c.rescales} of 100 tokens)" in texts
    plt.close(ax.figure)


def test_check_walkthrough_passes_and_can_fail(monkeypatch):
    """Lesson 04's one-line check passes on the real kernel and fails when numpy's segment 1 is
    off by one code."""
    from lessonkit import dataflow, quant
    assert dataflow.check_walkthrough(), str(dataflow.check_walkthrough())
    real = quant.quantize_q
    monkeypatch.setattr(quant, "quantize_q", lambda q: ((real(q)[0] // 2).astype(real(q)[0].dtype), real(q)[1]))
    bad = dataflow.check_walkthrough()
    assert not bad and "segment 1" in str(bad)


def test_aarch64_line_code_tells_fused_from_plain_multiplies():
    """The line s += dot32 * qsc[b] compiles to fmadd for aarch64 (GCC contracts it), while
    s = s * ks * scale compiles to plain fmul: the helper's count tells the two apart."""
    import shutil
    from lessonkit.core.toolchain import AARCH64_CC
    if shutil.which(AARCH64_CC) is None:
        pytest.skip(f"{AARCH64_CC} is not installed")
    fused = df.aarch64_line_code("s += (float)dot32 * qsc[b]", segment=2)
    plain = df.aarch64_line_code("s = s * ks * scale", segment=2)
    assert fused.mnemonics.get("fmadd", 0) >= 1 and "fmul" not in fused.mnemonics, fused
    assert plain.mnemonics.get("fmul", 0) >= 1 and "fmadd" not in plain.mnemonics, plain
    assert str(fused).startswith(AARCH64_CC) and f"line {fused.line} " in str(fused)
