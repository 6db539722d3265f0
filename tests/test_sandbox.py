"""A student's edit proves itself before it is loaded: every new build of native/ runs in a child
process against the engine's quantized math first (lessonkit/smoke.py). A crash, a hang or a wrong
result there is a KernelCheckError in the student's process, which keeps its state and its old
library. Each case runs in a child process of its own, so a failure of the sandbox would fail
the test instead of killing pytest."""
from __future__ import annotations

import pytest

from childproc import assert_clean, run_python

# The child's common start: a copy of native/, its intact build loaded and called once.
SETUP = """
import shutil, tempfile, warnings
from pathlib import Path
import numpy as np
import lessonkit as lk
from lessonkit import native
from conftest import make_case

work = Path(tempfile.mkdtemp())
src = work / "native"
shutil.copytree(native.NATIVE_DIR, src, ignore=shutil.ignore_patterns("tests"))
kernel_c = src / "flash_attn_q8_neon.c"
ANCHOR = "const int nblk = hd / QBLK;"

def edit(code, anchor=ANCHOR, path=kernel_c):
    text = path.read_text()
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + "\\n    " + code, 1))

cache, q, _, _ = make_case(5, 40, 2, 64, 16)

def call(ffi, lib):
    out = np.empty(64, np.float32)
    lib.flash_attn_single_q_q8_neon(ffi.from_buffer("float[]", out), ffi.from_buffer("float[]", q),
                                    *cache.kernel_args(1, ffi), 64, 0.125)
    return out

def expect_refused(**load_args):
    # load() must raise KernelCheckError; its message is printed for the test to read
    try:
        native.load(src_dir=src, **load_args)
    except native.KernelCheckError as e:
        print("MESSAGE", str(e).replace("\\n", " | "))
    else:
        raise SystemExit(f"a build that should be refused was loaded ({load_args})")

def load_warned(**load_args):
    # load() with every warning it gives recorded: (ffi, lib, [warnings])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ffi, lib = native.load(src_dir=src, **load_args)
    return ffi, lib, caught

ffi0, lib0 = native.load(src_dir=src)
before = call(ffi0, lib0)
state = {"unsaved": [1, 2, 3]}   # the student's work, which must survive
"""

AFTER = """
# the library loaded before keeps working, and the process's state is intact
assert np.array_equal(call(ffi0, lib0), before)
assert state == {"unsaved": [1, 2, 3]}
print("OK")
"""


@pytest.fixture(scope="module")
def shared_build_dir(tmp_path_factory):
    """One build folder for every case: the intact copy's library is then built once, not per case."""
    return str(tmp_path_factory.mktemp("sandbox-builds"))


@pytest.fixture
def run_case(shared_build_dir):
    def run(body: str, env: dict | None = None) -> str:
        proc = run_python(SETUP + body + AFTER, env={"LESSONKIT_BUILD_DIR": shared_build_dir, **(env or {})})
        out = assert_clean(proc)
        assert out.strip().endswith("OK"), out
        return out
    return run



def test_an_edit_that_does_not_compile_is_refused_through_the_lessons_path(run_case):
    """The edit a lesson makes (lessonkit.kernel_copy.edit_line on a copy) breaks the C: a BuildError
    with the compiler's message; nothing new is loaded and the process goes on."""
    out = run_case("""
from lessonkit import kernel_copy
kernel_copy.edit_line(src, kernel_copy.Edit("flash_attn_q8_neon.c", ANCHOR, "const int nblk = hd / ;"))
try:
    native.load(src_dir=src)
except native.KernelCheckError:
    raise SystemExit("a compile error was reported as a failed check")
except native.BuildError as e:
    print("MESSAGE", str(e).replace("\\n", " | "))
else:
    raise SystemExit("a build that does not compile was loaded")
""")
    assert "flash_attn_q8_neon.c" in out and "error" in out.lower()


