"""lessonkit.plotstyle: every drawing helper of lessonkit renders all its text at >= 12 pt (the
style's minimum, readable on a projector), checked on the rendered figure's Text artists, tick
labels included. The style's palette holds distinct colours."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

import lessonkit as lk  # noqa: E402
from lessonkit import dataflow, layout, plotstyle, rescales  # noqa: E402
from lessonkit.source import kernel_segments  # noqa: E402
from lessonkit.synthetic import cache_with_scores  # noqa: E402

from conftest import make_case  # noqa: E402


def small_texts(fig) -> list[tuple[str, float]]:
    """(text, size in pt) of every visible, non-empty Text artist of the drawn figure under MIN_PT."""
    fig.canvas.draw()  # tick labels exist only once the figure is drawn
    found = fig.findobj(matplotlib.text.Text)
    return [(t.get_text(), t.get_fontsize()) for t in found
            if t.get_visible() and t.get_text().strip() and t.get_fontsize() < plotstyle.MIN_PT]


def draw_dataflow():
    cache, q, _, _ = make_case(7, 100, 1, 128, 7)
    _, tr = lk.attend(q, cache, 0, trace=True)
    return dataflow.draw_dataflow(dataflow.pass_counts(tr, cache), kernel_segments(), kv_head=0,
                                  final_S=float(tr.S[-1])).figure


def draw_cache():
    return layout.draw_cache(make_case(3, 10, 3, 32, 4)[0], highlight=(6, 1))


def plot_running_max():
    cache, q, scale = cache_with_scores(np.array([1.0, 0.5, 2.0, 1.0, 3.0, 2.5], np.float32), head_dim=32)
    _, tr = lk.attend(q, cache, 0, scale=scale, trace=True)
    with matplotlib.rc_context({"font.size": 8, "xtick.labelsize": 7}):  # axes made before the style
        fig, (a, b) = plt.subplots(2, 1)
    rescales.plot_running_max(tr, a, b, "a title")
    return fig


def token_axis():
    plotstyle.use()
    fig, ax = plt.subplots()
    ax.plot([1024, 65536], [1, 2], label="a line")
    plotstyle.token_axis(ax)
    plotstyle.labelled(ax, "seq_len", "tokens", "time per token", "ns", title="a title")
    ax.legend()
    return fig


@pytest.mark.parametrize("draw", [draw_dataflow, draw_cache, plot_running_max, token_axis],
                         ids=lambda f: f.__name__)
def test_every_text_is_at_least_12_pt(draw):
    fig = draw()
    try:
        assert small_texts(fig) == []
    finally:
        plt.close(fig)


def test_the_check_sees_small_text():
    """The test above can fail: a 9-pt text and default 10-pt ticks are found."""
    with matplotlib.rc_context({"xtick.labelsize": 10, "ytick.labelsize": 10}):
        fig, ax = plt.subplots()
        ax.text(0.5, 0.5, "small", fontsize=9)
        sizes = dict(small_texts(fig))
    plt.close(fig)
    assert sizes["small"] == 9 and 10 in sizes.values()


def test_labelled_names_units_and_palette_is_distinct():
    fig, ax = plt.subplots()
    plotstyle.labelled(ax, "seq_len", "tokens", "time", "ns")
    assert ax.get_xlabel() == "seq_len (tokens)" and ax.get_ylabel() == "time (ns)"
    plt.close(fig)
    assert len(set(plotstyle.PALETTE)) == len(plotstyle.PALETTE)


def test_a_chinese_font_without_bold_draws_bold_labels_silently():
    """matplotlib logs "findfont: Failed to find font weight bold for FONT, now using 400." for a one-weight
    Chinese font (once per process, so the record is made here): the Chinese style drops that line and
    no other."""
    import logging
    before = lk.set_language("zh")
    try:
        plotstyle.use()
        font = plotstyle.cjk_font()
        if font is None:
            pytest.skip("no Chinese font here")
        log = logging.getLogger("matplotlib.font_manager")
        record = lambda msg: log.makeRecord(log.name, logging.WARNING, __file__, 1, msg, (), None)
        assert not log.filter(record(f"findfont: Failed to find font weight bold for {font}, now using 400."))
        assert log.filter(record("findfont: Font family 'X' not found."))
    finally:
        lk.set_language(before)
        plotstyle.use()
