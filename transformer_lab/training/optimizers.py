"""The optimisers of one model, as the ``optimizer`` config group chooses them: any
``torch.optim.Optimizer`` by ``_target_``, its other keys the constructor's keywords except tlab's
``params`` (``all`` or ``hidden_matrices``), ``rest`` and ``lr_ratio`` (README: the ``optimizer``
group)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from transformer_lab.errors import ConfigError
from transformer_lab.training.settings import OptimizerSettings

PARAMETER_SETS = ("all", "hidden_matrices")
# Keys of an optimizer node that tlab reads itself (not constructor keywords).
TLAB_KEYS = ("name", "_target_", "params", "rest", "lr_ratio")
# Constructor parameters tlab fills in itself.
_FILLED_IN = ("self", "params", "lr")


class OptimizerSet:
    """The optimisers of one model, stepped together, each at the schedule's lr times its
    ``lr_ratio``."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer],
                 lr_ratios: Sequence[float]) -> None:
        self.optimizers = list(optimizers)
        self.lr_ratios = list(lr_ratios)

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers)

    def __getitem__(self, index: int) -> torch.optim.Optimizer:
        return self.optimizers[index]

    def __len__(self) -> int:
        return len(self.optimizers)

    def set_lr(self, lr: float) -> None:
        """Every parameter group of every optimiser to ``lr`` times its optimiser's ratio."""
        for optimizer, ratio in zip(self.optimizers, self.lr_ratios, strict=True):
            for group in optimizer.param_groups:
                group["lr"] = lr * ratio

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The trainable 2-D parameters of the model's ``blocks`` (Muon's share): not the embedding, the
    head or a PE's table."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Module):
        raise ConfigError("optimizer.params=hidden_matrices needs a model whose hidden layers "
                          f"are its `blocks` (tlab's TransformerModel); {type(model).__name__} "
                          "has none: use optimizer.params=all")
    return [p for p in blocks.parameters() if p.requires_grad and p.dim() == 2]


def decay_groups(params: Sequence[nn.Parameter], weight_decay: float) -> list[dict]:
    """Parameter groups: weight decay on matrices only; one group when it is 0."""
    if not weight_decay:
        return [{"params": list(params), "weight_decay": 0.0}]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


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


def build_optimizers(model: nn.Module, settings: OptimizerSettings, lr: float) -> OptimizerSet:
    """The optimisers ``settings`` describe over ``model``'s trainable parameters at learning rate
    ``lr``; ``ConfigError`` naming the optimiser for settings refused."""
    params = [p for p in model.parameters() if p.requires_grad]
    if settings.params not in PARAMETER_SETS:
        raise ConfigError(f"optimizer.params={settings.params} is not valid; use "
                          f"{' or '.join(PARAMETER_SETS)}")
    if settings.params == "all":
        return OptimizerSet([make_optimizer(settings, params, lr)], [settings.lr_ratio])
    if settings.rest is None:
        raise ConfigError(f"optimizer={settings.name} has params=hidden_matrices but no "
                          "optimizer.rest for the other parameters (embeddings, head, biases, "
                          "norm gains); give one, e.g. configs/optimizer/muon.yaml's")
    hidden = {id(p) for p in hidden_matrices(model)}
    parts = [(settings, [p for p in params if id(p) in hidden]),
             (settings.rest, [p for p in params if id(p) not in hidden])]
    parts = [(part, chosen) for part, chosen in parts if chosen]  # e.g. no hidden matrices
    return OptimizerSet([make_optimizer(part, chosen, lr) for part, chosen in parts],
                        [part.lr_ratio for part, _ in parts])


def make_optimizer(settings: OptimizerSettings, params: Sequence[nn.Parameter],
                   lr: float) -> torch.optim.Optimizer:
    """One optimiser over ``params``: decay groups where it takes ``weight_decay``, fused where
    possible."""
    cls = optimizer_class(settings)
    check_arguments(settings, cls)
    arguments = dict(settings.arguments)
    groups: list[dict] = [{"params": list(params)}]
    if "weight_decay" in arguments:
        groups = decay_groups(params, float(arguments["weight_decay"]))
    if arguments.get("fused") and not fusable(params):
        arguments["fused"] = None  # torch's default
    try:
        return cls(groups, lr=lr * settings.lr_ratio, **arguments)
    except Exception as exc:  # the class's own checks (a value out of range, ...)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"optimizer={settings.name}: {settings.target} refused its "
                          f"settings: {reason}") from None


def fusable(params: Sequence[nn.Parameter]) -> bool:
    """Every parameter is a floating tensor on the CPU or a GPU (what torch's fused kernels
    take)."""
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda")
                                for p in params)


def check_optimizer(settings: OptimizerSettings, model: nn.Module) -> None:
    """Pre-flight: the optimisers of ``settings`` build over ``model`` (``ConfigError``
    otherwise)."""
    build_optimizers(model, settings, lr=1e-3)
