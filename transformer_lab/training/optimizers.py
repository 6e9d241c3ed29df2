"""The optimisers of one model, as the ``optimizer`` config group chooses them: any
``torch.optim.Optimizer`` by ``_target_``, its other keys the constructor's keywords except tlab's
``params`` (``all`` or ``hidden_matrices``), ``rest`` and ``lr_ratio`` (README: the ``optimizer``
group)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch import nn

from transformer_lab.errors import ConfigError
from transformer_lab.training.settings import OptimizerSettings

PARAMETER_SETS = ("all", "hidden_matrices")
# Keys of an optimizer node that tlab reads itself (not constructor keywords).
TLAB_KEYS = ("name", "_target_", "params", "rest", "lr_ratio")
# Constructor parameters tlab fills in itself.
_FILLED_IN = ("self", "params", "lr")


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The trainable 2-D parameters of the model's ``blocks`` (Muon's share): not the embedding, the
    head or a PE's table."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        raise ConfigError("optimizer.params=hidden_matrices needs a model whose hidden layers "
                          f"are its `blocks` (tlab's TransformerModel); {type(model).__name__} "
                          "has none: use optimizer.params=all")
    return [p for p in blocks.parameters() if p.requires_grad and p.dim() == 2]


def optimizer_class(settings: OptimizerSettings) -> type[torch.optim.Optimizer]:
    """The ``torch.optim.Optimizer`` subclass ``settings.target`` names, or ``ConfigError``."""
    from transformer_lab.config.instantiate import locate

    try:
        found = locate(settings.target)
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"optimizer={settings.name}: _target_ '{settings.target}' cannot be "
                          f"imported ({reason})") from None
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise ConfigError(f"optimizer={settings.name}: _target_ '{settings.target}' is not a "
                          "torch.optim.Optimizer subclass; give one, e.g. torch.optim.AdamW")
    return found


def check_arguments(settings: OptimizerSettings, cls: type[torch.optim.Optimizer]) -> None:
    """``ConfigError`` for ``lr`` or the first keyword ``cls``'s constructor does not take (any,
    where it takes ``**kwargs``)."""
    if "lr" in settings.arguments:
        raise ConfigError(f"optimizer={settings.name}: 'lr' is not an optimizer setting: "
                          "train.lr and train.schedule set the learning rate (optimizer.lr_ratio "
                          "scales it for one optimizer)")
    parameters = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    taken = [name for name in parameters if name not in _FILLED_IN]
    for key in settings.arguments:
        if key not in parameters or key in _FILLED_IN:
            raise ConfigError(f"optimizer={settings.name}: {settings.target} takes no argument "
                              f"'{key}'; it takes {', '.join(taken)}")


def build_optimizers(model: nn.Module, settings: OptimizerSettings, lr: float
                     ) -> tuple[list[torch.optim.Optimizer], list[float]]:
    """The optimisers ``settings`` describe over ``model``'s trainable parameters at learning rate
    ``lr``, and their ``lr_ratio``s; ``ConfigError`` naming the optimiser for settings refused."""
    params = [p for p in model.parameters() if p.requires_grad]
    if settings.params not in PARAMETER_SETS:
        raise ConfigError(f"optimizer.params={settings.params} is not valid; use "
                          f"{' or '.join(PARAMETER_SETS)}")
    parts = [(settings, params)]
    if settings.params == "hidden_matrices":
        if settings.rest is None:
            raise ConfigError(f"optimizer={settings.name} has params=hidden_matrices but no "
                              "optimizer.rest for the other parameters (embeddings, head, "
                              "biases, norm gains); give one, e.g. configs/optimizer/muon.yaml's")
        hidden = {id(p) for p in hidden_matrices(model)}
        parts = [(settings, [p for p in params if id(p) in hidden]),
                 (settings.rest, [p for p in params if id(p) not in hidden])]
        parts = [(part, chosen) for part, chosen in parts if chosen]  # e.g. no hidden matrices
    return ([make_optimizer(part, chosen, lr) for part, chosen in parts],
            [part.lr_ratio for part, _ in parts])


def make_optimizer(settings: OptimizerSettings, params: Sequence[nn.Parameter],
                   lr: float) -> torch.optim.Optimizer:
    """One optimiser over ``params``: weight decay on matrices only; fused where torch's kernels
    take every parameter (floating, on the CPU or a GPU)."""
    cls = optimizer_class(settings)
    check_arguments(settings, cls)
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
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"optimizer={settings.name}: {settings.target} refused its "
                          f"settings: {reason}") from None


def check_optimizer(settings: OptimizerSettings, model: nn.Module) -> None:
    """Pre-flight: the optimisers of ``settings`` build over ``model`` (``ConfigError``
    otherwise)."""
    build_optimizers(model, settings, lr=1e-3)
