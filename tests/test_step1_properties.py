"""Step 1's properties one by one (issue 24): each passes the correct designs it must (built-ins,
designs tlab does not ship), fails the bug it is modelled on with the value an independent
computation gives, and names the culprit; the swap attribution and the code locations too.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components.feedforward import FeedForward, GatedFeedForward
from transformer_lab.components.moe import MoEFeedForward
from transformer_lab.components.norms import LayerNorm, RMSNorm, SequenceBatchNorm
from transformer_lab.components.positional import RotaryPositionalEncoding, rotate_with_cos_sin
from transformer_lab.config.compose import compose
from transformer_lab.config.spec import RunSpec
from transformer_lab.measures.model_properties import (
    ALIASING_RATIO,
    SCALE_EXPONENT_LIMIT,
    attention_paths_agree,
    bf16_behaviour,
    device_placement,
    eval_determinism,
    ffn_nonlinearity,
    norm_scale_control,
    position_distinguishability,
    position_max_len,
    query_sees_a_key,
)
from transformer_lab.model import build_model
from transformer_lab.mutants import BY_NAME, mutant_config
from transformer_lab.mutants.feedforward import FunctionalDropoutFFN, LinearFFN
from transformer_lab.mutants.negatives import DyT, MishFFN, ScaleNorm, SquaredReLUFFN
from transformer_lab.mutants.norms import RMSTimesNorm, SquaredVarianceLayerNorm

VOCAB = 10
HERE = Path(__file__).name


def _model(*overrides: str, seed: int = 0) -> nn.Module:
    cfg = compose(["experiment=smoke", *overrides])
    cfg.model.vocab_size = VOCAB
    return build_model(cfg, seed=seed)


def _mutant_model(name: str, *overrides: str) -> nn.Module:
    cfg = mutant_config(BY_NAME[name], overrides)
    cfg.model.vocab_size = VOCAB
    return build_model(cfg, seed=0)


# --- position distinguishability over all pairs ---------------------------------------------

ROPE_SCALINGS = [
    [], ["pe.base=500000"], ["pe.style=interleaved"],
    ["pe.scaling=linear", "pe.factor=4"], ["pe.scaling=ntk", "pe.factor=4"],
    ["pe.scaling=dynamic", "pe.factor=4", "pe.original_max_len=64"],
    ["pe.scaling=yarn", "pe.factor=4", "pe.original_max_len=64"],
    ["pe.scaling=llama3", "pe.factor=8", "pe.original_max_len=64"],
]


@pytest.mark.parametrize("scaling", ROPE_SCALINGS, ids=lambda o: " ".join(o) or "default")
@pytest.mark.parametrize("arch", ["encoder", "decoder"])
def test_rope_with_every_scaling_tells_all_pairs_apart_on_the_tiny_model(scaling, arch):
    result = position_distinguishability(_model("pe=rope", f"arch={arch}", *scaling))
    assert result.passed, result.detail
    assert result.value >= 2 * ALIASING_RATIO  # head_dim 4: two frequencies, >= 0.27


def test_a_sinusoid_with_every_frequency_1_aliases_positions_44_apart():
    result = position_distinguishability(_mutant_model("aliasing_sinusoidal_pe"))
    assert result.passed is False
    # independent reference: every feature is sin(p) or cos(p), so the distance of p and p + k
    # over that of neighbours is the chord ratio |sin(k / 2)| / sin(1 / 2); k = 44 is the
    # closest return below 256 (44 - 14 pi = 0.018 rad)
    chord = abs(math.sin(44 / 2)) / math.sin(1 / 2)
    assert result.value == pytest.approx(chord, rel=0.1)
    p, q = (int(word) for word in result.detail.split("positions ")[1].split(" are")[0]
            .split(" and "))
    assert q - p == 44 and "AliasingSinusoidalPE" in result.detail


def test_distinguishability_names_positions_a_clamped_pe_merges():
    result = position_distinguishability(_mutant_model("clamped_pe"), max_len=64)
    assert result.passed is False and result.value == 0.0
    assert "gives positions 16 and 17 the same representation" in result.detail
    assert position_distinguishability(_mutant_model("clamped_pe"), max_len=17).passed


def test_distinguishability_does_not_apply_without_a_pe():
    assert position_distinguishability(_model("pe=none")).passed is None


# --- FFN nonlinearity -------------------------------------------------------------------------

D, HIDDEN = 8, 32


class _NoActivationFFN(FeedForward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.up_proj(x))


class _DeclaredLinearFFN(_NoActivationFFN):
    is_linear = True


def _with_ffn(ffn: nn.Module) -> nn.Module:
    model = _model("arch=decoder")
    model.blocks[0].feedforward = ffn
    return model


NONLINEAR_FFNS = {
    **{act: lambda act=act: FeedForward(D, HIDDEN, act) for act in
       ("relu", "gelu", "gelu_tanh", "swish", "leaky_relu")},
    **{name: lambda act=act: GatedFeedForward(D, HIDDEN, act) for name, act in
       (("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu"))},
    "bilinear_glu": lambda: _BilinearGLU(D, HIDDEN),
    "moe": lambda: MoEFeedForward(D, HIDDEN, n_experts=4, top_k=2),
    "squared_relu": lambda: SquaredReLUFFN(D, HIDDEN),
    "mish": lambda: MishFFN(D, HIDDEN),
    "functional_dropout": lambda: FunctionalDropoutFFN(D, HIDDEN),  # random, not linear
}


class _BilinearGLU(GatedFeedForward):
    """GLU without an activation (Shazeer 2020's "bilinear"): nonlinear through the product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_proj(x) * self.up_proj(x))


@pytest.mark.parametrize("name", list(NONLINEAR_FFNS))
def test_ffns_with_a_hidden_nonlinearity_pass(name):
    torch.manual_seed(0)
    result = ffn_nonlinearity(_with_ffn(NONLINEAR_FFNS[name]()))
    assert result.passed, result.detail
    assert result.value > 0.1  # far above float32 rounding


@pytest.mark.parametrize("make", [lambda: LinearFFN(D, HIDDEN, "relu"),
                                  lambda: LinearFFN(D, HIDDEN, "gelu"),
                                  lambda: _NoActivationFFN(D, HIDDEN)],
                         ids=["relu_after_down", "gelu_after_down", "no_activation"])
def test_one_linear_map_then_an_elementwise_function_fails(make):
    torch.manual_seed(0)
    result = ffn_nonlinearity(_with_ffn(make()))
    assert result.passed is False and result.value < 1e-5
    assert "has no hidden nonlinearity" in result.detail


def test_an_ffn_declared_linear_is_not_checked():
    result = ffn_nonlinearity(_with_ffn(_DeclaredLinearFFN(D, HIDDEN)))
    assert result.passed is None and "is_linear" in result.detail


# --- norm-layer scale control -----------------------------------------------------------------


def _with_norm(norm: nn.Module) -> nn.Module:
    model = _model("arch=decoder")
    model.blocks[0].norm1 = norm
    return model


@pytest.mark.parametrize("make", [lambda: LayerNorm(D), lambda: RMSNorm(D),
                                  lambda: SequenceBatchNorm(D), lambda: ScaleNorm(D),
                                  lambda: DyT(D), lambda: DyT(D, alpha=0.1)],
                         ids=["layernorm", "rmsnorm", "batchnorm", "scalenorm", "dyt",
                              "dyt_alpha_0.1"])
def test_norms_that_bound_their_output_pass(make):
    result = norm_scale_control(_with_norm(make()))
    assert result.passed, result.detail


def test_a_norm_multiplying_by_the_rms_grows_like_the_square_of_its_input():
    result = norm_scale_control(_with_norm(RMSTimesNorm(D)))
    assert result.passed is False
    assert result.value == pytest.approx(2.0, abs=0.01)  # x * rms(x): s^2
    assert "blocks.0.norm1 (RMSTimesNorm)" in result.detail


def test_a_layernorm_with_the_squared_variance_grows_as_its_input_shrinks():
    result = norm_scale_control(_with_norm(SquaredVarianceLayerNorm(D)))
    assert result.passed is False
    # (x - mean) / sqrt(var^2 + eps) ~ (x - mean) / var once var^2 >> eps: like s^-1
    assert result.value == pytest.approx(1.0, abs=0.01)
    assert result.value > SCALE_EXPONENT_LIMIT and "grows as the input shrinks" in result.detail


# --- attention: every query sees a key; SDPA vs written out -----------------------------------


def test_a_bias_masking_each_token_from_itself_leaves_the_first_query_keyless():
    decoder = _mutant_model("self_masking_alibi")
    result = query_sees_a_key(decoder, VOCAB, max_len=64)
    assert result.passed is False
    assert "query 0 (head 0) at every length from 1 to 64" in result.detail
    # SDPA returns 0 for that row, the written-out path NaN: the two paths disagree
    paths = attention_paths_agree(decoder, VOCAB)
    assert paths.passed is False and "finite: True / False" in paths.detail
    # in an encoder query 0 sees the keys after it, except in a one-token sequence
    encoder = _mutant_model("self_masking_alibi", "arch=encoder")
    encoder.positional.causal = False
    assert "at length 1:" in query_sees_a_key(encoder, VOCAB, max_len=64).detail


def test_split_alibi_lets_every_query_see_a_key():
    assert query_sees_a_key(_model("pe=alibi", "arch=encoder"), VOCAB, max_len=64).passed


# --- bf16 behaviour ---------------------------------------------------------------------------


class _BF16PositionsRoPE(RotaryPositionalEncoding):
    """gpt-neox #1016: positions cast to the dtype of a bf16 ``inv_freq``."""

    def forward(self, q, k, positions):
        inv_freq = self.inv_freq.bfloat16()
        angles = (positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]).float()
        return (rotate_with_cos_sin(q, angles.cos(), angles.sin()),
                rotate_with_cos_sin(k, angles.cos(), angles.sin()))


