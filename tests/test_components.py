"""Feed-forward, norms, attention and blocks against their formulas and against each other."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.components.attention import (
    AttentionInputs,
    MultiHeadAttention,
)
from transformer_lab.components.block import DeepNormBlock, PostNormBlock, PreNormBlock
from transformer_lab.components.feedforward import (
    FeedForward,
    GatedFeedForward,
    make_activation,
)
from transformer_lab.components.norms import LayerNorm, RMSNorm, SequenceBatchNorm


def test_seed_ffn_parameter_count():
    """The seed writes 768*3072 + 3072 + 3072*768 + 768 = 4,721,664, but that sum is 4,722,432:
    its figure counts the first layer's bias (3072) and leaves out the second's (768)."""
    ffn = FeedForward(d_model=768, d_ff=3072, activation="relu", bias=True)
    assert sum(p.numel() for p in ffn.parameters()) == 768 * 3072 + 3072 + 3072 * 768 + 768
    assert sum(p.numel() for p in ffn.parameters()) == 4_722_432
    weights_and_first_bias = ffn.up_proj.weight.numel() + ffn.up_proj.bias.numel() + (
        ffn.down_proj.weight.numel())
    assert weights_and_first_bias == 4_721_664  # the source article's number
    no_bias = FeedForward(d_model=768, d_ff=3072, bias=False)
    assert sum(p.numel() for p in no_bias.parameters()) == 2 * 768 * 3072


def test_gated_two_thirds_rule_matches_two_matrix_ffn():
    plain = FeedForward(d_model=96, d_ff=384, bias=False)
    gated = GatedFeedForward(d_model=96, d_ff=384, bias=False, match_params=True)
    assert GatedFeedForward.hidden_size(384, True) == 256
    assert sum(p.numel() for p in gated.parameters()) == sum(p.numel() for p in plain.parameters())
    assert gated.gate_proj.out_features == 384 * 2 // 3


def test_init_is_normal_002_with_zero_bias():
    torch.manual_seed(0)
    ffn = FeedForward(d_model=256, d_ff=1024)
    assert abs(ffn.up_proj.weight.std().item() - 0.02) < 1e-3
    assert torch.count_nonzero(ffn.up_proj.bias) == 0
    assert torch.count_nonzero(ffn.down_proj.bias) == 0


@pytest.mark.parametrize(
    "name, reference",
    [
        ("relu", lambda x: x.clamp_min(0)),
        ("gelu", lambda x: x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))),
        ("gelu_tanh", lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi)
                                                           * (x + 0.044715 * x**3)))),
        ("swish", lambda x: x * torch.sigmoid(x)),
        ("leaky_relu", lambda x: torch.where(x > 0, x, 0.01 * x)),
    ],
)
def test_activations_match_their_formulas(name, reference):
    x = torch.linspace(-5, 5, 101)
    torch.testing.assert_close(make_activation(name)(x), reference(x))


def test_gelu_and_gelu_tanh_differ():
    x = torch.linspace(-3, 3, 61)
    assert (make_activation("gelu")(x) - make_activation("gelu_tanh")(x)).abs().max() > 1e-5


def test_unknown_activation_names_valid_ones():
    with pytest.raises(ValueError, match="'mish'.*gelu.*relu"):
        make_activation("mish")


def test_swiglu_forward_is_gate_times_up():
    torch.manual_seed(0)
    ffn = GatedFeedForward(d_model=8, d_ff=16, activation="swish", bias=False)
    x = torch.randn(2, 3, 8)
    expected = ffn.down_proj(F.silu(ffn.gate_proj(x)) * ffn.up_proj(x))
    torch.testing.assert_close(ffn(x), expected)


def test_rmsnorm_and_layernorm_formulas():
    x = torch.randn(2, 5, 16) * 3 + 1
    rms = RMSNorm(16, eps=1e-6)(x)
    torch.testing.assert_close(rms, x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6))
    ln = LayerNorm(16)(x)
    torch.testing.assert_close(ln.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)


def test_batchnorm_normalises_over_batch_and_positions():
    x = torch.randn(4, 6, 8) * 2 + 5
    y = SequenceBatchNorm(8).train()(x)
    torch.testing.assert_close(y.mean(dim=(0, 1)), torch.zeros(8), atol=1e-5, rtol=0)
    assert y.shape == x.shape


def _attention_inputs(seq: int, causal: bool = False) -> AttentionInputs:
    return AttentionInputs(positions=torch.arange(seq), is_causal=causal)


def test_attention_matches_manual_softmax_and_weights_path():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=4)
    x = torch.randn(3, 7, 16)
    fast = attn(x, _attention_inputs(7, causal=True))
    inputs = _attention_inputs(7, causal=True)
    inputs.need_weights = True
    slow = attn(x, inputs)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    weights = attn.last_weights
    assert weights.shape == (3, 4, 7, 7)
    assert torch.all(weights.triu(1) == 0)  # causal: nothing from the future
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 7))


@pytest.mark.parametrize("mask_kind", ["causal", "additive"])
def test_attention_with_weights_equals_sdpa_values_and_gradients(mask_kind):
    """The written-out product ``need_weights`` uses computes what SDPA computes, gradients
    included (fp32: both sum 7 products of O(1) terms per score)."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=4)
    x = torch.randn(3, 7, 16, requires_grad=True)
    if mask_kind == "causal":
        inputs = _attention_inputs(7, causal=True)
    else:  # an ALiBi-like bias per head
        inputs = AttentionInputs(positions=torch.arange(7), mask=torch.randn(4, 7, 7))
    fused = attn(x, inputs)
    (fused_grad,) = torch.autograd.grad(fused.square().sum(), x)
    inputs.need_weights = True
    written = attn(x, inputs)
    (written_grad,) = torch.autograd.grad(written.square().sum(), x)
    torch.testing.assert_close(written, fused, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(written_grad, fused_grad, atol=1e-4, rtol=1e-4)
    assert attn.last_weights.shape == (3, 4, 7, 7)


def test_causal_attention_output_ignores_future_tokens():
    torch.manual_seed(0)
    attn = MultiHeadAttention(d_model=16, n_heads=2)
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 16)
    a, b = attn(x, _attention_inputs(6, True)), attn(y, _attention_inputs(6, True))
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def _block(cls, **kwargs):
    torch.manual_seed(0)
    return cls(d_model=16, attention=MultiHeadAttention(16, 2),
               feedforward=FeedForward(16, 32), make_norm=LayerNorm, **kwargs)


