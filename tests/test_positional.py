"""Tests for transformer_lab.components.positional.

Every reference value here is computed independently of the package (plain Python math, the
ALiBi authors' recursive get_slopes, a complex-number RoPE), so a wrong formula in the package
cannot be mirrored by the test.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from transformer_lab.components.positional import (
    PE_KINDS,
    ALiBiPositionalBias,
    LearnedPositionalEncoding,
    NoPositionalEncoding,
    RotaryPositionalEncoding,
    SinusoidalPositionalEncoding,
    T5RelativeBias,
    alibi_slopes,
    apply_rotary,
    check_positional_module,
    rope_inverse_frequencies,
    sinusoidal_table,
    t5_relative_bucket,
)

STYLES = ("half", "interleaved")


def _rope_angles(d: int, base: float) -> list[float]:
    return [base ** (-2 * i / d) for i in range(d // 2)]


# --------------------------------------------------------------------------------------------
# sinusoidal


def test_sinusoidal_table_matches_vaswani_formula() -> None:
    d, base = 16, 10000.0
    table = sinusoidal_table(64, d, base)
    assert table.shape == (64, d)
    for pos in (0, 1, 5, 37, 63):
        for i in range(d // 2):
            w = 1.0 / base ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos * w), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos * w), abs=1e-5)


def test_sinusoidal_table_odd_d_model() -> None:
    table = sinusoidal_table(10, 7)
    assert table.shape == (10, 7)
    # 4 sine dims (0, 2, 4, 6), 3 cosine dims (1, 3, 5); last column is a sine.
    w3 = 1.0 / 10000.0 ** (6 / 7)
    assert table[9, 6].item() == pytest.approx(math.sin(9 * w3), abs=1e-6)
    assert table[0, 1::2].tolist() == [1.0, 1.0, 1.0]


def test_sinusoidal_low_dims_oscillate_faster() -> None:
    table = sinusoidal_table(512, 32)
    mean_step = (table[1:] - table[:-1]).abs().mean(dim=0)  # (d,)
    sine_steps = mean_step[0::2]
    assert torch.all(sine_steps[:-1] > sine_steps[1:]), sine_steps


def test_sinusoidal_shift_is_a_fixed_linear_map() -> None:
    d, n = 12, 80
    table = sinusoidal_table(n, d).double()
    for k in (1, 3, 17):
        m = torch.zeros(d, d, dtype=torch.float64)
        for i in range(d // 2):
            b = k / 10000.0 ** (2 * i / d)
            # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
            m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = math.cos(b), math.sin(b)
            m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -math.sin(b), math.cos(b)
        shifted = table[:-k] @ m.T  # (n - k, d): M_k @ PE(pos) for every pos
        assert torch.allclose(shifted, table[k:], atol=1e-5)


def test_sinusoidal_module_extends_past_max_len() -> None:
    pe = SinusoidalPositionalEncoding(d_model=8, max_len=4)
    out = pe(torch.arange(10))
    assert out.shape == (10, 8)
    assert torch.allclose(out, sinusoidal_table(10, 8))


def test_sinusoidal_module_computes_far_positions_from_an_offset_as_the_formula() -> None:
    """Positions far past ``max_len``, from an offset (as a KV cache gives them), against the
    formula in float64. fp32 rounds ``w_i`` (``exp`` of a rounded exponent ``e <= 0``: relative
    ``eps (|e| + 1)``) and the product ``pos w_i`` (``eps / 2``): an angle error of at most
    ``pos w_i eps (|e| + 1.5) <= 1.5 eps pos`` (as ``w_i = exp(e)``), plus ``sin``/``cos``'s own
    rounding, about 1 ulp of a value in [-1, 1]."""
    d, base, last = 16, 10000.0, 4095
    positions = torch.arange(last - 95, last + 1)  # (96,)
    pe = SinusoidalPositionalEncoding(d_model=d, max_len=8, base=base)
    out = pe(positions)  # (96, d)
    assert out.shape == (96, d) and out.dtype == torch.float32
    frequencies = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    angles = positions.double()[:, None] * frequencies[None, :]  # (96, d/2)
    expected = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (96, d)
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=eps * (1.5 * last + 2))
    # the same float32 angles as the table's rows: only sin/cos's rounding (1 ulp each) differs
    torch.testing.assert_close(out, sinusoidal_table(last + 1, d, base)[positions],
                               rtol=0, atol=2 * eps)
    # a module cast to bfloat16 still computes its angles in float32, then rounds its output
    assert torch.equal(pe.to(torch.bfloat16)(positions), out.to(torch.bfloat16))


# --------------------------------------------------------------------------------------------
# apply_rotary


def _score(q: torch.Tensor, k: torch.Tensor, m: float, n: float, style: str, base: float):
    qr = apply_rotary(q[None], torch.tensor([m]), base=base, style=style)[0]
    kr = apply_rotary(k[None], torch.tensor([n]), base=base, style=style)[0]
    return torch.dot(qr, kr).item()


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("d", [4, 8, 64])
def test_rotary_scores_depend_only_on_relative_position(style: str, base: float, d: int) -> None:
    g = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, d, generator=g, dtype=torch.float64).unbind(0)
    for m, n in ((0, 3), (2, 5), (9, 1)):
        reference = _score(q, k, m, n, style, base)
        for offset in (1, 5, 100):
            shifted = _score(q, k, m + offset, n + offset, style, base)
            assert shifted == pytest.approx(reference, abs=1e-4 * d)


def test_rotary_seed_example_2_5_equals_7_10() -> None:
    q = torch.tensor([0.3, -1.2, 0.8, 0.5], dtype=torch.float64)
    k = torch.tensor([1.1, 0.4, -0.7, 0.9], dtype=torch.float64)
    for style in STYLES:
        a, b = _score(q, k, 2, 5, style, 10000.0), _score(q, k, 7, 10, style, 10000.0)
        assert a == pytest.approx(b, abs=1e-6)
        assert a != pytest.approx(torch.dot(q, k).item(), abs=1e-3)  # rotation did something


def test_rotary_half_and_interleaved_differ_by_a_fixed_permutation() -> None:
    d = 8
    x = torch.randn(3, 6, d)
    pos = torch.arange(6)
    half = apply_rotary(x, pos, style="half")
    inter = apply_rotary(x, pos, style="interleaved")
    assert (half - inter).abs().max() > 0.1
    # half pairs (i, i + d/2), interleaved pairs (2i, 2i + 1): perm moves one onto the other.
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    assert perm.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert torch.allclose(
        apply_rotary(x[..., perm], pos, style="half"), inter[..., perm], atol=1e-6
    )


@pytest.mark.parametrize("style", STYLES)
def test_rotary_preserves_norm_and_position_zero_is_identity(style: str) -> None:
    x = torch.randn(2, 4, 7, 16)
    out = apply_rotary(x, torch.arange(7) * 13, style=style)
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    assert not torch.allclose(out, x)
    assert torch.equal(apply_rotary(x, torch.zeros(7, dtype=torch.long), style=style), x)


def test_rotary_mixed_pairing_breaks_relative_property() -> None:
    d = 64
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, d, generator=g).unbind(0)
    worst = 0.0
    for m, n in ((0, 3), (2, 5), (10, 4)):
        scores = []
        for offset in (0, 1, 7, 50):
            pos_q, pos_k = torch.tensor([m + offset]), torch.tensor([n + offset])
            qr = apply_rotary(q[None], pos_q, style="half")[0]
            kr = apply_rotary(k[None], pos_k, style="interleaved")[0]
            scores.append(torch.dot(qr, kr).item())
        worst = max(worst, max(scores) - min(scores))
    assert worst > 1.0  # the "same relative position" scores differ by O(sqrt(d))


def test_rotary_interleaved_matches_complex_reference() -> None:
    d, t, base = 16, 9, 10000.0
    x = torch.randn(2, t, d, dtype=torch.float64)
    pos = torch.arange(t) * 3
    inv_freq = torch.tensor(_rope_angles(d, base), dtype=torch.float64)  # (d/2,)
    angles = pos.double()[:, None] * inv_freq[None, :]  # (t, d/2)
    rotation = torch.polar(torch.ones_like(angles), angles)  # (t, d/2) complex
    x_complex = torch.view_as_complex(x.reshape(2, t, d // 2, 2).contiguous())
    expected = torch.view_as_real(x_complex * rotation).reshape(2, t, d)
    got = apply_rotary(x, pos, style="interleaved")
    assert got.dtype == torch.float64
    assert torch.allclose(got, expected, atol=1e-5)


def test_rotary_float_positions_and_dtype() -> None:
    x = torch.randn(5, 8)
    a = apply_rotary(x, torch.arange(5), style="half")
    b = apply_rotary(x, torch.arange(5).float(), style="half")
    assert torch.equal(a, b)
    out = apply_rotary(x.bfloat16(), torch.arange(5))
    assert out.dtype == torch.bfloat16


def test_rotary_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"head_dim=5"):
        apply_rotary(torch.randn(3, 5), torch.arange(3))
    with pytest.raises(ValueError, match=r"style='foo' is not valid; choose 'half' or"):
        apply_rotary(torch.randn(3, 4), torch.arange(3), style="foo")
    with pytest.raises(ValueError, match=r"positions"):
        apply_rotary(torch.randn(3, 4), torch.arange(4))


# --------------------------------------------------------------------------------------------
# rope_inverse_frequencies


def _yarn_reference(d, base, factor, orig, beta_fast=32.0, beta_slow=1.0) -> list[float]:
    def corr_dim(rotations: float) -> float:
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    out = []
    for i, theta in enumerate(_rope_angles(d, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        keep = 1.0 - ramp
        out.append(theta / factor * (1.0 - keep) + theta * keep)
    return out


def _close(tensor: torch.Tensor, values: list[float]) -> bool:
    return torch.allclose(tensor.double(), torch.tensor(values, dtype=torch.float64), rtol=1e-5)


@pytest.mark.parametrize("d, base", [(8, 10000.0), (64, 10000.0), (128, 500000.0)])
def test_rope_frequencies_each_scaling(d: int, base: float) -> None:
    plain = _rope_angles(d, base)
    inv, scale = rope_inverse_frequencies(d, base)
    assert inv.shape == (d // 2,) and scale == 1.0 and _close(inv, plain)

    inv, scale = rope_inverse_frequencies(d, base, scaling="linear", factor=4.0)
    assert scale == 1.0 and _close(inv, [t / 4.0 for t in plain])

    ntk_base = base * 4.0 ** (d / (d - 2))
    inv, _ = rope_inverse_frequencies(d, base, scaling="ntk", factor=4.0)
    assert _close(inv, _rope_angles(d, ntk_base))
    assert inv[0].item() == pytest.approx(1.0)  # fastest pair untouched
    assert inv[-1].item() == pytest.approx(plain[-1] / 4.0 ** ((d - 2) / (d - 2)), rel=1e-5)

    for seq_len in (None, 100, 256):
        inv, _ = rope_inverse_frequencies(
            d, base, scaling="dynamic", factor=2.0, original_max_len=256, seq_len=seq_len
        )
        assert _close(inv, plain)
    dyn_base = base * ((2.0 * 1000 / 256) - 1.0) ** (d / (d - 2))
    inv, _ = rope_inverse_frequencies(
        d, base, scaling="dynamic", factor=2.0, original_max_len=256, seq_len=1000
    )
    assert _close(inv, _rope_angles(d, dyn_base))

    for orig in (2048, 8192):  # d=64, L=8192: correction dim 12.9 (floor 12, not 13)
        inv, scale = rope_inverse_frequencies(
            d, base, scaling="yarn", factor=4.0, original_max_len=orig
        )
        assert _close(inv, _yarn_reference(d, base, 4.0, orig))
        assert scale == pytest.approx(0.1 * math.log(4.0) + 1.0)


@pytest.mark.parametrize("d, base", [(16, 10000.0), (64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("orig, s", [(16, 2.0), (2048, 8.0), (8192, 4.0)])
def test_yarn_paper_conditions_on_rotations(d: int, base: float, orig: int, s: float) -> None:
    """Peng et al. 2023, sec. 3.2: with r_i = L / lambda_i (turns of pair i over the original
    length L, lambda_i = 2 pi / theta_i), pairs with r > beta = 32 keep theta_i, pairs with
    r < alpha = 1 get theta_i / s, the rest lie in between, less interpolated as r grows."""
    inv, scale = rope_inverse_frequencies(d, base, scaling="yarn", factor=s, original_max_len=orig)
    assert scale == pytest.approx(0.1 * math.log(s) + 1.0)
    previous_keep = 1.0
    for i, theta in enumerate(_rope_angles(d, base)):
        turns = orig / (2 * math.pi / theta)
        got = inv[i].item()
        if turns > 32.0:
            assert got == pytest.approx(theta, rel=1e-6), (i, turns)
        elif turns < 1.0:
            assert got == pytest.approx(theta / s, rel=1e-6), (i, turns)
        else:
            assert theta / s * (1 - 1e-6) <= got <= theta * (1 + 1e-6), (i, turns)
        keep = (got - theta / s) / (theta - theta / s)  # 1: extrapolated, 0: interpolated
        assert keep <= previous_keep + 1e-5
        previous_keep = keep


def test_yarn_keeps_fast_pairs_and_interpolates_slow_pairs() -> None:
    plain = torch.tensor(_rope_angles(64, 10000.0))
    inv, _ = rope_inverse_frequencies(64, scaling="yarn", factor=4.0, original_max_len=2048)
    # correction range for d=64, base 1e4, L=2048: dims 8 (beta_fast=32) to 21 (beta_slow=1)
    assert torch.allclose(inv[:9], plain[:9])
    assert torch.allclose(inv[21:], plain[21:] / 4.0)
    middle = inv[9:21] / plain[9:21]
    assert torch.all((middle < 1.0) & (middle > 0.25))
    _, scale = rope_inverse_frequencies(64, scaling="yarn", factor=1.0, original_max_len=2048)
    assert scale == 1.0


def test_rope_frequencies_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"factor=0"):
        rope_inverse_frequencies(8, scaling="linear", factor=0)
    with pytest.raises(ValueError, match=r"factor=-2"):
        rope_inverse_frequencies(8, scaling="yarn", factor=-2, original_max_len=16)
    with pytest.raises(ValueError, match=r"scaling='foo'.*'linear'.*'yarn'"):
        rope_inverse_frequencies(8, scaling="foo")
    with pytest.raises(ValueError, match=r"original_max_len=None"):
        rope_inverse_frequencies(8, scaling="dynamic", factor=2.0)
    with pytest.raises(ValueError, match=r"head_dim=7"):
        rope_inverse_frequencies(7)


def _hf_rotary_embedding(d: int, base: float, orig: int, rope: dict):
    """Hugging Face's LLaMA rotary module for ``rope`` (``rope_type`` + its parameters)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    sizes = {"hidden_size": d * 4, "num_attention_heads": 4, "max_position_embeddings": orig}
    if int(transformers.__version__.split(".")[0]) >= 5:  # one rope_parameters dict
        config = LlamaConfig(**sizes, rope_parameters={**rope, "rope_theta": base,
                                                       "original_max_position_embeddings": orig})
    else:  # 4.x: rope_theta + rope_scaling; the original length is max_position_embeddings
        scaling = None if rope["rope_type"] == "default" else rope
        config = LlamaConfig(**sizes, rope_theta=base, rope_scaling=scaling)
    return LlamaRotaryEmbedding(config=config)


