"""Shared test data: random K/V/q in float32 and a KVCacheQ8 holding them; a disk that fills up."""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

import lessonkit as lk

# One compiler cache for every build the tests make (lessonkit/core/native.py, _build_cache): a clone, a copy of
# native/ or a scratch build folder with the same sources, flags and compiler takes the library built and
# checked before instead of compiling it again (15-35 s a build here). An edited copy has other bytes, so it is
# built and checked as ever. Set when pytest starts, so that the tests' child processes and nbval's kernels
# share it (not when a child imports this file for make_case: a test may have turned the cache off).
# The compiled files too (LESSONKIT_OBJECT_CACHE): a test's edited copy compiles only the files its edit changed
# (2 s, not 11 s, for an edit of the kernel file), the build tests included, which use no library of the cache.
BUILD_CACHE = Path(lk.__file__).resolve().parent.parent / ".build" / "test-cache"


def pytest_configure(config):
    """One marker per exercise (``pytest -m ex03_address``), read from the exercises' registry so
    that a lesson module's new exercise is registered without a hand-kept list."""
    (BUILD_CACHE / "objects").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LESSONKIT_BUILD_CACHE", str(BUILD_CACHE))
    os.environ.setdefault("LESSONKIT_OBJECT_CACHE", str(BUILD_CACHE / "objects"))
    from lessonkit import exercises
    for ex in exercises.ALL:
        config.addinivalue_line("markers", f"{ex.marker}: lesson {ex.lesson} {ex.title} (lessonkit.exercises)")


def make_case(seed: int, seq_len: int, n_kv_heads: int, head_dim: int, block_size: int):
    """(cache, q, K, V) with K, V float32 [seq_len, n_kv_heads, head_dim] and q [head_dim]."""
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((seq_len, n_kv_heads, head_dim), dtype=np.float32)
    V = rng.standard_normal((seq_len, n_kv_heads, head_dim), dtype=np.float32)
    q = rng.standard_normal(head_dim, dtype=np.float32)
    cache = lk.KVCacheQ8(n_kv_heads, head_dim, block_size)
    cache.append(K, V)
    return cache, q, K, V


@pytest.fixture
def small_case():
    return make_case(seed=1, seq_len=40, n_kv_heads=2, head_dim=64, block_size=16)


@pytest.fixture
def full_disk(monkeypatch):
    """Call it, and from then on every rename fails as on a full disk: os.replace, the last step of
    lessonkit.files.write_atomic, which must then leave the old file and no temporary one."""
    def refuse(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    return lambda: monkeypatch.setattr(os, "replace", refuse)


def _without_progress_lines():
    """nbval compares a cell's outputs without the new-build check's progress lines (both languages):
    whether a cell checks a build depends on what this checkout built and checked before (the
    builds and their records in .build/), not on the lesson. A stream left empty is dropped."""
    import re

    from nbval import plugin

    from lessonkit import check, language
    texts = []
    for lang in ("en", "zh"):
        before = language.set_language(lang)
        texts += [str(m) for m in (check.CHECKING_NEW, check.CHECKING_LONGER)]
        language.set_language(before)
    line = re.compile("^(?:" + "|".join(re.sub(r"\\\{[^}]*\\\}", ".*?", re.escape(t)) for t in texts) + ")\n",
                      re.MULTILINE)
    original = plugin.coalesce_streams

    def coalesce_streams(outputs):
        out = []
        for o in original(outputs) or []:
            if o.get("output_type") == "stream":
                o.text = line.sub("", o.text)
                if not o.text:
                    continue
            out.append(o)
        return out
    plugin.coalesce_streams = coalesce_streams
    return line


PROGRESS_LINE = _without_progress_lines()


def _snippets_after_each_english_lesson():
    """nbval collects one more item after the last cell of each English lesson (notebooks/NN_*.ipynb): the
    snippets its text and exercises give, typed into the kernel that has just run its cells
    (tests/test_snippets.py, run_after_cells), so that no test runs a lesson's cells a second time for them."""
    from fnmatch import fnmatch

    from nbval import plugin

    from lessonkit.lessons.workspace import LESSON_GLOB
    notebooks = Path(lk.__file__).resolve().parent.parent / "notebooks"

    class SnippetsAfterCells(pytest.Item):
        """Seconds for most lessons; lesson 07's takes 15-25 s here: its deep dive has the student run
        ``lowp_error.error_table(lowp_error.FULL_CASES)``, which runs both kernels over every case."""

        def runtest(self):
            from test_snippets import run_after_cells
            kernel = self.parent.kernel
            if self.parent.timed_out:   # nbval marks the cells after a timed-out one xfail: so is this item
                pytest.xfail("a cell of this lesson timed out (above): its snippets need the names its cells bind")
            if kernel is None or not kernel.is_alive():
                pytest.fail("nbval's kernel for this lesson is gone (it died, or nbval stopped it after a cell gave "
                            "no output in time): its snippets need the names its cells bind")
            with tempfile.TemporaryDirectory(prefix="snippets-") as tmp:
                run_after_cells(Path(self.parent.path).stem, kernel.km, kernel.kc, Path(tmp) / "my-work")

        def reportinfo(self):
            return self.path, None, f"{self.parent.path.name}::{self.name}"

    original = plugin.IPyNbFile.collect

    def collect(self):
        yield from original(self)
        path = Path(self.path).resolve()
        if path.parent == notebooks and fnmatch(path.name, LESSON_GLOB):   # test_snippets.LESSONS
            yield SnippetsAfterCells.from_parent(self, name="snippets after the lesson's cells")
    plugin.IPyNbFile.collect = collect


_snippets_after_each_english_lesson()
