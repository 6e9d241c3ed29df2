"""Forward-pass properties of a built model: every built-in passes, every mutant is caught.

The built-ins are the tiny model of ``experiment=smoke`` (d_model 8, 2 heads) in every PE x
arch, every FFN and every block x norm layer, and every preset; the mutants are the catalogue
of :mod:`transformer_lab.mutants`, each expected to fail a named check with a detail naming it
(the harmless ones, correct designs tlab does not ship, to fail none).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from transformer_lab.config.spec import RunSpec
from transformer_lab.measures.model_properties import (
    DeviceAudit,
    causality,
    device_placement,
    model_properties,
    position_injectivity,
)
from transformer_lab.model import build_model
from transformer_lab.mutants import (
    BUILT_IN_BLOCKS,
    BUILT_IN_FFNS,
    BUILT_IN_NORM_LAYERS,
    BUILT_IN_PES,
    BUILT_IN_PRESETS,
    BY_NAME,
    MUTANTS,
    mutant_config,
)

VOCAB = 10
PES = ["none", *BUILT_IN_PES]  # the control too
FFNS, BLOCKS, NORM_LAYERS = BUILT_IN_FFNS, BUILT_IN_BLOCKS, BUILT_IN_NORM_LAYERS


def _compose(*overrides: str):
    from transformer_lab.config.compose import compose

    cfg = compose(["experiment=smoke", *overrides])
    cfg.model.vocab_size = VOCAB
    return cfg


def _mutant(name: str, *overrides: str):
    cfg = mutant_config(BY_NAME[name], overrides)
    cfg.model.vocab_size = VOCAB
    return cfg


def _build(cfg) -> nn.Module:
    torch.manual_seed(0)
    return build_model(cfg)


def _failed(results) -> dict[str, str]:
    return {r.name: r.detail for r in results if r.passed is False}


BUILT_INS = (
    [(f"pe={pe}", f"arch={arch}") for pe in PES for arch in ("encoder", "decoder")]
    + [(f"ffn={ffn}", "arch=decoder") for ffn in FFNS]
    + [(f"block={block}", f"norm_layer={layer}", "arch=decoder", "model.n_layers=2")
       for block, layer in itertools.product(BLOCKS, NORM_LAYERS)]
    + [(f"preset={preset}",) for preset in BUILT_IN_PRESETS]  # at their own sizes
    + [("ffn=moe", "arch=decoder")]
)


@pytest.mark.parametrize("overrides", BUILT_INS, ids=[" ".join(o) for o in BUILT_INS])
def test_every_built_in_passes_every_check(overrides):
    model = _build(_compose(*overrides))
    failed = _failed(model_properties(model, VOCAB))
    if "pe=none" in overrides:  # the control: no PE, positions indistinguishable
        assert set(failed) == {"position_injectivity"}
        assert "positions 0 and 1 get the same representation" in failed["position_injectivity"]
    else:
        assert failed == {}


def test_checks_leave_the_model_as_it_was():
    model = _build(_compose("norm_layer=batchnorm", "arch=decoder", "model.n_layers=2"))
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    results = model_properties(model, VOCAB)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    exempt = next(r for r in results if r.name == "train_eval_agreement").detail
    assert "exempt (BatchNorm)" in exempt


# task_gradient is measured in step 1's backward pass (tests/test_step1_properties.py), not here
STEP1_MUTANTS = [m for m in MUTANTS if m.expected.startswith("step1:")
                 and m.expected != "step1:task_gradient"]
DETAILS = {  # what the failing check's detail must say
    "position_blind": "positions 0 and 1 get the same representation",
    "clamped_pe": "positions 16 and 17 get the same representation",
    "batch_dependent_rope": "when the other sequences of its batch changed",
    "sequence_axis_norm": "output at position 0 changed when token 1 changed",
    "token_shift_ffn": "output at position 0 changed when token 1 changed",
    "overflow_pe": "from sequence length 33 on (position 32)",
    "exploding_ffn": "multiplies its input's RMS by 100",
    "noisy_train_ffn": "train-mode outputs differ from eval-mode ones",
    "skip_in_eval_ffn": "train-mode outputs differ from eval-mode ones",
    "float64_pe": "positional (Float64PE) returned torch.float64 for torch.float32",
    "cpu_table_pe": "CPUTablePE: __getitem__ at transformer_lab/mutants/positional.py",
    "aliasing_sinusoidal_pe": "positions 11 and 55 are only 0.018 of a neighbour step apart",
    "linear_ffn": "the FFN (LinearFFN) of block 0 has no hidden nonlinearity",
    "activation_first_ffn": "the FFN (ActivationFirstFFN) of block 0 is a sum of one-variable "
                            "functions of its inputs",
    "rms_times_norm": "(RMSTimesNorm): output RMS",
    "squared_variance_layernorm": "(SquaredVarianceLayerNorm): output RMS",
    "self_masking_alibi": "(SelfMaskingALiBi) with the causal mask masks every key of query 0",
    "bf16_table_rope": "(BF16TableRoPE) rounds to half precision in a float32 run",
    "functional_dropout_ffn": "blocks.0.feedforward (FunctionalDropoutFFN) gave outputs",
    "offset_blind_rope": "position 1 (one token at a time) differs from the full forward",
    "stale_dynamic_rope": "position 15 (3 tokens at a time) differs from the full forward",
    "top_left_alibi": "position 1 (one token at a time) differs from the full forward",
}
HARMLESS = [m for m in MUTANTS if m.expected == "harmless"]


@pytest.mark.parametrize("mutant", STEP1_MUTANTS, ids=[m.name for m in STEP1_MUTANTS])
def test_each_step1_mutant_fails_its_check_with_a_detail_naming_it(mutant):
    failed = _failed(model_properties(_build(_mutant(mutant.name)), VOCAB))
    check = mutant.expected.split(":", 1)[1]
    assert check in failed, f"{mutant.name} passed {check}"
    assert DETAILS[mutant.name] in failed[check]


@pytest.mark.parametrize("mutant", HARMLESS, ids=[m.name for m in HARMLESS])
def test_each_harmless_design_passes_every_check(mutant):
    assert _failed(model_properties(_build(_mutant(mutant.name)), VOCAB)) == {}


def test_each_step1_mutant_fails_no_check_before_its_own():
    order = [r.name for r in model_properties(_build(_compose()), VOCAB)]
    for mutant in STEP1_MUTANTS:
        results = model_properties(_build(_mutant(mutant.name)), VOCAB)
        first = next(r.name for r in results if r.passed is False)
        assert first == mutant.expected.split(":", 1)[1], (mutant.name, first)
        assert order == [r.name for r in results]


def test_the_catalogue_covers_the_issue_and_every_target_imports():
    from transformer_lab.config.instantiate import locate as _locate

    assert set(DETAILS) == {m.name for m in STEP1_MUTANTS}
    for mutant in MUTANTS:
        cls = _locate(mutant.target)
        assert cls.__doc__ and mutant.expected.split(":")[0] in (
            "preflight", "step1", "step2", "step3", "harmless")


def test_the_causal_mask_wins_over_a_large_positive_future_bias():
    model = _build(_mutant("future_bias_alibi"))
    assert _failed(model_properties(model, VOCAB)) == {}
    plain = _build(_compose("pe=alibi", "arch=decoder"))
    tokens = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(tokens), plain.eval()(tokens))
    # without the mask (an encoder) the same bias is a leak: the check does see it
    leaky = _build(_mutant("future_bias_alibi", "arch=encoder"))
    leaky.causal = True  # a decoder whose mask is missing would attend to the future
    leaky.attention_mask = lambda q_len, k_len, device: leaky.positional(q_len, k_len)
    assert causality(leaky, VOCAB).passed is False


@pytest.mark.parametrize("name", ["wrong_shape_pe", "wrong_shape_ffn"])
def test_protocol_mutants_are_refused_before_the_run(name):
    from transformer_lab.config.protocols import check_protocols
    from transformer_lab.errors import ConfigError

    cfg = _mutant(name)
    with pytest.raises(ConfigError, match="must"):
        check_protocols(RunSpec.of(cfg).model, _build(cfg), 4)


@pytest.mark.parametrize("name", ["mixed_pairing_rope", "flipped_sign_rope"])
def test_rope_mutants_pass_step1_and_fail_the_rotary_relative_check(name):
    from transformer_lab.routines.check import rotary_relative_check

    cfg = _mutant(name)
    assert _failed(model_properties(_build(cfg), VOCAB)) == {}
    assert rotary_relative_check(RunSpec.of(cfg)).status == "FAIL"
    assert rotary_relative_check(RunSpec.of(_compose("pe=rope"))).status == "PASS"


def test_injectivity_fails_exactly_from_the_clamp_index():
    cfg = _mutant("clamped_pe")
    cfg.pe.clamp_at = 40
    result = position_injectivity(_build(cfg), VOCAB, max_len=128)
    assert result.passed is False and result.value == 0.0
    assert "positions 63 and 64" in result.detail  # first tested pair past 40: (63, 64)
    assert position_injectivity(_build(cfg), VOCAB, max_len=40).passed


class _TablePE(nn.Module):
    kind = "additive"

    def __init__(self, on_device: bool) -> None:
        super().__init__()
        self.on_device = on_device
        self.anchor = nn.Parameter(torch.zeros(8))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        device = positions.device if self.on_device else None
        table = torch.arange(32, dtype=torch.float32, device=device)[:, None].repeat(1, 8)
        return table[positions] + self.anchor  # (T, 8)


@pytest.mark.parametrize("on_device", [True, False])
def test_device_audit_tells_a_table_made_on_the_device_from_one_made_on_the_cpu(on_device):
    model = _build(_compose("pe=sinusoidal", "arch=decoder"))
    model.positional = _TablePE(on_device)
    assert device_placement(model, VOCAB).passed is on_device


def test_device_audit_accepts_a_cpu_table_moved_to_the_device():
    x = torch.ones(4, 8)
    with DeviceAudit() as audit:
        moved = torch.arange(4.0).to(x.device)  # made on the CPU, then moved: correct
        _ = x + moved[:, None]
        _ = x * torch.tensor(2.0)  # a 0-dim CPU tensor mixes with CUDA tensors legally
    assert audit.violations == []
    with DeviceAudit() as audit:
        _ = x + torch.arange(4.0)[:, None]
    assert len(audit.violations) == 1
