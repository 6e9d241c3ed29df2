"""The knobs of real architectures (issue 14): GQA/MQA, head size, logit scale, separate
biases, tied embeddings, embedding norm, parallel block, YaRN/Llama 3 RoPE settings and the
Mixture-of-Experts FFN. Each: bad values exit 2 before anything is written; the parameter
formula equals the built model; defaults leave the original model's numbers unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_refused, read_csv

from transformer_lab.components.attention import AttentionInputs, MultiHeadAttention
from transformer_lab.components.positional import RotaryPositionalEncoding
from transformer_lab.components.positional.rope_scaling import rope_inverse_frequencies
from transformer_lab.config.compose import compose
from transformer_lab.measures.parameters import matmul_weight_params, parameter_breakdown
from transformer_lab.model import build_model

KNOBS = [
    ["model.n_kv_heads=2"], ["model.n_kv_heads=1"], ["model.head_dim=6"],
    ["model.attn_scale=1.0"],
    ["model.qkv_bias=true", "model.out_bias=false", "model.attn_bias=false"],
    ["model.tie_embeddings=true"], ["model.embed_norm=true"], ["model.parallel_block=true"],
    ["pe.scaling=yarn", "pe.factor=4", "pe.original_max_len=8", "pe.beta_fast=16",
     "pe.beta_slow=2", "pe.attention_factor=1.2"],
    ["pe.scaling=llama3", "pe.factor=8", "pe.original_max_len=8"],
    ["ffn=moe"], ["ffn=moe", "ffn.expert=gelu", "ffn.top_k=1", "ffn.router=topk_then_softmax"],
    ["preset=llama"], ["preset=mixtral"], ["preset=gpt2"], ["preset=bert"],
    ["preset=t5_encoder"], ["preset=gpt_neox"],
]


def _built(spec_for, overrides: list[str]):
    sizes = [] if any(o.startswith("preset=") for o in overrides) else [
        "model.d_model=16", "model.n_heads=4"]  # a preset keeps its own toy sizes
    spec, _ = spec_for(*sizes, *overrides)
    return spec.model, build_model(spec.model, seed=0)


@pytest.mark.parametrize("overrides", KNOBS, ids=lambda o: " ".join(o))
def test_parameter_formula_equals_built_model(spec_for, overrides):
    spec, model = _built(spec_for, overrides)
    tokens = torch.randint(0, spec.vocab_size, (2, 6))
    assert model(tokens).shape == (2, 6, spec.vocab_size)
    assert parameter_breakdown(spec)["total"] == sum(p.numel() for p in model.parameters())


def test_defaults_keep_the_original_model_exactly(spec_for):
    """Every knob at its default builds the same weights and outputs as before the knobs."""
    spec, model = _built(spec_for, [])
    explicit, same = _built(spec_for, ["model.n_kv_heads=4", "model.head_dim=4",
                                       "model.qkv_bias=true", "model.out_bias=true",
                                       f"model.attn_scale={1 / math.sqrt(4)}"])
    tokens = torch.randint(0, spec.vocab_size, (2, 6))
    for (name, a), b in zip(model.state_dict().items(), same.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    torch.testing.assert_close(model(tokens), same(tokens), atol=1e-6, rtol=1e-6)
    assert matmul_weight_params(spec) == matmul_weight_params(explicit)


@pytest.mark.parametrize("n_kv_heads, head_dim", [(1, None), (2, None), (2, 6), (4, 10)])
def test_gqa_keeps_ropes_relative_property(n_kv_heads, head_dim):
    """Shifting every position by 7 leaves GQA/MQA attention with RoPE unchanged: q_m . k_n
    depends on n - m only, also when one K head serves several query heads."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, head_dim=head_dim)
    rope = RotaryPositionalEncoding(attention.head_dim)
    x = torch.randn(2, 5, 16)
    outs = [attention(x, AttentionInputs(positions=torch.arange(5) + shift, rotary=rope))
            for shift in (0, 7)]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    # and it is attention over grouped heads: K/V projections are H_kv heads wide
    assert attention.kv_size == n_kv_heads * attention.head_dim


