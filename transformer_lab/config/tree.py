"""Where the Hydra config tree is and what it offers (no heavy imports: used by ``tlab list``).

The tree lives in ``configs/`` at the repository root and is copied into the wheel as
``transformer_lab/configs``; ``CONFIG_DIR`` finds whichever is present.
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


def config_dirs(user_dirs: Iterable[Path | str] = ()) -> list[Path]:
    """``CONFIG_DIR`` then the user's own config trees (``--config-dir``), in Hydra's order."""
    return [CONFIG_DIR, *(Path(d) for d in user_dirs)]


def user_config_dirs(cfg: Any) -> list[Path]:
    """The ``--config-dir`` trees a composed config was made with (its ``config_dirs`` key,
    filled in by the app), so routines find the user's choices too."""
    return [Path(d) for d in (cfg.get("config_dirs") or ())]


def group_choices(group: str, user_dirs: Iterable[Path | str] = ()) -> list[str]:
    """The YAML files of a config group in every searched tree, without extension, sorted."""
    return sorted({p.stem for d in config_dirs(user_dirs) for p in (d / group).glob("*.yaml")})


def choice_file(group: str, choice: str, user_dirs: Iterable[Path | str] = ()) -> Path | None:
    """The YAML of ``group=choice`` that Hydra would load (the first tree that has it)."""
    return next((d / group / f"{choice}.yaml" for d in config_dirs(user_dirs)
                 if (d / group / f"{choice}.yaml").is_file()), None)
