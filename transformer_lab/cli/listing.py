"""``tlab list``: every choice of every config group."""

from __future__ import annotations

import re

import typer

from transformer_lab.cli.common import ConfigDir


def list_choices(config_dir: ConfigDir = None) -> None:
    """Print every available choice of every config group (default marked *), your own config
    tree's (--config-dir) included."""
    from rich.console import Console
    from rich.table import Table

    from transformer_lab.config.tree import (
        CONFIG_DIR,
        GROUPS,
        group_choices,
        old_group_folder_notes,
    )
    from transformer_lab.errors import EXIT_USAGE
    from transformer_lab.results.console import print_error, print_warning

    if config_dir is not None and not config_dir.is_dir():
        print_error(f"--config-dir '{config_dir}' is not a directory; give a folder holding "
                    "config groups, e.g. DIR/pe/my_pe.yaml")
        raise typer.Exit(EXIT_USAGE)
    user_dirs = [config_dir.resolve()] if config_dir is not None else []
    for note in old_group_folder_notes(user_dirs):
        print_warning(note)
    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", (CONFIG_DIR / "config.yaml").read_text(),
                               re.MULTILINE))
    table = Table(title=f"config groups ({', '.join(map(str, [CONFIG_DIR, *user_dirs]))})")
    table.add_column("group")
    table.add_column("choices (* default)")
    for group in GROUPS:
        choices = [f"{c}*" if defaults.get(group) == c else c
                   for c in group_choices(group, user_dirs)]
        table.add_row(group, ", ".join(choices))
    Console().print(table)
