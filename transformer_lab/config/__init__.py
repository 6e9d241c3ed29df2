"""Configs: the Hydra tree (``tree``), composing it (``compose``), turning a config group into
an object (``instantiate``), the plug-in protocols of user components (``protocols``) and
choosing another choice of a group inside a routine (``choices``).

``compose`` and ``build_task`` are importable from here, without importing Hydra until used.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "compose":
        from transformer_lab.config.compose import compose

        return compose
    if name == "build_task":
        from transformer_lab.config.instantiate import build_task

        return build_task
    raise AttributeError(name)
