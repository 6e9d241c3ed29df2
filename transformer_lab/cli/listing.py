"""``tlab list``: every choice of every config group."""

from __future__ import annotations

import functools
from pathlib import Path

from transformer_lab.cli.common import ConfigDir, usage_errors


def list_choices(config_dir: ConfigDir = None) -> None:
    """Print every available choice of every config group, your own config tree's
    (--config-dir) included, then the choices each command runs with by default."""
    from rich.table import Table

    from transformer_lab.app.arguments import user_config_dirs_of
    from transformer_lab.config.tree import (
        CONFIG_DIR,
        GROUPS,
        group_choices,
        old_group_folder_notes,
    )
    from transformer_lab.results.console import print_table, print_warning, result_table

    with usage_errors():  # the message of any command's --config-dir
        user_dirs = user_config_dirs_of(["--config-dir", str(config_dir)] if config_dir else [])
    for note in old_group_folder_notes(user_dirs):
        print_warning(note)
    table = Table(title=f"config groups ({', '.join(map(str, [CONFIG_DIR, *user_dirs]))})")
    table.add_column("group", no_wrap=True)
    table.add_column("choices")
    for group in GROUPS:
        table.add_row(group, ", ".join(group_choices(group, user_dirs)))
    print_table(table)
    defaults = command_defaults()  # a column per group whose default differs between commands
    first = next(iter(defaults.values()))
    varying = [g for g in first if len({d.get(g) for d in defaults.values()}) > 1]
    shared = " ".join(f"{g}={first[g]}" for g in first if g not in varying)
    table = result_table("each command's defaults (tlab run: validate's)",
                         f"every command: {shared}")
    for column in ["command", *varying]:
        table.add_column(column, no_wrap=True)
    for command, choices in defaults.items():
        table.add_row(command, *(choices[g] for g in varying))
    print_table(table)


def command_defaults() -> dict[str, dict[str, str]]:
    """Each command's choice of every group (``{"train": {"model": "small", ...}}``):
    ``configs/config.yaml``'s defaults list, then its experiment's ``override /group: choice``
    entries, after those of the experiments it builds on (``- train`` in compare.yaml)."""
    import yaml

    from transformer_lab.config.tree import CONFIG_DIR

    @functools.cache  # an experiment's parents and models are shared
    def read(path: Path) -> dict:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}

    def entries(path: Path) -> list:
        return read(path).get("defaults") or []

    top = {group: choice for entry in entries(CONFIG_DIR / "config.yaml")
           if isinstance(entry, dict) for group, choice in entry.items()
           if group not in ("experiment", "preset")}

    def apply(experiment: str, choices: dict[str, str]) -> dict[str, str]:
        path = CONFIG_DIR / "experiment" / f"{experiment}.yaml"
        for entry in entries(path):
            if isinstance(entry, str) and entry != "_self_":
                apply(entry, choices)  # an experiment this one builds on
            elif isinstance(entry, dict):
                choices.update({key.split("/")[-1]: str(value) for key, value in entry.items()
                                if key.startswith("override /")})
        width = (read(path).get("model") or {}).get("d_model")  # its own size, if it sets one
        choices["d_model"] = str(width or choices.get("d_model") or
                                 read(CONFIG_DIR / "model" / f"{choices['model']}.yaml")["d_model"])
        return choices

    return {path.stem.replace("_", "-"): apply(path.stem, dict(top))
            for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml"))}
