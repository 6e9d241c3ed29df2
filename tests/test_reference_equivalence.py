"""Our components against independent implementations.

* RoPE ``style="half"`` vs Hugging Face LLaMA (``LlamaRotaryEmbedding``, ``rotate_half``,
  ``apply_rotary_pos_emb``); ``style="interleaved"`` vs Hugging Face GPT-J
  (``rotate_every_two``; the complex-number form is in ``test_positional.py``).
* ``t5_relative_bucket`` vs ``T5Attention._relative_position_bucket``.
* ALiBi slopes vs BLOOM's ``build_alibi_tensor`` (Press et al.'s ``get_slopes`` is in
  ``test_positional.py``).
* Our pre-LN GELU block vs ``torch.nn.TransformerEncoderLayer(norm_first=True)`` with the
  weights copied over (needs only torch).

The Hugging Face tests need the optional ``transformers`` package
(``pip install 'transformer_lab[reference]'``) and are skipped with that reason without it.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_lab.components.attention import AttentionInputs
from transformer_lab.components.positional import alibi_slopes, apply_rotary, t5_relative_bucket
from transformer_lab.model import build_model

NO_TRANSFORMERS = "transformers is not installed (pip install 'transformer_lab[reference]')"
HEAD_SIZES = (8, 32, 64, 128)
BASES = (10000.0, 500000.0, 100.0)


def _llama_cos_sin(head_dim: int, base: float, positions: torch.Tensor):
    """cos, sin (1, T, head_dim) from HF's LlamaRotaryEmbedding, whatever the config API."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama", reason=NO_TRANSFORMERS)
    from transformers import LlamaConfig

    attempts = (
        {"rope_parameters": {"rope_type": "default", "rope_theta": base}},  # transformers >= 5
        {"rope_theta": base},  # transformers 4.x
    )
    for extra in attempts:
        try:
            config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, **extra)
            rotary = llama.LlamaRotaryEmbedding(config=config)
            x = torch.zeros(1, len(positions), head_dim, dtype=torch.float64)
            cos, sin = rotary(x, positions[None])
        except (TypeError, KeyError, ValueError):
            continue
        inv_freq = rotary.inv_freq.double()
        expected = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if torch.allclose(inv_freq, expected, rtol=1e-6):
            return cos, sin
    pytest.skip("this transformers version builds LlamaRotaryEmbedding differently")


@pytest.mark.parametrize("head_dim", HEAD_SIZES)
@pytest.mark.parametrize("base", BASES)
def test_rope_half_matches_hf_llama(head_dim: int, base: float) -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama", reason=NO_TRANSFORMERS)
    positions = torch.arange(0, 200, 7)  # (T,)
    cos, sin = _llama_cos_sin(head_dim, base, positions)  # (1, T, head_dim)
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(2, 3, len(positions), head_dim, generator=g)  # (B, H, T, Dh)
    k = torch.randn(2, 3, len(positions), head_dim, generator=g)
    q_ref, k_ref = llama.apply_rotary_pos_emb(q, k, cos.float(), sin.float())
    torch.testing.assert_close(apply_rotary(q, positions, base=base, style="half"), q_ref,
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rotary(k, positions, base=base, style="half"), k_ref,
                               atol=1e-5, rtol=1e-5)
    # and HF's rotate_half is the pairing (x[i], x[i + d/2]) that style="half" uses
    x = torch.arange(head_dim, dtype=torch.float32)
    half = head_dim // 2
    assert llama.rotate_half(x).tolist() == torch.cat([-x[half:], x[:half]]).tolist()


