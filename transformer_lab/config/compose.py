"""Composing tlab's Hydra config outside a Hydra app (tests, pre-flight checks); the tree itself
is in :mod:`transformer_lab.config.tree`."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.tree import CONFIG_DIR

__all__ = ["compose", "register_resolvers"]


def _div(a: int, b: int) -> int:
    return int(a) // int(b) if int(b) else 0


def register_resolvers() -> None:
    """``${tlab.div:a,b}`` integer division, ``${tlab.not:x}`` boolean negation."""
    if not OmegaConf.has_resolver("tlab.div"):
        OmegaConf.register_new_resolver("tlab.div", _div)
    if not OmegaConf.has_resolver("tlab.not"):
        OmegaConf.register_new_resolver("tlab.not", lambda x: not x)


register_resolvers()


def compose(overrides: list[str] | tuple[str, ...] = (), config_dir: Path = CONFIG_DIR,
            return_hydra_config: bool = False) -> DictConfig:
    """Compose the config outside a Hydra app (tests, pre-flight checks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides),
                             return_hydra_config=return_hydra_config)
