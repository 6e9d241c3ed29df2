"""Variants of a run (another group choice or key value, a merged block), composed from the
config its ``RunSpec`` was read from as Hydra composes a command line, and read back as a
``RunSpec``."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from transformer_lab.config.schema import check_schema
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.tree import (
    choice_file,
    choice_node,
    group_choices,
    user_config_dirs,
)
from transformer_lab.errors import ConfigError


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


def with_choice(spec: RunSpec, group: str, choice: str) -> RunSpec:
    """``spec`` with config group ``group`` set to ``choice`` (like ``group=choice``)."""
    return _read(spec, _with_choice(spec.source, group, choice))


def with_value(spec: RunSpec, key: str, value: Any) -> RunSpec:
    """``spec`` as ``KEY=VALUE`` on its command line would make it: a group's choice (a
    ``_global_`` one such as a preset) or an existing key's value."""
    return _read(spec, _with_value(spec.source, key, value))


def pe_spec(spec: RunSpec, name: str) -> RunSpec:
    """``spec`` with ``pe=name`` (the run's own pe node, overrides included, when it is that)."""
    return spec if spec.model.pe.name == name else with_choice(spec, "pe", name)


def merged(spec: RunSpec, patch: Mapping[str, Any]) -> RunSpec:
    """``spec`` with ``patch`` (nested keys) merged over its config (interpolations live);
    ``patch["routine"]`` replaces the routine."""
    return _read(spec, _merged(spec.source, patch))


def merged_block(spec: RunSpec, key: str, without: Sequence[str] = ()) -> RunSpec:
    """``spec`` with the block at ``key`` of its own config (e.g. validate's ``routine.smoke``)
    merged over it, less its keys ``without``; the block as written, so that its interpolations
    resolve at the merged values (smoke's ``lr`` per width)."""
    block = OmegaConf.to_container(OmegaConf.select(spec.source, key))  # (unresolved)
    return merged(spec, {k: v for k, v in block.items() if k not in without})


def _read(spec: RunSpec, variant: DictConfig) -> RunSpec:
    """The spec of ``variant``, a config composed from ``spec``'s, its keys checked as the
    pre-flight's (``config.schema``): the vocabulary ``spec`` has from its task stays while the
    variant's task is the same."""
    check_schema(variant)
    read = RunSpec.of(variant)
    if read.model.vocab_size is None and spec.model.vocab_size is not None \
            and dict(read.task) == dict(spec.task):
        read = read.with_vocab(spec.model.vocab_size)
    return read


def choices(spec: RunSpec, group: str) -> list[str]:
    """The choices of config group ``group`` for ``spec``'s run: tlab's and those in the user's
    config trees (``--config-dir``)."""
    return group_choices(group, user_config_dirs(spec.source))


def is_group(spec: RunSpec, key: str) -> bool:
    """True when ``key`` names a config group, not a key."""
    return _is_group(spec.source, key)


def _is_group(cfg: DictConfig, key: str) -> bool:
    return "." not in key and bool(group_choices(key, user_config_dirs(cfg)))


def _with_choice(cfg: DictConfig, group: str, choice: str) -> DictConfig:
    variant = copy.deepcopy(cfg)
    with open_dict(variant):
        variant[group] = load_choice(group, choice, user_config_dirs(cfg))
    return variant


def _with_value(cfg: DictConfig, key: str, value: Any) -> DictConfig:
    if _is_group(cfg, key):
        path = choice_file(key, str(value), user_config_dirs(cfg))
        if path is not None and _package(path) == "_global_":
            return _with_global_choice(cfg, key, str(value))
        return _with_choice(cfg, key, str(value))
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


def _with_global_choice(cfg: DictConfig, group: str, choice: str) -> DictConfig:
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
            variant = _with_choice(variant, str(name).removeprefix("override /"), str(picked))
    body = OmegaConf.masked_copy(node, [k for k in node if k != "defaults"])
    variant = copy.deepcopy(variant) if variant is cfg else variant
    with open_dict(variant):
        variant.merge_with(body)
    return variant


def _merged(cfg: DictConfig, patch: Mapping[str, Any]) -> DictConfig:
    variant = copy.deepcopy(cfg)
    patch = OmegaConf.create(dict(patch))
    with open_dict(variant):
        if "routine" in patch:
            variant.routine = patch.pop("routine")
        variant.merge_with(patch)
    return variant