def test_mqa_equals_mha_with_duplicated_kv_heads():
    torch.manual_seed(0)
    mqa = MultiHeadAttention(16, 4, n_kv_heads=1, bias=False)
    mha = MultiHeadAttention(16, 4, bias=False)
    q, k, v = mqa.qkv_proj.weight.split([16, 4, 4])
    with torch.no_grad():
        mha.qkv_proj.weight.copy_(torch.cat([q, k.repeat(4, 1), v.repeat(4, 1)]))
        mha.out_proj.weight.copy_(mqa.out_proj.weight)
    x = torch.randn(2, 5, 16)
    inputs = AttentionInputs(positions=torch.arange(5), is_causal=True)
    torch.testing.assert_close(mqa(x, inputs), mha(x, inputs), atol=1e-6, rtol=1e-6)


def test_attention_scale_multiplies_the_logits():
    torch.manual_seed(0)
    plain = MultiHeadAttention(8, 2, scale=1.0)
    x = torch.randn(1, 4, 8)
    inputs = AttentionInputs(positions=torch.arange(4), need_weights=True)
    plain(x, inputs)
    q, k, _ = plain.split_heads(x)
    expected = (q @ k.transpose(-2, -1)).softmax(-1)  # no 1/sqrt(d)
    torch.testing.assert_close(plain.last_weights, expected, atol=1e-6, rtol=1e-6)


def test_tied_embeddings_and_parallel_block_wiring(spec_for):
    _, model = _built(spec_for, ["model.tie_embeddings=true", "model.parallel_block=true"])
    assert model.lm_head.weight is model.token_embedding.weight
    block = model.blocks[0]
    x = torch.randn(1, 3, 16)
    inputs = AttentionInputs(positions=torch.arange(3))
    expected = x + block.attention(block.norm1(x), inputs) + block.feedforward(block.norm2(x))
    torch.testing.assert_close(block(x, inputs), expected)


def test_yarn_betas_and_attention_factor_reach_the_frequencies():
    base = rope_inverse_frequencies(64, 10000.0, scaling="yarn", factor=4.0,
                                    original_max_len=4096)
    moved = rope_inverse_frequencies(64, 10000.0, scaling="yarn", factor=4.0,
                                     original_max_len=4096, beta_fast=4.0, beta_slow=0.5,
                                     attention_factor=1.5)
    assert not torch.equal(base[0], moved[0]) and moved[1] == 1.5
    assert base[1] == pytest.approx(0.1 * math.log(4.0) + 1.0)


def test_llama3_scaling_keeps_high_and_divides_low_frequencies():
    inv_freq, scale = rope_inverse_frequencies(64, 500000.0, scaling="llama3", factor=8.0,
                                               original_max_len=64)
    plain, _ = rope_inverse_frequencies(64, 500000.0)
    wavelength = 2 * math.pi / plain
    assert scale == 1.0
    assert torch.equal(inv_freq[wavelength < 64 / 4], plain[wavelength < 64 / 4])
    torch.testing.assert_close(inv_freq[wavelength > 64], plain[wavelength > 64] / 8)


