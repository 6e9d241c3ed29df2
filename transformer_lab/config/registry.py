"""The check of a config read from a run: every ``_target_`` one of tlab's components or a class
given to the Python API, by name, before anything is imported; ``--trust-code`` adds those the
run recorded (docs/security.md)."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from transformer_lab.config.instantiate import HYDRA_KEYS, given_targets
from transformer_lab.errors import ConfigError

# packages whose classes are components a config may name (besides the tree's targets)
OWN_PACKAGES = ("transformer_lab.components", "transformer_lab.tasks")
TRUST_HINT = ("if the run used your own component and you trust its code, load it with "
              "--trust-code")

_TRUST_CODE: ContextVar[bool] = ContextVar("tlab_trust_code", default=False)


@contextmanager
def trusting_code(trust: bool = True) -> Iterator[None]:
    """Within the block (``--trust-code``), a saved config may name its run's user components."""
    token = _TRUST_CODE.set(bool(trust))
    try:
        yield
    finally:
        _TRUST_CODE.reset(token)


def code_trusted() -> bool:
    """True inside :func:`trusting_code` (``--trust-code`` was given)."""
    return _TRUST_CODE.get()


@functools.cache
def registered_targets() -> frozenset[str]:
    """The ``_target_`` names of tlab's config tree (outside ``hydra/``) and the ``nn.Module``
    and task classes of ``OWN_PACKAGES``, under every module path that exports them."""
    import yaml
    from torch import nn

    from transformer_lab.config.tree import CONFIG_DIR
    from transformer_lab.tasks.base import Task

    names: set[str] = set()
    for path in CONFIG_DIR.rglob("*.yaml"):
        if path.relative_to(CONFIG_DIR).parts[0] != "hydra":
            names.update(target for _, target in _targets(yaml.safe_load(path.read_text())))
    for package_name in OWN_PACKAGES:
        package = importlib.import_module(package_name)
        modules = [package, *(importlib.import_module(info.name) for info in
                              pkgutil.walk_packages(package.__path__, f"{package_name}."))]
        names.update(f"{module.__name__}.{name}" for module in modules
                     for name, value in vars(module).items()
                     if isinstance(value, type) and issubclass(value, nn.Module | Task)
                     and value.__module__.startswith("transformer_lab."))
    return frozenset(names)


def user_components(config: Any) -> list[str]:
    """The ``_target_`` names of a config (plain values or an OmegaConf node) that are not
    tlab's: what a run records it was trained with, for ``--trust-code``."""
    return sorted({str(t) for _, t in _targets(_plain(config))} - registered_targets())


def _targets(node: Any) -> Iterator[tuple[str, Any]]:
    """``(key path, value)`` of every ``_target_`` in a tree of plain values."""
    return ((where, value) for where, key, value, _ in _walk(node) if key == "_target_")


def _plain(config: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(config, DictConfig | ListConfig):
        return OmegaConf.to_container(config, resolve=False)
    return config


def check_saved_config(config: Any, source: str, recorded: Sequence[str] = ()) -> None:
    """Refuse (``ConfigError``, one line naming the key and ``source``) a config read from a run
    that names a callable other than tlab's components (or, with ``--trust-code``, one of
    ``recorded``), an instantiate option, a misplaced ``_partial_`` or an interpolation."""
    trusted = code_trusted()
    for path, key, value, node in _walk(_plain(config)):
        where = f"{source}: {path}"
        if key is not None and not isinstance(key, str):
            raise ConfigError(f"{where}: {key!r} is not a config key")
        if isinstance(value, str) and "${" in value:
            raise ConfigError(f"{where}={value!r} is an interpolation; a saved config holds "
                              "resolved values only")
        if key == "_target_":
            if not isinstance(value, str):
                raise ConfigError(f"{where} is not a component name")
            if value in registered_targets() or value in given_targets() \
                    or (trusted and value in recorded):
                continue
            if trusted:
                raise ConfigError(f"{where}={value} is none of tlab's components nor one the run "
                                  f"recorded when it was trained ({', '.join(recorded) or 'none'}"
                                  "); --trust-code loads only those")
            raise ConfigError(f"{where}={value} is not one of tlab's components (tlab list); "
                              f"{TRUST_HINT}")
        if key == "_partial_" and (not isinstance(value, bool) or "_target_" not in node):
            raise ConfigError(f"{where}={value!r}: _partial_ is a bool beside a _target_")
        if key in HYDRA_KEYS and not trusted:  # never in tlab's tree
            raise ConfigError(f"{where}: {key} is an instantiate option tlab's components never "
                              f"use; {TRUST_HINT}")


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any, Any, dict]]:
    """``(key path, key, value, the dict holding it)`` of every entry of a tree of plain
    values, a node's ``_target_`` first; a list's items have the key None."""
    if isinstance(node, dict):
        for key, value in sorted(node.items(), key=lambda item: item[0] != "_target_"):
            where = f"{path}.{key}" if path else str(key)
            yield where, key, value, node
            yield from _walk(value, where)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield f"{path}[{i}]", None, value, {}
            yield from _walk(value, f"{path}[{i}]")
