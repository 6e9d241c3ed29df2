"""A catalogue of deliberately broken components, and of correct designs tlab does not ship, for
``tlab mutants``: does the validation routine catch each at its expected step, and pass the
correct ones? (docs/detector.md, "The mutant catalogue")"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_M = "transformer_lab.mutants"
_D = "${model.d_model}"
_HEAD_DIM = "${tlab.div:${model.d_model},${model.n_heads}}"
_FFN = {"d_model": _D, "d_ff": "${model.d_ff}", "activation": "gelu",
        "init_std": "${model.init_std}"}


@dataclass(frozen=True)
class Mutant:
    """One broken component and the routine's step/check expected to catch it."""

    name: str
    group: str  # pe | ffn (formerly activation) | norm_layer
    target: str  # the _target_
    arch: str  # encoder | decoder
    expected: str  # preflight | step1:<check> | step2 | step3[:check] | harmless
    settings: dict[str, Any] = field(default_factory=dict)
    partial: bool = False  # norm_layer nodes are partials: d_model -> module

    def node(self) -> dict[str, Any]:
        """The config node that replaces ``cfg[group]``."""
        node = {"name": self.name, "_target_": self.target, **self.settings}
        return {**node, "_partial_": True} if self.partial else node


MUTANTS: tuple[Mutant, ...] = (
    # position information lost
    Mutant("position_blind", "pe", f"{_M}.positional.PositionBlindPE", "encoder",
           "step1:position_injectivity", {"d_model": _D}),
    Mutant("clamped_pe", "pe", f"{_M}.positional.ClampedPE", "encoder",
           "step1:position_injectivity", {"d_model": _D, "clamp_at": 16}),
    Mutant("batch_dependent_rope", "pe", f"{_M}.positional.BatchDependentRoPE", "encoder",
           "step1:batch_independence", {"head_dim": _HEAD_DIM}),
    # relative property broken
    Mutant("mixed_pairing_rope", "pe", f"{_M}.positional.MixedPairingRoPE", "encoder",
           "step3:rotary_relative", {"head_dim": _HEAD_DIM}),
    Mutant("flipped_sign_rope", "pe", f"{_M}.positional.FlippedSignRoPE", "encoder",
           "step3:rotary_relative", {"head_dim": _HEAD_DIM}),
    # position offsets under a KV cache (right in a full forward, wrong in cached decoding)
    Mutant("offset_blind_rope", "pe", f"{_M}.positional.OffsetBlindRoPE", "decoder",
           "step1:cached_decoding", {"head_dim": _HEAD_DIM}),
    Mutant("stale_dynamic_rope", "pe", f"{_M}.positional.StaleDynamicRoPE", "decoder",
           "step1:cached_decoding", {"head_dim": _HEAD_DIM, "scaling": "dynamic",
                                     "factor": 2.0, "original_max_len": 16}),
    Mutant("top_left_alibi", "pe", f"{_M}.positional.TopLeftALiBi", "decoder",
           "step1:cached_decoding", {"n_heads": "${model.n_heads}", "causal": True}),
    # future leaks in a decoder
    Mutant("sequence_axis_norm", "norm_layer", f"{_M}.norms.SequenceAxisNorm", "decoder",
           "step1:causality", partial=True),
    Mutant("token_shift_ffn", "ffn", f"{_M}.feedforward.TokenShiftFFN", "decoder",
           "step1:causality", _FFN),
    Mutant("future_bias_alibi", "pe", f"{_M}.positional.FutureBiasALiBi", "decoder",
           "harmless", {"n_heads": "${model.n_heads}", "causal": True}),
    # numerical
    Mutant("overflow_pe", "pe", f"{_M}.positional.OverflowPE", "decoder",
           "step1:finite_at_max_len", {"d_model": _D, "limit": 32}),
    Mutant("exploding_ffn", "ffn", f"{_M}.feedforward.ExplodingFFN", "decoder",
           "step1:ffn_gain", _FFN),
    # train/eval inconsistency
    Mutant("noisy_train_ffn", "ffn", f"{_M}.feedforward.NoisyTrainFFN", "encoder",
           "step1:train_eval_agreement", _FFN),
    Mutant("skip_in_eval_ffn", "ffn", f"{_M}.feedforward.SkipInEvalFFN", "encoder",
           "step1:train_eval_agreement", _FFN),
    # protocol
    Mutant("wrong_shape_pe", "pe", f"{_M}.positional.WrongShapePE", "encoder", "preflight",
           {"d_model": _D}),
    Mutant("wrong_shape_ffn", "ffn", f"{_M}.feedforward.WrongShapeFFN", "encoder",
           "preflight", _FFN),
    Mutant("float64_pe", "pe", f"{_M}.positional.Float64PE", "encoder", "step1:output_dtype",
           {"d_model": _D}),
    Mutant("cpu_table_pe", "pe", f"{_M}.positional.CPUTablePE", "decoder",
           "step1:device_placement", {"d_model": _D}),
    # --- bugs modelled on public issue trackers (issue 24): each caught by the step-1
    # property that names it
    Mutant("aliasing_sinusoidal_pe", "pe", f"{_M}.positional.AliasingSinusoidalPE", "encoder",
           "step1:position_distinguishability", {"d_model": _D}),
    Mutant("linear_ffn", "ffn", f"{_M}.feedforward.LinearFFN", "encoder",
           "step1:ffn_nonlinearity", _FFN),
    Mutant("rms_times_norm", "norm_layer", f"{_M}.norms.RMSTimesNorm", "decoder",
           "step1:norm_scale_control", partial=True),
    Mutant("squared_variance_layernorm", "norm_layer", f"{_M}.norms.SquaredVarianceLayerNorm",
           "encoder", "step1:norm_scale_control", partial=True),
    Mutant("self_masking_alibi", "pe", f"{_M}.positional.SelfMaskingALiBi", "decoder",
           "step1:query_sees_a_key", {"n_heads": "${model.n_heads}", "causal": True}),
    Mutant("bf16_table_rope", "pe", f"{_M}.positional.BF16TableRoPE", "decoder",
           "step1:bf16_behaviour", {"head_dim": _HEAD_DIM}),
    Mutant("functional_dropout_ffn", "ffn", f"{_M}.feedforward.FunctionalDropoutFFN", "decoder",
           "step1:eval_determinism", {**_FFN, "p": 0.1}),
    # --- classes that slipped through (issue 32)
    Mutant("renormalised_top1_moe", "ffn", f"{_M}.feedforward.RenormalisedTop1MoE", "decoder",
           "step1:task_gradient", {"d_model": _D, "d_ff": "${model.d_ff}", "n_experts": 4,
                                   "top_k": 1, "init_std": "${model.init_std}"}),
    Mutant("activation_first_ffn", "ffn", f"{_M}.feedforward.ActivationFirstFFN", "encoder",
           "step1:ffn_interaction", _FFN),
    # correct designs tlab does not ship (mutants.negatives): no check may fail them
    Mutant("scale_norm", "norm_layer", f"{_M}.negatives.ScaleNorm", "decoder", "harmless",
           partial=True),
    Mutant("dyt_norm", "norm_layer", f"{_M}.negatives.DyT", "decoder", "harmless",
           partial=True),
    Mutant("squared_relu_ffn", "ffn", f"{_M}.negatives.SquaredReLUFFN", "decoder", "harmless",
           _FFN),
    Mutant("mish_ffn", "ffn", f"{_M}.negatives.MishFFN", "decoder", "harmless", _FFN),
    Mutant("kerple_log_bias", "pe", f"{_M}.negatives.KerpleLogBias", "decoder", "harmless",
           {"n_heads": "${model.n_heads}"}),
    Mutant("xpos_rope", "pe", f"{_M}.negatives.XPosRoPE", "decoder", "harmless",
           {"head_dim": _HEAD_DIM}),
    # correct published designs that break an assumption of the old step-1 properties (issue
    # 32): a zero start, weights that do not sum to one, a norm-free or parameter-adding block;
    # each in both archs
    *(Mutant(f"{name}/{arch}", group, f"{_M}.negatives.{target}", arch, "harmless", settings)
      for name, group, target, settings in (
          ("rezero_block", "block", "ReZeroBlock", {"d_model": _D}),
          ("zero_init_output_block", "block", "ZeroInitOutputBlock", {"d_model": _D}),
          ("zero_gate_attention_block", "block", "ZeroGateAttentionBlock", {"d_model": _D}),
          ("sigmoid_attention_block", "block", "SigmoidAttentionBlock",
           {"d_model": _D, "max_len": "${model.max_len}"}),
          ("quiet_attention_block", "block", "QuietAttentionBlock", {"d_model": _D}),
          ("qk_norm_block", "block", "QKNormBlock", {"d_model": _D}),
          ("normformer_block", "block", "NormFormerBlock", {"d_model": _D}),
          ("shared_norm_parallel_block", "block", "SharedNormParallelBlock", {"d_model": _D}),
          ("admin_block", "block", "AdminBlock", {"d_model": _D}),
          ("zero_down_geglu", "ffn", "ZeroDownGeGLU",
           {"d_model": _D, "d_ff": "${model.d_ff}", "init_std": "${model.init_std}"}),
          ("p_rope", "pe", "PRoPE", {"head_dim": _HEAD_DIM}),
      ) for arch in ("encoder", "decoder")),
)

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


