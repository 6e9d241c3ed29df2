"""From a config group to an object: ``_target_`` instantiation with one-line errors, and the
task of a config.

A group's node is ``{_target_: dotted.path, name: label, **keyword arguments}``; ``name`` is a
label for tables and messages, not an argument. A ``_target_`` may also name a class given in
this process (the Python API's components, defined in a notebook or a function, with no import
path): ``in_process_targets`` makes it reachable, while a run lasts, as
``in_process_target("<its module>.<its qualified name>")``, an attribute path of this module.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_lab.errors import ConfigError

HYDRA_KEYS = ("_args_", "_recursive_", "_convert_")  # instantiate() options, not arguments
_IN_PROCESS_CLASSES: dict[str, Any] = {}  # dotted name -> the class given in this process


class InProcessTargets:
    """The classes given in this process, one attribute per part of their dotted names, so that
    any ``_target_`` lookup (Hydra's: import the module, then follow the attributes) finds
    them."""

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix

    def __getattr__(self, part: str) -> Any:
        path = self.__dict__.get("_prefix", "") + part
        if path in _IN_PROCESS_CLASSES:
            return _IN_PROCESS_CLASSES[path]
        if any(name.startswith(f"{path}.") for name in _IN_PROCESS_CLASSES):
            return InProcessTargets(f"{path}.")
        raise AttributeError(f"no component '{path}' was given in this process")


in_process = InProcessTargets()


def locate(path: str) -> Any:
    """The object a dotted ``_target_`` path names, found as ``hydra.utils.instantiate`` finds
    it (``hydra.utils.get_object``); a failure is raised, not also logged by Hydra (the caller
    reports it in one line)."""
    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")
    level = hydra_log.level
    hydra_log.setLevel(logging.CRITICAL)
    try:
        return get_object(path)
    finally:
        hydra_log.setLevel(level)


def in_process_target(name: str) -> str:
    """The ``_target_`` of the class given in this process as dotted ``name``."""
    return f"{__name__}.in_process.{name}"


@contextmanager
def in_process_targets(classes: Mapping[str, type]) -> Iterator[None]:
    """Within the block, each of ``classes`` (dotted name -> class) is the object that
    ``in_process_target(name)`` names."""
    _IN_PROCESS_CLASSES.update(classes)
    try:
        yield
    finally:
        for name in classes:
            _IN_PROCESS_CLASSES.pop(name, None)


def resolve_component(cfg: DictConfig, group: str) -> dict[str, Any]:
    """The node of config group ``group`` as a plain dict with interpolations resolved."""
    return OmegaConf.to_container(cfg[group], resolve=True)


def instantiate_component(cfg: DictConfig | dict[str, Any], group: str, **kwargs: Any) -> Any:
    """Instantiate the ``_target_`` of config group ``group`` (minus its ``name`` label).

    Flat specs are built directly (``_target_(**spec, **kwargs)``, or a partial with
    ``_partial_``); anything richer goes through ``hydra.utils.instantiate``. Any failure
    (unknown ``_target_``, bad argument) becomes a ``ConfigError`` naming group, choice and cause.
    """
    spec = dict(cfg) if isinstance(cfg, dict) else resolve_component(cfg, group)
    name = spec.pop("name", spec.get("_target_"))
    try:
        nested = any(isinstance(v, dict) and "_target_" in v for v in spec.values())
        if nested or any(key in spec for key in HYDRA_KEYS):
            from hydra.utils import instantiate

            return instantiate(spec, **kwargs)
        target = locate(spec.pop("_target_"))
        partial = spec.pop("_partial_", False)
        return functools.partial(target, **spec, **kwargs) if partial else target(**spec, **kwargs)
    except Exception as exc:
        while exc.__cause__ is not None:
            exc = exc.__cause__
        message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise ConfigError(f"{group}={name}: {message}") from exc


def build_task(cfg: DictConfig) -> Any:
    """Instantiate ``cfg.task`` and copy its vocabulary size into ``cfg.model.vocab_size``."""
    from transformer_lab.tasks.language import LanguageModelTask

    task = instantiate_component(cfg, "task")
    if isinstance(task, LanguageModelTask) and not cfg.arch.causal:
        raise ConfigError(f"task={cfg.task.name} is next-token prediction and needs "
                          "arch=decoder (an encoder would see the token it must predict)")
    cfg.model.vocab_size = task.vocab_size
    return task
