"""Terminal output: rich consoles for results (stdout) and messages (stderr), made for 80
columns: tables wrap their details, never a name or a header word; paths print whole."""

from __future__ import annotations

import math

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# emoji=False: user text such as a value "auto:x" or "a:x:b" prints as written, not as an emoji
console = Console(highlight=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)
NARROW = 100  # columns below which a table puts long details under the name (check_table)


def print_error(message: str) -> None:
    """One-or-two-line error message, no traceback; never wrapped by rich (the terminal
    wraps it, and a path or command in it copies whole)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)


def result_table(title: str, caption: str | None = None) -> Table:
    """An empty result table in tlab's style: a rule under the header, no edges, one space
    between columns."""
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False,
                 padding=(0, 1, 0, 0))


def cell(value: object, digits: int = 3, thousands: str = "") -> str:
    """A table cell: ``-`` for None or NaN; a float to ``digits`` significant digits, from 1000
    on whole (``thousands``: the separator, e.g. ``,``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:{thousands}.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return str(value)


LONGEST_WORD = 32  # a column is kept at least as wide as its longest word up to this


def print_table(table: Table) -> None:
    """Print a result table: its title (which names the run's path) whole, each column at least
    as wide as its longest word, header included (``final_loss``, ``token_embedding`` never
    split or cut), lines not cropped."""
    if isinstance(table.title, str):  # neither wrapped nor cropped: it copies whole
        table.title = Text(table.title, no_wrap=True, overflow="ignore")
    for column in table.columns:
        texts = [text.plain if isinstance(text, Text) else Text.from_markup(text).plain
                 if isinstance(text, str) else "" for text in (column.header, *column.cells)]
        longest = max((len(word) for text in texts for word in text.split()), default=0)
        column.min_width = max(column.min_width or 0, min(longest, LONGEST_WORD))
    console.print(table, crop=False)


def print_final_line(command: str, status: str, details: list[str], seconds: float) -> None:
    """A command's last line, e.g. ``validate: PASS, 26 checks, 3 SKIP, 12.3 s``."""
    console.print(", ".join([f"{command}: {status}", *details, f"{seconds:.1f} s"]),
                  soft_wrap=True, markup=False, highlight=False)