def preset_negative(preset: str) -> tuple[str, str, str, list[str]]:
    """A preset as a negative, at the smoke size as ``tlab validate`` runs it
    (:data:`PRESETS_AT_OWN_SIZE` at its own sizes)."""
    from omegaconf import OmegaConf

    from transformer_lab.config.tree import choice_file

    node = OmegaConf.load(choice_file("preset", preset))
    arch = next(choice for entry in node.defaults for group, choice in entry.items()
                if group.endswith("/arch"))
    sizes = ([f"routine.smoke.model.{key}={node.model[key]}" for key in _SMOKE_SIZES]
             if preset in PRESETS_AT_OWN_SIZE else [])
    return f"preset={preset}", "preset", arch, [f"preset={preset}", *sizes]


def built_in_negatives() -> list[tuple[str, str, str, list[str]]]:
    """``(name, group, arch, overrides)`` of every built-in PE x arch, FFN (decoder), block x
    norm layer (decoder, 2 layers) and preset (:func:`preset_negative`)."""
    rows = [(f"pe={pe}/{arch}", "pe", arch, [f"pe={pe}", f"arch={arch}"])
            for pe in BUILT_IN_PES for arch in ("encoder", "decoder")]
    rows += [(f"ffn={ffn}", "ffn", "decoder", [f"ffn={ffn}", "arch=decoder"])
             for ffn in BUILT_IN_FFNS]
    rows += [(f"block={block}/{layer}", "block", "decoder",
              [f"block={block}", f"norm_layer={layer}", "arch=decoder",
               "routine.smoke.model.n_layers=2"])
             for block in BUILT_IN_BLOCKS for layer in BUILT_IN_NORM_LAYERS]
    rows += [preset_negative(preset) for preset in BUILT_IN_PRESETS]
    return rows


# a config group under its other name (the tree renamed activation -> ffn, norm -> block)
_OTHER_NAME = {"ffn": "activation", "activation": "ffn", "block": "norm", "norm": "block"}


def mutant_config(mutant: Mutant, overrides: list[str] | tuple[str, ...] = (),
                  experiment: str = "smoke") -> Any:
    """The composed config (``experiment``, default smoke) with ``mutant``'s arch and its node
    in place of ``cfg[mutant.group]`` (interpolations resolve against the config)."""
    from omegaconf import OmegaConf, open_dict

    from transformer_lab.config.compose import compose

    cfg = compose([f"experiment={experiment}", f"arch={mutant.arch}", *overrides])
    group = mutant.group if mutant.group in cfg else _OTHER_NAME.get(mutant.group, mutant.group)
    with open_dict(cfg):
        cfg[group] = OmegaConf.create(mutant.node())
    return cfg
