"""Composing tlab's Hydra config outside a Hydra app (tests, pre-flight checks), its resolvers
and the old group names."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.tree import CONFIG_DIR, GROUP_ALIASES

__all__ = ["GROUP_ALIASES", "compose", "register_resolvers", "rename_group_aliases"]

_OVERRIDE_HEAD = re.compile(
    r"^(?P<prefix>[~+]*)(?P<group>[A-Za-z_][A-Za-z0-9_]*)(?P<rest>[./@=].*)?$", re.S)


def rename_group_aliases(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``["activation=relu", "norm=post"]`` -> ``(["ffn=relu", "block=post"], ["activation",
    "norm"])``: overrides with the old group names of ``GROUP_ALIASES`` renamed, and the old
    names that were used (for a deprecation line). Other overrides are returned unchanged."""
    renamed, used = [], []
    for text in overrides:
        match = _OVERRIDE_HEAD.match(text)
        old = match.group("group") if match else None
        if old in GROUP_ALIASES:
            text = f"{match.group('prefix')}{GROUP_ALIASES[old]}{match.group('rest') or ''}"
            used.append(old)
        renamed.append(text)
    return renamed, used


def _div(a: int, b: int) -> int:
    return int(a) // int(b) if int(b) else 0


def _head_dim(d_model: int, n_heads: int, head_dim: int | None = None) -> int:
    """``head_dim`` when given (``model.head_dim``), else ``d_model // n_heads``."""
    return int(head_dim) if head_dim is not None else _div(d_model, n_heads)


def _per_width(total: float, width: int) -> float:
    """``total / width``: a learning rate that shrinks as the model widens (Adam moves every
    weight by about lr a step, so a layer's output moves by about lr x width)."""
    return float(total) / int(width)


def register_resolvers() -> None:
    """``${tlab.div:a,b}`` integer division, ``${tlab.not:x}`` boolean negation,
    ``${tlab.head_dim:d_model,n_heads,head_dim}`` the per-head size,
    ``${tlab.per_width:total,width}`` a width-scaled learning rate."""
    resolvers = {"tlab.head_dim": _head_dim, "tlab.div": _div, "tlab.per_width": _per_width,
                 "tlab.not": lambda x: not x}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


register_resolvers()


def compose(overrides: list[str] | tuple[str, ...] = (), config_dir: Path = CONFIG_DIR,
            return_hydra_config: bool = False) -> DictConfig:
    """Compose the config outside a Hydra app; old group names are renamed silently."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides, _ = rename_group_aliases(overrides)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return hydra_compose("config", overrides=overrides,
                             return_hydra_config=return_hydra_config)
