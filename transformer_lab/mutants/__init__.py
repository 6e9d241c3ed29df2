"""A catalogue of deliberately broken components, and of correct designs tlab does not ship, for
``tlab mutants``: does the validation routine catch each at its expected step, and pass the
correct ones? (docs/detector.md, "The mutant catalogue")"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_D = "${model.d_model}"
_DIM = {"d_model": _D}
_HEAD_DIM = {"head_dim": "${tlab.div:${model.d_model},${model.n_heads}}"}
_ALIBI = {"n_heads": "${model.n_heads}", "causal": True}
_FFN = {"d_model": _D, "d_ff": "${model.d_ff}", "activation": "gelu",
        "init_std": "${model.init_std}"}


@dataclass(frozen=True)
class Mutant:
    """One broken component and the routine's step/check expected to catch it."""

    name: str
    group: str  # pe | ffn | norm_layer | block
    target: str  # the _target_
    arch: str  # encoder | decoder
    expected: str  # preflight | step1:<check> | step2 | step3[:check] | harmless
    settings: dict[str, Any] = field(default_factory=dict)

    def node(self) -> dict[str, Any]:
        """The config node that replaces ``cfg[group]``."""
        node = {"name": self.name, "_target_": self.target, **self.settings}
        # a norm_layer node is a partial (d_model -> module)
        return {**node, "_partial_": True} if self.group == "norm_layer" else node