def test_a_segfaulting_edit_is_refused_with_the_signal_named(run_case):
    out = run_case("""
edit("*(volatile int *)0 = 1;")
expect_refused()
""")
    assert "SIGSEGV" in out and "flash_attn_single_q_q8_neon" in out and "Nothing new was loaded" in out


def test_a_hanging_edit_is_refused_after_the_timeout(run_case):
    out = run_case("""
edit("for (;;) { }")
expect_refused()
""", env={"LESSONKIT_SMOKE_TIMEOUT": "4"})
    assert "did not finish in 4 s" in out and "flash_attn_single_q_q8_neon" in out


def test_a_wrong_result_is_refused_with_the_check_and_its_error(run_case):
    """A child python builds an intact copy and an edited one, and checks each, as every case of this file does."""
    out = run_case("""
edit("scale *= 2.0f;")
expect_refused()
""")
    assert "wrong results" in out and "flash_attn_single_q_q8_neon on case" in out
    assert "off by" in out and "tolerance 1e-04" in out and "verify='crashes'" in out


def test_a_library_that_forks_when_loaded_is_refused(run_case):
    """A constructor that calls fork() passes every result check (each copy computes right), but loaded
    into the student's process it would copy that process (with its Jupyter kernel). The check's child
    runs in a process group of its own: the copy it left behind is seen, ended, and the build refused.
    The check waits for the forked processes it finds, before it refuses the build."""
    out = run_case("""
import os, time
pid_file = work / "forked.pid"
os.environ["FA_FORKED_PID_FILE"] = str(pid_file)
text = kernel_c.read_text()
kernel_c.write_text("#include <stdio.h>\\n#include <stdlib.h>\\n#include <unistd.h>\\n"
                    "__attribute__((constructor)) static void fa_fork_at_load(void) {\\n"
                    "    if (fork() == 0) { FILE *f = fopen(getenv(\\"FA_FORKED_PID_FILE\\"), \\"w\\");\\n"
                    "        fprintf(f, \\"%d\\", (int)getpid()); fclose(f); sleep(60); _exit(0); }\\n}\\n" + text)
expect_refused()
pid = int(pid_file.read_text())
for unused in range(50):   # killed with its group; then reaped by init (a zombie until then)
    try:
        proc_state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        proc_state = "gone"
    if proc_state in ("gone", "Z"):
        break
    time.sleep(0.1)
print("FORKED COPY", proc_state)
""")
    assert "calls fork()" in out and "other processes running" in out and "Nothing new was loaded" in out
    assert "FORKED COPY gone" in out or "FORKED COPY Z" in out


def test_the_debug_build_is_checked_too(run_case):
    out = run_case("""
edit("*(volatile int *)0 = 1;")
expect_refused(debug=True)
""")
    assert "SIGSEGV" in out


def test_a_kernel_broken_on_purpose_loads_with_an_explicit_opt_in(run_case):
    """A child python builds an intact copy and an edited one, and checks each, as every case of this file does."""
    out = run_case("""
edit("scale *= 2.0f;")
ffi1, lib1, caught = load_warned(verify="crashes")
assert any("computes wrong results" in str(w.message) for w in caught), [str(w.message) for w in caught]
assert not np.allclose(call(ffi1, lib1), before)      # it really is the broken kernel
# the opt-in still catches crashes
edit("*(volatile int *)0 = 1;")
expect_refused(verify="crashes")
""")
    assert "SIGSEGV" in out


def test_verify_skip_loads_without_running_the_check(run_case):
    out = run_case("""
import json
edit("scale *= 3.0f;")
ffi1, lib1 = native.load(src_dir=src, verify="skip")
path = native.build(src_dir=src, verify="skip")
assert json.loads(Path(str(path) + ".json").read_text())["verified"] == "skip"
# asked for the full check later, the same library is checked then, and refused
expect_refused()
""")
    assert "wrong results" in out


