"""What a component class says about itself, asked through its config node.

A component declares what the rest of tlab needs to know about it on its own class (see
``docs/custom_components.md``): a parameter-count formula, the property checks that apply, what
it is expected to do on reversal, whether it keeps module state, ... tlab finds the class from
the node's ``_target_`` and asks it:

* a plain class attribute is returned as it is (``SandwichNormBlock.norms_per_block`` -> 4);
* a classmethod is called with the node's keyword arguments (interpolations resolved; ``name``,
  ``_target_``, ``_partial_`` and any argument the method does not take left out) plus the
  caller's extras (``d_model`` for a norm layer, ``arch`` for a reversal expectation).

A class that declares nothing, or a ``_target_`` that cannot be imported, gives ``None``: the
caller then treats the component as unknown (your own component: no formula, SKIP).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import HYDRA_KEYS, given_component, locate

# Keys of a config node that are not constructor arguments.
_NOT_ARGUMENTS = ("name", "_target_", "_partial_", *HYDRA_KEYS)

Node = DictConfig | Mapping[str, Any]


def component_class(node: Node | None) -> type | None:
    """The class named by ``node._target_`` (that of a Python API component: the class or
    instance given); None without one or when it cannot be imported."""
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


def component_arguments(node: Node) -> dict[str, Any]:
    """The node's constructor keyword arguments, interpolations resolved where they resolve."""
    if isinstance(node, DictConfig):
        try:
            spec = OmegaConf.to_container(node, resolve=True)
        except Exception:  # e.g. a node loaded on its own: keep what resolves
            spec = {}
            for key in node:
                try:
                    value = node[key]
                except Exception:
                    continue
                spec[key] = (OmegaConf.to_container(value, resolve=True)
                             if isinstance(value, DictConfig) else value)
    else:
        spec = dict(node)
    return {k: v for k, v in spec.items() if k not in _NOT_ARGUMENTS}


def call_with_accepted(method: Any, arguments: Mapping[str, Any]) -> Any:
    """``method(**arguments)`` with only the arguments its signature takes (all of them if it
    has ``**kwargs``); None when a required argument is missing."""
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return method(**arguments)
    params = signature.parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        arguments = {k: v for k, v in arguments.items() if k in signature.parameters}
    try:
        signature.bind(**arguments)
    except TypeError:
        return None
    return method(**arguments)


def declared(node: Node | None, attribute: str, **extra: Any) -> Any:
    """What the class of ``node`` declares as ``attribute``: the attribute itself, or, for a
    method, its result for the node's keyword arguments and ``extra``. None when undeclared.
    An instance given to the Python API counts its own parameters (``count_parameters``)."""
    given = given_component(node) if node is not None else None
    if attribute == "count_parameters" and hasattr(given, "parameters") \
            and not isinstance(given, type):
        return sum(p.numel() for p in given.parameters())
    cls = component_class(node)
    value = getattr(cls, attribute, None) if cls is not None else None
    if value is None or not callable(value) or isinstance(value, type):
        return value
    return call_with_accepted(value, {**component_arguments(node), **extra})
