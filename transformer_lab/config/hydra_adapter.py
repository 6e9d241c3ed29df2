"""The one place where tlab uses Hydra's private API (``hydra._internal``).

Checked on hydra-core 1.3.2 (``pyproject.toml`` allows ``>=1.3,<1.4``). Everything else in tlab
uses Hydra's public API only; if a Hydra release moves these names, this file is the one to fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def locate(path: str) -> Any:
    """The object named by a dotted ``_target_`` path (what ``hydra.utils.instantiate`` does)."""
    from hydra._internal.utils import _locate

    return _locate(path)


def group_options(config_dir: Path, group: str) -> list[str]:
    """The choices of config group ``group`` (e.g. ``hydra/launcher``) as Hydra's loader sees
    them from ``config_dir``, installed Hydra plugins included."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.plugins import Plugins  # noqa: F401  (registers plugin search paths)

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(config_dir)))
    return sorted(loader.get_group_options(group))
