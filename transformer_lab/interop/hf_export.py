"""A trained tlab decoder as a Hugging Face causal LM (``tlab export --to-hf``): its
``transformers`` family where one expresses it, else its own code (``hf_remote``); the logits are
checked either way (docs/export.md)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from transformer_lab.config.spec import ModelSpec
from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf import composed_model, preset_of, to_hf
from transformer_lab.interop.hf_families import COMPONENTS, FAMILIES, Family, Unsupported
from transformer_lab.model import TransformerModel, embedding_scale

# Keys of the model node that shape the forward pass (the others: training, sizes of tables).
MODEL_KEYS = ("d_model", "n_heads", "n_layers", "d_ff", "n_kv_heads", "head_dim", "attn_scale",
              "qkv_bias", "out_bias", "ffn_bias", "tie_embeddings", "embed_norm",
              "parallel_block", "embed_scale", "pe_scale", "residual_scale",
              "gated_match_params", "max_len")
# Keys of a component's node that are labels, training settings or copies of model keys.
NOT_FORWARD = {"name", "_target_", "_partial_", "d_model", "d_ff", "head_dim", "max_len", "init",
               "bias", "dropout", "residual_dropout", "init_std", "load_balance_coef",
               "z_loss_coef", "match_params", "residual_scale"}
# RoPE settings that only matter under a scaling (pe.scaling other than none).
ROPE_SCALING_KEYS = {"factor", "original_max_len", "beta_fast", "beta_slow", "attention_factor",
                     "low_freq_factor", "high_freq_factor"}
PROBE_LENGTH = 8  # tokens of the logits check (fewer where model.max_len is shorter)


def components_text(spec: ModelSpec) -> str:
    return " ".join(f"{group}={spec.component(group).name}" for group in COMPONENTS)


def forward_settings(spec: ModelSpec) -> dict[str, Any]:
    """The settings of ``spec`` that shape the forward pass, tlab's defaults made explicit."""
    head_dim = spec.head_dim or spec.d_model // spec.n_heads
    explicit = {"n_kv_heads": spec.n_kv_heads or spec.n_heads, "head_dim": head_dim,
                "attn_scale": spec.attn_scale or 1 / math.sqrt(head_dim),
                "qkv_bias": spec.attn_bias if spec.qkv_bias is None else spec.qkv_bias,
                "out_bias": spec.attn_bias if spec.out_bias is None else spec.out_bias,
                "embed_scale": embedding_scale(spec.embed_scale, spec.d_model)}
    settings = {f"model.{key}": explicit.get(key, getattr(spec, key)) for key in MODEL_KEYS}
    settings["arch"] = "decoder" if spec.causal else "encoder"
    for group in COMPONENTS:
        node = spec.component(group)
        settings[group] = node.name
        ignored = NOT_FORWARD | (ROPE_SCALING_KEYS if node.get("scaling") == "none" else set())
        settings.update({f"{group}.{key}": value for key, value in node.items()
                         if key not in ignored and not isinstance(value, dict)})
    return settings


def check_expressible(spec: ModelSpec, family: Family) -> Any:
    """The family's HF config of ``spec``, or ``ConfigError`` naming what it cannot hold: a
    component, then every forward setting lost on the way there and back."""
    try:
        hf_config = family.hf_config(spec)
        back = composed_model(family.overrides(hf_config))
    except Unsupported as exc:
        raise ConfigError(f"{family.hf_class} cannot express this run's {exc}") from None
    except (KeyError, AttributeError, ValueError) as exc:
        preset = composed_model([f"preset={family.preset}"])
        names = {group: (spec.component(group).name, preset.component(group).name)
                 for group in COMPONENTS}
        wrong = [f"{group}={ours} (it has {its})" for group, (ours, its) in names.items()
                 if ours != its]
        what = ", ".join(wrong) or f"settings ({type(exc).__name__}: {exc})"
        raise ConfigError(f"{family.hf_class} cannot express this run's {what}") from None
    ours, theirs = forward_settings(spec), forward_settings(back)
    if "max_len" not in spec.pe:  # model.max_len sizes a PE's table only (none for ALiBi)
        ours.pop("model.max_len"), theirs.pop("model.max_len")
    lost = [f"{key}={_shown(ours.get(key))} (it has {_shown(theirs.get(key))})"
            for key in sorted(set(ours) | set(theirs))
            if not _same(ours.get(key), theirs.get(key))]
    if lost:
        raise ConfigError(f"{family.hf_class} cannot express this run's " + ", ".join(lost[:4])
                          + (f" and {len(lost) - 4} more" if len(lost) > 4 else ""))
    return hf_config


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return a == b


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def check_same_logits(model: TransformerModel, hf: Any, spec: ModelSpec) -> float:
    """The largest logit difference from tlab's on a seeded probe batch; ``ConfigError`` beyond fp32
    rounding (relative 1e-4)."""
    length = min(PROBE_LENGTH, int(spec.max_len))
    vocab = int(spec.vocab_size)
    tokens = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.eval()(tokens)  # (2, T, V)
        theirs = hf(tokens).logits  # (2, T, V)
    difference = (ours - theirs).abs().max().item()
    tolerance = 1e-4 * (1.0 + ours.abs().max().item())
    if not difference <= tolerance:
        raise ConfigError(f"{type(hf).__name__} does not compute this run's model: its logits "
                          f"differ by {difference:.3g} (> {tolerance:.2g}); a setting its config "
                          "does not hold")
    return difference