# (our RotaryPositionalEncoding settings, HF rope parameters, sequence length)
HF_ROPE_CASES = {
    "none": ({}, {"rope_type": "default"}, 40),
    "base_500000": ({"base": 500000.0}, {"rope_type": "default"}, 40),
    "linear": ({"scaling": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0}, 40),
    # static NTK == HF dynamic NTK with factor 1 at L' = s * L: base * (L'/L)^(d/(d-2))
    "ntk": ({"scaling": "ntk", "factor": 4.0}, {"rope_type": "dynamic", "factor": 1.0}, 4 * 512),
    "dynamic_short": ({"scaling": "dynamic", "factor": 2.0},
                      {"rope_type": "dynamic", "factor": 2.0}, 300),
    "dynamic_long": ({"scaling": "dynamic", "factor": 2.0},
                     {"rope_type": "dynamic", "factor": 2.0}, 2000),
    "yarn": ({"scaling": "yarn", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0}, 40),
    "yarn_16": ({"scaling": "yarn", "factor": 16.0}, {"rope_type": "yarn", "factor": 16.0}, 40),
}


@pytest.mark.parametrize("case", list(HF_ROPE_CASES))
def test_rope_scalings_match_huggingface(case: str) -> None:
    """Inverse frequencies, attention scale and rotated q/k equal HF LLaMA's rotary module."""
    ours_kwargs, hf_rope, seq_len = HF_ROPE_CASES[case]
    ours_kwargs = dict(ours_kwargs)
    d, orig = 64, 512
    base = ours_kwargs.pop("base", 10000.0)
    hf = _hf_rotary_embedding(d, base, orig, hf_rope)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 4, seq_len, d, generator=g).unbind(0)  # (1, H, T, d) each
    positions = torch.arange(seq_len)
    hf_cos, hf_sin = hf(q, positions[None])  # (1, T, d): cat(freqs, freqs), times the scale
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)

    pe = RotaryPositionalEncoding(head_dim=d, base=base, style="half", original_max_len=orig,
                                  **ours_kwargs)
    our_q, our_k = pe(q, k, positions)
    assert torch.allclose(pe.inv_freq, hf.inv_freq.float(), rtol=1e-5), case
    assert pe.attention_scale == pytest.approx(hf.attention_scaling), case
    assert torch.allclose(our_q, hf_q, atol=1e-4) and torch.allclose(our_k, hf_k, atol=1e-4)
    if case != "none":  # the scaling really changed something (except dynamic below L)
        plain = rope_inverse_frequencies(d, 10000.0)[0]
        assert torch.allclose(pe.inv_freq, plain) == (case == "dynamic_short"), case