def test_compiler_warnings_of_a_build_that_succeeds_are_shown(run_case):
    out = run_case("""
edit("float never_set; if (seq_len < 0) scale += never_set;")
ffi1, lib1, caught = load_warned()
msgs = [str(w.message) for w in caught if issubclass(w.category, native.BuildWarning)]
assert msgs and "never_set" in msgs[0], msgs
assert caught[0].filename == "native/flash_attn_q8_neon.c", caught[0].filename
print("WARNING", msgs[0])
assert np.array_equal(call(ffi1, lib1), before)
""")
    assert "never_set" in out and "warning" in out


def test_the_intact_sources_pass_their_check():
    from pathlib import Path
    import json
    from lessonkit import native
    path = native.build()
    record = json.loads(Path(str(path) + ".json").read_text())
    assert record["verified"] == "results" and record["failures"] == [] and record["crash"] is None


@pytest.mark.parametrize("verify", ["yes", True, None])
def test_verify_must_be_a_known_level(verify):
    from lessonkit import native
    with pytest.raises(ValueError, match="verify must be one of"):
        native.build(verify=verify)


def test_printf_and_a_multi_line_macro_leave_a_correct_kernel_loadable(run_case):
    """The first debugging step: printf (stdout) and fprintf(stderr) in the kernel, and a #define over
    two lines in the header. The check's report travels on its own channel, so the kernel's output
    cannot be taken for it; what the kernel printed is shown, cut to a few lines."""
    out = run_case("""
text = kernel_c.read_text()
kernel_c.write_text("#include <stdio.h>\\n" + text)
edit('printf("out seq_len=%d\\\\n", seq_len); fprintf(stderr, "err seq_len=%d\\\\n", seq_len);')
header = src / "flash_attn_q8.h"
h = header.read_text()
i = h.rfind("#endif")
header.write_text(h[:i] + "#define MY_MAX(a, b) \\\\\\n    ((a) > (b) ? (a) : (b))\\n" + h[i:])
import contextlib, io
shown = io.StringIO()
with contextlib.redirect_stdout(shown):
    ffi1, lib1 = native.load(src_dir=src)
print("SHOWN", shown.getvalue().replace("\\n", " | "))
assert np.array_equal(call(ffi1, lib1), before)
""")
    shown = out.split("SHOWN", 1)[1].split("\n", 1)[0]
    assert "Your kernel printed" in shown and "out seq_len=1" in shown and "err seq_len=" in shown
    assert "more lines)" in shown and shown.count("seq_len=") <= 10  # cut to a few lines of each


def test_a_buffer_sized_for_short_caches_is_refused_at_the_first_longer_call(run_case):
    """A plausible edit keeps every score in a fixed array. float seen[128] fails the new-build check
    itself (its longest cache has 4,100 tokens over 129 blocks); float seen[8192] passes it and is
    refused, before the call, on the first cache longer than the check's, by a check at that length
    in a child process. Calls on short caches still run, and the process survives.
    Two edited builds, each checked, then the check at a longer length."""
    out = run_case("""
def keep_scores(n):
    shutil.copy(native.NATIVE_DIR / "flash_attn_q8_neon.c", kernel_c)
    text = kernel_c.read_text()
    text = text.replace("    float M = -1e9f, S = 0.0f;", f"    float seen[{n}];\\n    float M = -1e9f, S = 0.0f;", 1)
    text = text.replace("        s = s * ks * scale;\\n", "        s = s * ks * scale;\\n        seen[t] = s;\\n", 1)
    text = text.replace("    /* == segment 4: normalize once == */",
                        "    float top = -1e9f;\\n    for (int t = 0; t < seq_len; t++) top = fmaxf(top, seen[t]);\\n"
                        "    if (top != M) S = 0.0f;\\n    /* == segment 4: normalize once == */", 1)
    kernel_c.write_text(text)

keep_scores(128)
expect_refused()
keep_scores(8192)
ffi1, lib1 = native.load(src_dir=src)
assert np.allclose(call(ffi1, lib1), before, atol=1e-6)   # right on a short cache
rng = np.random.default_rng(1)
long_cache = lk.KVCacheQ8(2, 64, 256)
long_cache.append(rng.standard_normal((20000, 2, 64), dtype=np.float32), rng.standard_normal((20000, 2, 64), dtype=np.float32))
from lessonkit.kernels.attention import call_kernel
for attempt in (1, 2):  # the second refusal comes without a second child
    try:
        call_kernel(ffi1, lib1, np.empty(64, np.float32), q, long_cache, 1, 0.125)
    except native.KernelCheckError as e:
        print("MESSAGE", attempt, str(e).replace("\\n", " | "))
    else:
        raise SystemExit("a kernel that overflows on long caches was called on one")
assert np.allclose(call(ffi1, lib1), before, atol=1e-6)   # short caches still run
# the intact build is checked at that length once, and then called
out = call_kernel(ffi0, lib0, np.empty(64, np.float32), q, long_cache, 1, 0.125)
assert np.isfinite(out).all()
""")
    assert "SIGSEGV" in out and "4100 tokens" in out
    assert "MESSAGE 1" in out and "MESSAGE 2" in out and "32768 tokens" in out and "The call was not made" in out


