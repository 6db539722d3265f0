"""lessonkit.table: an HTML table for JupyterLab (the browser aligns the columns, whatever the width
of a Chinese character), a plain form for a terminal that pads nothing."""
from __future__ import annotations

from lessonkit.table import Table, show


def test_html_holds_caption_header_and_formatted_cells_escaped():
    t = Table([("single", 1234.5678, None), ("<b>", -0.5, 3)], header=["变体", "ns", "n"], caption="a & b",
              formats={1: ".1f"})
    html = t._repr_html_()
    assert html.startswith('<table class="lessonkit-table">') and "<caption>a &amp; b</caption>" in html
    assert "<th>变体</th>" in html and '<td style="text-align:left">&lt;b&gt;</td>' in html
    assert '<td style="text-align:right">1234.6</td>' in html and '<td style="text-align:left">single</td>' in html
    assert '<td style="text-align:left"></td>' in html   # None is an empty cell


def test_plain_form_pads_nothing_and_escapes_bars():
    t = Table([("最大权重", 0.25), ("x", 1.0)], header=["what", "|code|"], caption="c", formats={1: ".2f"})
    assert str(t).split("\n") == ["c", "| what | \\|code\\| |", "|---|---|", "| 最大权重 | 0.25 |", "| x | 1.00 |"]
    assert repr(t) == str(t)


def test_show_prints_the_plain_form_outside_ipython(capsys):
    show(Table([(1,)], header=["n"]))
    assert capsys.readouterr().out == "| n |\n|---|\n| 1 |\n"