# --------------------------------------------------------------------------------------------
# RotaryPositionalEncoding


@pytest.mark.parametrize("style", STYLES)
def test_rotary_module_matches_apply_rotary(style: str) -> None:
    pe = RotaryPositionalEncoding(head_dim=16, base=500000.0, style=style)
    q, k = torch.randn(2, 3, 10, 16), torch.randn(2, 1, 10, 16)
    pos = torch.arange(10)
    q2, k2 = pe(q, k, pos)
    assert q2.shape == q.shape and k2.shape == k.shape
    assert torch.allclose(q2, apply_rotary(q, pos, base=500000.0, style=style), atol=1e-6)
    assert torch.allclose(k2, apply_rotary(k, pos, base=500000.0, style=style), atol=1e-6)
    # cache grown then sliced gives the same numbers as a fresh module
    pe(torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16), torch.arange(40))
    q3, _ = pe(q, k, pos)
    assert torch.allclose(q3, q2)


def test_rotary_partial_leaves_tail_unchanged() -> None:
    pe = RotaryPositionalEncoding(head_dim=16, rotary_fraction=0.25)
    assert pe.rot == 4
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    q2, k2 = pe(q, k, torch.arange(6))
    assert torch.equal(q2[..., 4:], q[..., 4:]) and torch.equal(k2[..., 4:], k[..., 4:])
    assert torch.allclose(q2[..., :4], apply_rotary(q[..., :4], torch.arange(6)), atol=1e-6)
    assert not torch.allclose(q2[..., :4], q[..., :4])


