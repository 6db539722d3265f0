"""One plot style for the classroom, readable from the back of the room: ``use()`` sets every text
to at least 12 pt at the figure's size, 2-pt lines, and the Okabe-Ito palette (readable with the
common colour-vision deficiencies: Okabe and Ito, "Color Universal Design", 2008)."""
from __future__ import annotations

from ..core import language
from ..core.language import _

MIN_PT = 12  # no text smaller than this at the figure's size (tests/test_plotstyle.py checks it)
SIZES = {"title": 15, "label": 13, "tick": 12, "legend": 12, "text": 12}
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442")  # Okabe-Ito less black

# Chinese plot text: the first of these fonts the machine has (fonts-noto-cjk, fonts-wqy-microhei on
# Debian; PingFang SC on macOS; Microsoft YaHei on Windows). use() sets font.family to ["DejaVu Sans",
# that font]: matplotlib (>= 3.6) takes each character from the first listed font that has it, so Latin
# text stays in DejaVu Sans. Only fonts that exist are listed (matplotlib warns for each missing one).
# mathtext's fonts have no Chinese: Chinese labels write Sₜ, not $S_t$ (tests/test_edition.py checks it).
CJK_FONTS = ("Noto Sans CJK SC", "WenQuanYi Micro Hei", "PingFang SC", "Microsoft YaHei", "Source Han Sans SC",
             "Noto Sans SC", "Heiti SC", "SimHei", "Noto Sans CJK JP", "Noto Serif CJK SC")
INSTALL_CJK = ("Debian/Ubuntu/WSL: sudo apt install fonts-noto-cjk (or fonts-wqy-microhei); macOS and Windows "
               "have PingFang SC and Microsoft YaHei already; then restart the kernel")

STYLE = {"font.size": SIZES["text"], "axes.titlesize": SIZES["title"], "figure.titlesize": SIZES["title"],
         "axes.labelsize": SIZES["label"], "xtick.labelsize": SIZES["tick"], "ytick.labelsize": SIZES["tick"],
         "legend.fontsize": SIZES["legend"], "legend.title_fontsize": SIZES["legend"], "lines.linewidth": 2.0,
         "lines.markersize": 7, "axes.grid": True, "grid.alpha": 0.3,
         "figure.dpi": 110,  # a 10-inch-wide figure fills a 1100-pixel-wide notebook column
         "savefig.dpi": 150}


def use() -> None:
    """Apply the style to every figure drawn from now on; in Chinese with a Chinese font."""
    import matplotlib as mpl
    from cycler import cycler
    mpl.rcParams.update(STYLE)
    mpl.rcParams["axes.prop_cycle"] = cycler(color=list(PALETTE))
    if language.language() == "zh":
        found = cjk_font()
        mpl.rcParams["font.family"] = ["DejaVu Sans", found] if found else ["DejaVu Sans"]
        if found:
            _quiet_missing_weight(found)
    else:
        mpl.rcParams["font.family"] = ["sans-serif"]


_told = False


def _quiet_missing_weight(font: str) -> None:
    """A Chinese font with no bold face (WenQuanYi Micro Hei has one weight) draws bold text at its one
    weight, and matplotlib says so on every bold label ("findfont: Failed to find font weight bold
    for ..."): that English line under a Chinese plot tells the student nothing to do, so it goes."""
    import logging
    log = logging.getLogger("matplotlib.font_manager")
    if not any(getattr(f, "lessonkit_font", None) == font for f in log.filters):
        quiet = logging.Filter()
        quiet.filter = lambda record: not ("Failed to find font weight" in record.getMessage()
                                           and font in record.getMessage())
        quiet.lessonkit_font = font
        log.addFilter(quiet)


def cjk_font() -> str | None:
    """The first font of CJK_FONTS matplotlib finds, or None: then one warning says what to install,
    and matplotlib's own "Glyph ... missing" warnings (one per character) are silenced."""
    global _told
    import warnings
    found = _first_cjk_font()
    if found is None and _add_new_system_fonts():
        found = _first_cjk_font()
    if found is None and not _told:
        _told = True
        warnings.warn(_("No Chinese font found: plots will show boxes for Chinese text. Install one: {install}.")
                      .format(install=INSTALL_CJK), MissingChineseFont, stacklevel=2)
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
    return found


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
    """Add font files installed since matplotlib made its font cache (made once, at its first run);
    whether any was added."""
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


language.on_change(lambda lang: use())  # the font follows the language


def apply(ax) -> None:
    """The style's text sizes on an axes made before ``use()``."""
    ax.tick_params(labelsize=SIZES["tick"])
    ax.xaxis.label.set_fontsize(SIZES["label"])
    ax.yaxis.label.set_fontsize(SIZES["label"])
    ax.title.set_fontsize(SIZES["title"])
    if ax.get_legend() is not None:
        for text in ax.get_legend().get_texts():
            text.set_fontsize(SIZES["legend"])


def labelled(ax, xlabel: str, xunit: str | None = None, ylabel: str | None = None, yunit: str | None = None,
             title: str | None = None):
    """Name the axes as ``quantity (unit)``, e.g. ``labelled(ax, "seq_len", "tokens", "time", "ns")``."""
    def unit(quantity, u):  # Chinese puts the unit in full-width brackets
        return _("{quantity} ({u})").format(quantity=quantity, u=u) if u else quantity
    ax.set_xlabel(unit(xlabel, xunit), fontsize=SIZES["label"])
    if ylabel is not None:
        ax.set_ylabel(unit(ylabel, yunit), fontsize=SIZES["label"])
    if title is not None:
        ax.set_title(title, fontsize=SIZES["title"])
    return ax


TOKEN_TICKS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def token_axis(ax, ticks=TOKEN_TICKS) -> None:
    """The seq_len axis of the timing plots: log base 2, ticks 1K, 2K, ..."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t // 1024}K" for t in ticks])
    ax.set_xlabel(_("seq_len, tokens (log scale)"))
