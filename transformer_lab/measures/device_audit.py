"""Which tensors of a forward were made on the CPU regardless of the model's device? Followed by
provenance, not by device, so a CPU-only machine sees them too (docs/detector.md)."""

from __future__ import annotations

import inspect
import traceback
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from transformer_lab.measures.property_result import called_from, flat_tensors

_HOST = "_tlab_host"  # attribute set on a host tensor: where it was made ("" if unknown)
_FACTORIES = {"arange", "zeros", "ones", "empty", "full", "tensor", "as_tensor", "rand",
              "randn", "randint", "randperm", "linspace", "logspace", "eye"}
_MOVES = {"to", "cuda", "type_as", "new_tensor", "new_zeros", "new_ones", "new_empty",
          "new_full"}


def _is_host(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and hasattr(value, _HOST)


def _mark(result: Any, made: str) -> Any:
    for value in flat_tensors(result):
        setattr(value, _HOST, made)
    return result


def _calling_module() -> str:
    """The class of the innermost module whose own code (a method with ``self``) is running,
    outside torch: ``CPUTablePE``; ``""`` if none."""
    for frame, _ in traceback.walk_stack(inspect.currentframe()):
        owner = frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and not frame.f_code.co_filename.startswith(
                torch.__path__[0]):
            return type(owner).__name__
    return ""


class DeviceAudit(TorchFunctionMode):
    """Records in ``violations`` each op that mixes a host tensor with a device tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.violations: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if name in _FACTORIES or name == "cpu":
            if kwargs.get("device") is not None:
                return result
            made = ".cpu()" if name == "cpu" else f"torch.{name}"
            return _mark(result, f"{made} at {called_from(inspect.currentframe())}")
        if name in _MOVES:
            # .to(dtype) keeps the provenance; .to(device / tensor) and new_* follow the target
            moved = name != "to" or any(isinstance(a, torch.Tensor | torch.device | str)
                                        for a in (*args[1:], kwargs.get("device")))
            if not moved:
                return _mark(result, getattr(args[0], _HOST)) if _is_host(args[0]) else result
            # a no-op move returns the same object: give back a fresh alias, not host-marked
            return result.view_as(result) if result is args[0] else result
        tensors = flat_tensors((args, kwargs))
        host = [t for t in tensors if _is_host(t)]
        if host and len(host) == len(tensors):
            return _mark(result, getattr(host[0], _HOST))
        if name == "__getitem__" and not _is_host(args[0]):
            return result  # a CPU index into a CUDA tensor is legal
        host = [t for t in host if t.dim() > 0]
        if host:  # e.g. "CPUTablePE: __getitem__ at my_pe.py:12 (forward) mixed a tensor ..."
            owner, where = _calling_module(), called_from(inspect.currentframe())
            made = getattr(host[0], _HOST)
            self.violations.append(
                f"{owner + ': ' if owner else ''}{name}{f' at {where}' if where else ''} mixed "
                f"a tensor made without device= {', '.join(str(tuple(t.shape)) for t in host)}"
                f"{f' ({made})' if made else ''} with the model's tensors")
        return result


def host_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor made on the host regardless of the model's device."""
    return _is_host(value) and value.dim() > 0
