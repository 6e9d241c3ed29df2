"""Where the Hydra config tree is and what it offers (no heavy imports: used by ``tlab list``).

The tree lives in ``configs/`` at the repository root and is copied into the wheel as
``transformer_lab/configs``; ``CONFIG_DIR`` finds whichever is present.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIR = next(
    (p for p in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs") if p.is_dir()),
    _PACKAGE_DIR.parent / "configs",
)
# Groups whose choices are components or settings a user picks (shown by `tlab list`).
GROUPS = ("experiment", "model", "pe", "norm", "norm_layer", "activation", "arch", "task", "train")


def group_choices(group: str, config_dir: Path = CONFIG_DIR) -> list[str]:
    """The YAML files of a config group, without extension, sorted."""
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
