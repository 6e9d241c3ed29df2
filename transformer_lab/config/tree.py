"""Where the Hydra config tree is and what it offers (no heavy imports: used by ``tlab list``).

The tree lives in ``configs/`` at the repository root and is copied into the wheel as
``transformer_lab/configs``; ``CONFIG_DIR`` finds whichever is present.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # transformer_lab/
CONFIG_DIR = next(
    (p for p in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs") if p.is_dir()),
    _PACKAGE_DIR.parent / "configs",
)
# Groups whose choices are components or settings a user picks (shown by `tlab list`).
GROUPS = ("experiment", "model", "pe", "block", "norm_layer", "ffn", "arch", "task", "train")


# Config trees of the user's own (``--config-dir``), searched after ``CONFIG_DIR`` as Hydra
# does; set once per process by the pre-flight check and by the runner of each job.
_USER_CONFIG_DIRS: list[Path] = []


def set_user_config_dirs(dirs: list[Path]) -> None:
    _USER_CONFIG_DIRS[:] = [Path(d) for d in dirs]


def config_dirs() -> list[Path]:
    """``CONFIG_DIR`` then the user's config trees, in Hydra's search order."""
    return [CONFIG_DIR, *_USER_CONFIG_DIRS]


def group_choices(group: str) -> list[str]:
    """The YAML files of a config group in every searched tree, without extension, sorted."""
    return sorted({p.stem for d in config_dirs() for p in (d / group).glob("*.yaml")})


def choice_file(group: str, choice: str) -> Path | None:
    """The YAML of ``group=choice`` that Hydra would load (the first tree that has it)."""
    return next((d / group / f"{choice}.yaml" for d in config_dirs()
                 if (d / group / f"{choice}.yaml").is_file()), None)
