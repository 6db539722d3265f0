"""lessonkit.roofline (lesson 09): the floor arithmetic, the path read from the registry, the check of
every version against the scalar reference, and input checks before any C call."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import roofline, variants


def test_floor_and_demand_by_hand():
    assert roofline.bytes_per_token(128) == 128 + 128 + 4 + 4
    assert roofline.floor_ns(264, 20.0) == pytest.approx(13.2)
    # 100 cycles at 2.4 GHz = 41.67 ns per token; 264 bytes in that time = 6.336 GB/s; four cores 4x
    assert roofline.demand_gbps(100, 2.4, 1) == pytest.approx(6.336)
    assert roofline.demand_gbps(100, 2.4, 4) == pytest.approx(4 * 6.336)


def test_path_follows_the_registry():
    p = roofline.path()
    assert p[0] == "neon" and set(p) <= set(variants.BY_NAME)
    assert all(variants.BY_NAME[n].adds.startswith("on v") for n in p[1:] if n != "fast")


def test_every_version_passes_and_a_wrong_output_fails(monkeypatch):
    passed, failures = roofline.check_variants(shapes=roofline.SHAPES[:3])
    assert failures == [] and passed == 3 * len(roofline.path())
    real = roofline.run_variant
    # a version whose output is off by 1e-4 of its max must be reported
    monkeypatch.setattr(roofline, "run_variant", lambda n, *a, **k: real(n, *a, **k) * (1 + 1e-4 * (n == "fast")))
    passed, failures = roofline.check_variants(names=["fast"], shapes=roofline.SHAPES[2:3])
    assert passed == 0 and "fast" in failures[0]


def test_lowp_is_the_last_rung_and_held_to_its_bound(monkeypatch):
    p = roofline.path()
    assert p.index("fast") < p.index("lowp") == len(p) - 1  # exact versions, fast, then what leaves fp32 weights
    # lowp is not within RTOL of the scalar kernel on these shapes (its 14-bit weights), only within its bound
    plain = roofline.BOUNDED
    monkeypatch.setattr(roofline, "BOUNDED", ())
    assert roofline.check_variants(names=["lowp"])[1], "lowp within 1e-5 everywhere: the bound would be unneeded"
    monkeypatch.setattr(roofline, "BOUNDED", plain)
    passed, failures = roofline.check_variants(names=["lowp"])
    assert failures == [] and passed == len(roofline.SHAPES)
    # an output off by 3e-4 of itself is beyond the bound on most shapes (the bound is a few 1e-5 there)
    real = roofline.run_variant
    monkeypatch.setattr(roofline, "run_variant", lambda n, *a, **k: real(n, *a, **k) * (1 + 3e-4 * (n == "lowp")))
    passed, failures = roofline.check_variants(names=["lowp"])
    assert failures and all("lowp" in f for f in failures)


def test_run_variant_checks_before_c():
    cache = lk.KVCacheQ8(1, 64, 16)
    cache.append(np.ones((3, 1, 64), np.float32), np.ones((3, 1, 64), np.float32))
    with pytest.raises(ValueError):
        roofline.run_variant("nope", np.ones(64, np.float32), cache, 0)
    with pytest.raises(ValueError):
        roofline.run_variant("fast", np.ones(32, np.float32), cache, 0)
    with pytest.raises(ValueError):
        roofline.run_variant("fast", np.ones(64, np.float32), cache, 1)
    out = roofline.run_variant("fast", np.ones(64, np.float32), cache, 0)
    np.testing.assert_allclose(out, lk.attend(np.ones(64, np.float32), cache, 0, backend="scalar"), rtol=1e-5)


def test_cache_bytes_reads_sysfs_sizes(tmp_path):
    for i, size in enumerate(("48K", "2048K", "32M")):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert lk.env.last_level_bytes(tmp_path) == 32 << 20
    assert lk.env.last_level_bytes(tmp_path / "none") is None


def test_interleaved_min_keeps_the_least_disturbed_round():
    from lessonkit import timing
    samples = {"a": iter([0.0, 5.0, 1.0, 9.0]), "b": iter([0.0, 3.0, 3.0, 3.0])}  # first value: the warm-up
    cont = {k: (lambda it=it: next(it)) for k, it in samples.items()}
    assert timing.interleaved(cont, 3, stat="min") == {"a": 1.0, "b": 3.0}
    with pytest.raises(ValueError):
        timing.interleaved({"a": lambda: 1.0}, 1, stat="mean")


def test_chinese_texts_of_the_registry_and_the_table():
    before = lk.set_language("zh")
    try:  # every version's idea is Chinese in Chinese (tests/test_catalog.py: each has its catalog entry)
        assert all(re.search(r"[\u4e00-\u9fff]", roofline.what_it_adds(v.name)) for v in variants.VARIANTS)
        res = {"machine": "m", "rounds": 3, "rows": {1024: {"neon": 1.0}}, "a76": {}}
        t = roofline.table(res)
        assert t.header[:2] == ["版本", "1K"] and "估计" in t.caption and t.cells()[0][:2] == ["neon", "1.0"]
        assert "<th>版本</th>" in t._repr_html_()
    finally:
        lk.set_language(before)
    assert roofline.what_it_adds("magic") == variants.BY_NAME["magic"].adds


def test_saved_results_found_from_the_chinese_lessons(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # like notebooks/zh/: no data/ here; the lesson's path reaches notebooks/data/
    res, note = roofline.results(lk.native.REPO_DIR / "notebooks" / "data" / "09_how_fast.json")
    assert res["rows"] and "09_how_fast.json" in note


def test_saving_results_replaces_the_file_whole(tmp_path, monkeypatch, full_disk):
    """Lesson 09's saved figures are written beside the file and renamed over it: a failed write (here
    the rename) leaves the old figures and no temporary file."""
    from workbench import figures
    saved = tmp_path / "09.json"
    monkeypatch.setattr(figures, "collect", lambda: {"new": 2})
    assert figures.main(["--out", str(saved)]) == 0 and json.loads(saved.read_text()) == {"new": 2}
    assert roofline.results(saved)[0]["new"] == 2
    saved.write_text("old")
    full_disk()
    with pytest.raises(OSError):
        figures.main(["--out", str(saved)])
    assert saved.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["09.json"]


def test_intensity_by_hand():
    # 128 multiply-adds for K.q and 128 for the V sum, 2 operations each, on 264 bytes; four heads share them
    assert roofline.ops_per_token(128) == 512
    assert roofline.intensity() == pytest.approx(512 / 264)
    assert roofline.intensity(heads=4) == pytest.approx(4 * 512 / 264)


def _res(ratios, est, load=(0.5, 0.5)):
    """A saved-results dict of two versions at 8K (in a 32 MiB cache) and 256K (not), with every round's ns/token:
    neon 10.0 in each round, tile 10.0 / that round's ratio (neon's time / tile's) of ``ratios[T]``; A76 estimates."""
    samples = {T: {"neon": [10.0] * len(r), "tile": [10.0 / x for x in r]} for T, r in zip((8192, 262144), ratios)}
    return {"machine": "m", "bytes_per_token": 264, "cache_bytes": 32 << 20, "load": list(load), "cores": 2,
            "rows": {T: {n: min(v) for n, v in s.items()} for T, s in samples.items()}, "samples": samples,
            "a76": {"neon": {"cycles_per_token": 100.0, "bottleneck": "b0"},
                    "tile": {"cycles_per_token": est, "bottleneck": "b1"}}}


