"""Terminal output: rich consoles for results (stdout) and messages (stderr)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_error(message: str) -> None:
    """One-or-two-line error message, no traceback."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", emoji=False)


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", emoji=False)
