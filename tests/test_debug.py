"""Lesson 06's debugging: the batch runs under gdb and lldb (lessonkit.debugger: parsing, tier A with a
debugger and without), the by-hand sessions and their committed transcripts (lessonkit.by_hand,
tests/transcripts.py), make debug-aarch64 (qemu + gdb-multiarch), and the edited copies of the kernel
(lessonkit.kernel_copy). The workbook's native/ is never modified."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lessonkit as lk
import transcripts
from lessonkit import exercises as E
from lessonkit import by_hand, check, debug, debugger, env, kernel_copy, native, processes, rounding, setup, source, toy

GDB_OUTPUT = """\
Breakpoint 1 (flash_attn_single_q_q8_neon) pending.
[Thread debugging using libthread_db enabled]
@@enter seq_len=2 kh_off=0 hd=32
@@token t=0 s=0.5 M=0.5 S=1
@@token t=1 s=1.25 M=1.25 S=1.47236657
@@leave S=1.47236657
generated token ids: [3, 4]@@enter seq_len=3 kh_off=32 hd=32
@@token t=0 s=-1 M=-1 S=1
@@token t=1 s=-2 M=-1 S=1.36787939
@@token t=2 s=0 M=0 S=1.50321472
@@leave S=1.50321472
[Inferior 1 (process 42) exited normally]
"""


def loop_runs_seq_len(r: debugger.CallRecord) -> bool:
    """Tier A's second observation: t = 0, 1, ..., seq_len - 1, in order."""
    return r.t == list(range(r.seq_len))


def M_non_decreasing(r: debugger.CallRecord) -> bool:
    """Tier A's third observation: M never goes down within a call."""
    return all(b >= a for a, b in zip(r.M, r.M[1:]))


def summary(obs: debugger.Observation) -> dict:
    """The three observations of tier A over one observed generation, computed from its records."""
    rs, k = obs.records, obs.config.n_q_heads
    seq = [r.seq_len for r in rs]
    per_head = {}
    for r in rs:
        per_head.setdefault(r.q_head, []).append(r.seq_len)
    steps = [seq[i:i + k] for i in range(0, len(seq), k)]
    return {
        "kernel calls": len(rs),
        "calls per step": k,
        "seq_len at first call": seq[0] if seq else None,
        "seq_len at last call": seq[-1] if seq else None,
        "same seq_len for all calls of a step": all(len(set(s)) == 1 for s in steps),
        "seq_len grows by one per step": all(b[0] - a[0] == 1 for a, b in zip(steps, steps[1:])),
        "seq_len grows by one per call of each query head":
            all(all(b - a == 1 for a, b in zip(v, v[1:])) for v in per_head.values()),
        "token loop ran exactly seq_len times in every call": all(loop_runs_seq_len(r) for r in rs),
        "M never decreased within a call": all(M_non_decreasing(r) for r in rs),
        "token-loop iterations in all": sum(len(r.t) for r in rs),
    }


def native_digest() -> str:
    h = hashlib.sha256()
    for f in sorted(native.NATIVE_DIR.rglob("*")):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def test_parse_gdb_output():
    recs = debugger.parse_gdb_output(GDB_OUTPUT)
    assert len(recs) == 2
    a, b = recs
    assert (a.seq_len, a.kv_head, a.t, a.M, a.final_S) == (2, 0, [0, 1], [0.5, 1.25], 1.47236657)
    assert (b.seq_len, b.kv_head, len(b.t), b.s) == (3, 1, 3, [-1.0, -2.0, 0.0])
    assert loop_runs_seq_len(a) and loop_runs_seq_len(b)
    assert M_non_decreasing(a) and M_non_decreasing(b)


def test_record_properties_can_fail():
    r = debugger.CallRecord(0, 3, 0, [0, 2], [0, 0], [1.0, 0.5], [1, 2])
    assert not loop_runs_seq_len(r)     # one token skipped
    assert not M_non_decreasing(r)      # M went down
    r2 = debugger.CallRecord(0, 2, 0, [0, 1, 2], [0, 0, 0], [0, 1, 1], [1, 2, 3])
    assert not loop_runs_seq_len(r2)    # one iteration too many


