"""Which tensors of a forward were made on the CPU regardless of the model's device?

On a CPU-only machine ``torch.arange(T)`` inside ``forward`` (no ``device=``) gives the same
numbers as ``torch.arange(T, device=x.device)``; on a GPU the first meets CUDA tensors and
crashes. :class:`DeviceAudit` (a ``TorchFunctionMode``) follows the provenance instead of the
device: a factory call without ``device=`` (``arange, zeros, ones, empty, full, tensor, rand*,
linspace, eye``) and ``.cpu()`` make a *host* tensor; an op whose inputs are all host tensors
makes a host tensor; ``.to(device)``, ``.to(other)``, ``.cuda()`` make a device-following one.
An op that mixes a host tensor of one or more dims with a device-following tensor is recorded
(0-dim host tensors mix with CUDA tensors legally). Not caught: an explicit ``device="cpu"``
(on this machine it equals the model's device) and CPU tensors kept as plain attributes at
construction.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

_HOST = "_tlab_host"  # attribute set on a host tensor
_FACTORIES = {"arange", "zeros", "ones", "empty", "full", "tensor", "as_tensor", "rand",
              "randn", "randint", "randperm", "linspace", "logspace", "eye"}
_MOVES = {"to", "cuda", "type_as", "new_tensor", "new_zeros", "new_ones", "new_empty",
          "new_full"}


def _is_host(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and getattr(value, _HOST, False)


def _mark(result: Any) -> Any:
    for value in tree_flatten(result)[0]:
        if isinstance(value, torch.Tensor):
            setattr(value, _HOST, True)
    return result


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
        if name in _FACTORIES:
            return _mark(result) if kwargs.get("device") is None else result
        if name == "cpu":
            return _mark(result)
        if name in _MOVES:
            # .to(dtype) keeps the provenance; .to(device / tensor) and new_* follow the target
            moved = name != "to" or any(isinstance(a, torch.Tensor | torch.device | str)
                                        for a in (*args[1:], kwargs.get("device")))
            if not moved:
                return _mark(result) if _is_host(args[0]) else result
            # a no-op move returns the same object: give back a fresh alias, not host-marked
            return result.view_as(result) if result is args[0] else result
        tensors = [v for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor)]
        host = [t for t in tensors if _is_host(t)]
        if not host:
            return result
        if len(host) == len(tensors):
            return _mark(result)
        if name == "__getitem__" and not _is_host(args[0]):
            return result  # a CPU index into a CUDA tensor is legal
        if any(t.dim() > 0 for t in host):
            shapes = ", ".join(str(tuple(t.shape)) for t in host if t.dim() > 0)
            self.violations.append(f"{name} mixed a tensor made without device= {shapes} "
                                   "with the model's tensors")
        return result


def host_tensor(value: Any) -> bool:
    """Whether ``value`` is a tensor made on the host regardless of the model's device."""
    return _is_host(value) and value.dim() > 0
