"""Positional encodings: one module per file, all following the protocol in :mod:`.base`.

======================================  ========  =========================================
class / function                        kind      paper
======================================  ========  =========================================
:class:`NoPositionalEncoding`           none      (NoPE)
:class:`SinusoidalPositionalEncoding`   additive  Vaswani et al. 2017, arXiv:1706.03762
:class:`LearnedPositionalEncoding`      additive  Devlin et al. 2018 (BERT), arXiv:1810.04805
:class:`RotaryPositionalEncoding`       rotary    Su et al. 2021 (RoFormer), arXiv:2104.09864
:class:`ALiBiPositionalBias`            bias      Press et al. 2021, arXiv:2108.12409
:class:`T5RelativeBias`                 bias      Raffel et al. 2019 (T5), arXiv:1910.10683
======================================  ========  =========================================
"""

from __future__ import annotations

from .alibi import ALIBI_SYMMETRIC, ALiBiPositionalBias, alibi_slopes
from .base import PE_KINDS, check_positional_module
from .learned import LEARNED_INITS, LearnedPositionalEncoding
from .none import NoPositionalEncoding
from .rope_scaling import ROPE_SCALINGS, rope_inverse_frequencies
from .rotary import (
    ROTARY_STYLES,
    RotaryPositionalEncoding,
    apply_rotary,
    rotary_cos_sin,
    rotate_with_cos_sin,
)
from .sinusoidal import SinusoidalPositionalEncoding, sinusoidal_table
from .t5_bias import T5RelativeBias, t5_relative_bucket

__all__ = [
    "ALIBI_SYMMETRIC",
    "LEARNED_INITS",
    "PE_KINDS",
    "ROPE_SCALINGS",
    "ROTARY_STYLES",
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
