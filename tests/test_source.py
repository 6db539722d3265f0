"""The kernel's segment markers, through which lessons find their line ranges."""
from __future__ import annotations

import pytest

from lessonkit.source import KERNEL_FILE, kernel_segments, numbered_lines


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