# (name, group, class in transformer_lab.mutants, arch, expected, settings), in the order of the
# ``tlab mutants`` table
_CATALOGUE: tuple[tuple[str, str, str, str, str, dict[str, Any]], ...] = (
    # position information lost
    ("position_blind", "pe", "positional.PositionBlindPE", "encoder",
     "step1:position_injectivity", _DIM),
    ("clamped_pe", "pe", "positional.ClampedPE", "encoder", "step1:position_injectivity",
     {**_DIM, "clamp_at": 16}),
    ("batch_dependent_rope", "pe", "positional.BatchDependentRoPE", "encoder",
     "step1:batch_independence", _HEAD_DIM),
    # relative property broken
    ("mixed_pairing_rope", "pe", "positional.MixedPairingRoPE", "encoder",
     "step3:rotary_relative", _HEAD_DIM),
    ("flipped_sign_rope", "pe", "positional.FlippedSignRoPE", "encoder", "step3:rotary_relative",
     _HEAD_DIM),
    # position offsets under a KV cache (right in a full forward, wrong in cached decoding)
    ("offset_blind_rope", "pe", "positional.OffsetBlindRoPE", "decoder", "step1:cached_decoding",
     _HEAD_DIM),
    ("stale_dynamic_rope", "pe", "positional.StaleDynamicRoPE", "decoder",
     "step1:cached_decoding",
     {**_HEAD_DIM, "scaling": "dynamic", "factor": 2.0, "original_max_len": 16}),
    ("top_left_alibi", "pe", "positional.TopLeftALiBi", "decoder", "step1:cached_decoding",
     _ALIBI),
    # future leaks in a decoder
    ("sequence_axis_norm", "norm_layer", "norms.SequenceAxisNorm", "decoder", "step1:causality",
     {}),
    ("token_shift_ffn", "ffn", "feedforward.TokenShiftFFN", "decoder", "step1:causality", _FFN),
    ("future_bias_alibi", "pe", "positional.FutureBiasALiBi", "decoder", "harmless", _ALIBI),
    # numerical
    ("overflow_pe", "pe", "positional.OverflowPE", "decoder", "step1:finite_at_max_len",
     {**_DIM, "limit": 32}),
    ("exploding_ffn", "ffn", "feedforward.ExplodingFFN", "decoder", "step1:ffn_gain", _FFN),
    # train/eval inconsistency
    ("noisy_train_ffn", "ffn", "feedforward.NoisyTrainFFN", "encoder",
     "step1:train_eval_agreement", _FFN),
    ("skip_in_eval_ffn", "ffn", "feedforward.SkipInEvalFFN", "encoder",
     "step1:train_eval_agreement", _FFN),
    # protocol
    ("wrong_shape_pe", "pe", "positional.WrongShapePE", "encoder", "preflight", _DIM),
    ("wrong_shape_ffn", "ffn", "feedforward.WrongShapeFFN", "encoder", "preflight", _FFN),
    ("float64_pe", "pe", "positional.Float64PE", "encoder", "step1:output_dtype", _DIM),
    ("cpu_table_pe", "pe", "positional.CPUTablePE", "decoder", "step1:device_placement", _DIM),
    # --- bugs modelled on public issue trackers (issue 24): each caught by the step-1
    # property that names it
    ("aliasing_sinusoidal_pe", "pe", "positional.AliasingSinusoidalPE", "encoder",
     "step1:position_distinguishability", _DIM),
    ("linear_ffn", "ffn", "feedforward.LinearFFN", "encoder", "step1:ffn_nonlinearity", _FFN),
    ("rms_times_norm", "norm_layer", "norms.RMSTimesNorm", "decoder",
     "step1:norm_scale_control", {}),
    ("squared_variance_layernorm", "norm_layer", "norms.SquaredVarianceLayerNorm", "encoder",
     "step1:norm_scale_control", {}),
    ("self_masking_alibi", "pe", "positional.SelfMaskingALiBi", "decoder",
     "step1:query_sees_a_key", _ALIBI),
    ("bf16_table_rope", "pe", "positional.BF16TableRoPE", "decoder", "step1:bf16_behaviour",
     _HEAD_DIM),
    ("functional_dropout_ffn", "ffn", "feedforward.FunctionalDropoutFFN", "decoder",
     "step1:eval_determinism", {**_FFN, "p": 0.1}),
    # --- classes that slipped through (issue 32)
    ("renormalised_top1_moe", "ffn", "feedforward.RenormalisedTop1MoE", "decoder",
     "step1:task_gradient", {"d_model": _D, "d_ff": "${model.d_ff}", "n_experts": 4,
                             "top_k": 1, "init_std": "${model.init_std}"}),
    ("activation_first_ffn", "ffn", "feedforward.ActivationFirstFFN", "encoder",
     "step1:ffn_interaction", _FFN),
    # correct designs tlab does not ship (mutants.negatives): no check may fail them
    ("scale_norm", "norm_layer", "negatives.ScaleNorm", "decoder", "harmless", {}),
    ("dyt_norm", "norm_layer", "negatives.DyT", "decoder", "harmless", {}),
    ("squared_relu_ffn", "ffn", "negatives.SquaredReLUFFN", "decoder", "harmless", _FFN),
    ("mish_ffn", "ffn", "negatives.MishFFN", "decoder", "harmless", _FFN),
    ("kerple_log_bias", "pe", "negatives.KerpleLogBias", "decoder", "harmless",
     {"n_heads": "${model.n_heads}"}),
    ("xpos_rope", "pe", "negatives.XPosRoPE", "decoder", "harmless", _HEAD_DIM),
    # correct published designs that break an assumption of the old step-1 properties (issue
    # 32): a zero start, weights that do not sum to one, a norm-free or parameter-adding block;
    # each in both archs
    *((f"{name}/{arch}", group, f"negatives.{target}", arch, "harmless", settings)
      for name, group, target, settings in (
          ("rezero_block", "block", "ReZeroBlock", _DIM),
          ("zero_init_output_block", "block", "ZeroInitOutputBlock", _DIM),
          ("zero_gate_attention_block", "block", "ZeroGateAttentionBlock", _DIM),
          ("sigmoid_attention_block", "block", "SigmoidAttentionBlock",
           {**_DIM, "max_len": "${model.max_len}"}),
          ("quiet_attention_block", "block", "QuietAttentionBlock", _DIM),
          ("qk_norm_block", "block", "QKNormBlock", _DIM),
          ("normformer_block", "block", "NormFormerBlock", _DIM),
          ("shared_norm_parallel_block", "block", "SharedNormParallelBlock", _DIM),
          ("admin_block", "block", "AdminBlock", _DIM),
          ("zero_down_geglu", "ffn", "ZeroDownGeGLU",
           {"d_model": _D, "d_ff": "${model.d_ff}", "init_std": "${model.init_std}"}),
          ("p_rope", "pe", "PRoPE", _HEAD_DIM),
      ) for arch in ("encoder", "decoder")),
)
MUTANTS: tuple[Mutant, ...] = tuple(
    Mutant(name, group, f"transformer_lab.mutants.{target}", arch, expected, dict(settings))
    for name, group, target, arch, expected, settings in _CATALOGUE)

