"""Tables that fit the terminal by leaving columns out, never by cutting cells.

Theory of operation
-------------------
rich shrinks a table that is wider than the console by wrapping its cells and
then cutting them with an ellipsis ("inbou…", "2.59…"): a cut number is a
wrong number.  `fit_table` measures every column first (its widest cell or
its header, in terminal cells), and while the table is wider than `width`
leaves out the shown column that matters least (`Col.keep`, lowest first;
the first column always stays).  What is left is drawn with each column at
its measured width and `no_wrap`, so nothing is cut.  One column may be
`free` text (an event's description, a stage's member list): it takes the
room that is left, at least `FREE_MIN` cells, and wraps between words.  The
columns left out are named in the title, so the reader knows to widen the
terminal (or to read `gwtf-node status --json`).

A table drawn with rich's default box takes 3 cells per column (a border and
one cell of padding on each side) plus 1 for the last border.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

FREE_MIN = 24  # the narrowest a free-text column is drawn (it wraps between words)


@dataclass(frozen=True)
class Col:
    header: str
    keep: int = 50  # the lower, the sooner it is left out of a narrow table
    free: bool = False  # free text: wraps to the room left instead of setting the table's width


def cell_width(markup: str) -> int:
    """Terminal cells of the widest line of a cell written in rich markup."""
    from rich.text import Text

    return max((Text.from_markup(line).cell_len for line in markup.split("\n")), default=0)


def table_width(widths: Sequence[int]) -> int:
    return sum(widths) + 3 * len(widths) + 1


def fit_table(title: str, cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int | None) -> Any:
    """A rich Table of `rows` (cells in rich markup, one per column of `cols`) at most `width` cells wide
    (None: any width), leaving out the columns that matter least when it is too wide (the module doc)."""
    from rich.table import Table

    natural = [max([cell_width(c.header)] + [cell_width(r[i]) for r in rows]) for i, c in enumerate(cols)]
    least = [min(n, FREE_MIN) if c.free else n for c, n in zip(cols, natural)]
    shown = list(range(len(cols)))
    if width is not None:
        while len(shown) > 1 and table_width([least[i] for i in shown]) > width:
            shown.remove(min(shown[1:], key=lambda i: (cols[i].keep, -i)))
    left_out = [cols[i].header for i in range(len(cols)) if i not in shown]
    note = f" [dim](too narrow for: {', '.join(left_out)})[/]" if left_out else ""
    t = Table(title=title + note, title_justify="left", expand=False)
    for i in shown:
        if cols[i].free:
            t.add_column(cols[i].header, min_width=least[i], overflow="fold")
        else:
            t.add_column(cols[i].header, no_wrap=True, min_width=natural[i])
    for r in rows:
        t.add_row(*[r[i] for i in shown])
    return t
