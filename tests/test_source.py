"""The kernel's segment markers, through which lessons find their line ranges, and the functions and
diffs lessons show from the C files."""
from __future__ import annotations

import pytest

from lessonkit import variants
from lessonkit.source import (KERNEL_FILE, SIMD_HEADER, STEPS_FILE, find_line, function_diff, function_lines,
                              kernel_segments, numbered_lines, show_function)


def test_four_segments_in_order():
    segs = kernel_segments()
    assert list(segs) == [1, 2, 3, 4]
    ends = [0]
    for s in segs.values():
        assert ends[-1] < s.begin < s.end
        ends.append(s.end)
    lines = KERNEL_FILE.read_text().splitlines()
    body = lambda n: "\n".join(lines[segs[n].begin - 1:segs[n].end])  # noqa: E731
    assert "qsc[b] = qm * KVQ_INV" in body(1)          # Q to int8
    assert "i8x16_dot_s32" in body(2) and "s = s * ks * scale" in body(2)  # scoring
    assert "expf(M - s)" in body(3) and "S += vsf" in body(3)              # online rescale
    assert "1.0f / S" in body(4)                                           # normalization


def test_numbered_lines_are_the_file_lines():
    seg = kernel_segments()[4]
    shown = numbered_lines(seg.begin, seg.end).splitlines()
    assert shown[0].split()[0] == str(seg.begin)
    assert "segment 4" in shown[0] and "end segment 4" in shown[-1]


@pytest.mark.parametrize("text,words", [
    ("/* == segment 1: a == */\n/* == segment 1: a == */\n", "opened twice"),
    ("/* == end segment 2 == */\n", "closed but never opened"),
    ("/* == segment 3: c == */\n", "never closed"),
])
def test_broken_markers_are_reported(tmp_path, text, words):
    f = tmp_path / "k.c"
    f.write_text(text)
    with pytest.raises(ValueError, match=words):
        kernel_segments(f)


C_TEXT = """\
int helper(int a);          /* a prototype: not the definition */
/* helper(x) in a comment */
static int helper(int a)
{
    return -a;
}
"""


def test_function_lines_finds_the_definition_not_the_prototype(tmp_path):
    f = tmp_path / "k.c"
    f.write_text(C_TEXT)
    assert function_lines("helper", f) == (3, 6)
    with pytest.raises(ValueError, match="no definition"):
        function_lines("missing", f)
    shown = show_function("helper", f).splitlines()   # with the comment line above it
    assert shown[0].split()[0] == "2" and shown[-1].split(None, 1)[1] == "}"


def test_show_function_q_code_from_the_simd_header():
    text = show_function("q_code", SIMD_HEADER)
    lines = text.splitlines()
    assert "static inline int8_t q_code(float v)" in text
    first = int(lines[0].split()[0])
    assert SIMD_HEADER.read_text().splitlines()[first - 1].strip() == lines[0].split(None, 1)[1].strip()


def test_find_line_searches_inside_the_segment():
    lines = KERNEL_FILE.read_text().splitlines()
    seg2 = kernel_segments()[2]
    n = find_line("k_cache_q8[t / kv_bs]", segment=2)
    assert seg2.begin < n < seg2.end and "k_cache_q8[t / kv_bs]" in lines[n - 1]
    assert "KVQ_INV" in lines[find_line("kscale[(size_t)t * nkv]", segment=2) - 1]
    assert "#define KVQ_INV" in SIMD_HEADER.read_text().splitlines()[find_line("#define KVQ_INV", path=SIMD_HEADER) - 1]
    with pytest.raises(ValueError, match="segment 2"):
        find_line("v_cache_q8[t / kv_bs]", segment=2)   # that line is in segment 3
    with pytest.raises(ValueError, match="no segment 9"):
        find_line("x", segment=9)


TWO_FUNCTIONS = """\
/* a: one */
int a(int x)
{
    int y = x;
    return y + 1;
}

/* b: two */
int b(int x)
{
    int y = x;
    return y + 2;
}
"""


def test_function_diff_has_the_files_line_numbers(tmp_path):
    f = tmp_path / "k.c"
    f.write_text(TWO_FUNCTIONS)
    lines = function_diff(f, "a", "b").splitlines()
    assert lines[:2] == ["--- k.c:a", "+++ k.c:b"]
    assert lines[2] == "@@ -1,6 +8,6 @@"     # a's comment is line 1 of the file, b's line 8
    assert "-/* a: one */" in lines and "+/* b: two */" in lines
    assert "-    return y + 1;" in lines and "+    return y + 2;" in lines and "     int y = x;" in lines
    other = tmp_path / "other.c"
    other.write_text("\n\n" + TWO_FUNCTIONS.replace("y + 1", "y + 3"))   # a two lines lower, changed
    assert function_diff(f, "a", "a", path_b=other).splitlines()[:3] == ["--- k.c:a", "+++ other.c:a",
                                                                         "@@ -2,5 +4,5 @@"]
    assert function_diff(f, "a", "a") == ""           # no difference, no diff
    with pytest.raises(ValueError, match="no definition"):
        function_diff(f, "a", "missing")


STEPS = [v for v in variants.VARIANTS if v.function.startswith("flash_attn_q8_v")]


def test_every_version_is_a_function_that_reads_alone():
    """v4 .. v10 and v14 lowp (lesson 09): each a function of flash_attn_q8_steps.c, about 20-40 lines, under a
    comment that names it and the idea it adds, in the registry's order."""
    assert [v.name for v in STEPS] == ["tile", "score4", "tile_rescale", "vexp", "vkq_regs", "magic", "prefetch", "lowp"]
    starts = []
    for v in STEPS:
        first, last = function_lines(v.function, STEPS_FILE)
        assert 20 <= last - first + 1 <= 40, (v.name, last - first + 1)
        shown = show_function(v.function, STEPS_FILE).splitlines()
        assert f"/* v{v.version} {v.name}:" in shown[0], shown[0]
        starts.append(first)
    assert starts == sorted(starts)


def test_each_version_differs_from_the_one_before_by_its_idea():
    text = {(a.name, b.name): function_diff(STEPS_FILE, a.function, b.function) for a, b in zip(STEPS, STEPS[1:])}
    changed = {k: [l for l in d.splitlines() if l[:1] in "+-" and l[:3] not in ("+++", "---")] for k, d in text.items()}
    assert all(len(c) <= 24 for c in changed.values()), {k: len(c) for k, c in changed.items()}
    assert "+        fa_vkq_tile_magic(VKQ, vr, w, n, hd);" in changed[("vkq_regs", "magic")]
    assert "-        fa_vkq_tile(VKQ, vr, w, n, hd);" in changed[("vkq_regs", "magic")]
    assert any("fa_exp_tile" in l for l in changed[("tile_rescale", "vexp")] if l.startswith("+"))
    assert any("prefetch_token" in l for l in changed[("magic", "prefetch")] if l.startswith("+"))