def test_post_and_pre_norm_differ_where_they_should():
    x = torch.randn(2, 5, 16) * 4 + 2
    inputs = _attention_inputs(5)
    post, pre = _block(PostNormBlock), _block(PreNormBlock)
    pre.load_state_dict(post.state_dict())  # identical weights, different wiring
    y_post, y_pre = post(x, inputs), pre(x, inputs)
    # post-LN output is normalised per token; pre-LN keeps the residual stream's scale
    torch.testing.assert_close(y_post.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    assert y_pre.mean(-1).abs().max() > 0.5
    # pre-LN = x + f(LN(x)): recompute by hand
    h = x + pre.attention(pre.norm1(x), inputs)
    torch.testing.assert_close(y_pre, h + pre.feedforward(pre.norm2(h)))
    assert pre.needs_final_norm and not post.needs_final_norm


def test_residual_scale_multiplies_each_branch():
    x = torch.randn(2, 5, 16)
    inputs = _attention_inputs(5)
    half = _block(PreNormBlock, residual_scale=0.5)
    one = _block(PreNormBlock)
    h = x + 0.5 * one.attention(one.norm1(x), inputs)
    torch.testing.assert_close(half(x, inputs), h + 0.5 * one.feedforward(one.norm2(h)))


def test_deepnorm_constants_and_init_gain():
    torch.manual_seed(0)
    MultiHeadAttention(16, 2)  # same RNG draws as _block before its FFN
    reference = FeedForward(16, 32)
    block = _block(DeepNormBlock, n_layers=6)
    assert block.alpha == pytest.approx((2 * 6) ** 0.25)
    assert block.beta == pytest.approx((8 * 6) ** -0.25)
    scaled = reference.up_proj.weight * block.beta
    torch.testing.assert_close(block.feedforward.up_proj.weight, scaled)
