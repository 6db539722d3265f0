"""workbench/a76.py: the registry, llvm-mca's output, the token loop found in a trace, expf inlined,
the CLI. The estimates themselves are a model's, so no test asserts a cycle count of the kernel;
the live checks assert what cannot be otherwise (a dependent chain costs at least its latencies)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit import native
from workbench import a76

DATA = Path(__file__).parent / "data"
need_tools = pytest.mark.skipif(bool(a76.missing_tools()),
                                reason=f"needs {', '.join(a76.missing_tools())} (Debian: llvm-19, "
                                       "gcc-aarch64-linux-gnu, qemu-user)")
need_mca = pytest.mark.skipif(shutil.which(a76.MCA) is None, reason="needs llvm-mca-19 (Debian llvm-19)")

REGISTRY = r'''/* X(version, name, function, adds) */
#define FA_VARIANTS(X) \
  X(0, "scalar", flash_attn_single_q_q8_scalar, "plain C") \
  X(1, "neon",   flash_attn_single_q_q8_neon,   "the article's loop") \
  X(2, "tile4",  toy_tile4,                     "four tokens per \"tile\"")
/* as the real registry: every entry declared, for fa_timing.c's table */
#include "flash_attn_q8.h"
#define FA_DECLARE(version, name, fn, adds) \
    void fn(float *restrict, const float *restrict, int8_t *const *, int8_t *const *, const float *restrict, \
        const float *restrict, int, int, int, int, int, int, float);
FA_VARIANTS(FA_DECLARE)
'''
TOY = r'''#include "flash_attn_q8.h"
/* a kernel-shaped toy whose token loop is known: one period handles 4 tokens */
void toy_tile4(float *restrict attn_out, const float *restrict q, int8_t *const *k, int8_t *const *v,
    const float *restrict kscale, const float *restrict vscale,
    int seq_len, int kv_dim, int kv_bs, int nkv, int kh_off, int hd, float scale)
{
    float acc = 0.0f;
    for (int t = 0; t + 4 <= seq_len; t += 4)
        acc = acc * scale + kscale[t] + kscale[t + 1] * 2.0f + kscale[t + 2] * 3.0f + kscale[t + 3];
    attn_out[0] = acc;
}
'''


def fixture_native(tmp_path, registry=True):
    d = tmp_path / "native"
    shutil.copytree(native.NATIVE_DIR, d, ignore=shutil.ignore_patterns("tests", "tools"))
    if registry:
        (d / "fa_variants.h").write_text(REGISTRY)
        (d / "toy_tile4.c").write_text(TOY)
    return d


def test_registry_parsed(tmp_path):
    d = fixture_native(tmp_path)
    vs = a76.variants(d, group=False)
    assert [(v.version, v.name, v.function) for v in vs] == [
        (0, "scalar", "flash_attn_single_q_q8_scalar"), (1, "neon", "flash_attn_single_q_q8_neon"),
        (2, "tile4", "toy_tile4")]
    assert vs[2].adds == r'four tokens per \"tile\"'
    # the grouped kernels (not in the registry: their signature has G) come after the registry's entries
    assert [(v.name, v.function) for v in a76.variants(d)[3:]] == [
        ("group4", "flash_attn_group_q8_neon"), ("group4_lowp", "flash_attn_group_q8_lowp")]


def test_the_workbook_registry_and_the_grouped_kernel(tmp_path):
    names = [v.function for v in a76.variants(fixture_native(tmp_path, registry=False))]
    assert "flash_attn_single_q_q8_neon" in names and "flash_attn_group_q8_neon" in names


def test_registry_without_lines_is_an_error(tmp_path):
    d = fixture_native(tmp_path, registry=False)
    (d / "fa_variants.h").write_text("#define FA_VARIANTS(X)\n")
    with pytest.raises(ValueError, match="no X"):
        a76.variants(d)


def test_parse_captured_mca_output():
    # captured on this machine: llvm-mca-19 -mcpu=neoverse-n1 -iterations=300 on the article
    # kernel's token loop (-march=armv8.2-a+dotprod); the numbers are read from the file's lines
    text = (DATA / "llvm_mca_n1_neon_token.txt").read_text()
    r = a76.parse_mca(text)
    assert r["iterations"] == 300
    assert r["total_cycles"] == int(re.search(r"Total Cycles:\s+(\d+)", text).group(1))
    assert r["cycles_per_iteration"] == pytest.approx(r["total_cycles"] / 300)
    # the largest of the two kinds wins, and the unit under the most pressure is named
    assert r["bottleneck"].startswith("Resource Pressure N1UnitV1")


def test_parse_mca_rejects_other_text():
    with pytest.raises(ValueError):
        a76.parse_mca("not llvm-mca output")


@need_mca
def test_live_mca_dependent_chain_costs_its_latency():
    # 8 fadds, each waiting for the one before: no model can run an iteration in fewer cycles than
    # 8 fadd latencies (2 on both models); independent ones run faster than that chain
    chain = ["fadd s0, s0, s1"] * 8
    free = [f"fadd s{i}, s{i}, s9" for i in range(8)]
    for cpu in a76.CPUS:
        dep, ind = a76.mca(chain, cpu, 200), a76.mca(free, cpu, 200)
        assert dep["cycles_per_iteration"] >= 8 * 2 * 0.95, cpu
        assert ind["cycles_per_iteration"] < dep["cycles_per_iteration"], cpu


@need_tools
def test_token_loop_period_of_a_tile(tmp_path):
    d = fixture_native(tmp_path)
    vs = a76.variants(d)
    work = tmp_path / "w"
    work.mkdir()
    exe = a76.build(work, vs, True, d)
    loops = a76.token_loops(exe, 2, "toy_tile4")
    assert [lp["tokens_per_period"] for lp in loops] == [4.0]
    ins = a76.disassemble(loops[0]["words"], True)
    assert any(i.startswith(("ldr", "ldp", "ld1")) for i in ins)  # the kscale loads of the tile
    assert sum(i.startswith(("fadd", "fmadd", "fmul")) for i in ins) >= 4  # its four tokens' arithmetic
    # the article kernel: one token per period, and its K-row dot (sdot) is in the block
    neon = a76.token_loops(exe, 1, "flash_attn_single_q_q8_neon")
    assert [lp["tokens_per_period"] for lp in neon] == [1.0]
    ins = a76.disassemble(neon[0]["words"], True)
    assert sum(i.startswith("sdot") for i in ins) == 2 * a76.HD // 32


@pytest.fixture(scope="module")
def dotprod_build(tmp_path_factory):
    """(the registry's variants, their aarch64 dotprod build): one cross-compile (about 8 s) for the tests that
    trace the workbook's own kernels."""
    vs = a76.variants()
    return vs, a76.build(tmp_path_factory.mktemp("a76-dotprod"), vs, True, None)


@need_tools
def test_all_three_token_loops_of_the_stored_scores_kernel(dotprod_build):
    """two_pass_scores_fast has three loops over the tokens (the scores by tiles of 16, exp(s - M) four
    scores a step, V by tiles): at the short length the exp loop is a small run among the block loops, and
    an estimate that missed it would credit the kernel with less work than it does."""
    vs, exe = dotprod_build
    i = [v.name for v in vs].index("two_pass_scores_fast")
    loops = a76.token_loops(exe, i, vs[i].function)
    assert sorted(lp["tokens_per_period"] for lp in loops) == [4.0, 16.0, 16.0], loops


def _libm_expf_words():
    libm = Path(a76.SYSROOT) / "lib" / "libm.so.6"
    dump = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(libm)], capture_output=True, text=True,
                          check=True).stdout
    syms = subprocess.run(["aarch64-linux-gnu-objdump", "-T", str(libm)], capture_output=True, text=True,
                          check=True).stdout
    m = re.search(r"^([0-9a-f]+) g\s+DF \.text\s+([0-9a-f]+)\s+GLIBC_2\.27\s+expf$", syms, re.M)
    start, size = int(m.group(1), 16), int(m.group(2), 16)
    words = {}
    for line in dump.splitlines():
        mm = re.match(r"^\s*([0-9a-f]+):\s+([0-9a-f]{8})\s", line)
        if mm and start <= int(mm.group(1), 16) < start + size:
            words[int(mm.group(1), 16) - start] = int(mm.group(2), 16)
    return [words[k] for k in sorted(words)]


