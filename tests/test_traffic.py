"""lessonkit.traffic: the byte model by hand, and valgrind's simulation against it."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit import native, traffic

needs_valgrind = pytest.mark.skipif(not traffic.valgrind_available(), reason="valgrind is not installed")
# Debian and Ubuntu ship callgrind.h in the valgrind package (Fedora: valgrind-devel)
has_callgrind_h = sys.platform.startswith("linux") and Path("/usr/include/valgrind/callgrind.h").is_file()


def test_model_by_hand():
    T, hd = 1000, 128
    single = traffic.model_bytes("single", T, hd, n_kv_heads=1)
    assert single == dict(k=T * hd, v=T * hd, scales=2 * 4 * T, scores_written=0, scores_read=0,
                          total=2 * T * hd + 8 * T, k_first=T * hd, k_second=0, score_array=0)
    rec = traffic.model_bytes("two_pass_recompute", T, hd)
    assert rec["k"] == 2 * T * hd and rec["scales"] == 3 * 4 * T
    scores = traffic.model_bytes("two_pass_scores", T, hd)
    assert scores["scores_written"] == scores["scores_read"] == 8 * T
    # the stacked bars' parts add up to the total, and name the second read of K
    for m in (single, rec, scores):
        assert sum(m[p] for p in traffic.PARTS) == m["total"]
    assert rec["k_second"] == T * hd and scores["score_array"] == 16 * T
    # lines per token of one head: 264 bytes (K + V) alone, 320 with 8 heads interleaved
    assert traffic.bytes_per_token(hd, 1) == dict(k=hd + 4, kv=2 * (hd + 4))
    assert traffic.bytes_per_token(hd, 8)["kv"] == 320
    assert traffic.fit_limits("a76-l2", hd, 8)["k_fits"] == (512 << 10) / 160
    # with 8 kv heads each token's scale read costs 32 bytes of its line; 16+ heads: a whole line
    assert traffic.model_bytes("single", T, hd, n_kv_heads=8)["scales"] == 2 * 32 * T
    assert traffic.model_bytes("single", T, hd, n_kv_heads=32)["scales"] == 2 * 64 * T
    with pytest.raises(ValueError, match="variant must be one of"):
        traffic.model_bytes("three_pass", T)


def test_presets():
    a76 = traffic.preset("a76")
    assert a76.d1.size == 64 << 10 and a76.ll.size == 3 << 20
    assert traffic.preset("a76-l2").ll.size == 512 << 10
    for p in (a76, traffic.preset("a76-l2")):  # valgrind needs a power-of-two number of sets
        for level in (p.d1, p.ll):
            sets = level.size // (level.assoc * level.line)
            assert sets & (sets - 1) == 0
    with pytest.raises(ValueError, match="preset must be one of"):
        traffic.preset("m1")


@needs_valgrind
@pytest.mark.parametrize("variant", ["single", "two_pass_recompute"])
def test_simulation_matches_the_model_at_long_context(variant):
    """At 64K tokens (16 MiB of K and V, far above the simulated 3 MiB last level) every byte of
    the model comes from DRAM exactly once per read: the simulation agrees within 10%."""
    sim = traffic.simulate(variant, 65536, preset_name="a76")
    model = traffic.model_bytes(variant, 65536)["total"]
    assert abs(sim.dram_bytes / model - 1) < 0.10, (sim.dram_bytes, model)


@needs_valgrind
def test_recompute_reads_k_twice():
    T = 65536
    single = traffic.simulate("single", T)
    rec = traffic.simulate("two_pass_recompute", T)
    k_once = traffic.model_bytes("single", T)["k"] + 4 * T  # K rows and K scales
    assert abs((rec.dram_bytes - single.dram_bytes) / k_once - 1) < 0.10


@needs_valgrind
def test_warm_small_cache_reads_nothing_from_dram():
    """1K tokens (264 KB) fit in the simulated 3 MiB last level: after a first call, none of it
    comes from DRAM again. (A stray line or two of stack, whose place depends on the build, may
    still miss: the bound is 1% of the cold traffic, i.e. under 45 of its 4200 lines.)"""
    cold = traffic.model_bytes("single", 1024)["total"]
    assert traffic.simulate("single", 1024, warm=True).dram_bytes <= 0.01 * cold
    assert traffic.simulate("single", 1024).dram_bytes >= traffic.model_bytes("single", 1024)["total"]


@needs_valgrind
@pytest.mark.parametrize("variant,accesses", [("softmax_naive", 3), ("softmax_safe", 4),
                                              ("softmax_online", 3)])
def test_softmax_memory_accesses_per_element(variant, accesses):
    """Milakov and Gimelshein's table: naive 3, safe 4, online 3 accesses per element. Over 1M
    floats (4 MiB, above the last level) each access is one element of DRAM traffic."""
    n = 1 << 20
    sim = traffic.simulate(variant, n)
    per_element = sim.dram_bytes / (4 * n)
    assert abs(per_element - accesses) < 0.1, per_element
    model = traffic.softmax_accesses_per_element(variant)
    assert model["loads"] + model["stores"] == accesses


def test_driver_marks_the_call_with_client_requests_or_falls_back():
    """With valgrind's header the driver brackets the kernel call with CALLGRIND_TOGGLE_COLLECT and
    valgrind runs with --collect-atstart=no; built without it, the measured function is collected
    by name (--toggle-collect)."""
    if has_callgrind_h:
        assert traffic.measure_method() == "client-requests"
        assert traffic.collect_options("measured_call") == ["--collect-atstart=no"]
    fallback = native.build_program(traffic.DRIVER_SOURCE, ["-O1", "-DFA_CLIENT_REQUESTS=0",
                                                            *_driver_arch()], "fa_driver_fallback")
    assert traffic.measure_method(fallback) == "toggle-collect"
    assert traffic.collect_options("measured_softmax", fallback) == ["--toggle-collect=measured_softmax"]


def _driver_arch() -> list[str]:
    if native.is_arm64():
        return ["-march=armv8-a"]
    inc = native.simde_include_dir()
    return [f"-I{inc}"] if inc else []


@pytest.mark.skipif(not (native.is_arm64() and sys.platform.startswith("linux")),
                    reason="arm64 Linux only, where valgrind runs the driver (built with -march=armv8-a)")
def test_arm64_driver_has_no_sdot():
    """valgrind 3.19 cannot run sdot: the driver is the NEON path without it, whatever the CPU has."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump is not installed")
    asm = subprocess.run([objdump, "-d", str(traffic.driver())], capture_output=True, text=True, check=True).stdout
    assert re.search(r"<_?flash_attn_single_q_q8_neon>:", asm)  # macOS prefixes symbols with _
    assert re.search(r"\bsdot\b", asm) is None


@needs_valgrind
@pytest.mark.parametrize("variant", ["single", "group4", "scalar"])
def test_warm_up_call_is_not_counted(variant):
    """warm runs the kernel once before the measured call; only the measured call is counted, so
    warm and cold execute the very same instructions and reads (the data's place in the caches
    differs). "scalar" calls libm's expf, as the NEON kernel does on arm64: without LD_BIND_NOW the
    cold call also counted the dynamic linker resolving expf on first use (628 instructions more)."""
    cold = traffic.simulate(variant, 512)
    warm = traffic.simulate(variant, 512, warm=True)
    assert warm.instructions == cold.instructions
    assert warm.reads == cold.reads