class _MatmulAnglesRoPE(RotaryPositionalEncoding):
    """Angles by a matmul: bf16 under autocast (HF computes them with autocast disabled)."""

    def forward(self, q, k, positions):
        angles = positions.float()[:, None] @ self.inv_freq[None, :]  # (T, Dh/2)
        return (rotate_with_cos_sin(q, angles.cos(), angles.sin()),
                rotate_with_cos_sin(k, angles.cos(), angles.sin()))


@pytest.mark.parametrize("pe", ["rope", "sinusoidal", "learned", "alibi", "t5"])
def test_built_in_pes_keep_positions_distinct_under_bf16_autocast(pe):
    model = _model(f"pe={pe}", "arch=decoder")
    max_len = position_max_len(model)
    assert bf16_behaviour(model, VOCAB, max_len).passed is None  # float32 run: does not apply
    result = bf16_behaviour(model, VOCAB, max_len, "bf16")
    assert result.passed, result.detail


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_positions_cast_to_bf16_merge_256_and_257(precision):
    model = _model("pe=rope", "arch=decoder")
    model.positional = _BF16PositionsRoPE(4)
    result = bf16_behaviour(model, VOCAB, 256, precision)
    assert result.passed is False
    assert "gives positions 256 and 257 the same representation" in result.detail


