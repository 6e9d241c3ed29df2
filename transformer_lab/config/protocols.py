"""Does a built component plug in? Each is run once on tiny inputs against its group's protocol
(``docs/custom_components.md``), before the run starts; correctness is ``tlab validate``'s job."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from transformer_lab.config.spec import ModelSpec
from transformer_lab.errors import ConfigError


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def _call(label: str, what: str, fn: Any, *args: Any) -> Any:
    try:
        with torch.no_grad():
            return fn(*args)
    except Exception as exc:
        message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise ConfigError(f"{label}: {what} failed: {message}") from exc


def _check_positional(label: str, pe: nn.Module, d_model: int, n_heads: int, head_dim: int,
                      seq_len: int) -> None:
    if pe.kind == "additive":
        out = _call(label, f"pe(positions of length {seq_len})", pe, torch.arange(seq_len))
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (seq_len, d_model):
            raise ConfigError(f"{label}: an additive PE must return (T, d_model) = "
                              f"{(seq_len, d_model)} for T positions, got {_shape(out)}")
    elif pe.kind == "rotary":
        q = torch.randn(1, n_heads, seq_len, head_dim)  # (B, H, T, Dh)
        out = _call(label, "pe(q, k, positions)", pe, q, q.clone(), torch.arange(seq_len))
        pair = out if isinstance(out, tuple | list) else (out,)
        if len(pair) != 2 or not all(isinstance(t, torch.Tensor) and t.shape == q.shape
                                     for t in pair):
            raise ConfigError(f"{label}: a rotary PE must return (q, k) shaped like q and k "
                              f"{tuple(q.shape)}, got {', '.join(_shape(t) for t in pair)}")
    elif pe.kind == "bias":
        out = _call(label, f"pe({seq_len}, {seq_len})", pe, seq_len, seq_len)
        if not (isinstance(out, torch.Tensor) and out.dim() == 3
                and out.shape[0] in (1, n_heads) and tuple(out.shape[1:]) == (seq_len, seq_len)):
            raise ConfigError(f"{label}: a bias PE must return (n_heads, T, T) = "
                              f"{(n_heads, seq_len, seq_len)}, got {_shape(out)}")


def _check_shape_kept(label: str, name: str, module: object, d_model: int, seq_len: int,
                      not_a_module: str, wrong_shape: str) -> None:
    """``module`` is an ``nn.Module`` mapping (B, T, d_model) to the same shape."""
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{label}: {not_a_module}")
    x = torch.randn(2, seq_len, d_model)  # (B, T, D)
    out = _call(label, f"{name}(x of shape {tuple(x.shape)})", module, x)
    if not isinstance(out, torch.Tensor) or out.shape != x.shape:
        raise ConfigError(f"{label}: {wrong_shape}; {tuple(x.shape)} came out as {_shape(out)}")


def check_protocols(m: ModelSpec, model: nn.Module, seq_len: int) -> None:
    """``ConfigError`` naming the group and class of the first component of ``model`` that does
    not follow its protocol: pe (additive ``(T,) -> (T, d_model)``, rotary ``(q, k, positions)
    -> (q, k)``, bias ``(T, T) -> (n_heads or 1, T, T)``), ffn and norm ``(B, T, d_model)`` kept."""
    def label(group: str, module: object) -> str:
        return f"{group}={m.component(group).name} ({type(module).__name__})"

    head_dim = m.head_dim or m.d_model // m.n_heads  # model.head_dim (T5 d_kv, ...)
    _check_positional(label("pe", model.positional), model.positional, m.d_model, m.n_heads,
                      head_dim, seq_len)
    if not len(model.blocks):
        return
    block = model.blocks[0]
    _check_shape_kept(label("ffn", block.feedforward), "ffn", block.feedforward, m.d_model,
                      seq_len, "an FFN must be a torch.nn.Module built with d_model and d_ff "
                      "keywords", "an FFN must map (B, T, d_model) -> (B, T, d_model)")
    if getattr(block, "norm1", None) is not None:  # a norm-free block (ReZero) has none
        _check_shape_kept(label("norm_layer", block.norm1), "norm", block.norm1, m.d_model,
                          seq_len, "norm_layer must be a callable d_model -> torch.nn.Module "
                          "(use _partial_: true for a class)",
                          "a norm must keep the shape (B, T, d_model)")
