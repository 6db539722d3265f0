"""native.cover: a call on a cache larger than any the library's check ran on first checks the library
on a cache of the call's shape, in a child process. These tests replace the child (native.smoke) by a
recorder, so they see which checks cover() asks for and what it does with the answer; the real child
on real kernels is tests/test_sandbox.py's."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from lessonkit import check, native
from lessonkit.smoke import CASES, tolerance


@pytest.fixture
def fake_child(monkeypatch):
    """The workbook's library, with a private copy of its record and a recorder in place of the child:
    ``asked`` lists the shapes checked; ``answer`` (a dict, or a function of the shape) is the result."""
    ffi, lib = native.load()
    entry = native._records[id(lib)]
    monkeypatch.setitem(native._records, id(lib), (lib, entry[1], {**entry[2], "covered": [list(c[:4]) for c in CASES]},
                                                   "results"))
    monkeypatch.setattr(native, "_write_record", lambda path, record: None)  # the real record stays as it is
    state = {"asked": [], "answer": {}}

    def child(path, header, verify, shape):
        state["asked"].append(shape)
        answer = state["answer"](shape) if callable(state["answer"]) else state["answer"]
        return {"verified": verify, "failures": [], "crash": None, "output": "", "covered": [shape], **answer}
    monkeypatch.setattr(native, "smoke", child)
    state["lib"] = lib
    return state


def test_a_cache_the_base_check_covers_starts_no_child(fake_child):
    native.cover(fake_child["lib"], 4100, 8, 128, 16)
    native.cover(fake_child["lib"], 3000, 2, 64, 256)   # fewer heads, smaller head_dim, larger blocks
    assert fake_child["asked"] == []


def test_a_longer_cache_is_checked_at_a_power_of_two_at_least_twice_as_long(fake_child):
    native.cover(fake_child["lib"], 4101, 8, 128, 16)
    native.cover(fake_child["lib"], 9000, 8, 128, 16)    # covered by that check: no second child
    native.cover(fake_child["lib"], 20000, 8, 128, 16)
    assert fake_child["asked"] == [[16384, 8, 128, 16], [32768, 8, 128, 16]]


def test_a_shape_no_case_covers_is_checked_even_when_short(fake_child):
    """A buffer sized by tokens x head_dim overflows at 2,000 tokens of head_dim 256, a shape the
    check had only run on 9 tokens of."""
    native.cover(fake_child["lib"], 2000, 1, 256, 32)
    native.cover(fake_child["lib"], 100, 32, 64, 16)    # a token row (kv_dim 2048) longer than any case's
    native.cover(fake_child["lib"], 3000, 2, 64, 1)     # more blocks than any case (3000 of 1 token)
    assert fake_child["asked"] == [[2048, 1, 256, 32], [128, 32, 64, 16], [4096, 2, 64, 1]]


def test_a_smaller_cache_in_every_size_is_covered_whatever_its_shape(fake_child):
    """Fewer tokens, tokens x kv heads, tokens x kv_dim and blocks than the 4,100 x 8 x 128 case, in
    blocks of 16: covered, with 16 kv heads of 64 too (the sizes a buffer could be sized by are smaller)."""
    for shape in ((2000, 16, 64, 16), (100, 2, 64, 8), (4100, 1, 32, 16), (500, 8, 128, 64)):
        native.cover(fake_child["lib"], *shape)
    assert fake_child["asked"] == []


def test_a_refusal_is_kept_for_every_call_it_would_check_again(fake_child):
    fake_child["answer"] = {"crash": "crashed with SIGSEGV"}
    for T in (9000, 9000, 12000, 16384, 100000):
        with pytest.raises(native.KernelCheckError, match="checked now on a cache of 16384 tokens") as e:
            native.cover(fake_child["lib"], min(T, 16384), 8, 128, 16)
        assert "The call was not made" in str(e.value) and "seq_len" in str(e.value)
    assert fake_child["asked"] == [[16384, 8, 128, 16]]  # one child, not one per call
    native.cover(fake_child["lib"], 4000, 8, 128, 16)   # a covered call still runs


def test_wrong_results_refuse_under_results_and_warn_under_crashes(fake_child):
    fake_child["answer"] = {"failures": [["flash_attn_single_q_q8_neon", [16384, 8, 128, 16, 7, 0], None,
                                          ["off", 0.5, 1e-4]]]}
    with pytest.raises(native.KernelCheckError, match="wrong results") as e:
        native.cover(fake_child["lib"], 9000, 8, 128, 16)
    assert "overflows or loses precision" in str(e.value) and "seen[8192]" not in str(e.value)
    lib = fake_child["lib"]
    native._records[id(lib)] = (*native._records[id(lib)][:3], "crashes")  # the latest load asked for crashes
    with pytest.warns(native.BuildWarning, match="computes wrong results"):
        native.cover(lib, 5000, 4, 128, 16)


def test_the_latest_load_sets_the_level_cover_judges_by(fake_child):
    ffi, lib = native.load()
    assert native._records[id(lib)][3] == "results"
    native.load(verify="crashes")
    assert native._records[id(lib)][3] == "crashes"
    native.load()
    assert native._records[id(lib)][3] == "results"


def test_threads_calling_together_wait_for_one_check(fake_child):
    def slow(shape):
        time.sleep(0.3)
        return {}
    fake_child["answer"] = slow
    threads = [threading.Thread(target=native.cover, args=(fake_child["lib"], 9000, 8, 128, 16)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake_child["asked"] == [[16384, 8, 128, 16]]


def test_a_record_with_damaged_shapes_covers_nothing_and_does_not_break_the_call(fake_child):
    lib = fake_child["lib"]
    unused, path, record, verify = native._records[id(lib)]
    record["covered"] = [None, [1, 2], ["x", 1, 2, 3], 5]
    native.cover(lib, 10, 1, 32, 16)
    assert fake_child["asked"] == [[16, 1, 32, 16]]


def test_the_tolerance_grows_with_the_length_and_stays_far_below_a_real_mistake():
    """float32 running sums over T tokens drift about as sqrt(T) * 2**-24; the intact kernel was off by
    1.1e-4 at 2M tokens and 1.7e-4 at 4M, over the fixed 1e-4 (measured in this repository's check).
    The tolerance at those lengths must hold them, and stay under the 1e-2 of a real mistake."""
    assert tolerance(4100) == 1e-4
    assert tolerance(1 << 21) > 2 * 1.1e-4 and tolerance(1 << 22) > 2 * 1.7e-4
    assert tolerance(1 << 26) < 1e-2 / 4  # 64M tokens: more than any cache in memory here


def test_the_intact_kernel_passes_its_check_on_two_million_tokens():
    """The real child on the workbook's kernel, at a length where the fixed 1e-4 refused it."""
    lib = native.build()
    result = check.smoke(lib, (native.NATIVE_DIR / native.HEADER).read_text(), "results", [1 << 21, 1, 32, 256])
    assert result["crash"] is None and result["failures"] == [], result