def test_angles_made_by_a_matmul_merge_positions_under_autocast_only():
    model = _model("pe=rope", "arch=decoder")
    model.positional = _MatmulAnglesRoPE(4)
    assert bf16_behaviour(model, VOCAB, 256).passed is None
    assert bf16_behaviour(model, VOCAB, 256, "bf16").passed is False


def test_a_bf16_table_in_a_float32_run_fails_naming_the_line():
    result = bf16_behaviour(_mutant_model("bf16_table_rope"), VOCAB, 256)
    assert result.passed is False
    assert "transformer_lab/mutants/positional.py" in result.detail
    assert result.value == pytest.approx(2 ** -9, rel=1.0)  # bf16's rounding of cos/sin


# --- eval determinism -------------------------------------------------------------------------


def test_a_dropout_left_on_in_eval_is_named_and_the_random_state_kept():
    model = _mutant_model("functional_dropout_ffn")
    before = torch.random.get_rng_state()
    result = eval_determinism(model, VOCAB)
    assert torch.equal(before, torch.random.get_rng_state())
    assert result.passed is False
    assert "blocks.0.feedforward (FunctionalDropoutFFN)" in result.detail


def test_module_dropout_is_off_in_eval():
    model = _model("arch=decoder", "model.dropout.ffn=0.5", "model.dropout.attention=0.5")
    assert eval_determinism(model, VOCAB).passed


# --- where in the user's code -----------------------------------------------------------------


class _ArangeSinusoid(nn.Module):
    """A sinusoidal PE that makes its positions with ``torch.arange`` without ``device=``."""

    kind = "additive"

    def __init__(self, d_model: int) -> None:
        super().__init__()
        frequencies = torch.exp(torch.arange(0, d_model, 2) * (-math.log(1e4) / d_model))
        self.register_buffer("frequencies", frequencies)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        made = torch.arange(positions.shape[0])[:, None].float()  # (T, 1) on the CPU
        angles = made * self.frequencies  # (T, d/2)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class _RaisingPE(_ArangeSinusoid):
    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a bug in my PE")


