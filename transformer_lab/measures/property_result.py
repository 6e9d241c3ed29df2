"""What a step-1 property check returns, and the helpers the checks share (docs/detector.md)."""

from __future__ import annotations

import copy
import functools
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import ParamSpec

import torch
from torch import nn

P = ParamSpec("P")
AMPLIFIED_STD = 0.3  # weight-matrix std of the copy the invariance checks measure
PERTURBED_STD = 0.02  # size of the values a zero-started parameter gets (tlab's init_std)


@dataclass
class PropertyResult:
    """One property: ``passed`` is None when it does not apply (e.g. causality in an encoder)."""

    name: str
    passed: bool | None
    value: float | None = None
    tolerance: float | None = None
    detail: str = ""


def verdict(name: str, ok: bool, value: float, tolerance: float | None, passed: str,
            failed: str) -> PropertyResult:
    """The row of a measured property: ``passed`` as its detail when ``ok``, else ``failed``."""
    return PropertyResult(name, ok, value, tolerance, passed if ok else failed)


@contextmanager
def evaluating(model: nn.Module) -> Iterator[None]:
    """Eval mode without gradients; the model's mode is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def eval_outputs(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) in eval mode, without gradients; the model's mode is restored."""
    with evaluating(model):
        return model(tokens).float()


def random_tokens(vocab_size: int, batch: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=generator)  # (B, T)


def relative_change(diff: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """|diff| over the mean norm of ``reference``'s rows, per row: (..., V) -> (...)."""
    scale = reference.norm(dim=-1).mean().clamp_min(1e-30)
    return diff.norm(dim=-1) / scale


def perturbed_copy(model: nn.Module, std: float = PERTURBED_STD) -> nn.Module:
    """A copy of ``model`` whose trainable parameters that start at exactly zero are set to
    small values: matrices to N(0, ``std``), vectors and scalars to U(``std``/2, ``std``)
    (docs/detector.md, "Zero starts")."""
    # tensors a forward left on a module (an MoE's ``aux_loss``) may be part of an autograd
    # graph, which deepcopy refuses: the copy gets them detached
    kept = [value for module in model.modules() for value in vars(module).values()
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter)
            and value.grad_fn is not None]
    copied = copy.deepcopy(model, memo={id(value): value.detach() for value in kept})
    generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for parameter in copied.parameters():
            if not parameter.requires_grad or parameter.numel() == 0 or bool(parameter.any()):
                continue
            noise = (torch.randn(parameter.shape, generator=generator) * std  # a matrix
                     if parameter.dim() >= 2
                     else std * (0.5 + 0.5 * torch.rand(parameter.shape, generator=generator)))
            parameter.copy_(noise.to(parameter.dtype))
    return copied


def amplified_copy(model: nn.Module) -> nn.Module:
    """A :func:`perturbed_copy` of ``model`` whose every weight matrix (parameter of 2+ dims) is
    rescaled to std :data:`AMPLIFIED_STD`: attention far from uniform (docs/detector.md)."""
    copied = perturbed_copy(model, AMPLIFIED_STD)
    with torch.no_grad():
        for parameter in copied.parameters():
            if parameter.dim() >= 2 and parameter.numel() > 1 and float(parameter.std()) > 0:
                parameter.mul_(AMPLIFIED_STD / parameter.std())
    return copied


@contextmanager
def train_mode_without_dropout(model: nn.Module) -> Iterator[list[str]]:
    """``model.train()`` with every dropout probability 0 and modules with running statistics
    (torch BatchNorm: train mode uses the batch's statistics, by design) left in eval mode.
    Yields the names of those modules; restores the modes and probabilities afterwards."""
    from transformer_lab.components.attention import MultiHeadAttention

    was_training, saved, exempt = model.training, [], []
    model.train()
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
            exempt.append(name)
        attribute = ("p" if isinstance(module, nn.modules.dropout._DropoutNd)
                     else "dropout" if isinstance(module, MultiHeadAttention) else None)
        if attribute:
            saved.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, 0.0)
    try:
        yield exempt
    finally:
        for module, attribute, value in saved:
            setattr(module, attribute, value)
        model.train(was_training)


def flat_tensors(value: object) -> list[torch.Tensor]:
    """The tensors in ``value``: a tensor, or (nested) tuples, lists and dict values."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, tuple | list):
        return [t for item in value for t in flat_tensors(item)]
    return [value] if isinstance(value, torch.Tensor) else []


def component(module: nn.Module) -> str:
    """A module as messages name it: its class (``MyNorm``)."""
    return type(module).__name__


# Files that are not the user's code: torch, the standard library, these checks.
_NOT_USER_CODE = tuple(str(Path(p).resolve()) for p in (
    Path(torch.__file__).parent, sysconfig.get_paths()["stdlib"], Path(__file__).parent))


def _location(frames: Iterable[tuple[FrameType, int]]) -> str:
    """``file:line (function)`` of the first of ``frames`` in the user's code, or ``""``; the
    file relative to the working directory where it is below it."""
    for frame, line in frames:
        path = Path(frame.f_code.co_filename).resolve()
        if not str(path).startswith(_NOT_USER_CODE):
            shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
            return f"{shown}:{line} ({frame.f_code.co_name})"
    return ""


def called_from(frame: FrameType | None) -> str:
    """Where in the user's code the current op was called (innermost frame from ``frame``
    outwards), or ``""``."""
    return _location(traceback.walk_stack(frame))


def failed(name: str, exc: Exception) -> PropertyResult:
    """The property ``name`` as a FAIL because the forward raised ``exc``, naming the line of
    the user's code it came from (the innermost such frame)."""
    message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    where = _location(reversed(list(traceback.walk_tb(exc.__traceback__))))
    return PropertyResult(name, False, detail=f"the forward raised {type(exc).__name__}"
                          f"{f' at {where}' if where else ''}: {message[:200]}")


def property_check(check: Callable[P, PropertyResult]) -> Callable[P, PropertyResult]:
    """``check``, returning its FAIL row (:func:`failed`, named after it) where it raises."""

    @functools.wraps(check)
    def checked(*args: P.args, **kwargs: P.kwargs) -> PropertyResult:
        try:
            return check(*args, **kwargs)
        except Exception as exc:
            return failed(check.__name__, exc)

    return checked
