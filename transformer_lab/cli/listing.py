"""``tlab list``: every choice of every config group."""

from __future__ import annotations

import re


def list_choices() -> None:
    """Print every available choice of every config group (default marked *)."""
    from rich.console import Console
    from rich.table import Table

    from transformer_lab.config.tree import CONFIG_DIR, GROUPS, group_choices

    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", (CONFIG_DIR / "config.yaml").read_text(),
                               re.MULTILINE))
    table = Table(title=f"config groups ({CONFIG_DIR})")
    table.add_column("group")
    table.add_column("choices (* default)")
    for group in GROUPS:
        choices = [f"{c}*" if defaults.get(group) == c else c for c in group_choices(group)]
        table.add_row(group, ", ".join(choices))
    Console().print(table)
