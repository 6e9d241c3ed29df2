"""Where the Hydra config tree is and what it offers (no heavy imports: used by ``tlab list``).

The tree lives in ``configs/`` at the repository root and is copied into the wheel as
``transformer_lab/configs``; ``CONFIG_DIR`` finds whichever is present. A user's own trees
(``--config-dir``) are searched after it; in them a folder with a group's old name
(``GROUP_ALIASES``: ``activation/``, ``norm/``) still holds choices of the new group until tlab
0.3. Hydra finds those in its ConfigStore (``config_store_choices``), as no folder has the
group's name.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # transformer_lab/
CONFIG_DIR = next(
    (p for p in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs") if p.is_dir()),
    _PACKAGE_DIR.parent / "configs",
)
# Groups whose choices are components or settings a user picks (shown by `tlab list`).
GROUPS = ("experiment", "preset", "model", "pe", "block", "norm_layer", "ffn", "arch", "task",
          "train", "logger")
# Config groups renamed in 0.2, the old names accepted until 0.3: old -> new.
GROUP_ALIASES = {"activation": "ffn", "norm": "block"}


def config_dirs(user_dirs: Iterable[Path | str] = ()) -> list[Path]:
    """``CONFIG_DIR`` then the user's own config trees (``--config-dir``), in Hydra's order."""
    return [CONFIG_DIR, *(Path(d) for d in user_dirs)]


def user_config_dirs(cfg: Any) -> list[Path]:
    """The ``--config-dir`` trees a composed config was made with (its ``config_dirs`` key,
    filled in by the app), so routines find the user's choices too."""
    return [Path(d) for d in (cfg.get("config_dirs") or ())]


def group_folders(group: str) -> list[str]:
    """The folder names that hold choices of ``group``: its own, then its old names."""
    return [group, *(old for old, new in GROUP_ALIASES.items() if new == group)]


def group_choices(group: str, user_dirs: Iterable[Path | str] = ()) -> list[str]:
    """The YAML files of a config group in every searched tree (in its old-named folders too),
    without extension, sorted."""
    dirs = config_dirs(user_dirs)
    return sorted({p.stem for folder in group_folders(group) for d in dirs
                   for p in (d / folder).glob("*.yaml")})


def choice_file(group: str, choice: str, user_dirs: Iterable[Path | str] = ()) -> Path | None:
    """The YAML of ``group=choice`` that Hydra would load: the first tree with it in the
    group's folder, else the first with it in an old-named folder."""
    dirs = config_dirs(user_dirs)
    return next((d / folder / f"{choice}.yaml" for folder in group_folders(group) for d in dirs
                 if (d / folder / f"{choice}.yaml").is_file()), None)


def old_group_folders(user_dirs: Iterable[Path | str]) -> list[Path]:
    """The folders of the user's trees named as a group was before 0.2 (``DIR/activation``)."""
    return [Path(d) / old for d in user_dirs for old in GROUP_ALIASES
            if (Path(d) / old).is_dir()]


def old_group_folder_notes(user_dirs: Iterable[Path | str]) -> list[str]:
    """One deprecation line per old-named folder of the user's trees, naming its new name."""
    return [f"config folder '{folder}' is now '{GROUP_ALIASES[folder.name]}': rename it (the "
            "old name works until tlab 0.3)" for folder in old_group_folders(user_dirs)]


def config_store_choices(user_dirs: Iterable[Path | str]) -> dict[str, dict[str, Path]]:
    """Group -> choice -> file of the choices that only old-named folders hold (the first
    tree's where several do): what Hydra must find in its ConfigStore under the new group name.
    A choice that a folder of the new name holds too is left out: that file wins, as in
    ``choice_file`` (Hydra would merge a stored node of the same name into it)."""
    dirs = config_dirs(user_dirs)
    choices: dict[str, dict[str, Path]] = {}
    for folder in old_group_folders(user_dirs):
        group = GROUP_ALIASES[folder.name]
        for path in sorted(folder.glob("*.yaml")):
            if not any((d / group / path.name).is_file() for d in dirs):
                choices.setdefault(group, {}).setdefault(path.stem, path)
    return choices