def test_rotary_bad_rotary_dimension_names_values() -> None:
    with pytest.raises(ValueError, match=r"6.*0\.5.*rot.*3|rot.*6.*0\.5.*3") as info:
        RotaryPositionalEncoding(head_dim=6, rotary_fraction=0.5)
    assert "head_dim" in str(info.value) and "rotary_fraction" in str(info.value)
    with pytest.raises(ValueError, match=r"7.*even"):
        RotaryPositionalEncoding(head_dim=7)
    for fraction in (0.0, 1.5, -0.5):
        with pytest.raises(ValueError, match=rf"rotary_fraction={fraction}"):
            RotaryPositionalEncoding(head_dim=8, rotary_fraction=fraction)
    with pytest.raises(ValueError, match=r"style='foo'"):
        RotaryPositionalEncoding(head_dim=8, style="foo")
    with pytest.raises(ValueError, match=r"scaling='bar'"):
        RotaryPositionalEncoding(head_dim=8, scaling="bar")
    with pytest.raises(ValueError, match=r"original_max_len"):
        RotaryPositionalEncoding(head_dim=8, scaling="yarn", factor=2.0)


def test_rotary_yarn_scales_cos_sin_like_hf() -> None:
    pe = RotaryPositionalEncoding(head_dim=32, scaling="yarn", factor=8.0, original_max_len=64)
    s = 0.1 * math.log(8.0) + 1.0
    assert pe.attention_scale == pytest.approx(s)
    q = torch.randn(1, 1, 5, 32)
    q2, k2 = pe(q, q.clone(), torch.arange(5))
    assert torch.allclose(q2.norm(dim=-1), s * q.norm(dim=-1), atol=1e-5)
    # logits scale by s^2 (the paper's 1/t) and keep the relative property
    scores = (q2 @ k2.transpose(-1, -2))[0, 0]
    assert torch.allclose(scores.diagonal(), s**2 * (q[0, 0] ** 2).sum(-1), rtol=1e-5)