FASTER = [1.2, 1.22, 1.25, 1.25, 1.3, 1.28, 1.26]   # 7 rounds: the band is the lowest to the highest, all above 1.05
UNSURE = [0.97, 1.1, 1.0, 1.02, 0.99, 1.08, 1.01]   # a band that reaches into 5 % of the same
SLOWER = [0.8, 0.82, 0.79, 0.85, 0.81, 0.8, 0.83]


def test_steps_verdicts_follow_the_saved_rounds(monkeypatch):
    monkeypatch.setattr(roofline, "path", lambda: ["neon", "tile"])
    res = _res((FASTER, UNSURE), est=80.0)
    assert roofline.lengths_here(res) == (8192, 262144)
    (row,) = roofline.steps(res)
    # 8K: every round's ratio is 1.2-1.3, the median 1.25: tile faster; 256K: the band 0.97-1.10 cannot tell
    assert row["cache"].outcome == "a" and row["cache"].ratio == pytest.approx(1.25)
    assert row["cache"].band == (pytest.approx(1.2), pytest.approx(1.3))
    assert row["dram"].outcome == "cannot tell"
    # the estimate: -20 % is the model's "faster", and within its 36 % average error; both faster: they agree
    assert row["a76"] == (pytest.approx(-0.2), "faster", True)
    assert row["agree"] is True and row["bottleneck"] == "b1"
    cells = roofline.steps_table(res).cells()[0]
    assert cells[2] == "faster: 1.25 (1.20-1.30)" and cells[3].startswith("cannot tell: 1.01")
    # slower here, slower by more than the model's error: they agree; slower here and faster by the estimate do not
    (row,) = roofline.steps(_res((SLOWER, SLOWER), est=150.0))
    assert row["cache"].outcome == row["dram"].outcome == "b" and row["a76"][1] == "slower" and row["a76"][2] is False
    assert row["agree"] is True
    assert roofline.steps(_res((SLOWER, SLOWER), est=80.0))[0]["agree"] is False
    # a busy machine (load above the 2 cores) cannot tell, whatever the rounds say; then nothing to agree on
    (row,) = roofline.steps(_res((FASTER, FASTER), est=80.0, load=(3.0, 1.0)))
    assert row["cache"].outcome == "cannot tell" and "agree" not in row
    assert "busy" in roofline.steps_table(_res((FASTER, FASTER), est=80.0, load=(3.0, 1.0))).cells()[0][2]


