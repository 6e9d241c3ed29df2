"""Variants of one run's config (another group choice or key value, a merged block), their
typed training settings, seeds, and metrics rows tagged with the variant."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from transformer_lab.config.tree import (
    choice_file,
    choice_node,
    group_choices,
    user_config_dirs,
)
from transformer_lab.errors import ConfigError
from transformer_lab.training.optimizers import TLAB_KEYS, OptimizerSettings
from transformer_lab.training.trainer import TrainSettings


def train_settings(cfg: DictConfig) -> TrainSettings:
    """The typed training settings of ``cfg`` (without an ``optimizer`` node, as an older
    run's: AdamW)."""
    node = cfg.get("optimizer")
    return TrainSettings.from_mapping(
        OmegaConf.to_container(cfg.train, resolve=True), int(cfg.model.d_model),
        None if node is None else optimizer_settings(OmegaConf.to_container(node, resolve=True)))


def optimizer_settings(values: Mapping[str, Any]) -> OptimizerSettings:
    """An ``optimizer`` node's values: tlab's keys (``TLAB_KEYS``) read, the others the
    constructor's keywords (lists as tuples); ``rest`` in the same way."""
    rest = values.get("rest")
    return OptimizerSettings(
        name=str(values.get("name", values.get("_target_"))), target=str(values.get("_target_")),
        arguments={key: tuple(value) if isinstance(value, list) else value
                   for key, value in values.items() if key not in TLAB_KEYS},
        params=str(values.get("params", "all")), lr_ratio=float(values.get("lr_ratio", 1.0)),
        rest=None if rest is None else optimizer_settings(rest))


def seed_sources(cfg: DictConfig, seed: int) -> tuple[int, int]:
    """(initialisation seed, data-order seed) of the run's seed ``seed``: both ``seed`` unless
    ``seed_init`` / ``seed_data`` set one apart, which then moves by the same offset."""
    offset = seed - int(cfg.seed)
    init, data = cfg.get("seed_init"), cfg.get("seed_data")
    return (seed if init is None else int(init) + offset,
            seed if data is None else int(data) + offset)


def as_list(value: Any) -> list[str]:
    """A list, or a comma-separated string, as a list of stripped strings (None: [])."""
    if isinstance(value, ListConfig | list | tuple):
        return [str(v).strip() for v in value]
    return [v.strip() for v in str(value or "").split(",") if v.strip()]


def load_choice(group: str, choice: str, user_dirs: Sequence[Path] = ()) -> DictConfig:
    """The node of ``group=choice`` (unresolved), in tlab's tree then ``user_dirs``."""
    node = choice_node(group, choice, user_dirs)
    if node is None:
        valid = ", ".join(group_choices(group, user_dirs))
        raise ConfigError(f"unknown {group} '{choice}'; valid: {valid}")
    return node


def with_choice(cfg: DictConfig, group: str, choice: str) -> DictConfig:
    """A copy of ``cfg`` with config group ``group`` set to ``choice`` (like ``group=choice``)."""
    variant = copy.deepcopy(cfg)
    with open_dict(variant):
        variant[group] = load_choice(group, choice, user_config_dirs(cfg))
    return variant


def is_group(cfg: DictConfig, key: str) -> bool:
    """True when ``key`` names a config group, not a key."""
    return "." not in key and bool(group_choices(key, user_config_dirs(cfg)))


def with_value(cfg: DictConfig, key: str, value: Any) -> DictConfig:
    """A copy of ``cfg`` as ``KEY=VALUE`` on its command line would make it: a group's choice
    (a ``_global_`` one such as a preset: ``with_global_choice``) or an existing key's value."""
    if is_group(cfg, key):
        path = choice_file(key, str(value), user_config_dirs(cfg))
        if path is not None and _package(path) == "_global_":
            return with_global_choice(cfg, key, str(value))
        return with_choice(cfg, key, str(value))
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    if not isinstance(node, DictConfig) or leaf not in node:
        where = f"'{parent}'" if parent else "the config"
        keys = ", ".join(str(k) for k in node) if isinstance(node, DictConfig) else "none"
        raise ConfigError(f"unknown key '{key}' ('{leaf}' is not in {where}; its keys: {keys})")
    variant = copy.deepcopy(cfg)
    with open_dict(variant):
        OmegaConf.update(variant, key, value, merge=True)
    return variant


def _package(path: Path) -> str | None:
    """The ``# @package`` header of a config file (None without one)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# @package"):
            return line.split(None, 2)[-1].strip()
        if line.strip() and not line.startswith("#"):
            return None
    return None


def with_global_choice(cfg: DictConfig, group: str, choice: str) -> DictConfig:
    """``cfg`` with a ``_global_`` choice (a preset) applied as Hydra applies it after the
    experiment: its ``override /group: choice`` entries, then its keys."""
    node = load_choice(group, choice, user_config_dirs(cfg))
    variant = cfg
    for entry in node.get("defaults", []):
        overrides = entry.items() if isinstance(entry, Mapping) else [(entry, None)]
        for name, picked in overrides:
            if not str(name).startswith("override /") or picked is None:
                raise ConfigError(f"{group}={choice} cannot be varied: its defaults list has "
                                  f"'{name}' (only 'override /group: choice' entries)")
            variant = with_choice(variant, str(name).removeprefix("override /"), str(picked))
    body = OmegaConf.masked_copy(node, [k for k in node if k != "defaults"])
    variant = copy.deepcopy(variant) if variant is cfg else variant
    with open_dict(variant):
        variant.merge_with(body)
    return variant


def merged(cfg: DictConfig, patch: DictConfig | Mapping[str, Any] | None) -> DictConfig:
    """A copy of ``cfg`` with ``patch`` merged over it (interpolations live); ``patch.routine``
    replaces the routine."""
    variant = copy.deepcopy(cfg)
    if patch is None:
        return variant
    patch = OmegaConf.create(OmegaConf.to_container(patch) if isinstance(patch, DictConfig)
                             else dict(patch))
    with open_dict(variant):
        if "routine" in patch:
            variant.routine = patch.pop("routine")
        variant.merge_with(patch)
    return variant
