"""One plot style for the classroom: text readable from the back of the room on a projector.

``use()`` applies it (matplotlib rcParams): every text at least 12 pt at the figure's own size
(titles 15, axis labels 13, ticks and legends 12), lines 2 pt, the Okabe-Ito palette (readable
with the common colour-vision deficiencies: Okabe and Ito, "Color Universal Design", 2008) as the
colour cycle, 110 dpi on screen. lessonkit's own drawing helpers call it and size their text from
``SIZES``; ``labelled`` names an axis with its unit, ``token_axis`` is the seq_len axis of the
timing plots (lessons 05 and 08)."""
from __future__ import annotations

from . import language

MIN_PT = 12  # no text smaller than this at the figure's size (tests/test_plotstyle.py checks it)
SIZES = {"title": 15, "label": 13, "tick": 12, "legend": 12, "text": 12}
# Okabe-Ito, without its black (black stays for text and reference lines)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")

# Chinese plot text (the Chinese lessons, lessonkit.language): the first of these fonts that the machine
# has: Noto Sans CJK SC (Debian/Ubuntu fonts-noto-cjk), WenQuanYi Micro Hei (fonts-wqy-microhei),
# PingFang SC (macOS), Microsoft YaHei (Windows), then other common ones. use() makes font.family
# ["DejaVu Sans", that font]: matplotlib (>= 3.6) takes each character from the first font of the list
# that has it, so Latin text stays in DejaVu Sans as in the English lessons. Only fonts that exist go in
# the list: matplotlib logs a warning for every listed family it cannot find. A label with a $...$ formula is
# drawn wholly by mathtext, whose fonts have no Chinese (boxes, and only a logged warning): Chinese labels write
# Sₜ, not $S_t$ (tests/test_edition.py checks the lessons and lessonkit for that mix).
CJK_FONTS = ("Noto Sans CJK SC", "WenQuanYi Micro Hei", "PingFang SC", "Microsoft YaHei", "Source Han Sans SC",
             "Noto Sans SC", "Heiti SC", "SimHei", "Noto Sans CJK JP", "Noto Serif CJK SC")
INSTALL_CJK = ("Debian/Ubuntu/WSL: sudo apt install fonts-noto-cjk (or fonts-wqy-microhei); macOS and Windows "
               "have PingFang SC and Microsoft YaHei already; then restart the kernel")

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
    """Apply the classroom style to every figure drawn from now on in this process. In Chinese
    (lessonkit.set_language("zh"), before or after) it also picks a Chinese font: ``cjk_font()``."""
    import matplotlib as mpl
    from cycler import cycler
    mpl.rcParams.update(STYLE)
    mpl.rcParams["axes.prop_cycle"] = cycler(color=list(PALETTE))
    if language.language() == "zh":
        found = cjk_font()
        mpl.rcParams["font.family"] = ["DejaVu Sans", found] if found else ["DejaVu Sans"]
    else:
        mpl.rcParams["font.family"] = ["sans-serif"]


_told = False


def cjk_font() -> str | None:
    """The first font of CJK_FONTS that this machine's matplotlib finds, or None. With none, it says
    once (a warning) what to install, and silences matplotlib's own "Glyph ... missing" warning, one
    per character, that would follow: the plots then show boxes where the Chinese goes."""
    global _told
    import warnings
    found = _first_cjk_font()
    if found is None and _add_new_system_fonts():
        found = _first_cjk_font()
    if found is not None:
        return found
    if not _told:
        _told = True
        warnings.warn("没有找到中文字体，图中的中文会显示成方框。No Chinese font found: plots will show boxes "
                      f"for Chinese text. Install one: {INSTALL_CJK}.", MissingChineseFont, stacklevel=2)
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
    return None


def _first_cjk_font() -> str | None:
    from matplotlib import font_manager
    for name in CJK_FONTS:
        try:
            font_manager.findfont(font_manager.FontProperties(family=name), fallback_to_default=False)
            return name
        except ValueError:
            continue
    return None


def _add_new_system_fonts() -> bool:
    """Tell matplotlib about font files installed since it made its font cache (~/.cache/matplotlib:
    it is made once, the first time matplotlib runs, so a font package installed later is unknown to
    it until the cache is deleted). Returns whether any was added."""
    from matplotlib import font_manager
    known = {entry.fname for entry in font_manager.fontManager.ttflist}
    added = False
    for path in font_manager.findSystemFonts():
        if path not in known:
            try:
                font_manager.fontManager.addfont(path)
                added = True
            except Exception:  # an unreadable font file is not the lesson's problem
                continue
    return added


class MissingChineseFont(UserWarning):
    """No font with Chinese characters: what to install is in the message."""


# A language switch restyles: the font follows the language (set_language("zh") in a Chinese lesson's first cell)
language.on_change(lambda lang: use())


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

    def unit(quantity, u):  # Chinese puts the unit in full-width brackets
        return language.tr(f"{quantity} ({u})", f"{quantity}（{u}）") if u else quantity
    ax.set_xlabel(unit(xlabel, xunit), fontsize=SIZES["label"])
    if ylabel is not None:
        ax.set_ylabel(unit(ylabel, yunit), fontsize=SIZES["label"])
    if title is not None:
        ax.set_title(title, fontsize=SIZES["title"])
    return ax


TOKEN_TICKS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def token_axis(ax, ticks=TOKEN_TICKS) -> None:
    """The x axis of a plot over cache lengths: log scale base 2, ticks labelled 1K, 2K, ...
    (lessons 05 and 08)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t // 1024}K" for t in ticks])
    ax.set_xlabel(language.tr("seq_len, tokens (log scale)", "seq_len，token 数（对数坐标）"))
