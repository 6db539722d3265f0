# The workbook's two commands:
#   make lab    set up .venv, build the kernel, open JupyterLab on lesson 00
#   make test   set up .venv, build the kernel, run every test (C, pytest, notebooks)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
BUILD  := .build/ctest
CTEST_SRC := native/tests/test_kernel.c $(wildcard native/*.c)
CTEST_FLAGS := -std=gnu11 -Wall -Wextra -Werror -Inative
HOST_ARCH := $(shell uname -m)
# Jupyter refuses to run as root unless told; only root (a container, CI) gets the flag
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)

# aarch64 test builds: the cross compiler and qemu-user on other hosts, the native tools on ARM
ifneq ($(filter aarch64 arm64,$(HOST_ARCH)),)
  A64_CC  := $(or $(CC_AARCH64),cc)
  A64_RUN :=
else
  A64_CC  := $(or $(CC_AARCH64),aarch64-linux-gnu-gcc)
  A64_RUN := qemu-aarch64 -L /usr/aarch64-linux-gnu
endif

.PHONY: setup build lab test test-c test-asan test-aarch64 test-py bench clean help
help:
	@echo "make lab    set up and open the workbook in JupyterLab"
	@echo "make test   set up and run every test"
	@echo "make bench  time the kernel against its variants and numpy (BENCH_ARGS=--quick)"
	@echo "make build | test-c | test-asan | test-aarch64 | test-py | clean"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[lab,test]'
	touch $(STAMP)

setup: $(STAMP)

build: setup
	$(PY) -m lessonkit build
	$(PY) -m lessonkit build --debug

lab: build
	$(VENV)/bin/jupyter lab $(LAB_ARGS) --ServerApp.root_dir=. notebooks/00_start_here.ipynb

test: build test-c test-asan test-aarch64 test-py

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

# ... and for aarch64, with sdot (armv8.2-a+dotprod) and without (armv8-a, the fallback).
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
	fi

test-py: setup
	$(PY) -m pytest --nbval-lax tests notebooks

# Speed is measured here, never in tests: ns per token, GB/s and the target ratios.
bench: build
	$(PY) -m lessonkit.bench $(BENCH_ARGS)

clean:
	rm -rf .build