def test_a_non_static_helper_in_the_kernel_file_says_it_must_be_static(run_case):
    out = run_case("""
edit("", anchor="void flash_attn_single_q_q8_neon(", path=kernel_c)
text = kernel_c.read_text()
kernel_c.write_text(text.replace("void flash_attn_single_q_q8_neon(", "float twice(float x) { return 2.0f * x; }\\n"
                                 "void flash_attn_single_q_q8_neon(", 1))
try:
    native.load(src_dir=src)
except native.BuildError as e:
    print("MESSAGE", str(e).replace("\\n", " | "))
""")
    assert "twice is defined twice" in out and "must be static" in out and "flash_attn_q8_traced.c" in out
    assert "/tmp" not in out.split("MESSAGE", 1)[1].split("\n", 1)[0]  # no private temporary paths


def test_a_function_body_in_the_header_is_named_before_anything_compiles(run_case):
    out = run_case("""
header = src / "flash_attn_q8.h"
h = header.read_text()
i = h.rfind("#endif")
header.write_text(h[:i] + "static inline float twice(float x) { return 2.0f * x; }\\n" + h[i:])
line = h[:i].count("\\n") + 1
try:
    native.load(src_dir=src)
except native.KernelCheckError:
    raise SystemExit("the header was reported as a failed check, not named")
except native.BuildError as e:
    print("MESSAGE", line, str(e).replace("\\n", " | "))
""")
    line = out.split("MESSAGE ", 1)[1].split(" ", 1)[0]
    assert f"flash_attn_q8.h:{line}" in out and "static inline" in out and "Traceback" not in out


def test_a_process_the_kernel_forks_does_not_outlive_the_check(run_case, tmp_path):
    """The check runs in a process group of its own and the group is killed when it ends: a kernel that
    forks a sleeper in a call leaves nothing running (the sleeper writes its pid first), and the build is
    refused: called in the student's process, it would copy that process."""
    pid_file = tmp_path / "sleeper.pid"
    out = run_case(f"""
text = kernel_c.read_text()
kernel_c.write_text("#include <stdio.h>\\n#include <unistd.h>\\n" + text)
edit('if (seq_len == 1 && fork() == 0) {{ FILE *f = fopen("{pid_file}", "w"); fprintf(f, "%d", (int)getpid()); '
     'fclose(f); sleep(60); _exit(0); }}')
expect_refused()
import os, time
pid = int(Path("{pid_file}").read_text())
for _ in range(50):
    try:
        run_state = Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        run_state = "gone"
    if run_state in ("gone", "Z", "X"):
        break
    time.sleep(0.1)
print("SLEEPER", run_state)
""")
    assert "SLEEPER gone" in out or "SLEEPER Z" in out or "SLEEPER X" in out, out
    assert "calls fork()" in out, out