def test_device_placement_names_the_pe_and_both_lines():
    model = _model("pe=sinusoidal", "arch=decoder")
    model.positional = _ArangeSinusoid(8)
    result = device_placement(model, VOCAB)
    assert result.passed is False
    assert result.detail.startswith(f"_ArangeSinusoid: mul at tests/{HERE}:")
    assert f"(torch.arange at tests/{HERE}:" in result.detail


def test_a_raising_forward_is_reported_with_the_users_line():
    model = _model("pe=sinusoidal", "arch=decoder")
    model.positional = _RaisingPE(8)
    result = eval_determinism(model, VOCAB)
    assert result.passed is False
    assert f"RuntimeError at tests/{HERE}:" in result.detail and "(forward)" in result.detail


# --- attribution by swapping ------------------------------------------------------------------


def _step1_rows(cfg) -> dict:
    """Step 1's rows of the composed ``cfg``, at validate's smoke step."""
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.routines.smoke import forward_backward_check, smoke_setup
    from transformer_lab.routines.validate import step_configs

    spec = RunSpec.of(cfg)
    smoke = step_configs(spec.with_vocab(build_task(spec).vocab_size))["smoke"]
    _, model, batches = smoke_setup(smoke)
    before = torch.random.get_rng_state()
    rows = forward_backward_check(smoke, model, batches[0])
    assert torch.equal(before, torch.random.get_rng_state())  # step 2 trains as without it
    return {row.check: row for row in rows}


def test_the_defaults_swapped_in_are_the_primary_configs():
    from transformer_lab.routines.attribution import default_choices

    defaults = default_choices()
    cfg = compose(["experiment=smoke"])
    assert set(defaults) == {"pe", "ffn", "norm_layer", "block"}
    assert all(cfg[group].name == choice for group, choice in defaults.items())


def test_only_groups_off_their_default_are_swapped():
    from transformer_lab.routines.attribution import swaps

    spec = RunSpec.of(compose(["experiment=smoke", "ffn=relu", "pe=rope"]))
    assert [group for group, _, _ in swaps(spec)] == ["ffn"]
    spec = RunSpec.of(compose(["experiment=smoke", "pe.base=500000"]))
    assert [group for group, _, _ in swaps(spec)] == ["pe"]


def test_a_failing_row_names_the_component_whose_swap_makes_it_hold():
    rows = _step1_rows(mutant_config(BY_NAME["squared_variance_layernorm"],
                                     experiment="validate"))
    detail = rows["norm_scale_control"].detail
    assert detail.endswith("culprit: the norm layer (SquaredVarianceLayerNorm): with layernorm "
                           "the property holds")
    assert rows["norm_scale_control"].status == "FAIL"


def test_a_failure_no_swap_repairs_says_so(spec_for):
    from transformer_lab.measures.property_result import PropertyResult
    from transformer_lab.routines.attribution import culprits

    spec, _ = spec_for("ffn=relu", "norm_layer=rmsnorm")
    model = build_model(spec.model, seed=0)
    found = culprits(spec, model, {"x"}, lambda _: [PropertyResult("x", False)])
    assert found == {"x": "no single swap to a default (ffn=gelu, norm_layer=layernorm) "
                          "makes it hold"}
    default, _ = spec_for()
    assert culprits(default, model, {"x"}, lambda _: []) == {"x": ""}  # nothing to swap


def test_f_dropout_defaults_to_training():  # the premise of the functional-dropout mutant
    x = torch.ones(1000)
    assert not torch.equal(F.dropout(x, 0.5), x)


# --- issue 32: zero starts, unnormalised attention, task gradients, feature interaction -------


