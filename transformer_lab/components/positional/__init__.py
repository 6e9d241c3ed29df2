"""Positional encodings: one module per file, all following the protocol in :mod:`.base`."""

from __future__ import annotations

from .alibi import ALiBiPositionalBias, alibi_slopes
from .base import PE_KINDS, check_positional_module
from .learned import LearnedPositionalEncoding
from .none import NoPositionalEncoding
from .rope_scaling import ROPE_SCALINGS, rope_inverse_frequencies
from .rotary import RotaryPositionalEncoding, apply_rotary, rotary_cos_sin, rotate_with_cos_sin
from .sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table
from .t5_bias import T5RelativeBias, t5_relative_bucket

__all__ = [
    "PE_KINDS",
    "ROPE_SCALINGS",
    "ALiBiPositionalBias",
    "LearnedPositionalEncoding",
    "NoPositionalEncoding",
    "RotaryPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "T5RelativeBias",
    "alibi_slopes",
    "apply_rotary",
    "check_positional_module",
    "rope_inverse_frequencies",
    "rotary_cos_sin",
    "rotate_with_cos_sin",
    "sinusoidal_table",
    "t5_relative_bucket",
]