@pytest.mark.parametrize("text,words", [
    ("@@token t=0 s=1 M=1 S=1\n", "outside a kernel call"),
    ("@@enter seq_len=1 kh_off=0 hd=32\n@@leave S=1\n@@token t=0 s=1 M=1 S=1\n", "outside a kernel call"),
    ("@@enter seq_len=one kh_off=0 hd=32\n", "line 1"),
    ("@@enter seq_len=1 hd=32\n", "kh_off"),
])
def test_parse_errors(text, words):
    with pytest.raises(ValueError, match=words):
        debugger.parse_gdb_output(text)


def test_breakpoint_lines_follow_the_source(tmp_path):
    bp = debugger.breakpoints()
    lines = source.KERNEL_FILE.read_text().splitlines()
    segs = source.kernel_segments()
    assert segs[3].begin < bp.token_line < segs[3].end and debugger.TOKEN_TEXT in lines[bp.token_line - 1]
    assert segs[4].begin < bp.leave_line < segs[4].end
    assert "S" in lines[bp.leave_line - 1]
    shifted = tmp_path / source.KERNEL_FILE.name
    shifted.write_text("\n\n\n" + source.KERNEL_FILE.read_text())
    bp2 = debugger.breakpoints(shifted)
    assert (bp2.token_line, bp2.leave_line) == (bp.token_line + 3, bp.leave_line + 3)
    cmds = debugger.gdb_commands(bp)
    assert cmds.index("set breakpoint pending on") < cmds.index("break ")
    assert f"break {bp.file}:{bp.token_line}" in cmds and f"break {debugger.KERNEL}" in cmds


def line_functions(line: int) -> list[str]:
    """The functions of the debug library that have machine code for the kernel file's ``line``, as
    gdb's ``info line`` reports them."""
    out = subprocess.run(["gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off", "-ex",
                          f"info line {source.KERNEL_FILE.name}:{line}", str(native.library_path(debug=True))],
                         capture_output=True, text=True, timeout=60).stdout
    return sorted(set(re.findall(r"starts at address 0x[0-9a-f]+ <([A-Za-z_]\w*)", out)))


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_empty_hook_lines_have_no_code_in_the_kernel():
    """Why the breakpoint is not on the TRACE_TOKEN line: in the debug build that line has
    machine code only in the traced copy of the kernel; the chosen line is in both."""
    hook = source.find_line("TRACE_TOKEN(", segment=3)
    assert line_functions(hook) == [debugger.KERNEL + "_traced"]
    assert line_functions(debugger.breakpoints().token_line) == [debugger.KERNEL, debugger.KERNEL + "_traced"]


