"""One plot style for the classroom: text readable from the back of the room on a projector.

``use()`` applies it (matplotlib rcParams): every text at least 12 pt at the figure's own size
(titles 15, axis labels 13, ticks and legends 12), lines 2 pt, the Okabe-Ito palette (readable
with the common colour-vision deficiencies: Okabe and Ito, "Color Universal Design", 2008) as the
colour cycle, 110 dpi on screen. lessonkit's own drawing helpers call it and size their text from
``SIZES``; ``labelled`` names an axis with its unit, ``token_axis`` is the seq_len axis of the
timing plots (lessons 05 and 08)."""
from __future__ import annotations

MIN_PT = 12  # no text smaller than this at the figure's size (tests/test_plotstyle.py checks it)
SIZES = {"title": 15, "label": 13, "tick": 12, "legend": 12, "text": 12}
# Okabe-Ito, without its black (black stays for text and reference lines)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")

STYLE = {
    "font.size": SIZES["text"],
    "axes.titlesize": SIZES["title"],
    "figure.titlesize": SIZES["title"],
    "axes.labelsize": SIZES["label"],
    "xtick.labelsize": SIZES["tick"],
    "ytick.labelsize": SIZES["tick"],
    "legend.fontsize": SIZES["legend"],
    "legend.title_fontsize": SIZES["legend"],
    "lines.linewidth": 2.0,
    "lines.markersize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 110,      # a 10-inch-wide figure fills a 1100-pixel-wide notebook column
    "savefig.dpi": 150,
}


def use() -> None:
    """Apply the classroom style to every figure drawn from now on in this process."""
    import matplotlib as mpl
    from cycler import cycler
    mpl.rcParams.update(STYLE)
    mpl.rcParams["axes.prop_cycle"] = cycler(color=list(PALETTE))


def apply(ax) -> None:
    """The style's text sizes on an axes that already exists (``use()`` acts on axes made after it):
    tick labels, axis labels, title and legend of ``ax``."""
    ax.tick_params(labelsize=SIZES["tick"])
    ax.xaxis.label.set_fontsize(SIZES["label"])
    ax.yaxis.label.set_fontsize(SIZES["label"])
    ax.title.set_fontsize(SIZES["title"])
    legend = ax.get_legend()
    if legend is not None:
        for text in legend.get_texts():
            text.set_fontsize(SIZES["legend"])


def labelled(ax, xlabel: str, xunit: str | None = None, ylabel: str | None = None, yunit: str | None = None,
             title: str | None = None):
    """Name the axes of ``ax`` with their units, as ``quantity (unit)``: e.g.
    ``labelled(ax, "seq_len", "tokens", "time per token", "ns")``. Returns ``ax``."""
    ax.set_xlabel(f"{xlabel} ({xunit})" if xunit else xlabel, fontsize=SIZES["label"])
    if ylabel is not None:
        ax.set_ylabel(f"{ylabel} ({yunit})" if yunit else ylabel, fontsize=SIZES["label"])
    if title is not None:
        ax.set_title(title, fontsize=SIZES["title"])
    return ax


TOKEN_TICKS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def token_axis(ax, ticks=TOKEN_TICKS) -> None:
    """The x axis of a plot over cache lengths: log scale base 2, ticks labelled 1K, 2K, ...
    (lessons 05 and 08)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t // 1024}K" for t in ticks])
    ax.set_xlabel("seq_len, tokens (log scale)")
