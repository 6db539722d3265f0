"""Tables that a lesson or a helper shows: an HTML table in JupyterLab, a plain-text form in a
terminal. A Chinese character is not two Latin columns wide in the browser's output font, so no
column is aligned by counting characters: the browser lays out the HTML, and the plain form
separates cells with ``|`` (as a Markdown table does) without padding them.

    Table(rows, header=["tokens", "ns per token"], caption="...")   # a cell's last line shows it
    show(table)                                                     # or shown from inside a helper
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Sequence


def _cell(value, fmt: str | None) -> str:
    if value is None:
        return ""
    if fmt is not None and not isinstance(value, str):
        return format(value, fmt)
    return str(value)


@dataclass
class Table:
    """Rows of values under a header; ``formats`` maps a column (by index) to a format spec."""
    rows: Sequence[Sequence]
    header: Sequence[str] = ()
    caption: str = ""
    formats: dict = field(default_factory=dict)

    def cells(self) -> list[list[str]]:
        return [[_cell(v, self.formats.get(i)) for i, v in enumerate(row)] for row in self.rows]

    def _repr_html_(self) -> str:
        def numeric(s: str) -> bool:
            return s.replace(".", "", 1).replace("-", "", 1).replace("%", "").replace(",", "").replace("e", "", 1) \
                .replace("+", "", 1).strip().isdigit()

        out = ['<table class="lessonkit-table">']
        if self.caption:
            out.append(f"<caption>{html.escape(str(self.caption))}</caption>")
        if self.header:
            out.append("<thead><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
                       + "</tr></thead>")
        out.append("<tbody>")
        for row in self.cells():
            tds = "".join(f'<td style="text-align:{"right" if numeric(c) else "left"}">{html.escape(c)}</td>'
                          for c in row)
            out.append(f"<tr>{tds}</tr>")
        out.append("</tbody></table>")
        return "".join(out)

    def __str__(self) -> str:
        def row(cells) -> str:  # a "|" inside a cell is escaped, as a Markdown table writes it
            return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

        lines = [str(self.caption)] if self.caption else []
        if self.header:
            lines += [row(self.header), "|" + "---|" * len(self.header)]
        lines += [row(r) for r in self.cells()]
        return "\n".join(lines)

    __repr__ = __str__


def show(table: Table) -> None:
    """Display ``table`` as HTML under IPython (JupyterLab, nbval), else print its plain form."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(table)
    else:
        print(table)