def test_trace_records_show_the_three_observations():
    recs, tokens = debugger.records_from_trace(16)
    assert tokens == toy.generate(16, verbose=False).tokens
    assert len(recs) == 64
    assert [r.seq_len for r in recs] == [i // 4 + 1 for i in range(64)]
    assert all(loop_runs_seq_len(r) and M_non_decreasing(r) for r in recs)
    # M after each token is the running max of the scores, computed here independently
    for r in recs:
        np.testing.assert_array_equal(np.array(r.M, np.float32),
                                      np.maximum.accumulate(np.array(r.s, np.float32)))


def test_without_gdb_the_trace_is_used(monkeypatch):
    monkeypatch.setattr(debugger, "debugger_path", lambda d: None)
    obs = debugger.observe_generation(16)
    assert obs.source == "trace" and "gdb is not installed" in obs.message
    s = summary(obs)
    assert s["kernel calls"] == 64 and s["token loop ran exactly seq_len times in every call"]
    with pytest.raises(RuntimeError, match="not installed"):
        debugger.observe_generation(4, use_gdb=True)


def test_a_failing_gdb_run_falls_back_with_the_reason(monkeypatch):
    """gdb present but unable to run the program (e.g. ptrace forbidden): the trace, and why."""
    monkeypatch.setattr(debugger, "debugger_path", lambda d: "/bin/true")
    monkeypatch.setattr(debugger, "_run_batch", lambda *a, **k: ("warning: ptrace: Operation not permitted\n", "", ""))
    obs = debugger.observe_generation(8)
    assert obs.source == "trace" and "gdb saw 0 kernel calls, expected 32" in obs.message
    with pytest.raises(RuntimeError, match="ptrace"):
        debugger.observe_generation(8, use_gdb=True)


def test_a_hung_run_is_killed():
    assert processes.run_bounded(["sleep", "30"], timeout=0.5).returncode is None


def test_a_killed_run_whose_helper_keeps_the_pipe_open_ends_in_bounded_time():
    """killpg ends the run's process group; a helper that left it (setsid) keeps the pipe open. Reading
    what is left is bounded too: the call ends after the timeout plus KILLED_READ_S, not after the helper."""
    import time
    start = time.monotonic()
    assert processes.run_bounded(["sh", "-c", "setsid sleep 60 & sleep 60"], timeout=0.5).returncode is None
    assert time.monotonic() - start < 0.5 + processes.KILLED_READ_S + 5


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_observe_generation_under_gdb():
    obs = debugger.observe_generation(16, use_gdb=True)
    assert obs.source == "gdb"
    s = summary(obs)
    assert s["kernel calls"] == 64 and s["calls per step"] == 4
    assert (s["seq_len at first call"], s["seq_len at last call"]) == (1, 16)
    assert s["seq_len grows by one per step"] and s["same seq_len for all calls of a step"]
    assert s["seq_len grows by one per call of each query head"]
    assert s["token loop ran exactly seq_len times in every call"]
    assert s["M never decreased within a call"]
    assert s["token-loop iterations in all"] == 4 * sum(range(1, 17))
    assert obs.tokens == toy.generate(16, verbose=False).tokens
    # what gdb printed is what the traced build records, to the printed precision
    recs, _ = debugger.records_from_trace(16)
    for g, t in zip(obs.records, recs):
        assert (g.seq_len, g.kv_head, g.t) == (t.seq_len, t.kv_head, t.t)
        np.testing.assert_allclose(g.M, t.M, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g.S, t.S, rtol=1e-5)
    assert "pending" in obs.commands


@pytest.mark.slow
def test_make_debug_aarch64_stops_in_the_sdot_build():
    """make debug-aarch64: the breakpoints of the batch run in the aarch64 build under qemu-aarch64 and
    gdb-multiarch; the dot helper is compiled to sdot."""
    tools = ("make", "aarch64-linux-gnu-gcc", "qemu-aarch64", "gdb-multiarch", "timeout")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"missing: {', '.join(missing)} "
                    "(Debian: apt install gcc-aarch64-linux-gnu qemu-user gdb-multiarch)")
    proc = subprocess.run(["make", "-s", "--no-print-directory", "debug-aarch64", f"PY={sys.executable}"],
                          cwd=native.REPO_DIR, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (r,) = debugger.parse_gdb_output(proc.stdout)
    assert (r.seq_len, r.kv_head, len(r.t)) == (20, 1, 20)    # fa_driver attends kv head NKV - 1
    assert loop_runs_seq_len(r) and M_non_decreasing(r) and r.final_S >= 1.0
    assert re.search(r"\bsdot\b", proc.stdout.split("@@disassembly", 1)[1].split("@@end disassembly")[0])
    assert "sdot instructions in i8x16_dot_s32: 1" in proc.stdout
    # a run that never reaches the kernel fails the target (the driver refuses an unknown variant)
    bad = subprocess.run(["make", "-s", "--no-print-directory", "debug-aarch64", f"PY={sys.executable}",
                          "A64_DEBUG_ARGS=no_such_variant 20 64 2 8 cold 4096"],
                         cwd=native.REPO_DIR, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "FAILED debug-aarch64" in bad.stdout


def test_edits_go_to_a_copy_only(tmp_path):
    before = native_digest()
    truncate = kernel_copy.BREAKS["truncate"][0]
    with pytest.raises(ValueError, match="copy"):
        kernel_copy.edit_line(native.NATIVE_DIR, truncate)
    copy = kernel_copy.copy_native(tmp_path)
    with pytest.raises(ValueError, match="copy"):   # a file outside the copy: the workbook's native/
        kernel_copy.edit_line(copy, kernel_copy.Edit(os.path.relpath(source.SIMD_HEADER, copy), truncate.text))
    with pytest.raises(TypeError, match="Edit"):
        kernel_copy.edit_line(copy, ("q8_simd.h", truncate.text))
    assert not (copy / "tests").exists() and (copy / "flash_attn_q8.h").is_file()
    ch = kernel_copy.edit_line(copy, truncate)
    text = (copy / ch.file).read_text().splitlines()
    assert text[ch.line - 1].strip() == "int r = (int)v;" and "0.5f" in ch.old
    with pytest.raises(ValueError, match="no line"):
        kernel_copy.edit_line(copy, truncate)    # already edited: the text is gone
    assert native_digest() == before


def build_failures(copy) -> list[str]:
    """What the check of a new build (in a child process, before loading) found wrong in ``copy``, in
    words (the record holds smoke.py's codes and numbers)."""
    record = Path(str(native.build(src_dir=copy, verify="crashes")) + ".json")
    return [check.failure(f) for f in json.loads(record.read_text())["failures"]]


def test_the_intact_kernel_gives_the_reference_weights():
    ffi, lib = native.load()
    cache = lk.KVCacheQ8(2, 64, 16)
    rng = np.random.default_rng(0)
    cache.append(rng.standard_normal((200, 2, 64), dtype=np.float32),
                 rng.standard_normal((200, 2, 64), dtype=np.float32))
    q = rng.standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(kernel_copy.call_kernel(ffi, lib, q, cache, 1, 0.125),
                               lk.attend(q, cache, 1, scale=0.125, backend="numpy"), rtol=1e-4, atol=1e-5)
    s = np.linspace(-2, 5, 40)
    np.testing.assert_allclose(kernel_copy.kernel_weights(ffi, lib, s), kernel_copy.softmax_weights(s),
                               rtol=1e-5, atol=1e-7)


def weights_without_rescale(scores) -> np.ndarray:
    """What a kernel without the online rescale computes, in float64: each token keeps the weight
    exp(s_t - M_t) relative to the running max M_t of its own time; then the division by their sum."""
    s = np.asarray(scores, np.float64)
    w = np.exp(s - np.maximum.accumulate(s))
    return w / w.sum()


@pytest.mark.slow
def test_no_rescale_break():
    before = native_digest()
    b = kernel_copy.break_kernel("no_rescale")
    assert kernel_copy.break_kernel("no_rescale") is b     # one build per kind and process
    assert [c.file for c in b.changes] == ["flash_attn_q8_neon.c"] * 2
    assert any(f.startswith("flash_attn_single_q_q8_neon on case") for f in build_failures(b.copy))
    # the broken weights are exactly what "every token keeps the max of its own time" predicts
    s = np.linspace(0.0, 8.0, 64)
    wrong = kernel_copy.kernel_weights(b.ffi, b.lib, s)
    np.testing.assert_allclose(wrong, np.full(64, 1 / 64), rtol=1e-5)   # every score is a new max
    s2 = np.array([3.0, 0.0, 1.0, 4.0, 2.0, 5.0, -1.0])
    np.testing.assert_allclose(kernel_copy.kernel_weights(b.ffi, b.lib, s2), weights_without_rescale(s2), rtol=1e-5)
    # an edited copy drives the toy generation too
    assert toy.generate(4, src_dir=b.copy, verbose=False, verify="crashes").kernel == "copy"
    copy = b.copy
    b.folder.cleanup()   # the copy goes; the library already loaded stays usable
    assert not copy.exists() and native_digest() == before


@pytest.mark.slow
def test_truncation_break():
    b = kernel_copy.break_kernel("truncate")
    assert any(f.startswith("flash_attn_single_q_q8_neon on case") for f in build_failures(b.copy))
    s = np.linspace(0.0, 8.0, 64)           # q all ones: every code is exactly +-127, nothing to round
    np.testing.assert_allclose(kernel_copy.kernel_weights(b.ffi, b.lib, s), kernel_copy.softmax_weights(s), rtol=1e-5)
    q = np.random.default_rng(7).standard_normal(64).astype(np.float32)
    cache = lk.KVCacheQ8(1, 64, 16)
    cache.append(np.ones((3, 1, 64), np.float32), np.ones((3, 1, 64), np.float32))
    tr = kernel_copy.trace_with(b.ffi, b.lib, q, cache, 0, 0.125)
    v, _ = rounding.q_block_scaled(q)
    np.testing.assert_array_equal(tr.q_codes, rounding.round_codes(v, "trunc"))   # numpy's own truncation
    assert tr.n_q_quantized == 1
    b.folder.cleanup()   # the copy goes; the library already loaded stays usable


LLDB_OUTPUT = """\
(lldb) run
1 location added to breakpoint 1
(lldb)  frame variable seq_len kh_off hd
(int) seq_len = 2
(int) kh_off = 32
(int) hd = 32
(lldb)  frame variable t s M S
(int) t = 0
(float) s = -0.5
(float) M = -0.5
(float) S = 1
(lldb)  frame variable t s M S
(int) t = 1
(float) s = 1.0E+1
(float) M = 1.0E+1
(float) S = 1.00000036
(lldb)  frame variable S
(float) S = 1.00000036
Process 42 exited with status = 0 (0x00000000)
"""


def test_parse_lldb_output():
    recs = debugger.parse_lldb_output(LLDB_OUTPUT)
    assert len(recs) == 1
    r = recs[0]
    assert (r.seq_len, r.kv_head, r.t, r.s, r.M, r.final_S) == (2, 1, [0, 1], [-0.5, 10.0], [-0.5, 10.0], 1.00000036)
    with pytest.raises(ValueError, match="outside a kernel call"):
        debugger.parse_lldb_output(LLDB_OUTPUT.split("(lldb)  frame variable t s M S", 1)[1])
    with pytest.raises(ValueError, match="line 2 of the lldb output"):   # a value lldb did not print
        debugger.parse_lldb_output("(lldb)  frame variable seq_len kh_off hd\n(int) seq_len = 2\n")


def test_debugger_names_and_missing_debuggers(monkeypatch):
    with pytest.raises(ValueError, match="'gdb', 'lldb'.*use_debugger=False"):
        debugger.observe_generation(4, debugger="windbg")
    with pytest.raises(ValueError, match="'gdb', 'lldb'"):
        by_hand.session_step("start", debugger="windbg")
    with pytest.raises(TypeError, match="not both"):
        debugger.observe_generation(4, use_gdb=True, use_debugger=True)
    with pytest.raises(TypeError, match="None, True or False"):
        debugger.observe_generation(4, use_debugger="yes")
    with pytest.raises(TypeError, match="ToyConfig"):
        debugger.observe_generation(4, config={"vocab": 8})
    monkeypatch.setattr(debugger, "lldb_path", lambda: None)
    with pytest.raises(RuntimeError, match="apt install lldb.*Xcode"):
        debugger.observe_generation(4, debugger="lldb", use_debugger=True)
    obs = debugger.observe_generation(4, debugger="lldb")
    assert obs.source == "trace" and "apt install lldb" in obs.message


def test_lldb_is_found_under_a_versioned_name(tmp_path, monkeypatch):
    for n in ("lldb-14", "lldb-19", "lldb-server-19"):
        (tmp_path / n).write_text("#!/bin/sh\n")
        (tmp_path / n).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert setup.lldb_path() == str(tmp_path / "lldb-19")
    (tmp_path / "lldb").write_text("#!/bin/sh\n")
    (tmp_path / "lldb").chmod(0o755)
    assert setup.lldb_path() == str(tmp_path / "lldb")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gdb", "lldb"])
def test_both_debuggers_give_the_same_records(which):
    if debugger.debugger_path(which) is None:
        pytest.skip(debugger.install_hint(which))
    obs = debugger.observe_generation(16, debugger=which, use_debugger=True)
    assert obs.source == which and len(obs.records) == 64          # 4 query heads x 16 steps
    assert [r.seq_len for r in obs.records] == [i // 4 + 1 for i in range(64)]
    assert all(len(r.t) == r.seq_len and loop_runs_seq_len(r) for r in obs.records)
    assert all(M_non_decreasing(r) for r in obs.records)
    # both print 9 significant digits of a float32 (enough to round-trip it): same as the trace
    recs, tokens = debugger.records_from_trace(16)
    assert obs.tokens == tokens
    for g, t in zip(obs.records, recs):
        np.testing.assert_allclose(g.M, t.M, rtol=1e-7)
        np.testing.assert_allclose(g.S, t.S, rtol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gdb", "lldb"])
def test_committed_session_transcripts_are_current(which):
    """The by-hand session, re-run, matches the committed transcript (floats masked: their last
    digits depend on the CPU path). A change of the kernel that moves a line fails here."""
    if debugger.debugger_path(which) is None:
        pytest.skip(debugger.install_hint(which))
    ok, diff = transcripts.transcripts_match(which)
    assert ok, (f"{by_hand.transcript_path(which).name} is out of date; refresh it with\n  "
                f"{by_hand.REFRESH_COMMAND}\n{diff[:3000]}")


def test_session_commands_take_their_lines_from_the_source():
    for which in debugger.DEBUGGERS:
        cmds = transcripts.session_commands(which, library="libflash_attn_q8_debug_0123456789abcdef.so")
        code = [l for l in cmds.splitlines() if l and not l.startswith("#")]
        assert not any("@" in l and "LINE(" in l for l in code)
        token = debugger.breakpoints().token_line
        assert any(l.endswith(f"{source.KERNEL_FILE.name}:{token}") or l.endswith(f"-l {token}") for l in code)
        assert str(source.find_line("if (s > M) {")) in "\n".join(code)
        saved = transcripts.saved_transcript(which)
        assert f"({which}) " in saved and "/work/" not in saved and "0x<addr>" in saved


def test_clean_transcript_removes_what_varies():
    raw = (f"Traceback (most recent call last):\n  File \"<string>\", line 1\n"
           "ModuleNotFoundError: No module named 'lldb.embedded_interpreter'\n"
           f"at {native.REPO_DIR}/native/flash_attn_q8_neon.c:90 0x00007ffff3e6a936 process 15599 "
           "libflash_attn_q8_debug_7b64937c93cc38d0.so seq_len=1\n")
    assert transcripts.clean_transcript(raw, "lldb") == (
        "at <repo>/native/flash_attn_q8_neon.c:90 0x<addr> process <pid> libflash_attn_q8_debug_<hash>.so seq_len=1\n")
    assert (transcripts.mask_floats("M = -0.379 S = 1 t=3 x 1.0E+9 line 90:41")
            == "M = <float> S = 1 t=3 x <float> line 90:41")


def test_engine_recipe_is_labelled_not_run_here():
    text = by_hand.engine_debug_recipe()
    assert "not run here" in text.lower() and "6594" in text and "vllm_safetensors.c" in text
    assert debugger.KERNEL in text


def test_transcripts_from_another_environment_compare_the_kernel_lines(monkeypatch):
    """On another system, Python or debugger the frames differ: the test then compares the kernel's
    line numbers the session stops at, so a moved line still fails it."""
    which = "gdb"
    saved = transcripts.saved_transcript(which)
    lines = transcripts.kernel_lines(saved)
    assert lines, "the committed gdb session shows no kernel line"
    monkeypatch.setattr(transcripts, "capture_environment", lambda d: "elsewhere")
    monkeypatch.setattr(transcripts, "run_session", lambda d, t=120.0: saved.replace("Python", "CPython"))
    assert transcripts.transcripts_match(which) == (True, "")
    moved = saved.replace(f"flash_attn_q8_neon.c:{lines[0]}", f"flash_attn_q8_neon.c:{int(lines[0]) + 1}")
    monkeypatch.setattr(transcripts, "run_session", lambda d, t=120.0: moved)
    ok, why = transcripts.transcripts_match(which)
    assert not ok and "kernel lines" in why


def test_the_names_lessons_use_stay_importable_from_debug():
    """lessonkit.debug re-exports every debug.NAME the lessons and exercises use, the same objects as
    the modules that hold them. The aarch64 recipe is make debug-aarch64 now, and the capture of the
    session transcripts is tests/transcripts.py."""
    moved = {"aarch64_tools", "aarch64_recipe", "observe_aarch64", "run_session"}
    used = set()
    for path in [*native.REPO_DIR.glob("notebooks/*.ipynb"), *native.REPO_DIR.glob("lessonkit/exercises/*.py")]:
        used |= set(re.findall(r"\bdebug\.([A-Za-z_]\w*)", path.read_text()))
    assert {"observe_generation", "show_step", "break_kernel", "trace_with"} <= used
    assert [n for n in sorted(used - moved) if not hasattr(debug, n)] == []
    assert debug.observe_generation is debugger.observe_generation and debug.show_step is by_hand.show_step
    assert debug.break_kernel is kernel_copy.break_kernel


# ------------------------------------------------------------------ tier A: the student's own session

def typed_tier_a_session(which: str, tmp_path: Path) -> tuple[str, str]:
    """Run tier A's session as the lesson teaches it, the commands fed to the real debugger as a student
    types them (each Enter that repeats continue written out): (what the terminal showed, the file the
    debugger wrote). gdb reads them on stdin; lldb, whose stdin is not a terminal here, from -s in batch
    mode (-b stops at the first error, so it gets exactly one continue per stop and the one that ends
    the program)."""
    exe = debugger.debugger_path(which)
    if exe is None:
        pytest.skip(debugger.install_hint(which))
    lib = native.build(debug=True)
    log = tmp_path / f"tier_a_{which}.txt"
    stops = sum(r.seq_len + 1 for r in debugger.records_from_trace(by_hand.TIER_A_TOKENS)[0])
    typed = []
    for command, unused in by_hand.tier_a_commands(which, lib, log):
        typed += [command] * (stops if command == "continue" and typed.count("continue") == (which == "gdb")
                              else 1)
    # gdb: the first continue (to the first stop in the loop) is one of the stops; the second is repeated
    argv = shlex.split(by_hand.tier_a_command_line(which).splitlines()[1])   # the lesson's own command line
    argv[0] = exe
    if which == "gdb":
        proc = subprocess.run(argv, input="\n".join(typed) + "\n", capture_output=True, text=True, timeout=300,
                              cwd=native.REPO_DIR, env=debugger.child_env())
    else:
        script = tmp_path / "typed.lldb"
        script.write_text("\n".join(typed) + "\n")
        proc = subprocess.run([exe, "-x", "-b", "-s", str(script), *argv[1:]], capture_output=True, text=True,
                              timeout=300, cwd=native.REPO_DIR, env=debugger.child_env())
    assert log.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr, log.read_text()


@pytest.fixture(scope="module", params=["gdb", "lldb"])
def tier_a_session(request, tmp_path_factory):
    return request.param, *typed_tier_a_session(request.param, tmp_path_factory.mktemp(request.param))


def test_tier_a_accepts_a_real_session_pasted_or_logged(tier_a_session, tmp_path):
    which, terminal, logged = tier_a_session
    ex = lk.exercises.lesson06.tier_a
    for text in (terminal, logged):
        v = ex.check(text, answers=RIGHT_TIER_A)
        assert v and f"your {which} session is this generation's" in v.message and "24 values of M" in v.message
    f = tmp_path / "session.txt"
    f.write_text(logged)
    assert ex.check(f, answers=RIGHT_TIER_A) and ex.check(str(f), answers=RIGHT_TIER_A)
    # the session alone is not the whole answer, and its verdict states none of the answers
    v = ex.check(logged)
    assert v.status == E.NOT_ATTEMPTED and "answers=" in v.message and "1 1 1 1" not in v.message
    # each wrong answer gets its own reason, read from the same generation
    v = ex.check(logged, answers={"seq_len_first": 0, "calls_per_step": 1, "loop_runs_seq_len": True,
                                  "M_ever_decreases": True})
    assert v.status == E.INCORRECT and "3 answer(s)" in v.message, v.message
    assert "shows seq_len=1" in v.message and "for 4 entry stops" in v.message and "starts over" in v.message


RIGHT_TIER_A = {"seq_len_first": 1, "calls_per_step": 4, "loop_runs_seq_len": True, "M_ever_decreases": False}


def replace_value(text: str, line: int, value: str) -> str:
    """``text`` with the value at the end of its ``line`` (0-based: ``= 1.25`` or ``seq_len=3, ...``) replaced."""
    lines = text.splitlines()
    lines[line] = re.sub(r"= \S+$", f"= {value}", lines[line])
    return "\n".join(lines) + "\n"


def test_tier_a_refuses_a_doctored_session(tier_a_session):
    which, unused, logged = tier_a_session
    ex = lk.exercises.lesson06.tier_a
    session = by_hand.read_session(logged)
    c = next(c for c in session.calls if c.seq_len == 3)   # a call with three stops in the loop
    (t0, m0, _s, _l0), (t1, m1, _s, l1) = c.stops[:2]
    # M edited to decrease: the second stop's M set below the first one's
    v = ex.check(replace_value(logged, l1, f"{m0 - 1.0:.9g}"))
    assert v.status == E.INCORRECT and "M decreases" in v.message and "did not come from the kernel" in v.message
    # a seq_len changed: one call's entry says 2 where the generation has 3
    lines = logged.splitlines()
    lines[c.line] = lines[c.line].replace("seq_len=3", "seq_len=2") if which == "gdb" else "(int) seq_len = 2"
    assert lines[c.line] != logged.splitlines()[c.line]
    v = ex.check("\n".join(lines))
    assert v.status == E.INCORRECT and "cannot come from this generation" in v.message
    # a value typed by hand: M rounded to three digits (the order of the Ms unchanged)
    v = ex.check(replace_value(logged, l1, f"{m1:.3f}"))
    assert v.status == E.INCORRECT and "typed by hand" in v.message, v.message
    # the session stopped before the program's end
    v = ex.check("\n".join(logged.splitlines()[:c.line]))
    assert v.status == E.INCORRECT and "ends after 8 of the generation's 12 kernel calls" in v.message


@pytest.mark.parametrize("text,words", [("", "empty"), ("   \n\n", "empty"),
                                        ("(gdb) run\nhello\n", "no stop at the kernel's entry")])
def test_tier_a_refuses_an_empty_session(text, words):
    v = lk.exercises.lesson06.tier_a.check(text)
    assert v.status == E.INCORRECT and words in v.message


def test_tier_a_names_a_missing_file(tmp_path):
    v = lk.exercises.lesson06.tier_a.check(tmp_path / "nothing.txt")
    assert v.status == E.INCORRECT and "no file" in v.message


def test_tier_a_command_line_names_this_machine():
    for which in debugger.DEBUGGERS:
        line = by_hand.tier_a_command_line(which)
        python = Path(sys.executable)   # after the cd into the workbook, a Python inside it is named from there
        here = str(python.relative_to(native.REPO_DIR)) if python.is_relative_to(native.REPO_DIR) else str(python)
        assert f"cd {native.REPO_DIR}\n" in line and f" {here} -c " in line and by_hand.TIER_A_PROGRAM in line
        typed = "\n".join(c for c, unused in by_hand.tier_a_commands(which))
        assert "<hash>" not in typed and str(by_hand.tier_a_lines()[1]) in typed
    lldb = "\n".join(c for c, unused in by_hand.tier_a_commands("lldb"))
    assert native.library_path(debug=True).name in lldb


def test_without_gdb_lldb_runs_or_the_fallback_says_so(monkeypatch):
    """A Mac: no gdb. The default debugger is then lldb; with neither, the records come from the trace,
    the message says so and how to get each debugger, and same_records refuses to compare the trace
    with itself."""
    calls = []
    monkeypatch.setattr(debugger, "debugger_path", lambda d: "/usr/bin/lldb" if d == "lldb" else None)
    monkeypatch.setattr(debugger, "_run_batch", lambda exe, d, *a: calls.append(d) or ("", "", ""))
    obs = debugger.observe_generation(2)
    assert calls == ["lldb"] and obs.source == "trace" and "lldb saw 0 kernel calls" in obs.message
    monkeypatch.setattr(debugger, "debugger_path", lambda d: None)
    obs = debugger.observe_generation(2)
    assert obs.source == "trace" and "no debugger ran" in obs.message and 'debugger="lldb"' in obs.message
    assert "apt install lldb" in obs.message
    with pytest.raises(ValueError, match="traced build, not from a debugger"):
        debugger.same_records(obs)
