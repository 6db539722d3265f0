# The workbook's two commands:
#   make lab    set up .venv, build the kernel, open JupyterLab on your copy of lesson 00
#               (my-work/, git-ignored: lessonkit/lessons/workspace.py; make update, make reset LESSON=04)
#               make lab LAB_LANG=zh (or make lab-zh) opens the Chinese lesson 00 (notebooks/zh/) instead
#   make test   set up .venv, build the kernel, run every test (C, sanitizers, pytest, notebooks)
#
# Without internet (a classroom, a board behind a firewall): `make wheelhouse` on a machine with
# network gathers every wheel make lab, make test and the class hub install, for this Python and
# CPU, into wheelhouse/ (and JupyterHub's proxy into wheelhouse/npm/); copy that folder, then
# `make lab WHEELHOUSE=/path/to/wheelhouse` installs from it alone (pip --no-index). Without
# WHEELHOUSE pip uses its index as usual. make test-offline proves it in a namespace with no network.
#
# On aarch64, DOTPROD=0 or DOTPROD=1 forces the kernel's choice of the dot-product instruction
# (sdot, -march=armv8.2-a+dotprod) instead of asking the CPU: e.g. `make build DOTPROD=0` builds
# the NEON fallback on an RK3588, `make test DOTPROD=0` tests it. It sets LESSONKIT_DOTPROD for
# every command below (python -m lessonkit build, the C test builds, pytest, the notebooks). It
# changes nothing on x86, where the kernel is compiled through SIMDe.
PYTHON ?= python3
# the optional dependencies of pyproject.toml that setup installs: bench is ggml-python, llama.cpp's
# ggml for make bench's llama.cpp rows and their tests (built from source by pip, about 35 s on
# 2 cores); lint is actionlint, for tests/test_workflow.py (it downloads a program while it
# installs, so it is left out). Read when .venv is made.
EXTRAS ?= lab,test,bench
VENV   := .venv
PY     := $(VENV)/bin/python
# Set (make lab WHEELHOUSE=wheelhouse), every pip install below takes its packages from that folder
# only; unset, pip uses its index and configuration as before. The absolute path, because pip runs
# from other folders too (an isolated build, a clone in make test-offline).
PIP_FROM := $(if $(WHEELHOUSE),--no-index --find-links $(abspath $(WHEELHOUSE)),)
# Where make wheelhouse writes: WHEELHOUSE if given, else wheelhouse/ (git-ignored). Its own
# name, so that the default folder does not switch PIP_FROM on.
WHEELHOUSE_DIR := $(or $(WHEELHOUSE),wheelhouse)
# The extras the wheelhouse holds: everything setup may install by default, the bench's ggml-python
# (a source package, compiled once here into a wheel) and the class hub's packages
WHEELHOUSE_EXTRAS := lab,test,bench,class
# What an offline pip install -e . needs beside the project's wheels: its isolated build's packages
# (pyproject's build-system, and wheel, which older setuptools ask for) and pip, which setup upgrades
WHEELHOUSE_TOOLS := 'setuptools>=64' 'cffi>=1.16' wheel pip
# What test-py runs; e.g. PYTEST_ARGS=notebooks/00_start_here.ipynb for lesson 00 alone. The notebooks come
# first: the longest files start early, and the short test files fill in behind them
PYTEST_ARGS ?= notebooks tests
# make test-py runs its test files on this many processes (pytest-xdist), each file whole in one of them:
# a notebook's cells run in order in one kernel, as nbval needs (PYTEST_JOBS=0: one process, no workers).
# A worker that crashes is not replaced (--max-worker-restart=0): the run fails at once with the test
# that crashed it, where a replaced worker could leave the run waiting for tests nobody runs.
PYTEST_JOBS ?= 2
STAMP  := $(VENV)/.installed-stamp
BUILD  := .build/ctest
CTEST_SRC := native/tests/test_kernel.c $(wildcard native/*.c)
CTEST_FLAGS := -std=gnu11 -Wall -Wextra -Werror -Inative
HOST_ARCH := $(shell uname -m)
HOST_OS   := $(shell uname -s)
# Jupyter refuses to run as root unless told; only root (a container, CI) gets the flag
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
# The student's copies of the lessons and of native/ (lessonkit/lessons/workspace.py's WORK_DIR; in
# .gitignore): lessons run and saved there, so git pull never meets a student's edit
WORK := my-work
# The edition make lab opens: en (notebooks/) or zh (notebooks/zh/, the Chinese lessons). Not LANG,
# which is the shell's locale.
LAB_LANG ?= en
ifeq ($(filter en zh,$(LAB_LANG)),)
  $(error LAB_LANG must be en (English lessons) or zh (中文课程), not '$(LAB_LANG)')
endif
LAB_START := $(WORK)/$(if $(filter zh,$(LAB_LANG)),zh/,)00_start_here.ipynb
# The Chinese lessons get JupyterLab's Chinese interface too: its language pack (the lab extra) as the
# default locale, from class/lab-settings-zh/overrides.json (what the class hub sets for everyone).
# A default only: a language chosen in Settings > Language stays the student's.
LAB_LOCALE := $(if $(filter zh,$(LAB_LANG)),--LabApp.app_settings_dir=$(CURDIR)/class/lab-settings-zh,)

ifneq ($(DOTPROD),)
  ifeq ($(filter 0 1,$(DOTPROD)),)
    $(error DOTPROD must be 0 (no sdot) or 1 (sdot), not '$(DOTPROD)')
  endif
  export LESSONKIT_DOTPROD := $(DOTPROD)
endif

# aarch64 test builds: the cross compiler and qemu-user on other hosts, the native tools on ARM
ifneq ($(filter aarch64 arm64,$(HOST_ARCH)),)
  A64_CC  := $(or $(CC_AARCH64),cc)
  A64_RUN :=
else
  A64_CC  := $(or $(CC_AARCH64),aarch64-linux-gnu-gcc)
  A64_RUN := qemu-aarch64 -L /usr/aarch64-linux-gnu
endif
# valgrind's client-request header for the cross-built driver: a cross compiler does not search
# /usr/include, so the folder is linked into one of its own (the header is the same on every CPU)
CALLGRIND_H := /usr/include/valgrind/callgrind.h

# The kernel-facing pytest files that test-asan-py runs against the sanitized library: every
# call into native/ from Python (accuracy, bad inputs, the cache, traced kernel, GQA and split-KV
# on threads, streaming merges, timing loops). Not the build tests (they compile copies of
# native/ and run gdb), the notebooks or valgrind. Two tests are left out: the traced kernel's output
# equals the untraced kernel's bit for bit only while the compiler fuses the same multiply-adds in both
# copies (GCC's default -ffp-contract=fast), and the instrumentation changes where it fuses them; the
# second is lesson 04's check cell (dataflow.check_walkthrough), which asserts that same equality.
ASAN_PY_TESTS := tests/test_kernel_accuracy.py tests/test_bad_inputs.py tests/test_cache.py \
  tests/test_trace.py tests/test_kernels_split.py tests/test_streaming.py tests/test_dataflow.py \
  tests/test_quant.py tests/test_layout.py tests/test_timing.py tests/test_softmax_synthetic.py \
  tests/test_rounding.py tests/test_rescales.py tests/test_precision.py tests/test_toy.py \
  --deselect tests/test_trace.py::test_traced_output_equals_untraced_bit_for_bit \
  --deselect tests/test_dataflow.py::test_check_walkthrough_passes_and_can_fail
ASAN_PY_SANITIZE ?= address,undefined,float-cast-overflow
ASAN_PY_LOGS := .build/asan-py
SANITIZER_REPORT := runtime error:|ERROR: [A-Za-z]*Sanitizer|SUMMARY: [A-Za-z]*Sanitizer

# (grade: the teachers' grading, below)
.PHONY: grade catalog setup site-setup site handouts build lab lab-zh copies update reset reset-native test test-c test-asan test-asan-py test-aarch64 debug-aarch64 test-py test-bench figures test-offline wheelhouse class class-demo class-publish class-unit class-teardown test-class bench bench-a76 clean help
help:
	@echo "make lab    set up and open the workbook in JupyterLab (make lab-zh or LAB_LANG=zh: 中文版第 00 课)"
	@echo "make test   set up and run every test"
	@echo "make bench  time the kernel against its variants and numpy (BENCH_ARGS=--quick)"
	@echo "make bench-a76  llvm-mca ESTIMATES of cycles per token on the RK3588's cores (A76 via the"
	@echo "  Neoverse N1 model, A55); needs llvm-19, gcc-aarch64-linux-gnu, qemu-user (CYCLES_ARGS=--quick)"
	@echo "make figures  measure lesson 09's saved figures again on this machine (a few minutes; a quiet machine)"
	@echo "make update   git fetch and merge (not if it touches $(WORK)/), then copy the lessons it brought into $(WORK)/"
	@echo "make reset LESSON=04   start lesson 04 over (your copy moves to $(WORK)/old/); LESSON=zh/04 the Chinese one;"
	@echo "  LESSON=glossary the glossary; make reset-native: the kernel copy"
	@echo "make catalog   check lessonkit's Chinese messages (.po) and compile them (.mo); needs msgfmt (gettext)"
	@echo "make site   the lessons as two websites, English and Chinese, into _site/en and _site/zh (open"
	@echo "  _site/index.html; no network needed); make handouts: one A4 PDF per lesson, _site/handouts/en|zh/"
	@echo "make grade STUDENTS=folder OUT=grades   grade the students' notebooks (one folder each, or /home for a"
	@echo "  class hub's homes) with otter-grader: OUT/grades.csv and OUT/feedback/STUDENT.html (README: Grading)"
	@echo "make build | test-c | test-asan | test-asan-py | test-aarch64 | test-py | test-bench | clean"
	@echo "make debug-aarch64   lesson 06's breakpoints in the aarch64 build (sdot) under qemu and gdb-multiarch"
	@echo "  (make test-py PYTEST_ARGS=notebooks/00_start_here.ipynb: one lesson)"
	@echo "make wheelhouse   with network: every wheel setup and the class hub need, into wheelhouse/"
	@echo "  (WHEELHOUSE=dir for another folder), and JupyterHub's proxy into wheelhouse/npm/"
	@echo "make lab WHEELHOUSE=/path/to/wheelhouse   install from that folder only, no network"
	@echo "  (any target that sets up .venv: make test WHEELHOUSE=..., make setup WHEELHOUSE=...)"
	@echo "make test-offline   make setup and lesson 00 in a fresh clone with no network, from the wheelhouse"
	@echo "For teachers (as root; README: For teachers): make class CLASS_ROSTER=roster.csv serves JupyterHub to"
	@echo "  the class from this machine; make class-demo (three demo students on 127.0.0.1); make class-publish"
	@echo "  (students get this commit); make class-unit (systemd); make test-class (the hub end to end)"
	@echo "DOTPROD=0 or DOTPROD=1 (aarch64): build and test without or with sdot, whatever the CPU"
	@echo "  reports (e.g. make build DOTPROD=0); it sets LESSONKIT_DOTPROD"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(PIP_FROM) --upgrade pip
	$(PY) -m pip install --quiet $(PIP_FROM) -e '.[$(EXTRAS)]'
	touch $(STAMP)

setup: $(STAMP)

# make site and make handouts (README: "The lessons as a website and handouts"): the site extra of
# pyproject.toml (Sphinx, MyST-NB, the book theme, MathJax, Playwright, jieba: about 80 MB to download,
# 280 MB in .venv, most of it the Node.js inside Playwright) goes into .venv the first time one of
# them runs, under a stamp of its own, so that make lab installs no more than before. make test installs it too, for tests/test_site.py; make test-py alone runs those tests
# where it is installed and skips them, saying so, where not. make test-offline needs none of it.
SITE_STAMP := $(VENV)/.site-installed-stamp
$(SITE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(PIP_FROM) -e '.[site]'
	touch $(SITE_STAMP)

site-setup: $(SITE_STAMP)

# Both editions' sites from the committed notebooks (nothing runs), every warning an error
site: site-setup
	$(PY) -m workbench site

# Printed from the site by the system's Chromium (Debian: chromium-headless-shell or chromium)
handouts: site
	$(PY) -m workbench handouts

# The grade extra (otter-grader, which brings pandas and playwright), on demand: make grade and the
# tests install it into .venv beside setup's, make lab never. Not from a wheelhouse (an offline
# classroom has what make lab needs; tests/test_grade.py skips without it).
GRADE_STAMP := $(VENV)/.grade-stamp
$(GRADE_STAMP): $(STAMP)
	$(PY) -m pip install --quiet $(PIP_FROM) -e '.[grade]'
	touch $(GRADE_STAMP)

build: setup
	$(PY) -m lessonkit build
	$(PY) -m lessonkit build --debug

# JupyterLab serves the whole checkout (native/ is browsable) and opens the student's copy of lesson 00
# of the edition LAB_LANG names
lab: build copies
	$(VENV)/bin/jupyter lab $(LAB_ARGS) $(LAB_LOCALE) --ServerApp.root_dir=. $(LAB_START)

lab-zh:
	$(MAKE) lab LAB_LANG=zh

# Copy each lesson that has no working copy yet into $(WORK)/; existing copies are never touched
copies: setup
	LESSONKIT_LANG=$(LAB_LANG) $(PY) -m workbench workspace copies

# The update: git fetch, then a fast-forward to the new commits unless they touch $(WORK)/ (git would
# overwrite a student's ignored copy there without a word: workbench/workspace.py's update), then (in a
# new make, so that setup sees a changed pyproject.toml) the copies of lessons the update added. A merge
# that stops on a conflict was meant for native/ or notebooks/ edited in place: the README's "Your own
# copies" says how to keep that work.
update: setup
	@LESSONKIT_LANG=$(LAB_LANG) $(PY) -m workbench workspace update
	$(MAKE) copies

# Start one lesson over; the old copy moves to $(WORK)/old/. No setup: it needs only the .venv that
# made the copies (the standard library does the work). LESSON reaches python as typed: through the
# environment, unexpanded ($(value)), so that no quote, $ or ; in it is read by make or the shell, and
# after --, so that LESSON=-h is a lesson name to refuse, not a request for help. unexport: make would
# otherwise export the command line's LESSON to every recipe, expanding it (LESSON='$(shell ...)' ran).
unexport LESSON
reset: export LESSON_ARG = $(value LESSON)
reset:
	@if [ -z "$$LESSON_ARG" ]; then echo "say which lesson: make reset LESSON=04"; exit 1; fi
	@if [ ! -x "$(PY)" ]; then echo "no $(PY) yet: make lab makes it, and your copies"; exit 1; fi
	@$(PY) -m workbench workspace reset -- "$$LESSON_ARG"

reset-native:
	@if [ ! -x "$(PY)" ]; then echo "no $(PY) yet: make lab makes it"; exit 1; fi
	$(PY) -m workbench workspace reset-native

# Two lanes at once, after the installs: test-py in the foreground (its log streams), and beside it the other
# targets one after another (TEST_SIDE), their log in $(SIDE_LOG) and printed after test-py's. Each lane alone
# leaves a core idle for much of its time: test-py's two workers wait on kernels and compilers, and the side
# targets are one process each (test-asan-py too: PYTEST_JOBS=1 there). Both lanes run to the end, and make test
# fails if either failed. The side lane is a process group of its own (setsid), which the recipe interrupts when
# Ctrl-C reaches it (Ctrl-C reaches test-py directly, as every process of the terminal's group); a shell starts a
# background job with Ctrl-C ignored, which env --default-signal undoes, so that make and pytest there tidy up as
# after a Ctrl-C. TEST_SERIAL=1, or a system without setsid and
# env --default-signal (macOS), runs everything one after another in one log.
TEST_SIDE := test-c test-asan test-aarch64 test-asan-py test-bench test-offline test-class
SIDE_LOG := .build/test-side.log
test: build site-setup $(if $(WHEELHOUSE),,$(GRADE_STAMP))
	@if [ -n "$(TEST_SERIAL)" ] || ! command -v setsid >/dev/null 2>&1 || ! env --default-signal=INT true 2>/dev/null; \
	then $(MAKE) --no-print-directory test-py $(TEST_SIDE); exit $$?; fi; \
	mkdir -p .build && rm -f $(SIDE_LOG) $(SIDE_LOG).status && \
	echo "== beside test-py: $(TEST_SIDE) (their log: $(SIDE_LOG), printed at the end)"; \
	setsid env --default-signal=INT sh -c 't=$$(date +%s); $(MAKE) --no-print-directory PYTEST_JOBS=1 $(TEST_SIDE) \
	  > $(SIDE_LOG) 2>&1; echo $$? $$(($$(date +%s) - t)) > $(SIDE_LOG).status' & \
	side=$$!; trap 'kill -INT -'$$side' 2>/dev/null; wait; exit 130' INT; \
	t0=$$(date +%s); $(MAKE) --no-print-directory test-py; py=$$?; t1=$$(date +%s); \
	wait $$side; read side_status side_s < $(SIDE_LOG).status 2>/dev/null || side_status=1; \
	echo "== $(TEST_SIDE), run beside test-py:"; cat $(SIDE_LOG); \
	echo "== make test: test-py $$((t1 - t0)) s (exit $$py); beside it $(TEST_SIDE) $${side_s:-?} s (exit $$side_status)"; \
	[ $$py -eq 0 ] && [ $$side_status -eq 0 ]

# The C test program: NEON kernel (SIMDe off ARM) against the scalar one, natively ...
test-c: setup
	@mkdir -p $(BUILD)
	$(CC) $(CTEST_FLAGS) -O2 $$($(PY) -m lessonkit cflags --arch-only) $(CTEST_SRC) -lm -o $(BUILD)/test_kernel
	$(BUILD)/test_kernel

# ... under AddressSanitizer + UndefinedBehaviorSanitizer (float-cast-overflow too: a NaN or
# out-of-range float cast to int8 is undefined behaviour) ...
test-asan: setup
	@mkdir -p $(BUILD)
	$(CC) $(CTEST_FLAGS) -O1 -g -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all \
	  -fno-omit-frame-pointer $$($(PY) -m lessonkit cflags --arch-only) \
	  $(CTEST_SRC) -lm -o $(BUILD)/test_kernel_asan
	$(BUILD)/test_kernel_asan

# ... the library Python loads, built with the same sanitizers (LESSONKIT_SANITIZE), under the
# kernel-facing pytest files. The sanitizer runtime must be the first library of the process, so
# it is preloaded into python (LD_PRELOAD; Linux only), with libstdc++: the runtime takes over C++'s
# throw and must find the real one when it starts, and matplotlib's C++ extensions, imported later,
# throw while they load. detect_leaks=0: CPython keeps objects
# alive until exit by design, which LeakSanitizer would report as leaks. Every report fails the
# target: the build stops at the first one (-fno-sanitize-recover=all), AddressSanitizer writes
# its reports to $(ASAN_PY_LOGS)/ (any process), and pytest leaves stderr alone (--capture=sys)
# so that UndefinedBehaviorSanitizer's report reaches the log that is searched afterwards. The files run on
# PYTEST_JOBS processes, as test-py's do: the workers inherit the preloaded runtime and write to the same logs.
test-asan-py: setup
	@if [ "$(HOST_OS)" != Linux ]; then \
	  echo "SKIPPED test-asan-py: preloads the sanitizer runtime into python with LD_PRELOAD (Linux only;" \
	       "make test-asan runs the C test program under the same sanitizers here)"; exit 0; \
	fi; \
	rt=$$($(CC) -print-file-name=libclang_rt.asan-$(HOST_ARCH).so); \
	[ -f "$$rt" ] || rt=$$($(CC) -print-file-name=libasan.so); \
	if [ ! -f "$$rt" ]; then echo "FAILED test-asan-py: $(CC) has no AddressSanitizer runtime" \
	  "(Debian: apt install build-essential, which brings libasan)"; exit 1; fi; \
	built=$$(LESSONKIT_SANITIZE=$(ASAN_PY_SANITIZE) LD_PRELOAD="$$rt libstdc++.so.6" ASAN_OPTIONS=detect_leaks=0 \
	  $(PY) -m lessonkit build) || exit 1; lib=$$(printf '%s\n' "$$built" | tail -n 1); lib=$${lib%% *}; \
	if ! nm -D "$$lib" | grep -q ' __asan_'; then echo "FAILED test-asan-py: $$lib is not instrumented:" \
	  "lessonkit/native.py ignored LESSONKIT_SANITIZE=$(ASAN_PY_SANITIZE)"; exit 1; fi; \
	echo "sanitized library: $$lib; preloading $$rt"; \
	rm -rf $(ASAN_PY_LOGS) && mkdir -p $(ASAN_PY_LOGS) && \
	{ LESSONKIT_SANITIZE=$(ASAN_PY_SANITIZE) LD_PRELOAD="$$rt libstdc++.so.6" \
	  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:log_path=$(CURDIR)/$(ASAN_PY_LOGS)/asan \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  $(PY) -m pytest -q --capture=sys -p no:cacheprovider -n $(PYTEST_JOBS) --max-worker-restart=0 $(ASAN_PY_TESTS); \
	  echo $$? > $(ASAN_PY_LOGS)/status; } 2>&1 | tee $(ASAN_PY_LOGS)/output.txt; \
	status=$$(cat $(ASAN_PY_LOGS)/status); \
	if ls $(ASAN_PY_LOGS)/asan.* >/dev/null 2>&1 || grep -Eq '$(SANITIZER_REPORT)' $(ASAN_PY_LOGS)/output.txt; then \
	  cat $(ASAN_PY_LOGS)/asan.* 2>/dev/null; \
	  echo "FAILED test-asan-py: sanitizer report (above; logs in $(ASAN_PY_LOGS)/)"; exit 1; \
	fi; \
	exit $$status

# ... and for aarch64, with sdot (armv8.2-a+dotprod) and without (armv8-a, the fallback), whatever
# DOTPROD says; then the
# valgrind driver as lessonkit.traffic builds it on arm64 (armv8-a: valgrind 3.19 cannot run sdot),
# with its client requests, run once outside valgrind.
test-aarch64:
	@if ! command -v $(firstword $(A64_CC)) >/dev/null 2>&1 || \
	    { [ -n "$(A64_RUN)" ] && ! command -v qemu-aarch64 >/dev/null 2>&1; }; then \
	  echo "SKIPPED test-aarch64: needs $(firstword $(A64_CC)) and qemu-aarch64" \
	       "(Debian: apt install gcc-aarch64-linux-gnu qemu-user)"; \
	else \
	  mkdir -p $(BUILD) && \
	  for march in armv8.2-a+dotprod armv8-a; do \
	    echo "== aarch64 -march=$$march" && \
	    $(A64_CC) $(CTEST_FLAGS) -O2 -march=$$march $(CTEST_SRC) -lm -o $(BUILD)/test_kernel_$$march && \
	    $(A64_RUN) $(BUILD)/test_kernel_$$march || exit 1; \
	  done; \
	  echo "== aarch64 valgrind driver, -march=armv8-a" && \
	  inc=; if [ -f $(CALLGRIND_H) ]; then \
	    mkdir -p $(BUILD)/include && ln -sfn $(dir $(CALLGRIND_H)) $(BUILD)/include/valgrind && inc=-I$(BUILD)/include; \
	  fi; \
	  $(A64_CC) $(CTEST_FLAGS) -O2 -g -march=armv8-a $$inc native/tools/fa_driver.c $(wildcard native/*.c) -lm \
	    -o $(BUILD)/fa_driver_armv8-a && \
	  echo "measured call marked by: $$($(A64_RUN) $(BUILD)/fa_driver_armv8-a method)" && \
	  $(A64_RUN) $(BUILD)/fa_driver_armv8-a single 4096 128 2 64 cold 1048576 && \
	  $(A64_RUN) $(BUILD)/fa_driver_armv8-a softmax_online 10000 128 1 64 warm || exit 1; \
	fi

# The aarch64 build under a debugger (lesson 06, going further): fa_driver.c (it builds a q8 cache and
# calls the kernel once) and the kernel cross-compiled -O0 -g with sdot, run under qemu-aarch64 stopped
# until gdb-multiarch connects (on an aarch64 machine: natively, under gdb), with the breakpoints of
# lessonkit.debugger (each stop prints one @@ line) and the disassembly of the dot helper. By hand:
#   aarch64-linux-gnu-gcc -std=gnu11 -O0 -g -march=armv8.2-a+dotprod -Inative native/tools/fa_driver.c \
#     native/*.c -lm -o fa_driver_a64
#   qemu-aarch64 -L /usr/aarch64-linux-gnu -g 1234 ./fa_driver_a64 single 20 64 2 8 cold 4096 &
#   gdb-multiarch -ex 'set sysroot /usr/aarch64-linux-gnu' -ex 'file fa_driver_a64' -ex 'target remote :1234'
#   (gdb) break flash_attn_single_q_q8_neon
#   (gdb) continue
#   (gdb) print seq_len
#   (gdb) disassemble i8x16_dot_s32      # sdot: the dot-product extension's instruction
# A64_DEBUG_ARGS: the driver's arguments (variant, seq_len, head_dim, kv heads, block size, cache state, bytes).
A64_DEBUG_ARGS ?= single 20 64 2 8 cold 4096
A64_GDB := $(if $(A64_RUN),gdb-multiarch,gdb)
# Each run builds and talks to gdb in a folder of its own ($$d, removed at the end): two runs at once (the two
# editions of lesson 06 on two test workers) had shared one program, one gdb script naming one port and one
# output file, so that one gdb attached to the other's qemu and the first qemu waited for a debugger for ever.
# qemu waiting for gdb leaves SIGTERM to the program it has not started yet, so timeout follows it with SIGKILL;
# --foreground keeps timeout in make's process group, which a caller that ends the group (lesson 06's cell,
# run_bounded) then ends whole: without it timeout made a group of its own, and its qemu outlived the cell.
A64_DEBUG = $$d/fa_driver_a64_debug
debug-aarch64:
	@if [ ! -x "$(PY)" ]; then echo "no $(PY) yet: make setup makes it"; exit 1; fi; \
	missing=; for t in $(firstword $(A64_CC)) $(if $(A64_RUN),qemu-aarch64) $(A64_GDB) timeout; do \
	  command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then echo "SKIPPED debug-aarch64: missing$$missing" \
	  "(Debian: apt install gcc-aarch64-linux-gnu qemu-user gdb-multiarch)"; exit 0; fi; \
	mkdir -p $(BUILD) && d=$$(mktemp -d $(BUILD)/debug-aarch64.XXXXXX) && trap 'rm -rf "$$d"' EXIT && \
	$(A64_CC) -std=gnu11 -O0 -g -march=armv8.2-a+dotprod -Inative native/tools/fa_driver.c $(wildcard native/*.c) \
	  -lm -o $(A64_DEBUG) || exit 1; \
	port=$$($(PY) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	{ echo "file $(A64_DEBUG)"; \
	  if [ -n "$(A64_RUN)" ]; then echo "set sysroot /usr/aarch64-linux-gnu"; \
	    echo "set tcp connect-timeout 20"; echo "target remote :$$port"; fi; \
	  $(PY) -c 'from lessonkit import debugger; print(debugger.gdb_commands(), end="")' || exit 1; \
	  echo 'echo @@disassembly\n'; echo "disassemble i8x16_dot_s32"; echo 'echo @@end disassembly\n'; \
	  if [ -n "$(A64_RUN)" ]; then echo continue; else echo "run $(A64_DEBUG_ARGS)"; fi; } > $(A64_DEBUG).gdb; \
	if [ -n "$(A64_RUN)" ]; then \
	  timeout --foreground -k 5 120 $(A64_RUN) -g $$port $(A64_DEBUG) $(A64_DEBUG_ARGS) & qemu=$$!; fi; \
	timeout --foreground -k 5 120 $(A64_GDB) -batch -nx -iex 'set debuginfod enabled off' -x $(A64_DEBUG).gdb > $(A64_DEBUG).out 2>&1; \
	status=$$?; if [ -n "$(A64_RUN)" ]; then kill $$qemu 2>/dev/null; wait $$qemu 2>/dev/null; fi; \
	grep -v '^\[' $(A64_DEBUG).out; \
	seq=$$(sed -n 's/.*@@enter seq_len=\([0-9]*\).*/\1/p' $(A64_DEBUG).out | head -n 1); \
	runs=$$(grep -c '@@token' $(A64_DEBUG).out); \
	sdot=$$(sed -n '/@@disassembly/,/@@end disassembly/p' $(A64_DEBUG).out | grep -cw sdot); \
	echo "debug-aarch64: seq_len $${seq:-?} at entry, the token loop stopped $$runs times;" \
	  "sdot instructions in i8x16_dot_s32: $$sdot"; \
	[ $$status -eq 0 ] && [ -n "$$seq" ] && [ "$$sdot" -gt 0 ] || { echo "FAILED debug-aarch64 (gdb exit $$status)"; exit 1; }

# --durations=25: the slowest tests of every run are in its log, where CI time is looked for
# tests/conftest.py holds what nbval needs (the progress lines left out, the snippets item after each English
# lesson), and pytest loads it only for a path under tests/: PYTEST_ARGS with none gets its smallest file
PYTEST_CONFTEST = $(if $(filter tests tests/ tests/%,$(PYTEST_ARGS)),,tests/test_nbval_compare.py)
test-py: setup $(if $(WHEELHOUSE),,$(GRADE_STAMP))
	$(PY) -m pytest --nbval-lax -n $(PYTEST_JOBS) --dist loadfile --max-worker-restart=0 --durations=25 \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg $(PYTEST_ARGS) $(PYTEST_CONFTEST)

# The benchmark in its quick mode: that it runs and prints every row and target (met, MISS or why not
# measured), not what the figures are (a shared CI machine's timings say little). The A76 estimates' quick
# mode runs in test-py, where tests/test_a76.py::test_quick_cli reads its table and target line.
test-bench: build
	$(PY) -m workbench bench --quick

# Every wheel an offline set-up installs, for this machine's Python ($(PYTHON)) and CPU: the project's
# dependencies with every extra of WHEELHOUSE_EXTRAS, what the isolated build of pip install -e .
# installs (pyproject's build-system, and wheel, which older setuptools ask for an editable build)
# and pip, which setup upgrades. lessonkit's own wheel is deleted: setup installs the checkout.
# Then JupyterHub's proxy, configurable-http-proxy, a node program that pip cannot bring; it is
# copied to other machines, so it must be pure JavaScript (no compiled addon), which is checked.
wheelhouse:
	@command -v npm >/dev/null 2>&1 || { echo "FAILED wheelhouse: needs npm, for JupyterHub's" \
	  "configurable-http-proxy (Debian: apt install npm)"; exit 1; }
	@mkdir -p $(WHEELHOUSE_DIR)
	$(PYTHON) -m pip wheel --quiet --wheel-dir $(WHEELHOUSE_DIR) '.[$(WHEELHOUSE_EXTRAS)]' \
	  $(WHEELHOUSE_TOOLS)
	@if [ "$(HOST_OS)" = Linux ] && [ "$$($(CLASS_PYTHON) -V 2>&1)" != "$$($(PYTHON) -V 2>&1)" ]; then \
	  echo "and for the class hub's Python, $(CLASS_PYTHON) ($$($(CLASS_PYTHON) -V 2>&1)): a package's newest release" \
	    "may need a newer Python than it"; \
	  tmp=$$(mktemp -d) && $(CLASS_PYTHON) -m venv "$$tmp/venv" && \
	  "$$tmp/venv/bin/python" -m pip wheel --quiet --wheel-dir $(WHEELHOUSE_DIR) '.[lab,class]' \
	    $(WHEELHOUSE_TOOLS); status=$$?; rm -rf "$$tmp"; exit $$status; \
	fi
	rm -f $(WHEELHOUSE_DIR)/lessonkit-*.whl
	npm install --silent --no-audit --no-fund --prefix $(WHEELHOUSE_DIR)/npm configurable-http-proxy@5
	@addons=$$(find $(WHEELHOUSE_DIR)/npm/node_modules \( -name '*.node' -o -name binding.gyp \) -print); \
	if [ -n "$$addons" ]; then echo "FAILED wheelhouse: configurable-http-proxy brought compiled code," \
	  "which may not run on another machine: $$addons"; exit 1; fi
	@echo "$(WHEELHOUSE_DIR)/: $$(ls $(WHEELHOUSE_DIR)/*.whl | wc -l | tr -d ' ') wheels and" \
	  "npm/node_modules/.bin/configurable-http-proxy, $$(du -sh $(WHEELHOUSE_DIR) | cut -f1) in all"

# The wheelhouse as a classroom uses it: a fresh clone of this checkout's commit (committed files
# only, no .venv, nothing built) runs make setup WHEELHOUSE=... and lesson 00 in a network
# namespace with no network. Its loopback is brought up, as the notebooks' kernels talk to nbval
# over 127.0.0.1. pip's configuration files and PIP_* variables are dropped, so that no other
# source (a local index, a find-links folder) can fill a gap in the wheelhouse. A namespace needs
# root (unshare -n) or user namespaces (unshare -rn); without either it is skipped with the reason.
# with tests/test_nbval_compare.py, so that tests/conftest.py (nbval without the check's progress lines) is loaded
OFFLINE_LESSON := notebooks/00_start_here.ipynb tests/test_nbval_compare.py
# A command prefix: pip with the wheelhouse alone, no configuration file and no PIP_* variable (this
# machine's or a developer's find-links or local index would hide a gap in the wheelhouse)
PIP_ALONE := env $$(env | sed -n 's/^\(PIP_[A-Za-z0-9_]*\)=.*/-u \1/p') PIP_CONFIG_FILE=/dev/null
OFFLINE_PROBE := import socket, sys; s = socket.socket(); s.settimeout(5); err = s.connect_ex(("1.1.1.1", 443)); \
  sys.exit("FAILED test-offline: the namespace reaches 1.1.1.1:443") if err == 0 else \
  print("no network: connecting to 1.1.1.1:443 fails,", __import__("os").strerror(err))
test-offline: wheelhouse
	@if ! command -v unshare >/dev/null 2>&1; then \
	  echo "SKIPPED test-offline: needs unshare (util-linux; Linux only) for a namespace with no network"; exit 0; fi; \
	if unshare -n true 2>/dev/null; then ns="unshare -n"; \
	elif unshare -rn true 2>/dev/null; then ns="unshare -rn"; \
	else echo "SKIPPED test-offline: unshare -n and unshare -rn are not permitted here" \
	  "($$(unshare -n true 2>&1 | head -n 1)): a namespace with no network needs root or user namespaces"; exit 0; fi; \
	wh=$(abspath $(WHEELHOUSE_DIR)); tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	git clone -q "$(CURDIR)" "$$tmp/wb" && git -C "$$tmp/wb" checkout -q --detach $$(git rev-parse HEAD) || exit 1; \
	echo "== a fresh clone of $$(git rev-parse --short HEAD) in $$tmp/wb; $$ns, pip from $$wh only"; \
	cd "$$tmp/wb" && $(PIP_ALONE) \
	  $$ns sh -c 'ip link set lo up && $(PYTHON) -c '\''$(OFFLINE_PROBE)'\'' || exit 1; \
	    t0=$$(date +%s); \
	    $(MAKE) --no-print-directory setup WHEELHOUSE="$$0" || { echo "FAILED test-offline: make setup"; exit 1; }; \
	    t1=$$(date +%s); \
	    .venv/bin/python -m pip install --quiet --dry-run --no-index --find-links "$$0" -e ".[class]" \
	      || { echo "FAILED test-offline: the class extra does not install from the wheelhouse"; exit 1; }; \
	    if command -v node >/dev/null 2>&1; then \
	      echo "configurable-http-proxy $$(node "$$0/npm/node_modules/.bin/configurable-http-proxy" --version)" \
	        || { echo "FAILED test-offline: configurable-http-proxy does not start"; exit 1; }; fi; \
	    t2=$$(date +%s); \
	    $(MAKE) --no-print-directory test-py WHEELHOUSE="$$0" PYTEST_ARGS="$(OFFLINE_LESSON)" \
	      || { echo "FAILED test-offline: $(OFFLINE_LESSON)"; exit 1; }; \
	    t3=$$(date +%s); \
	    echo "test-offline passed: make setup $$((t1 - t0)) s, class extra and proxy $$((t2 - t1)) s," \
	      "$(OFFLINE_LESSON) $$((t3 - t2)) s"' "$$wh"

# A class on one server (class/classroom.py; README's "For teachers"): as root, make class installs one
# shared environment in CLASS_DIR (the kernel prebuilt) and serves JupyterHub on CLASS_IP:CLASS_PORT
# to the people of CLASS_ROSTER (class/demo-roster.csv shows the columns), each a Unix user of their
# own. WHEELHOUSE=dir installs from a wheelhouse, with no network.
CLASS_DIR    ?= /srv/flash-attn-class
# The Python of the class's shared environment: every student runs it, so not one under a private
# home (a pyenv in /root, say): the system's python3 where there is one (class/classroom.py)
CLASS_PYTHON ?= $(if $(wildcard /usr/bin/python3),/usr/bin/python3,$(PYTHON))
export CLASS_PYTHON
CLASS_ROSTER ?= class/roster.csv
CLASS_IP     ?= 0.0.0.0
CLASS_PORT   ?= 8000
CLASS_DEMO_DIR ?= /srv/flash-attn-class-demo
CLASSROOM    := $(PYTHON) class/classroom.py
CLASS_FROM   := $(if $(WHEELHOUSE),--wheelhouse $(abspath $(WHEELHOUSE)),)
class:
	@if [ ! -f "$(CLASS_ROSTER)" ]; then echo "no roster $(CLASS_ROSTER): copy class/demo-roster.csv to" \
	  "class/roster.csv, put your class in it (name,password,role,language), or say CLASS_ROSTER=path"; exit 1; fi
	$(CLASSROOM) install --class-dir $(CLASS_DIR) $(CLASS_FROM)
	$(CLASSROOM) serve --class-dir $(CLASS_DIR) --roster $(CLASS_ROSTER) --ip $(CLASS_IP) --port $(CLASS_PORT)

# The whole kit on 127.0.0.1:CLASS_PORT with class/demo-roster.csv (three students and a teacher, Unix
# users fademo-*), installed in its own class folder CLASS_DEMO_DIR; Ctrl-C or SIGTERM stops it and
# removes the demo accounts and its hub's database. The folder (about 600 MB) stays for the next demo:
# make class-publish CLASS_DIR=$(CLASS_DEMO_DIR) publishes to it, rm -rf removes it
class-demo:
	$(CLASSROOM) demo --class-dir $(CLASS_DEMO_DIR) --prefix fademo- --ip 127.0.0.1 --port $(CLASS_PORT) $(CLASS_FROM)

# Students get this checkout's current commit at their server's next start (a lesson a student
# edited is kept); the kernel is built again for everyone
class-publish:
	$(CLASSROOM) publish --class-dir $(CLASS_DIR)

# A systemd unit that starts the hub at boot with these settings:
#   sudo make class-unit CLASS_ROSTER=... | sudo tee /etc/systemd/system/flash-attn-class.service
class-unit:
	@$(CLASSROOM) systemd-unit --class-dir $(CLASS_DIR) --roster $(abspath $(CLASS_ROSTER)) --ip $(CLASS_IP) --port $(CLASS_PORT)

# Remove the Unix accounts (and their homes) that the hub made: PREFIX=jupyter- for a class's
class-teardown:
	@if [ -z "$(PREFIX)" ]; then echo "say whose accounts: make class-teardown PREFIX=jupyter-"; exit 1; fi
	$(CLASSROOM) teardown --prefix $(PREFIX)

# The hub end to end (class/tests/test_hub.py: the admin list before anyone logs in, logins and the
# password pages in the student's language, the Chinese interface, lesson 00 in three servers,
# isolation, a crash, a memory hog and a fork bomb, an update, a clean stop that restores the cron and
# at deny files; it leaves the machine as it found it). It needs root
# and skips itself without. With a wheelhouse (make wheelhouse, which make test-offline runs first)
# it runs in a network namespace with no network, so the class's install is shown to need none.
test-class: setup
	@wh=$(abspath $(WHEELHOUSE_DIR)); \
	if [ -d "$$wh/npm" ] && [ "$$(id -u)" = 0 ] && unshare -n true 2>/dev/null; then \
	  echo "== test-class with no network, installing from $$wh"; \
	  $(PIP_ALONE) CLASS_WHEELHOUSE="$$wh" \
	    unshare -n sh -c 'ip link set lo up && exec "$$0" -m pytest -q -p no:cacheprovider class/tests' $(abspath $(PY)); \
	else \
	  $(PY) -m pytest -q -p no:cacheprovider class/tests; \
	fi

# Grading (workbench/grade.py; README's "Grading"): every lesson notebook in STUDENTS (one folder per
# student, or a class hub's homes: STUDENTS=/home) runs in a sandbox of its own (bubblewrap, where it
# is installed) and its exercises are checked by otter-grader tests made from the exercise registry.
# STUDENTS and OUT reach python as typed (through the environment, as make reset's LESSON does);
# GRADE_ARGS adds options (GRADE_ARGS='--jobs 4'; python -m workbench grade --help lists them).
OUT ?= grades
unexport STUDENTS OUT
grade: export GRADE_STUDENTS = $(value STUDENTS)
grade: export GRADE_OUT = $(value OUT)
grade: build $(GRADE_STAMP)
	@if [ -z "$$GRADE_STUDENTS" ]; then echo "say whose notebooks: make grade STUDENTS=folder (one folder per" \
	  "student, or /home for a class hub's homes) OUT=grades"; exit 1; fi
	$(PY) -m workbench grade --out="$$GRADE_OUT" $(GRADE_ARGS) -- "$$GRADE_STUDENTS"

# Speed is measured here, never in tests: ns per token, GB/s and the target ratios (workbench/bench.py; every
# tool of workbench/: python -m workbench --help).
bench: build
	$(PY) -m workbench bench $(BENCH_ARGS)

# Estimated, never measured: llvm-mca's cycles per token of each kernel's token loop, cross-compiled
# for aarch64 (no build of the local library needed); it skips with a message where tools are missing.
bench-a76: setup
	$(PY) -m workbench a76 $(CYCLES_ARGS)

# Lesson 09's saved figures measured again on this machine (notebooks/data/09_how_fast.json, which both editions
# read; workbench/figures.py): the versions timed in interleaved rounds (every round saved), lesson 08's and llama.cpp's rows, the A76 estimates, the
# roofs. A few minutes; run it on a quiet machine, then run lesson 09 again.
figures: build
	$(PY) -m workbench figures

# The one message catalog: msgfmt checks the .po (every entry translated, none fuzzy, the same fields
# as its English) and compiles the .mo that Python's gettext reads; the .mo is committed, so a student
# needs no msgfmt (tests/test_catalog.py holds the two to each other).
CATALOG := lessonkit/locale/zh_CN/LC_MESSAGES/lessonkit
catalog:
	msgfmt --check --statistics -o $(CATALOG).mo $(CATALOG).po

clean:
	rm -rf .build $(WORK)/.build
