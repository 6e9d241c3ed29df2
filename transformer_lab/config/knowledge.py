"""Ask a component class, found by its node's ``_target_``, what it declares about itself
(``docs/custom_components.md``, "What a component declares"); None when it declares nothing."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from transformer_lab.config.instantiate import HYDRA_KEYS, given_component, locate

# Keys of a config node that are not constructor arguments.
_NOT_ARGUMENTS = ("name", "_target_", "_partial_", *HYDRA_KEYS)

Node = Mapping[str, Any]


def component_class(node: Node | None) -> type | None:
    """The class named by ``node._target_`` (or given to the Python API); None without one or
    when it cannot be imported."""
    if node is None:
        return None
    given = given_component(node)
    if given is not None:
        return given if isinstance(given, type) else type(given)
    target = node.get("_target_")
    if not isinstance(target, str) or not target:
        return None
    try:
        found = locate(target)
    except Exception:  # an unknown target is reported where the component is built
        return None
    return found if isinstance(found, type) else None


def declared(node: Node | None, attribute: str, **extra: Any) -> Any:
    """What the class of ``node`` declares as ``attribute``: the attribute, or a method's result
    for the node's keyword arguments and ``extra`` (those it takes; None when a required one is
    missing). None when undeclared. A Python API instance counts its own parameters."""
    given = given_component(node) if node is not None else None
    if attribute == "count_parameters" and hasattr(given, "parameters") \
            and not isinstance(given, type):
        return sum(p.numel() for p in given.parameters())
    cls = component_class(node)
    method = getattr(cls, attribute, None) if cls is not None else None
    if method is None or not callable(method) or isinstance(method, type):
        return method
    arguments = {k: v for k, v in node.items() if k not in _NOT_ARGUMENTS} | extra
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return method(**arguments)
    if not any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        arguments = {k: v for k, v in arguments.items() if k in signature.parameters}
    try:
        signature.bind(**arguments)
    except TypeError:
        return None
    return method(**arguments)
