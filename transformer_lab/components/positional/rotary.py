"""Rotary position embedding (RoPE), both pairings, partial rotary and context scaling."""

from __future__ import annotations

import torch
from torch import nn

from .rope_scaling import rope_inverse_frequencies


def _check_style(style: str) -> None:
    if style not in ("half", "interleaved"):
        raise ValueError(f"style={style!r} is not valid; choose 'half' or 'interleaved'")


def _check_positions(positions: torch.Tensor, x: torch.Tensor, name: str) -> None:
    if positions.ndim != 1 or positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions has shape {tuple(positions.shape)}; expected "
                         f"({x.shape[-2]},) to match {name} of shape {tuple(x.shape)}")


def rotary_cos_sin(positions: torch.Tensor,
                   inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos(m theta_i)`` and ``sin(m theta_i)`` in float32: positions ``(T,)``, inv_freq ``(d/2,)``
    -> ``(T, d/2)`` each."""
    angles = positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]  # (T, d/2)
    return torch.cos(angles), torch.sin(angles)


def rotate_with_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        style: str = "half") -> torch.Tensor:
    """Rotate each pair of dimensions of ``x`` by the given angles, in float32, returned in ``x``'s
    dtype. ``style``: ``half`` pairs ``(x[i], x[i + d/2])`` (GPT-NeoX, HF LLaMA), ``interleaved``
    pairs ``(x[2i], x[2i+1])`` (RoFormer, Meta LLaMA).
    Shapes: x ``(..., T, d)``, cos and sin ``(T, d/2)`` -> ``(..., T, d)``."""
    _check_style(style)
    half = x.shape[-1] // 2
    xf, cos, sin = x.to(torch.float32), cos.to(torch.float32), sin.to(torch.float32)
    if style == "half":
        x1, x2 = xf[..., :half], xf[..., half:]  # (..., T, d/2) each
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)  # (..., T, d)
    else:
        x_even, x_odd = xf[..., 0::2], xf[..., 1::2]  # (..., T, d/2) each
        pairs = [x_even * cos - x_odd * sin, x_even * sin + x_odd * cos]
        out = torch.stack(pairs, dim=-1).flatten(-2)  # (..., T, d/2, 2) -> (..., T, d)
    return out.to(x.dtype)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0,
                 style: str = "half") -> torch.Tensor:
    """RoPE without scaling (Su et al. 2021, arXiv:2104.09864): pair ``i`` rotated by
    ``m base^(-2i/d)``.
    Shapes: x ``(..., T, d)`` (``d`` even), positions ``(T,)`` -> ``(..., T, d)``."""
    d = x.shape[-1]
    if d % 2 != 0:
        raise ValueError(f"head_dim={d} is not valid for RoPE; the rotated dimension must be even")
    _check_positions(positions, x, "x")
    inv_freq, _ = rope_inverse_frequencies(d, base)  # (d/2,)
    cos, sin = rotary_cos_sin(positions, inv_freq.to(x.device))  # (T, d/2) each
    return rotate_with_cos_sin(x, cos, sin, style)


class RotaryPositionalEncoding(nn.Module):
    """RoPE on queries and keys (``kind = "rotary"``; Su et al. 2021, RoFormer, arXiv:2104.09864):
    ``q_m . k_n`` depends on ``n - m`` only. ``style``, ``rotary_fraction`` (GPT-NeoX
    ``rotary_pct``) and the context scalings of :func:`rope_inverse_frequencies`.
    Shapes: q ``(B, H, T, head_dim)``, k ``(B, H_kv, T, head_dim)``, positions ``(T,)`` -> q, k."""

    kind = "rotary"

    # What tlab knows about this PE (docs/custom_components.md, "What a component declares").
    property_checks: tuple[str, ...] = ("rope_relative", "permutation")
    expected_reversal: dict[str, str] = {
        "encoder": "solves (relative only: needs 2 layers; absolute position comes from the "
                   "sequence edges)",
        "decoder": "solves",
    }

    @classmethod
    def count_parameters(cls) -> int:
        """None (cos/sin are computed)."""
        return 0

    def __init__(self, head_dim: int, base: float = 10000.0, style: str = "half",
                 rotary_fraction: float = 1.0, scaling: str = "none", factor: float = 1.0,
                 original_max_len: int | None = None, beta_fast: float = 32.0,
                 beta_slow: float = 1.0, attention_factor: float | None = None,
                 low_freq_factor: float = 1.0, high_freq_factor: float = 4.0) -> None:
        super().__init__()
        _check_style(style)
        if not 0.0 < rotary_fraction <= 1.0:
            raise ValueError(
                f"rotary_fraction={rotary_fraction} is not valid; it must be in (0, 1]"
            )
        rot = int(head_dim * rotary_fraction)
        if rot <= 0 or rot % 2 != 0:
            raise ValueError(
                f"rotary dimension rot=int(head_dim * rotary_fraction)=int({head_dim} * "
                f"{rotary_fraction})={rot} is not valid; it must be even and > 0 "
                f"(choose head_dim and rotary_fraction so that rot is a positive even number)"
            )
        self.head_dim, self.rot, self.base, self.style = head_dim, rot, float(base), style
        self.scaling, self.factor, self.original_max_len = scaling, float(factor), original_max_len
        #: the keywords of rope_inverse_frequencies
        self.scaling_options = dict(
            scaling=scaling, factor=self.factor, original_max_len=original_max_len,
            beta_fast=float(beta_fast), beta_slow=float(beta_slow),
            attention_factor=attention_factor, low_freq_factor=float(low_freq_factor),
            high_freq_factor=float(high_freq_factor))
        # inv_freq (rot/2,) float32 is out of state_dict and .to(): cos_sin moves it (validates
        # the arguments); dynamic scaling recomputes it for a longer sequence
        self.inv_freq, self.attention_scale = rope_inverse_frequencies(
            rot, self.base, **self.scaling_options)
        self._dynamic_len = original_max_len  # sequence length the frequencies were made for

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scaled cos/sin for ``positions (T,)`` -> two ``(T, rot/2)`` float32 tensors, computed
        from the positions: no table to size, so no read of their values."""
        if self.inv_freq.device != positions.device:  # moved once, not at every call
            self.inv_freq = self.inv_freq.to(positions.device)
        cos, sin = rotary_cos_sin(positions, self.inv_freq)  # (T, rot/2) each
        return cos * self.attention_scale, sin * self.attention_scale

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"RoPE was built for head_dim={self.head_dim} but got a tensor of shape "
                f"{tuple(x.shape)}"
            )
        if self.rot == self.head_dim:
            return rotate_with_cos_sin(x, cos, sin, self.style)  # (B, H, T, Dh)
        x_rot, x_pass = x[..., : self.rot], x[..., self.rot :]  # (B, H, T, rot), (.., Dh-rot)
        x_rot = rotate_with_cos_sin(x_rot, cos, sin, self.style)
        return torch.cat([x_rot, x_pass], dim=-1)  # (B, H, T, Dh)

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_positions(positions, q, "q")
        if self.scaling == "dynamic" and positions.numel():
            length = max(int(positions.max()) + 1, self.original_max_len)
            if length != self._dynamic_len:  # NTK frequencies for the sequence's length
                self.inv_freq, _ = rope_inverse_frequencies(
                    self.rot, self.base, **{**self.scaling_options, "seq_len": length})
                self._dynamic_len = length
        cos, sin = self.cos_sin(positions)  # (T, rot/2) each
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rot={self.rot}, base={self.base}, style={self.style!r}, "
            f"scaling={self.scaling!r}, factor={self.factor}, "
            f"original_max_len={self.original_max_len}"
        )
