"""From a config group to an object: ``_target_`` instantiation with one-line errors, and the
task of a config. ``name`` is a label, not an argument; the Python API's components (a class or
an instance) are built from the object given (``components_given``), not imported."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from transformer_lab.errors import ConfigError

HYDRA_KEYS = ("_args_", "_recursive_", "_convert_")  # instantiate() options, not arguments
_GIVEN: dict[tuple[str, str], Any] = {}  # (_target_, name) -> the class or instance given


@contextmanager
def components_given(given: Mapping[tuple[str, str], Any]) -> Iterator[None]:
    """Within the block, a node whose ``_target_`` and ``name`` are a key of ``given`` is built
    from the value: a class is called, an instance deep-copied (whatever the arguments)."""
    _GIVEN.update(given)
    try:
        yield
    finally:
        for key in given:
            _GIVEN.pop(key, None)


def given_component(node: Mapping[str, Any]) -> Any:
    """The class or instance given in this process for ``node``; None for any other node."""
    return _GIVEN.get((str(node.get("_target_")), str(node.get("name"))))


def given_targets() -> set[str]:
    """The ``_target_`` of every component given in this process."""
    return {target for target, _ in _GIVEN}


def locate(path: str) -> Any:
    """The object a dotted ``_target_`` names (``hydra.utils.get_object``), a failure raised
    without Hydra also logging it (the caller reports it in one line)."""
    from hydra.utils import get_object

    hydra_log = logging.getLogger("hydra.utils")
    level = hydra_log.level
    hydra_log.setLevel(logging.CRITICAL)
    try:
        return get_object(path)
    finally:
        hydra_log.setLevel(level)


def instantiate_component(node: Mapping[str, Any], group: str, **kwargs: Any) -> Any:
    """Build the ``_target_`` of ``node``, a resolved node of config group ``group``: flat and
    given specs directly, nested ones through ``hydra.utils.instantiate``. ``ConfigError``
    naming group, choice and cause for any failure."""
    spec = dict(node)
    given = given_component(spec)
    name = spec.pop("name", spec.get("_target_"))
    try:
        nested = any(isinstance(v, dict) and "_target_" in v for v in spec.values())
        if given is None and (nested or any(key in spec for key in HYDRA_KEYS)):
            from hydra.utils import instantiate

            return instantiate(spec, **kwargs)
        target = spec.pop("_target_")
        if given is None:
            target = locate(target)
        else:  # the class, or a copy of the instance per call
            target = given if isinstance(given, type) else lambda *a, **k: copy.deepcopy(given)
        partial = spec.pop("_partial_", False)
        return functools.partial(target, **spec, **kwargs) if partial else target(**spec, **kwargs)
    except Exception as exc:
        while exc.__cause__ is not None:
            exc = exc.__cause__
        message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise ConfigError(f"{group}={name}: {message}") from exc


def build_task(spec: Any) -> Any:
    """The task of ``spec`` (a ``RunSpec``); its ``vocab_size`` is the model's
    (``RunSpec.with_vocab``)."""
    from transformer_lab.tasks.language import LanguageModelTask

    task = spec.task.build()
    if isinstance(task, LanguageModelTask) and not spec.model.causal:
        raise ConfigError(f"task={spec.task.name} is next-token prediction and needs "
                          "arch=decoder (an encoder would see the token it must predict)")
    return task