@need_tools
@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-objdump") is None, reason="needs aarch64-linux-gnu-objdump")
def test_expf_fast_path_is_inlined_in_the_block(dotprod_build):
    vs, exe = dotprod_build
    i = [v.name for v in vs].index("neon")
    words = a76.token_loops(exe, i, vs[i].function)[0]["words"]
    expf = _libm_expf_words()
    # at least 10 consecutive instructions of the block are glibc's expf, in its own order
    text = " ".join(f"{w:08x}" for w in words)
    runs = [" ".join(f"{w:08x}" for w in expf[k:k + 10]) for k in range(len(expf) - 9)]
    assert any(r in text for r in runs)
    # and llvm-mca is not handed a call (it would charge 100 cycles for it)
    assert not any(re.match(r"bl\s|blr\s", x) for x in a76.disassemble(words, True))


@need_tools
def test_quick_cli():
    r = subprocess.run([sys.executable, "-m", "workbench", "a76", "--quick"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    assert "ESTIMATES" in r.stdout and "Neoverse N1" in r.stdout
    rows = [l.split("|") for l in r.stdout.splitlines() if "cyc/period" in l]  # the estimates' table
    assert {row[2].split()[0] for row in rows} == {"N1", "A55"} and all(float(row[3]) > 0 for row in rows)
    assert "target" not in r.stdout or re.search(r"^target  (met |MISS)  fast", r.stdout, re.M)


@need_tools
def test_every_registry_entry_and_the_group_get_an_estimate():
    # the tiled variants' loops are found (one period = one tile of FA_TILE tokens), so that no
    # entry of native/fa_variants.h is left out; a model's figures are not asserted, only that each
    # is positive and derived from whole token loops. Quick: dotprod only, the N1 model, 20 iterations.
    """Slow (about 45 s here): llvm-mca models the token loop of every registry version and both grouped kernels,
    each cross-compiled for aarch64; the one test that covers them all."""
    vs = a76.variants()
    assert [v.function for v in vs[-2:]] == ["flash_attn_group_q8_neon", "flash_attn_group_q8_lowp"]
    res = a76.estimate_all(("neoverse-n1",), (True,), iterations=a76.QUICK_ITERATIONS)
    assert [e.variant for e in res] == [v.name for v in vs]
    by = {e.variant: e for e in res}
    for e in res:
        assert e.cycles_per_token > 0 and e.tokens_per_period, e.variant
        assert len(e.cycles_per_period) == len(e.tokens_per_period)
        assert e.cycles_per_token == pytest.approx(sum(c / t for c, t in zip(e.cycles_per_period,
                                                                             e.tokens_per_period)))
    assert by["neon"].tokens_per_period == [1.0]
    native_tile = int(re.search(r"#define FA_TILE (\d+)", (native.NATIVE_DIR / "fa_online.h").read_text()).group(1))
    for name in ("tile", "score4", "vkq_regs", "fast", "group4", "lowp", "group4_lowp"):
        assert by[name].tokens_per_period[0] == native_tile, name


def test_lowp_report_words_its_target():
    est = [a76.Estimate(name, cpu, True, c, "", {}, [16], 264) for name, cpu, c in (
        ("lowp", "neoverse-n1", 56.0), ("fast", "neoverse-n1", 84.0), ("lowp", "cortex-a55", 240.0),
        ("group4_lowp", "neoverse-n1", 190.0), ("group4", "neoverse-n1", 212.0))]
    text = a76.lowp_report(est)
    assert text.startswith("target  met   lowp on the N1 model") and "(1.50x fewer)" in text
    assert "A55: lowp vs fast: 240.0 cycles/token (estimates)" in text  # no A55 fast estimate: no ratio
    est[0].cycles_per_token = 70.0
    assert a76.lowp_report(est).startswith("target  MISS")
    assert a76.lowp_report([]).startswith("target  n/a ")
