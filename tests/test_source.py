"""The kernel's segment markers, through which lessons find their line ranges."""
from __future__ import annotations

import pytest

from lessonkit.source import (KERNEL_FILE, SIMD_HEADER, find_line, function_lines, kernel_segments,
                              numbered_lines, show_function)


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
