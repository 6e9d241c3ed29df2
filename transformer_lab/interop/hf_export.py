"""A trained tlab decoder as a Hugging Face causal LM (``tlab export --to-hf``): its
``transformers`` family where one expresses it, else its own code (``hf_remote``); the logits are
checked either way (docs/export.md)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.compose import compose
from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf import preset_of, to_hf
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


def components_text(cfg: DictConfig) -> str:
    return " ".join(f"{group}={cfg[group].get('name')}" for group in COMPONENTS)


def forward_settings(cfg: DictConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that shape the forward pass, tlab's defaults made explicit."""
    m = cfg.model
    head_dim = m.get("head_dim") or m.d_model // m.n_heads
    explicit = {"n_kv_heads": m.get("n_kv_heads") or m.n_heads, "head_dim": head_dim,
                "attn_scale": m.get("attn_scale") or 1 / math.sqrt(head_dim),
                "qkv_bias": m.attn_bias if m.get("qkv_bias") is None else m.qkv_bias,
                "out_bias": m.attn_bias if m.get("out_bias") is None else m.out_bias,
                "embed_scale": embedding_scale(m.embed_scale, m.d_model)}
    settings = {f"model.{key}": explicit.get(key, m.get(key)) for key in MODEL_KEYS}
    settings["arch"] = "decoder" if cfg.arch.causal else "encoder"
    for group in COMPONENTS:
        node = OmegaConf.to_container(cfg[group], resolve=True)
        settings[group] = node.get("name")
        ignored = NOT_FORWARD | (ROPE_SCALING_KEYS if node.get("scaling") == "none" else set())
        settings.update({f"{group}.{key}": value for key, value in node.items()
                         if key not in ignored and not isinstance(value, dict)})
    return settings


def check_expressible(cfg: DictConfig, family: Family) -> Any:
    """The family's HF config of ``cfg``, or ``ConfigError`` naming what it cannot hold: a
    component, then every forward setting lost on the way there and back."""
    try:
        hf_config = family.hf_config(cfg)
        back = compose(family.overrides(hf_config))
    except Unsupported as exc:
        raise ConfigError(f"{family.hf_class} cannot express this run's {exc}") from None
    except (KeyError, AttributeError, ValueError) as exc:
        preset = compose([f"preset={family.preset}"])
        wrong = [f"{group}={cfg[group].get('name')} (it has {preset[group].get('name')})"
                 for group in COMPONENTS if cfg[group].get("name") != preset[group].get("name")]
        what = ", ".join(wrong) or f"settings ({type(exc).__name__}: {exc})"
        raise ConfigError(f"{family.hf_class} cannot express this run's {what}") from None
    ours, theirs = forward_settings(cfg), forward_settings(back)
    if "max_len" not in cfg.pe:  # model.max_len sizes a PE's table only (none for ALiBi)
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


def check_same_logits(model: TransformerModel, hf: Any, cfg: DictConfig) -> float:
    """The largest logit difference from tlab's on a seeded probe batch; ``ConfigError`` beyond fp32
    rounding (relative 1e-4)."""
    length = min(PROBE_LENGTH, int(cfg.model.max_len))
    vocab = int(cfg.model.vocab_size)
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


def fold_scales(model: TransformerModel, cfg: DictConfig
                ) -> tuple[TransformerModel, DictConfig, list[str]]:
    """(model, cfg, what was folded): ``embed_scale`` into an untied embedding table and
    ``pe_scale`` into a learned position table; unchanged where nothing folds."""
    folds, scale = [], float(model.embed_scale)
    tied = model.lm_head.weight is model.token_embedding.weight
    learned = isinstance(getattr(model.positional, "weight", None), torch.nn.Parameter)
    fold_embedding = scale != 1.0 and not tied
    fold_pe = model.pe_kind == "additive" and learned and float(model.pe_scale) != 1.0
    if not (fold_embedding or fold_pe):
        return model, cfg, folds
    model, cfg = copy.deepcopy(model), copy.deepcopy(cfg)
    with torch.no_grad():
        if fold_embedding:
            model.token_embedding.weight.mul_(scale)
            model.embed_scale, cfg.model.embed_scale = 1.0, "none"
            folds.append(f"model.embed_scale={scale:g} folded into the token embedding table")
        if fold_pe:
            model.positional.weight.mul_(float(model.pe_scale))
            folds.append(f"model.pe_scale={float(model.pe_scale):g} folded into the learned "
                         "position table")
            model.pe_scale, cfg.model.pe_scale = 1.0, 1.0
    return model, cfg, folds


def family_export(model: TransformerModel, cfg: DictConfig, family: Family
                  ) -> tuple[Any, list[str]]:
    """(the family's ``transformers`` model with tlab's logits, what was folded); ``ConfigError``
    naming what the family cannot express."""
    folded_model, folded_cfg, folds = fold_scales(model, cfg)
    try:
        check_expressible(folded_cfg, family)
    except ConfigError as refusal:
        if "model.embed_scale" in str(refusal) and cfg.model.get("tie_embeddings"):
            raise ConfigError(f"{refusal} (the output head shares the embedding table, so the "
                              "scale cannot be folded into it)") from None
        raise
    hf = to_hf(folded_model, folded_cfg)
    for config in (hf.config, hf.generation_config):  # tlab's tokenizers have no special tokens
        config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    check_same_logits(model, hf, cfg)
    return hf, folds


def export_model(model: TransformerModel, cfg: DictConfig, directory: Path) -> Route:
    """Write a trained decoder into ``directory`` as a HF causal LM (family class, else the run's
    own code); ``ConfigError`` for an encoder or a component of your own."""
    from transformer_lab.interop.hf_remote import load_remote, write_remote_code

    if not cfg.arch.causal:
        raise ConfigError("tlab export writes causal language models (AutoModelForCausalLM); "
                          "this run's model is an encoder (arch=encoder), whose output head "
                          "no HF encoder class holds")
    preset = preset_of(cfg)
    family = next((f for f in FAMILIES.values() if f.preset == preset and f.output_head), None)
    reason = f"no transformers causal LM has this run's components ({components_text(cfg)})"
    if family is not None:
        try:
            hf, folds = family_export(model, cfg, family)
        except ConfigError as refusal:
            reason = str(refusal).rstrip(".")
        else:
            hf.save_pretrained(directory)
            why = (f"{family.hf_class} computes this run's model ({components_text(cfg)}: "
                   f"preset={family.preset}'s components)")
            return Route(type(hf).__name__, False, why + "".join(f"; {f}" for f in folds))
    write_remote_code(model, cfg, directory)
    check_same_logits(model, load_remote(directory), cfg)
    return Route("TlabForCausalLM", True, f"{reason}: the run's own code is written beside "
                 "the weights (modeling_tlab.py)")