@pytest.mark.parametrize("head_dim", HEAD_SIZES)
@pytest.mark.parametrize("base", BASES)
def test_rope_interleaved_matches_hf_gptj(head_dim: int, base: float) -> None:
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj", reason=NO_TRANSFORMERS)
    positions = torch.arange(0, 150, 5)
    if base == 10000.0:  # GPT-J's own table (base fixed at 10000)
        sincos = gptj.create_sinusoidal_positions(int(positions.max()) + 1, head_dim)[positions]
    else:
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = positions.float()[:, None] * inv_freq[None]
        sincos = torch.cat([angles.sin(), angles.cos()], dim=-1)  # GPT-J's layout
    sin, cos = torch.split(sincos[None], head_dim // 2, dim=-1)  # (1, T, Dh/2) each
    g = torch.Generator().manual_seed(head_dim)
    x = torch.randn(2, len(positions), 3, head_dim, generator=g)  # GPT-J: (B, T, H, Dh)
    expected = gptj.apply_rotary_pos_emb(x, sin, cos)
    ours = apply_rotary(x.transpose(1, 2), positions, base=base, style="interleaved")
    torch.testing.assert_close(ours.transpose(1, 2), expected, atol=1e-5, rtol=1e-5)
    # style="half" is not GPT-J's pairing: a mix-up is visible
    mixed = apply_rotary(x.transpose(1, 2), positions, base=base, style="half").transpose(1, 2)
    assert (mixed - expected).abs().max() > 0.1


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 64), (8, 20), (64, 512)])
def test_t5_bucket_matches_hf_t5(bidirectional: bool, num_buckets: int, max_distance: int):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5", reason=NO_TRANSFORMERS)
    query = torch.arange(300)[:, None]
    key = torch.arange(300)[None, :]
    relative = key - query  # (300, 300), key_pos - query_pos as in HF's compute_bias
    expected = t5.T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    ours = t5_relative_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, expected)


def test_alibi_slopes_match_hf_bloom() -> None:
    bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom",
                                reason=NO_TRANSFORMERS)
    mask = torch.ones(1, 3)
    for n_heads in range(1, 33):
        alibi = bloom.build_alibi_tensor(mask, n_heads, torch.float32)  # (H, 1, T): m_h * pos
        torch.testing.assert_close(alibi_slopes(n_heads), alibi[:, 0, 1], rtol=1e-6, atol=0)


# --------------------------------------------------------------------------------------------
# our pre-LN GELU block vs torch.nn.TransformerEncoderLayer(norm_first=True)


def _copy_into_torch_layer(block: nn.Module, layer: nn.TransformerEncoderLayer) -> None:
    """Our fused qkv_proj is laid out like torch's in_proj_weight: rows [Q; K; V]."""
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(block.attention.qkv_proj.weight)
        layer.self_attn.in_proj_bias.copy_(block.attention.qkv_proj.bias)
        layer.self_attn.out_proj.weight.copy_(block.attention.out_proj.weight)
        layer.self_attn.out_proj.bias.copy_(block.attention.out_proj.bias)
        layer.linear1.weight.copy_(block.feedforward.up_proj.weight)
        layer.linear1.bias.copy_(block.feedforward.up_proj.bias)
        layer.linear2.weight.copy_(block.feedforward.down_proj.weight)
        layer.linear2.bias.copy_(block.feedforward.down_proj.bias)
        for ours, theirs in ((block.norm1, layer.norm1), (block.norm2, layer.norm2)):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
            theirs.eps = ours.eps


@pytest.mark.parametrize("d_model, n_heads, d_ff", [(16, 2, 64), (64, 4, 256), (96, 12, 384)])
@pytest.mark.parametrize("train_mode", [False, True])
def test_pre_ln_gelu_block_matches_torch_encoder_layer(spec_for, d_model: int, n_heads: int,
                                                       d_ff: int, train_mode: bool) -> None:
    spec, _ = spec_for("block=pre", "ffn=gelu", "pe=none", "norm_layer=layernorm",
                       "arch=encoder", f"model.d_model={d_model}", f"model.n_heads={n_heads}",
                       f"model.d_ff={d_ff}", "model.n_layers=1", "model.attn_bias=true",
                       "model.ffn_bias=true")
    torch.manual_seed(0)
    block = build_model(spec.model).blocks[0]
    with torch.no_grad():  # non-trivial norms and biases, so that every copy matters
        for name, p in block.named_parameters():
            if "norm" in name or p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
    _copy_into_torch_layer(block, layer)
    block.train(train_mode)
    layer.train(train_mode)
    x = torch.randn(3, 7, d_model, generator=torch.Generator().manual_seed(1))  # (B, T, D)
    ours = block(x, AttentionInputs(positions=torch.arange(7)))
    theirs = layer(x)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