@dataclass(frozen=True)
class Route:
    """How a run is exported and why (one sentence for the console)."""

    hf_class: str  # the transformers class, or TlabForCausalLM (the run's own code)
    remote_code: bool  # modeling_tlab.py beside the weights: load with trust_remote_code=True
    why: str


def fold_scales(model: TransformerModel, spec: ModelSpec
                ) -> tuple[TransformerModel, ModelSpec, list[str]]:
    """(model, spec, what was folded): ``embed_scale`` into an untied embedding table and
    ``pe_scale`` into a learned position table; unchanged where nothing folds."""
    folds, scale = [], float(model.embed_scale)
    tied = model.lm_head.weight is model.token_embedding.weight
    learned = isinstance(getattr(model.positional, "weight", None), torch.nn.Parameter)
    fold_embedding = scale != 1.0 and not tied
    fold_pe = model.pe_kind == "additive" and learned and float(model.pe_scale) != 1.0
    if not (fold_embedding or fold_pe):
        return model, spec, folds
    model = copy.deepcopy(model)
    with torch.no_grad():
        if fold_embedding:
            model.token_embedding.weight.mul_(scale)
            model.embed_scale, spec = 1.0, replace(spec, embed_scale="none")
            folds.append(f"model.embed_scale={scale:g} folded into the token embedding table")
        if fold_pe:
            model.positional.weight.mul_(float(model.pe_scale))
            folds.append(f"model.pe_scale={float(model.pe_scale):g} folded into the learned "
                         "position table")
            model.pe_scale, spec = 1.0, replace(spec, pe_scale=1.0)
    return model, spec, folds


def family_export(model: TransformerModel, spec: ModelSpec, family: Family
                  ) -> tuple[Any, list[str]]:
    """(the family's ``transformers`` model with tlab's logits, what was folded); ``ConfigError``
    naming what the family cannot express."""
    folded_model, folded_spec, folds = fold_scales(model, spec)
    try:
        check_expressible(folded_spec, family)
    except ConfigError as refusal:
        if "model.embed_scale" in str(refusal) and spec.tie_embeddings:
            raise ConfigError(f"{refusal} (the output head shares the embedding table, so the "
                              "scale cannot be folded into it)") from None
        raise
    hf = to_hf(folded_model, folded_spec)
    for config in (hf.config, hf.generation_config):  # tlab's tokenizers have no special tokens
        config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    check_same_logits(model, hf, spec)
    return hf, folds


def export_model(model: TransformerModel, spec: ModelSpec, directory: Path) -> Route:
    """Write a trained decoder into ``directory`` as a HF causal LM (family class, else the run's
    own code); ``ConfigError`` for an encoder or a component of your own."""
    from transformer_lab.interop.hf_remote import load_remote, write_remote_code

    if not spec.causal:
        raise ConfigError("tlab export writes causal language models (AutoModelForCausalLM); "
                          "this run's model is an encoder (arch=encoder), whose output head "
                          "no HF encoder class holds")
    preset = preset_of(spec)
    family = next((f for f in FAMILIES.values() if f.preset == preset and f.output_head), None)
    reason = f"no transformers causal LM has this run's components ({components_text(spec)})"
    if family is not None:
        try:
            hf, folds = family_export(model, spec, family)
        except ConfigError as refusal:
            reason = str(refusal).rstrip(".")
        else:
            hf.save_pretrained(directory)
            why = (f"{family.hf_class} computes this run's model ({components_text(spec)}: "
                   f"preset={family.preset}'s components)")
            return Route(type(hf).__name__, False, why + "".join(f"; {f}" for f in folds))
    write_remote_code(model, spec, directory)
    check_same_logits(model, load_remote(directory), spec)
    return Route("TlabForCausalLM", True, f"{reason}: the run's own code is written beside "
                 "the weights (modeling_tlab.py)")