def test_rotary_dynamic_recomputes_past_original_length() -> None:
    pe = RotaryPositionalEncoding(head_dim=16, scaling="dynamic", factor=2.0, original_max_len=8)
    plain = RotaryPositionalEncoding(head_dim=16)
    q = torch.randn(1, 1, 20, 16)
    short_dyn, _ = pe(q[:, :, :8], q[:, :, :8], torch.arange(8))
    short_plain, _ = plain(q[:, :, :8], q[:, :, :8], torch.arange(8))
    assert torch.allclose(short_dyn, short_plain)
    long_dyn, _ = pe(q, q, torch.arange(20))
    inv, _ = rope_inverse_frequencies(
        16, scaling="dynamic", factor=2.0, original_max_len=8, seq_len=20
    )
    angles = torch.arange(20).float()[:, None] * inv[None, :]
    expected = torch.cat(
        [
            q[..., :8] * angles.cos() - q[..., 8:] * angles.sin(),
            q[..., 8:] * angles.cos() + q[..., :8] * angles.sin(),
        ],
        dim=-1,
    )
    assert torch.allclose(long_dyn, expected, atol=1e-5)
    assert not torch.allclose(long_dyn[..., 1:, :], plain(q, q, torch.arange(20))[0][..., 1:, :])
    again, _ = pe(q[:, :, :8], q[:, :, :8], torch.arange(8))  # back below: restored
    assert torch.allclose(again, short_plain)