BY_NAME: dict[str, Mutant] = {m.name: m for m in MUTANTS}

# The built-in correct components (the negatives of ``tlab mutants``); pe=none is the control.
BUILT_IN_PES = ("sinusoidal", "learned", "sinusoidal_learned", "rope", "alibi", "t5")
BUILT_IN_FFNS = ("relu", "gelu", "gelu_tanh", "swish", "leaky_relu", "swiglu", "geglu", "reglu")
BUILT_IN_BLOCKS = ("post", "pre", "sandwich", "deepnorm")
BUILT_IN_NORM_LAYERS = ("layernorm", "rmsnorm", "batchnorm")
BUILT_IN_PRESETS = ("gpt2", "llama", "bert", "t5_encoder", "gpt_neox", "mixtral")
# Presets that steps 1-2 run at their own sizes: at the smoke size (d_model 8, 2 heads: head_dim
# 4) GPT-NeoX's 25% rotary would rotate 1 dimension, which RoPE cannot (it needs pairs).
PRESETS_AT_OWN_SIZE = ("gpt_neox",)
_SMOKE_SIZES = ("d_model", "n_heads", "n_layers", "d_ff")  # what routine.smoke.model sets


def built_in_negatives() -> list[tuple[str, str, str, list[str]]]:
    """``(name, group, arch, overrides)`` of every built-in PE x arch, FFN (decoder), block x
    norm layer (decoder, 2 layers) and preset (at the smoke size as ``tlab validate`` runs it,
    :data:`PRESETS_AT_OWN_SIZE` at its own sizes)."""
    from omegaconf import OmegaConf

    from transformer_lab.config.tree import choice_file

    rows = [(f"pe={pe}/{arch}", "pe", arch, [f"pe={pe}", f"arch={arch}"])
            for pe in BUILT_IN_PES for arch in ("encoder", "decoder")]
    rows += [(f"ffn={ffn}", "ffn", "decoder", [f"ffn={ffn}", "arch=decoder"])
             for ffn in BUILT_IN_FFNS]
    rows += [(f"block={block}/{layer}", "block", "decoder",
              [f"block={block}", f"norm_layer={layer}", "arch=decoder",
               "routine.smoke.model.n_layers=2"])
             for block in BUILT_IN_BLOCKS for layer in BUILT_IN_NORM_LAYERS]
    for preset in BUILT_IN_PRESETS:
        node = OmegaConf.load(choice_file("preset", preset))
        arch = next(choice for entry in node.defaults for group, choice in entry.items()
                    if group.endswith("/arch"))
        sizes = ([f"routine.smoke.model.{key}={node.model[key]}" for key in _SMOKE_SIZES]
                 if preset in PRESETS_AT_OWN_SIZE else [])
        rows.append((f"preset={preset}", "preset", arch, [f"preset={preset}", *sizes]))
    return rows


def mutant_config(mutant: Mutant, overrides: list[str] | tuple[str, ...] = (),
                  experiment: str = "smoke") -> Any:
    """The composed config (``experiment``, default smoke) with ``mutant``'s arch and its node
    in place of ``cfg[mutant.group]`` (interpolations resolve against the config)."""
    from omegaconf import OmegaConf, open_dict

    from transformer_lab.config.compose import compose
    from transformer_lab.config.tree import GROUP_ALIASES

    cfg = compose([f"experiment={experiment}", f"arch={mutant.arch}", *overrides])
    group = GROUP_ALIASES.get(mutant.group, mutant.group)  # activation -> ffn, norm -> block
    with open_dict(cfg):
        cfg[group] = OmegaConf.create(mutant.node())
    return cfg