BAD = [
    (["model.n_kv_heads=3"], "model.n_kv_heads=3 is not valid; it must divide model.n_heads=2"),
    (["model.n_kv_heads=0"], "model.n_kv_heads=0 is not valid"),
    (["model.head_dim=0"], "model.head_dim=0 is not valid"),
    (["model.attn_scale=-1"], "model.attn_scale=-1 is not valid; it must be a positive number"),
    (["model.qkv_bias=maybe"], "model.qkv_bias=maybe is not valid; it must be true or false"),
    (["model.out_bias=2"], "model.out_bias=2 is not valid"),
    (["model.tie_embeddings=2"], "model.tie_embeddings=2 is not valid"),
    (["model.embed_norm=yes"], "model.embed_norm=yes is not valid"),
    (["model.parallel_block=true", "block=post"],
     "model.parallel_block=true is not valid with block=post; it needs block=pre"),
    (["pe=rope", "pe.beta_fast=1", "pe.beta_slow=2"], "pe.beta_fast=1 is not valid"),
    (["pe=rope", "pe.beta_slow=0"], "pe.beta_slow=0 is not valid"),
    (["pe=rope", "pe.attention_factor=0"], "pe.attention_factor=0 is not valid"),
    (["pe=rope", "pe.scaling=llama3"], "pe.scaling=llama3 needs pe.original_max_len"),
    (["pe=rope", "pe.scaling=llama4"], "scaling='llama4' is not valid"),
    (["pe=rope", "pe.high_freq_factor=0.5"], "pe.high_freq_factor=0.5 is not valid"),
    (["ffn=moe", "ffn.n_experts=0"], "ffn.n_experts=0 is not valid"),
    (["ffn=moe", "ffn.top_k=5"], "ffn.top_k=5 is not valid; it must be in [1, ffn.n_experts=4]"),
    (["ffn=moe", "ffn.expert=mish"], "ffn.expert=mish is not valid; it must be one of gelu"),
    (["ffn=moe", "ffn.router=random"], "ffn.router=random is not valid; it must be one of"),
    (["ffn=moe", "ffn.load_balance_coef=-1"], "ffn.load_balance_coef=-1 is not valid"),
    (["ffn=moe", "ffn.z_loss_coef=-0.1"], "ffn.z_loss_coef=-0.1 is not valid"),
    (["preset=llama2"], "unknown preset 'llama2'"),
]


@pytest.mark.parametrize("args, expected", BAD, ids=lambda a: " ".join(a) if isinstance(a, list)
                         else None)
def test_bad_knob_values_exit_2_and_write_nothing(tlab, tmp_path, args, expected):
    out = tmp_path / "run"
    stderr = assert_refused(tlab("experiment=smoke", *args, f"hydra.run.dir={out}"), out,
                            expected)
    assert len(stderr.strip().splitlines()) <= 2


def test_preflight_runs_rope_at_model_head_dim():
    """The protocol check builds its q/k at ``model.head_dim`` (it used d_model // n_heads and
    refused this valid config)."""
    from transformer_lab.app.preflight import preflight
    from transformer_lab.config.compose import compose

    cfg = compose(["experiment=smoke", "pe=rope", "model.d_model=32", "model.n_heads=2",
                   "model.head_dim=8"])
    assert preflight(cfg).model.blocks[0].attention.head_dim == 8  # not 32 // 2


PRESETS = ["gpt2", "llama", "bert", "t5_encoder", "gpt_neox", "mixtral"]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_passes_smoke_on_three_seeds(tlab, tmp_path, preset):
    """A correct real architecture must pass steps 1-2 at its defaults: smoke's lr shrinks
    with the width (0.4 / d_model), so a preset's d_model 64 trains at 6.25e-3, not the tiny
    model's 5e-2 (at which BERT's loss rose over 10 steps)."""
    out = tmp_path / preset
    code, stdout, err = tlab("experiment=smoke", f"preset={preset}", "routine.seeds=3",
                             f"hydra.run.dir={out}")
    assert code == 0, stdout + err
    rows = [r for r in read_csv(out / "smoke.csv") if r["check"].startswith("smoke_loss_falls")]
    assert len(rows) == 3 and all(r["status"] == "PASS" for r in rows)


def test_validate_runs_steps_1_2_at_a_size_the_preset_can_be_built_at():
    """gpt_neox's partial rotary (a quarter of each head) has no even rotary dimension at the
    article's minimal size (head size 4): steps 1-2 run at the preset's own size, and say so;
    where the minimal size works, it is used."""
    from transformer_lab.config.spec import RunSpec
    from transformer_lab.routines.validate import at_step_size

    spec = RunSpec.of(compose(["experiment=validate", "preset=gpt_neox"]))
    smoke, note = at_step_size(spec, "smoke")
    assert smoke.model.d_model == spec.model.d_model == 64
    assert "the run's own size (d_model 64" in note and "rotary" in note
    assert smoke.train.lr == pytest.approx(0.4 / 64)  # smoke's lr at that width
    compare, note = at_step_size(spec, "compare")
    assert (compare.model.d_model, note) == (16, "")  # head size 8: rotary dimension 2
    small, note = at_step_size(RunSpec.of(compose(["experiment=validate"])), "smoke")
    assert (small.model.d_model, small.train.lr, note) == (8, 0.05, "")
