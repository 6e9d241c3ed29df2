"""Broken positional encodings: each a few lines on top of a correct built-in (see the
catalogue in :mod:`transformer_lab.mutants` for the check expected to catch each)."""

from __future__ import annotations

import torch

from transformer_lab.components.positional import (
    ALiBiPositionalBias,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    apply_rotary,
    rope_inverse_frequencies,
    rotary_cos_sin,
    rotate_with_cos_sin,
    sinusoidal_table,
)


class PositionBlindPE(SinusoidalPositionalEncoding):
    """Ignores ``positions``: every position gets the encoding of position 0."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.zeros_like(positions))  # (T, d_model), all rows equal


class ClampedPE(SinusoidalPositionalEncoding):
    """Silently clamps: every position from ``clamp_at`` on gets the same encoding."""

    def __init__(self, d_model: int, clamp_at: int = 16) -> None:
        super().__init__(d_model)
        self.clamp_at = clamp_at

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return super().forward(positions.clamp(max=self.clamp_at))  # (T, d_model)


class OverflowPE(SinusoidalPositionalEncoding):
    """Adds ``log(1 - pos / limit)`` to every dimension: small and finite at 4 tokens, -inf at
    ``pos = limit`` and NaN past it (a decay with a singularity)."""

    def __init__(self, d_model: int, limit: int = 32) -> None:
        super().__init__(d_model)
        self.limit = limit

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        decay = torch.log1p(-positions.float() / self.limit)  # (T,): NaN past limit
        return super().forward(positions) + decay[:, None]  # (T, d_model)


class Float64PE(SinusoidalPositionalEncoding):
    """Returns its table in float64 (whatever the activations' dtype)."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return super().forward(positions).double()  # (T, d_model) float64


class CPUTablePE(SinusoidalPositionalEncoding):
    """Builds its table in ``forward`` without ``device=``: on the CPU whatever the model's
    device (fine on a CPU-only machine, a device error on a GPU)."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        table = sinusoidal_table(int(positions.max()) + 1, self.d_model)  # (T, d) on the CPU
        return table[positions]  # (T, d_model)


class WrongShapePE(SinusoidalPositionalEncoding):
    """Returns half the model width: (T, d_model // 2)."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return super().forward(positions)[:, : self.d_model // 2]  # (T, d_model // 2)


class BatchDependentRoPE(RotaryPositionalEncoding):
    """RoPE whose frequencies are scaled by a statistic of the batch (``1 + mean |q|``): a
    sequence's encoding depends on the other sequences of its batch."""

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = 1.0 + q.detach().abs().mean()  # () over the whole batch
        return super().forward(q, k, positions.float() * scale)


class MixedPairingRoPE(RotaryPositionalEncoding):
    """Rotates q with the ``half`` pairing and k with the ``interleaved`` one: q_m . k_n no
    longer depends on n - m only."""

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (apply_rotary(q, positions, style="half"),
                apply_rotary(k, positions, style="interleaved"))


class FlippedSignRoPE(RotaryPositionalEncoding):
    """Rotates k by ``-n theta`` instead of ``+n theta``: q_m . k_n depends on m + n."""

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary(q, positions), apply_rotary(k, -positions)


class FutureBiasALiBi(ALiBiPositionalBias):
    """Causal ALiBi plus ``value`` (large, positive) on every key above the diagonal. In a
    decoder the model's causal mask (-inf) must win: HARMLESS, the model is plain ALiBi."""

    def __init__(self, n_heads: int, causal: bool = True, value: float = 1e4) -> None:
        super().__init__(n_heads, causal=causal)
        self.value = value

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        bias = super().forward(q_len, k_len)  # (H, Tq, Tk), queries at the last Tq positions
        first_query = k_len - q_len
        future = torch.ones(q_len, k_len, dtype=torch.bool,
                            device=bias.device).triu(first_query + 1)  # key after the query
        return bias + self.value * future  # (H, Tq, Tk)


# Bugs that only show with a KV cache (new tokens after an offset): step 1's cached_decoding.


class OffsetBlindRoPE(RotaryPositionalEncoding):
    """Rotates by ``arange`` of its input's length instead of the ``positions`` it is given:
    the same in a full forward, but under a KV cache the new token at position ``p`` is rotated
    as position 0 (Megatron-LM #453, llama2.c #286: the position offset is lost)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from_zero = torch.arange(q.shape[-2], device=positions.device)  # (T,) bug: positions
        return super().forward(q, k, from_zero)


class StaleDynamicRoPE(RotaryPositionalEncoding):
    """Dynamic NTK RoPE that scales its base for the length of the tensors it rotates,
    ``q.shape[-2]``, not the sequence's ``max(positions) + 1``: under a KV cache the new queries
    keep a short sequence's frequencies while the cached keys got the grown one's (HF
    transformers #25104)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stale_len = max(q.shape[-2], self.original_max_len or 0)  # bug: max(positions) + 1
        inv_freq, scale = rope_inverse_frequencies(
            self.head_dim, self.base, scaling=self.scaling, factor=self.factor,
            original_max_len=self.original_max_len, seq_len=stale_len)  # (Dh/2,)
        cos, sin = rotary_cos_sin(positions, inv_freq.to(q.device))  # (T, Dh/2) each
        cos, sin = cos * scale, sin * scale
        return (rotate_with_cos_sin(q, cos, sin, self.style),  # (B, H, T, Dh)
                rotate_with_cos_sin(k, cos, sin, self.style))


class TopLeftALiBi(ALiBiPositionalBias):
    """Returns the first ``q_len`` rows of its bias table (aligned top-left) instead of the
    last: the same in a full forward, but under a KV cache the new token at position ``p`` gets
    the biases of position 0 (PyTorch #108108: ``is_causal`` aligned top-left when
    ``q_len < k_len``)."""

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        table = super().forward(k_len, k_len)  # (H, Tk, Tk)
        return table[:, :q_len, :k_len]  # (H, Tq, Tk) bug: rows k_len - q_len .. k_len - 1


class AliasingSinusoidalPE(SinusoidalPositionalEncoding):
    """Sinusoidal PE whose exponent ``2i / d_model`` is floor-divided (a wrong ``div_term``, as
    ``/`` on integer tensors did in old PyTorch): every frequency is 1, so far positions alias
    (p and p + 44, as 44 is about 7 x 2 pi)."""

    def __init__(self, d_model: int, max_len: int = 512, base: float = 10000.0) -> None:
        super().__init__(d_model, max_len, base)
        exponent = torch.div(torch.arange(0, d_model, 2), d_model, rounding_mode="floor")  # 0s
        self.frequencies = base ** -exponent.float()  # (ceil(d/2),) all 1


class SelfMaskingALiBi(ALiBiPositionalBias):
    """ALiBi that also masks each token from itself (``-inf`` on the diagonal): in a decoder
    the first query then sees no key. SDPA returns 0 for that row, so the forward looks fine;
    the written-out softmax gives NaN."""

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        bias = super().forward(q_len, k_len)  # (H, Tq, Tk)
        itself = torch.eye(q_len, k_len, dtype=torch.bool, device=bias.device)  # (Tq, Tk)
        return bias.masked_fill(itself, float("-inf"))  # (H, Tq, Tk)


class BF16TableRoPE(RotaryPositionalEncoding):
    """RoPE whose cos/sin are kept in bfloat16, as a table stored so (modded-nanogpt #39): every
    rotation uses angles rounded to 8 bits, in a float32 run too."""

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = super().cos_sin(positions)  # (T, rot/2) each
        return cos.bfloat16(), sin.bfloat16()  # bug: stored as bfloat16
