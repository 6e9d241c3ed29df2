"""The optimisers of one model (the ``optimizer`` group, README): a ``torch.optim.Optimizer`` by
``_target_``, the other keys its keywords but tlab's ``params``, ``rest`` and ``lr_ratio``."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch import nn

from transformer_lab.config.spec import OptimizerSettings
from transformer_lab.errors import ConfigError

# Constructor parameters tlab fills in itself.
_FILLED_IN = ("self", "params", "lr")


def build_optimizers(model: nn.Module, settings: OptimizerSettings, lr: float
                     ) -> tuple[list[torch.optim.Optimizer], list[float]]:
    """The optimisers of ``settings`` over ``model``'s trainable parameters at ``lr``, and their
    ``lr_ratio``s; ``params=hidden_matrices`` (``SCHEMA`` checks the values): ``settings`` takes
    the 2-D parameters of the ``blocks`` (Muon's share), ``settings.rest`` the others."""
    params = [p for p in model.parameters() if p.requires_grad]
    parts = [(settings, params)]
    if settings.params == "hidden_matrices":
        if settings.rest is None:
            raise ConfigError(f"optimizer={settings.name} has params=hidden_matrices but no "
                              "optimizer.rest for the other parameters (embeddings, head, "
                              "biases, norm gains); give one, e.g. configs/optimizer/muon.yaml's")
        blocks = getattr(model, "blocks", None)
        if not isinstance(blocks, nn.Module):
            raise ConfigError("optimizer.params=hidden_matrices needs a model whose hidden layers "
                              f"are its `blocks` (tlab's TransformerModel); "
                              f"{type(model).__name__} has none: use optimizer.params=all")
        hidden = {id(p) for p in blocks.parameters() if p.dim() == 2}
        parts = [(settings, [p for p in params if id(p) in hidden]),
                 (settings.rest, [p for p in params if id(p) not in hidden])]
        parts = [(part, chosen) for part, chosen in parts if chosen]  # e.g. no hidden matrices
    return ([make_optimizer(part, chosen, lr) for part, chosen in parts],
            [part.lr_ratio for part, _ in parts])


def make_optimizer(settings: OptimizerSettings, params: Sequence[nn.Parameter],
                   lr: float) -> torch.optim.Optimizer:
    """One optimiser over ``params``: weight decay on matrices only; fused where torch's kernels
    take every parameter. ``ConfigError`` for a ``_target_`` not a ``torch.optim.Optimizer``,
    ``lr``, a keyword the constructor does not take (unless ``**kwargs``) or a value it refuses."""
    from transformer_lab.config.instantiate import locate

    name, target = settings.name, settings.target
    try:
        cls = locate(target)
    except Exception as exc:
        raise ConfigError(f"optimizer={name}: _target_ '{target}' cannot be imported "
                          f"({first_line(exc)})") from None
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
        raise ConfigError(f"optimizer={name}: _target_ '{target}' is not a "
                          "torch.optim.Optimizer subclass; give one, e.g. torch.optim.AdamW")
    if "lr" in settings.arguments:
        raise ConfigError(f"optimizer={name}: 'lr' is not an optimizer setting: "
                          "train.lr and train.schedule set the learning rate (optimizer.lr_ratio "
                          "scales it for one optimizer)")
    parameters = inspect.signature(cls.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        taken = [key for key in parameters if key not in _FILLED_IN]
        for key in settings.arguments:
            if key not in taken:
                raise ConfigError(f"optimizer={name}: {target} takes no argument '{key}'; it "
                                  f"takes {', '.join(taken)}")
    arguments = dict(settings.arguments)
    groups: list[dict] = [{"params": list(params)}]
    if decay := float(arguments.get("weight_decay") or 0.0):
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if arguments.get("fused") and not (params and all(
            p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)):
        arguments["fused"] = None  # torch's default
    try:
        return cls(groups, lr=lr * settings.lr_ratio, **arguments)
    except Exception as exc:  # the class's own checks (a value out of range, ...)
        raise ConfigError(f"optimizer={name}: {target} refused its settings: "
                          f"{first_line(exc)}") from None


def first_line(exc: Exception) -> str:
    """The first line of ``exc``'s message (its type's name when it has none)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_optimizer(settings: OptimizerSettings, model: nn.Module) -> None:
    """Pre-flight: the optimisers of ``settings`` build over ``model`` (``ConfigError``
    otherwise)."""
    build_optimizers(model, settings, lr=1e-3)