# --------------------------------------------------------------------------------------------
# alibi


def _press_get_slopes(n: int) -> list[float]:
    """get_slopes from github.com/ofirpress/attention_with_linear_biases, rewritten."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + _press_get_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes() -> None:
    assert alibi_slopes(8).tolist() == [1 / 2**i for i in range(1, 9)]
    assert alibi_slopes(1).tolist() == [1 / 256]
    for n in (2, 3, 5, 6, 12, 16, 24):
        assert torch.allclose(alibi_slopes(n).double(), torch.tensor(_press_get_slopes(n)).double())
    # 12 heads: 8 slopes of the 8-head set, then 1/2^0.5, 1/2^1.5, ... of the 16-head set
    assert alibi_slopes(12)[8].item() == pytest.approx(2**-0.5)
    with pytest.raises(ValueError, match=r"n_heads=0"):
        alibi_slopes(0)


def test_alibi_causal_bias_rows() -> None:
    pe = ALiBiPositionalBias(n_heads=4)
    bias = pe(6, 6)
    slopes = alibi_slopes(4)
    assert bias.shape == (4, 6, 6)
    for h in range(4):
        for i in range(6):
            for j in range(i + 1):
                assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))
            assert torch.all(bias[h, i, i + 1 :] == 0)  # future: 0, masked by the model
    assert pe(3, 5).shape == (4, 3, 5)
    assert torch.equal(pe(3, 5), ALiBiPositionalBias(n_heads=4)(3, 5))  # cached slice == fresh
    assert torch.equal(pe(3, 5), pe(5, 5)[:, 2:])  # the queries are the last 3 of 5 positions
    with pytest.raises(ValueError, match=r"q_len=6 is not valid for k_len=5"):
        pe(6, 5)


def test_alibi_bidirectional_forms() -> None:
    sym = ALiBiPositionalBias(n_heads=4, causal=False, symmetric="abs")(5, 5)
    assert torch.equal(sym, sym.transpose(-1, -2))
    assert sym[1, 0, 3].item() == pytest.approx(-alibi_slopes(4)[1].item() * 3)

    split = ALiBiPositionalBias(n_heads=4, causal=False, symmetric="split")(5, 5)
    assert not torch.equal(split, split.transpose(-1, -2))
    left, right = split[:2], split[2:]
    assert torch.isinf(left.triu(1)[:, 0, 1:]).all() and torch.isfinite(left.tril()).all()
    assert torch.isneginf(right[:, 1:, 0]).all()
    assert torch.all(split.diagonal(dim1=-2, dim2=-1) == 0)  # no row is fully masked
    assert right[0, 1, 4].item() == pytest.approx(-alibi_slopes(2)[0].item() * 3)


def test_alibi_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"symmetric='both'.*'abs'.*'split'"):
        ALiBiPositionalBias(n_heads=4, causal=False, symmetric="both")
    with pytest.raises(ValueError, match=r"n_heads=0"):
        ALiBiPositionalBias(n_heads=0)
    with pytest.raises(ValueError, match=r"n_heads=1"):
        ALiBiPositionalBias(n_heads=1, causal=False, symmetric="split")


# --------------------------------------------------------------------------------------------
# t5


def _t5_bucket_reference(rel: int, bidirectional: bool, num_buckets: int, max_distance: int):
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            bucket += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return bucket + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 50), (8, 20)])
def test_t5_bucket_matches_reference(bidirectional: bool, num_buckets: int, max_distance: int):
    rel = torch.arange(-300, 301)
    got = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    assert got.dtype == torch.long
    expected = [
        _t5_bucket_reference(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()
    ]
    assert got.tolist() == expected
    assert int(got.min()) >= 0 and int(got.max()) == num_buckets - 1


def test_t5_bucket_exact_small_distances_and_monotone() -> None:
    rel = torch.arange(-7, 8)
    bi = t5_relative_bucket(rel).tolist()
    assert bi == [7, 6, 5, 4, 3, 2, 1, 0, 17, 18, 19, 20, 21, 22, 23]
    uni = t5_relative_bucket(rel, bidirectional=False).tolist()
    assert uni == [7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    left = t5_relative_bucket(-torch.arange(0, 500))
    right = t5_relative_bucket(torch.arange(1, 500))
    assert torch.all(left[1:] >= left[:-1]) and torch.all(right[1:] >= right[:-1])
    assert int(left[-1]) == 15 and int(right[-1]) == 31


def test_t5_relative_bias_module() -> None:
    pe = T5RelativeBias(n_heads=3, num_buckets=16, max_distance=32)
    bias = pe(6, 9)  # the queries are the last 6 of 9 positions: query i at 3 + i
    assert bias.shape == (3, 6, 9)
    weight = pe.relative_attention_bias.weight
    for i, j in ((0, 0), (2, 7), (5, 1)):
        bucket = _t5_bucket_reference(j - (3 + i), True, 16, 32)
        assert torch.equal(bias[:, i, j], weight[bucket])
    assert torch.equal(bias[:, 1:, 1:], bias[:, :-1, :-1][:, :5, :8])  # Toeplitz in (i, j)
    bias.sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
    assert pe(4, 4).shape == (3, 4, 4)
    with pytest.raises(ValueError, match=r"n_heads=0"):
        T5RelativeBias(n_heads=0)


# --------------------------------------------------------------------------------------------
# learned


def test_learned_pe_table_and_length_error() -> None:
    pe = LearnedPositionalEncoding(d_model=8, max_len=5)
    assert pe(torch.arange(5)).shape == (5, 8)
    assert 0.01 < LearnedPositionalEncoding(d_model=64, max_len=64).weight.std().item() < 0.03
    with pytest.raises(ValueError, match=r"6.*max_len=5"):
        pe(torch.arange(6))
    with pytest.raises(ValueError, match=r"init='zeros'.*'normal'.*'sinusoidal'"):
        LearnedPositionalEncoding(d_model=8, max_len=5, init="zeros")
    sin_pe = LearnedPositionalEncoding(d_model=8, max_len=5, init="sinusoidal")
    assert torch.allclose(sin_pe.weight, sinusoidal_table(5, 8))
    assert isinstance(sin_pe.weight, nn.Parameter)


def test_learned_pe_interpolation() -> None:
    pe = LearnedPositionalEncoding(d_model=4, max_len=5, interpolate=True)
    assert torch.equal(pe(torch.arange(5)), pe.weight)
    long = pe(torch.arange(9))  # 2 * (5 - 1) + 1: every other row is an original row
    assert long.shape == (9, 4)
    assert torch.allclose(long[0::2], pe.weight, atol=1e-6)
    assert torch.allclose(long[1], (pe.weight[0] + pe.weight[1]) / 2, atol=1e-6)
    long.sum().backward()
    assert pe.weight.grad is not None


# --------------------------------------------------------------------------------------------
# protocol


def _builtins() -> list[nn.Module]:
    return [
        NoPositionalEncoding(),
        SinusoidalPositionalEncoding(d_model=8),
        LearnedPositionalEncoding(d_model=8, max_len=16),
        RotaryPositionalEncoding(head_dim=8),
        ALiBiPositionalBias(n_heads=2),
        T5RelativeBias(n_heads=2),
    ]


def test_builtins_follow_protocol() -> None:
    kinds = set()
    for module in _builtins():
        check_positional_module(module)
        kinds.add(module.kind)
    assert kinds == set(PE_KINDS)


def test_protocol_rejects_bad_modules() -> None:
    class BadKind(nn.Module):
        kind = "absolute"

        def forward(self, positions):
            return positions

    class NoForward(nn.Module):
        kind = "bias"

    class WrongSignature(nn.Module):
        kind = "rotary"

        def forward(self, x):
            return x

    class NoKind(nn.Module):
        def forward(self, positions):
            return positions

    with pytest.raises(TypeError, match=r"BadKind.*'absolute'.*'none'.*'additive'.*'rotary'"):
        check_positional_module(BadKind())
    with pytest.raises(TypeError, match=r"NoForward.*'bias'.*forward\(q_len, k_len\)"):
        check_positional_module(NoForward())
    with pytest.raises(TypeError, match=r"WrongSignature.*forward\(q, k, positions\)"):
        check_positional_module(WrongSignature())
    with pytest.raises(TypeError, match=r"NoKind.*kind"):
        check_positional_module(NoKind())
    with pytest.raises(TypeError, match=r"not a torch.nn.Module"):
        check_positional_module(object())


def test_hydra_instantiate_keyword_config() -> None:
    hydra_utils = pytest.importorskip("hydra.utils")
    pe = hydra_utils.instantiate(
        {
            "_target_": "transformer_lab.components.positional.RotaryPositionalEncoding",
            "head_dim": 8,
            "style": "interleaved",
            "scaling": "yarn",
            "factor": 2.0,
            "original_max_len": 32,
        }
    )
    check_positional_module(pe)
    assert pe.style == "interleaved" and pe.attention_scale > 1.0