def test_a_perturbed_copy_moves_only_trainable_parameters_that_start_at_zero():
    from transformer_lab.measures.property_result import PERTURBED_STD, perturbed_copy

    model = _model("arch=decoder")
    out_proj = model.blocks[0].attention.out_proj
    nn.init.zeros_(out_proj.weight)
    nn.init.zeros_(model.blocks[0].feedforward.down_proj.weight)
    model.blocks[0].feedforward.down_proj.weight.requires_grad_(False)  # frozen: never moves
    copied = perturbed_copy(model)
    weight = copied.blocks[0].attention.out_proj.weight
    assert bool(weight.all())
    assert float(weight.detach().std()) == pytest.approx(PERTURBED_STD, rel=0.3)
    bias = copied.blocks[0].attention.out_proj.bias  # zero vector: U(std / 2, std)
    assert bool(((bias >= PERTURBED_STD / 2) & (bias <= PERTURBED_STD)).all())
    assert not copied.blocks[0].feedforward.down_proj.weight.any()
    assert torch.equal(copied.token_embedding.weight, model.token_embedding.weight)
    assert not out_proj.weight.any()  # the model itself is left as it was


def _moe_router_gradient(ffn: nn.Module) -> float:
    x = torch.randn(4, 6, D, generator=torch.Generator().manual_seed(0))
    ffn(x).square().sum().backward()
    return float(ffn.gate.weight.grad.abs().max().detach())


@pytest.mark.parametrize("router", ["softmax_then_topk", "topk_then_softmax"])
def test_a_top1_moe_weights_its_expert_by_the_softmax_probability(router):
    moe = MoEFeedForward(D, HIDDEN, n_experts=4, top_k=1, router=router)
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))  # (N, E)
    weights, chosen = moe.route(logits)
    probs = logits.softmax(dim=-1)  # independent: Switch's gate is p_i of the chosen expert
    assert torch.equal(chosen[:, 0], probs.argmax(dim=-1))
    torch.testing.assert_close(weights[:, 0], probs.max(dim=-1).values)
    # so the router gets a task gradient of the size of the experts'; renormalised it gets none
    from transformer_lab.mutants.feedforward import RenormalisedTop1MoE

    torch.manual_seed(0)
    fixed = _moe_router_gradient(MoEFeedForward(D, HIDDEN, n_experts=4, top_k=1, router=router))
    torch.manual_seed(0)
    broken = _moe_router_gradient(RenormalisedTop1MoE(D, HIDDEN, n_experts=4, top_k=1))
    assert fixed > 0 and broken < 1e-4 * fixed  # float32 rounding of 1 - p / p


def test_task_gradient_names_a_router_the_task_does_not_train():
    from transformer_lab.measures.gradient_flow import GRADIENT_RATIO, task_gradient
    from transformer_lab.training.trainer import sequence_loss

    tokens = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(0))
    batches = [(tokens[:, :-1], tokens[:, 1:])]
    broken = _mutant_model("renormalised_top1_moe")
    result = task_gradient(broken, batches, sequence_loss)
    assert result.passed is False and result.value < GRADIENT_RATIO
    assert "blocks.0.feedforward.gate.weight gets a task-loss gradient" in result.detail
    fixed = _model("ffn=moe", "ffn.top_k=1", "ffn.n_experts=8", "arch=decoder")
    assert task_gradient(fixed, batches, sequence_loss).passed  # idle experts are left out
    rezero = _mutant_model("rezero_block/decoder")  # every branch gradient is 0 at init
    assert task_gradient(rezero, batches, sequence_loss).passed


class _SumOfOneVariable(nn.Module):
    """f(x)_i = sum_k W[i, k] tanh(x_k) + x_k^2: a sum of one-variable functions."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_model, d_model) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.tanh(x) + x.square()) @ self.weight.T


class _SquaredSum(nn.Module):
    """f(x)_i = (sum_k x_k)^2 for every i: each pair of features interacts, with the mixed
    difference 2 a^2 per output whatever x."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1, keepdim=True).square().expand_as(x)


def test_the_mixed_difference_is_rounding_without_interaction_and_large_with_it():
    from transformer_lab.measures.model_properties import (
        INTERACTION_TOLERANCE,
        mixed_differences,
    )

    with torch.no_grad():
        torch.manual_seed(0)
        separable = mixed_differences(_SumOfOneVariable(D, HIDDEN), D)
        squared = mixed_differences(_SquaredSum(), D)
    assert float(separable.max()) < INTERACTION_TOLERANCE
    # independent bound: |2 a^2| over a first difference |2 a s + a^2| with a = 1 and |s| the
    # size of a sum of D + 1 standard normals (at most ~4 sqrt(D + 1)): >= 2 / (8 sqrt(9) + 1)
    assert float(squared.min()) > 2 / (8 * math.sqrt(D + 1) + 1)


