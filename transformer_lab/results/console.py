"""Terminal output: rich consoles for results (stdout) and messages (stderr)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

# emoji=False: user text such as a value "auto:x" or "a:x:b" prints as written, not as an emoji
console = Console(highlight=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)


def print_error(message: str) -> None:
    """One-or-two-line error message, no traceback; never wrapped by rich (the terminal
    wraps it, and a path or command in it copies whole)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def print_warning(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", soft_wrap=True)
