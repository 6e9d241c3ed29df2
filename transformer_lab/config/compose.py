"""Composing tlab's Hydra config outside a Hydra app (tests, pre-flight checks), its resolvers
and the old group names."""

from __future__ import annotations

import re

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.tree import CONFIG_DIR, GROUP_ALIASES

_OVERRIDE_HEAD = re.compile(
    r"^(?P<prefix>[~+]*)(?P<group>[A-Za-z_][A-Za-z0-9_]*)(?P<rest>[./@=].*)?$", re.S)


def rename_group_aliases(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``["activation=relu"]`` -> ``(["ffn=relu"], ["activation"])``: the overrides with the old
    group names of ``GROUP_ALIASES`` renamed, and the old names used (for a deprecation line)."""
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


# ${tlab.div:a,b}, ${tlab.not:x}, ${tlab.head_dim:d_model,n_heads,head_dim} (model.head_dim when
# given), ${tlab.per_width:total,width}: a learning rate that shrinks as the model widens (Adam
# moves every weight by about lr a step, so a layer's output moves by about lr x width).
for _name, _resolver in {
        "tlab.div": _div, "tlab.not": lambda x: not x,
        "tlab.head_dim": lambda d_model, n_heads, head_dim=None:
            int(head_dim) if head_dim is not None else _div(d_model, n_heads),
        "tlab.per_width": lambda total, width: float(total) / int(width)}.items():
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)


def compose(overrides: list[str] | tuple[str, ...] = (),
            return_hydra_config: bool = False) -> DictConfig:
    """Compose the config outside a Hydra app; old group names are renamed silently."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides, _ = rename_group_aliases(overrides)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=overrides,
                             return_hydra_config=return_hydra_config)
