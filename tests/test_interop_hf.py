"""Hugging Face interop (issue 14): random-init ``transformers`` models saved with
``save_pretrained`` into a temp dir, imported with ``from_hf``: equal logits (fp32, <= 1e-5)
at several lengths, including beyond ``original_max_position_embeddings`` for each RoPE
scaling; tlab -> HF -> tlab exact; tlab's MoE against Mixtral's sparse MoE block. Skipped with
a reason when the ``hf`` extra is not installed."""

from __future__ import annotations

import pytest
import torch

from transformer_lab.components.moe import MoEFeedForward
from transformer_lab.errors import ConfigError

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'transformer_lab[hf]')")
from transformer_lab.interop.hf import from_hf, to_hf  # noqa: E402

SMALL = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=64)
ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0,
                "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16, "beta_fast": 16.0, "beta_slow": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}
LENGTHS = (5, 16, 40, 80)  # > original_max_position_embeddings (16) and max (64)


def _hf(kind: str, rope: str = "default", **extra):
    torch.manual_seed(0)
    if kind == "mixtral":
        config = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2,
                                            rope_parameters=ROPE[rope], **extra)
        return transformers.MixtralForCausalLM(config).eval()
    config = transformers.LlamaConfig(**SMALL, rope_parameters=ROPE[rope], **extra)
    return transformers.LlamaForCausalLM(config).eval()


def _max_diff(hf, model, length: int) -> float:
    tokens = torch.randint(0, 50, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = hf(tokens).logits
        assert expected.abs().max() > 1e-3  # a real comparison, not of zeros
        return (expected - model(tokens)).abs().max().item()


@pytest.mark.parametrize("kind, rope", [("llama", r) for r in ROPE] + [("mixtral", "default"),
                                                                        ("mixtral", "yarn")])
def test_saved_checkpoint_imports_with_equal_logits(tmp_path, kind, rope):
    hf = _hf(kind, rope)
    hf.save_pretrained(tmp_path)
    cfg, model = from_hf(str(tmp_path))
    assert cfg.pe.scaling == {"default": "none"}.get(rope, rope)
    for length in LENGTHS:
        assert _max_diff(hf, model, length) <= 1e-5, (kind, rope, length)


@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_round_trip_is_exact(kind):
    hf = _hf(kind, "yarn")
    cfg, model = from_hf(hf)
    back = to_hf(model, cfg)
    assert hf.state_dict().keys() == back.state_dict().keys()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(tensor, back.state_dict()[name]), name
    _, again = from_hf(back)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_qwen2_style_biases_are_expressed():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**SMALL)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    cfg, model = from_hf(hf)
    assert cfg.model.qkv_bias is True and cfg.model.out_bias is False
    assert _max_diff(hf, model, 12) <= 1e-5


def test_unsupported_setting_is_named(tmp_path):
    hf = _hf("llama", hidden_act="gelu")
    with pytest.raises(ConfigError, match="hidden_act='gelu'"):
        from_hf(hf)
    with pytest.raises(ConfigError, match="not a local Hugging Face model directory"):
        from_hf(str(tmp_path))


def test_moe_matches_mixtral_sparse_block():
    """Router logits, the experts chosen and the output of tlab's MoE equal HF Mixtral's."""
    from transformers.models.mixtral import modeling_mixtral as mm

    torch.manual_seed(0)
    config = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    block = mm.MixtralSparseMoeBlock(config).eval()
    ours = MoEFeedForward(32, 48, n_experts=4, top_k=2, expert="swiglu", bias=False)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
        ours.gate.weight.copy_(block.gate.weight)
        for e, expert in enumerate(ours.experts):
            gate, up = block.experts.gate_up_proj[e].chunk(2, dim=0)
            expert.gate_proj.weight.copy_(gate)
            expert.up_proj.weight.copy_(up)
            expert.down_proj.weight.copy_(block.experts.down_proj[e])
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = block(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        got = ours(x)
        logits = ours.gate(x.reshape(-1, 32))
        _, hf_logits_scores, hf_chosen = block.gate(x)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits, block.gate(x)[0], atol=0, rtol=0)
    assert torch.equal(ours.route(logits)[1], hf_chosen)