def test_ffn_interaction_fails_an_activation_before_the_up_projection():
    from transformer_lab.measures.model_properties import ffn_interaction

    result = ffn_interaction(_mutant_model("activation_first_ffn"))
    assert result.passed is False
    assert "(ActivationFirstFFN) of block 0 is a sum of one-variable functions" in result.detail
    assert ffn_interaction(_with_ffn(_SumOfOneVariable(D, HIDDEN))).passed is False
    assert ffn_nonlinearity(_mutant_model("activation_first_ffn")).passed  # why it is needed


@pytest.mark.parametrize("name", list(NONLINEAR_FFNS))
def test_every_ffn_with_mixing_passes_ffn_interaction(name):
    from transformer_lab.measures.model_properties import ffn_interaction

    torch.manual_seed(0)
    result = ffn_interaction(_with_ffn(NONLINEAR_FFNS[name]()))
    assert result.passed, result.detail


def test_unnormalised_attention_is_not_held_to_rows_summing_to_one():
    from transformer_lab.measures.model_properties import sums_to_one

    sigmoid = _mutant_model("sigmoid_attention_block/decoder")
    result = query_sees_a_key(sigmoid, VOCAB, 64)
    assert result.passed, result.detail
    assert not sums_to_one(sigmoid.blocks[0].attention)
    weights = sigmoid.attention_maps(torch.zeros(1, 6, dtype=torch.long))[0]  # (1, H, T, T)
    assert float(weights.sum(dim=-1).max()) < 0.5  # sigmoid(s - log 64): far below 1
    softmax = _model("arch=decoder")
    assert sums_to_one(softmax.blocks[0].attention)


class _TablePE(nn.Module):
    """A learned table of ``max_len`` rows that does not keep ``max_len`` (issue 30, item 5)."""

    kind = "additive"

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table(positions)  # (T, D)


def test_step1_probes_the_max_len_the_pe_constructor_is_given():
    cfg = compose(["experiment=validate", "pe=learned"])
    cfg.pe = {"name": "table", "_target_": f"{_TablePE.__module__}._TablePE",
              "d_model": "${model.d_model}", "max_len": 24}
    rows = _step1_rows(cfg)
    assert all(row.status != "FAIL" for row in rows.values()), {
        k: r.detail for k, r in rows.items() if r.status == "FAIL"}
    assert "up to 24" in rows["position_injectivity"].detail
    assert rows["finite_at_max_len"].value == 24


@pytest.mark.parametrize(("block", "param_count"), [
    ("rezero_block/encoder", "SKIP"),  # norm-free: pre-flight has no norm1 to check
    ("normformer_block/decoder", "SKIP"),  # adds parameters, inherits norms_per_block
    ("shared_norm_parallel_block/decoder", "PASS"),  # declares norms_per_block = 1
])
def test_custom_blocks_pass_step1_and_param_count_is_never_a_false_fail(block, param_count):
    from transformer_lab.routines.mutants import preflight

    cfg = mutant_config(BY_NAME[block], experiment="validate")
    preflight(cfg)
    rows = _step1_rows(cfg)
    assert all(row.status != "FAIL" for row in rows.values()), {
        k: r.detail for k, r in rows.items() if r.status == "FAIL"}
    assert rows["param_count"].status == param_count
    assert f"{int(rows['param_count'].value):,}" in rows["param_count"].detail


def test_parameters_move_names_one_the_optimiser_never_changed():
    from transformer_lab.routines.smoke import parameters_move

    model = _model("arch=decoder")
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name != "blocks.0.norm1.bias":
                parameter.add_(1e-3)
    row = parameters_move(model, initial)
    assert row.status == "FAIL" and row.value == 1
    assert "blocks.0.norm1.bias" in row.detail
    with torch.no_grad():
        model.blocks[0].norm1.bias.add_(1e-3)
    assert parameters_move(model, initial).status == "PASS"


class _RaisingDecoder(nn.Module):
    causal = True

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        raise ValueError("shapes do not match\n(a second line)")


def test_a_check_whose_forward_raises_is_a_fail_row_naming_the_users_line():
    import inspect

    from transformer_lab.measures.model_properties import causality

    result = causality(_RaisingDecoder(), 5)
    line = inspect.getsourcelines(_RaisingDecoder.forward)[1] + 1  # the raise
    assert result.name == "causality" and result.passed is False
    assert result.detail.startswith("the forward raised ValueError at ")
    assert result.detail.endswith(f"{Path(__file__).name}:{line} (forward): shapes do not match")