def test_steps_without_saved_rounds_give_no_verdict(monkeypatch):
    """A file saved before the rounds were kept (or with too few of them) still shows the table, with "-" here."""
    monkeypatch.setattr(roofline, "path", lambda: ["neon", "tile"])
    res = _res((FASTER, FASTER), est=80.0)
    del res["samples"]
    (row,) = roofline.steps(res)
    assert row["cache"] is None and row["dram"] is None and "agree" not in row
    t = roofline.steps_table(res)
    assert t.cells()[0][2:4] == ["-", "-"] and "make figures" in t.caption
    assert roofline.steps(_res((FASTER[:5], FASTER[:5]), est=80.0))[0]["cache"] is None  # under MIN_ROUNDS


def test_measure_saves_every_round(tmp_path, monkeypatch):
    """A reduced run of what make figures saves: each round's ns/token per length and version, the row the
    fastest of them, the load; written and read back as the lesson reads it."""
    from workbench import figures
    res = roofline.measure((1024,), names=["neon", "tile"], rounds=6)
    assert [len(res["samples"][1024][n]) for n in ("neon", "tile")] == [6, 6]
    assert res["rows"][1024]["tile"] == min(res["samples"][1024]["tile"]) and len(res["load"]) == 2
    saved = tmp_path / "09.json"
    monkeypatch.setattr(figures, "collect", lambda: res)
    assert figures.main(["--out", str(saved)]) == 0
    back = roofline.results(saved)[0]
    assert back["samples"][1024] == res["samples"][1024] and back["rows"][1024] == res["rows"][1024]


def test_a76_peak_block_is_the_useful_work():
    from workbench.figures import PEAK_BLOCK
    sdot = [i for i in PEAK_BLOCK if i.startswith("sdot")]
    fmla = [i for i in PEAK_BLOCK if i.startswith("fmla")]
    # 8 sdot x 16 int8 multiply-adds = 128 (K.q), 32 fmla x 4 lanes = 128 (V): 512 operations at hd 128
    assert 2 * (16 * len(sdot) + 4 * len(fmla)) == roofline.ops_per_token()
    # no accumulator is written by more than two instructions a block: the pipes bound it, not a chain
    dests = [i.split()[1] for i in PEAK_BLOCK]
    assert max(dests.count(d) for d in dests) <= 2


def test_instruction_counts_read_the_compiled_library():
    if lk.native.backend().startswith("simde-x86") is False:
        pytest.skip("counts x86 instructions")
    counts = roofline.instruction_counts(lk.native.library_path(), names=["neon", "magic", "fast"])
    if counts is None:
        pytest.skip("no objdump")
    # magic's conversion adds integers where the others convert; fast reaches v8's code through its jump
    assert counts["magic"]["vpaddd"] > counts["fast"]["vpaddd"] and counts["fast"]["vcvtdq2ps"] > 0


def test_the_saved_figures_rows_beside_the_versions_are_measured():
    """make figures' rows of lesson 08 and llama.cpp (workbench.figures.beyond_rows), at a short length and one
    round: every row a positive ns/token (a function moved out of lessonkit once broke this unseen)."""
    from workbench import figures
    rows = figures.beyond_rows(1024, 1)
    assert {"group4", "per_head4", "fast"} <= set(rows)
    assert all(v > 0 for k, v in rows.items() if k != "skipped"), rows
