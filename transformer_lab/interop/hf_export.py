"""A trained tlab decoder as a Hugging Face causal language model (``tlab export --to-hf``),
only where ``transformers`` computes the same function.

    family = causal_family(cfg)           # the HF family of the run's components, or refused
    check_expressible(cfg, family)        # every knob the family's HF config can hold
    hf = exported_model(model, cfg)       # to_hf, no special tokens, the same logits (checked)

What HF cannot express is refused with one ``ConfigError`` line naming the knobs: a component
the family's HF config has no setting for (the family's preset tells which it has, e.g. LLaMA's
``pe=rope``), then every setting of the forward pass that does not survive the way there and
back (tlab config -> HF config -> the tlab overrides that HF config stands for,
``Family.overrides``), e.g. ``model.embed_scale`` (LLaMA scales no embedding), a RoPE
``pe.style`` or ``model.parallel_block``. Settings of training
only (dropout, initialisation, an MoE's auxiliary losses) are not compared. Last, the exported
model's logits must equal tlab's on a probe batch within fp32 rounding.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.compose import compose
from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf import preset_of, to_hf
from transformer_lab.interop.hf_common import Family, Unsupported
from transformer_lab.interop.hf_families import FAMILIES
from transformer_lab.model import TransformerModel, embedding_scale

COMPONENTS = ("pe", "ffn", "block", "norm_layer")
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


def causal_family(cfg: DictConfig) -> Family:
    """The HF causal-LM family of a decoder's components (``ConfigError`` for an encoder or
    components no family has)."""
    if not cfg.arch.causal:
        raise ConfigError("tlab export writes causal language models (AutoModelForCausalLM); "
                          "this run's model is an encoder (arch=encoder), whose output head "
                          "no HF encoder class holds")
    preset = preset_of(cfg)
    family = next((f for f in FAMILIES.values() if f.preset == preset and f.output_head), None)
    if family is None:
        causal = sorted({f.preset for f in FAMILIES.values() if f.output_head})
        raise ConfigError(f"no Hugging Face causal LM has this run's components ("
                          f"{components_text(cfg)}); tlab exports the presets "
                          f"{', '.join(causal)} (train with preset=...)")
    return family


def components_text(cfg: DictConfig) -> str:
    return " ".join(f"{group}={cfg[group].get('name')}" for group in COMPONENTS)


def forward_settings(cfg: DictConfig) -> dict[str, Any]:
    """The settings of ``cfg`` that shape the forward pass, with tlab's defaults made explicit
    (``n_kv_heads`` null = ``n_heads``, ``embed_scale`` as the number it multiplies by, ...)."""
    m = cfg.model
    head_dim = m.get("head_dim") or m.d_model // m.n_heads
    explicit = {"n_kv_heads": m.get("n_kv_heads") or m.n_heads, "head_dim": head_dim,
                "attn_scale": m.get("attn_scale") or 1 / math.sqrt(head_dim),
                "qkv_bias": _first_set(m.get("qkv_bias"), m.attn_bias),
                "out_bias": _first_set(m.get("out_bias"), m.attn_bias),
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


def _first_set(value: Any, default: Any) -> Any:
    return default if value is None else value


def check_expressible(cfg: DictConfig, family: Family) -> Any:
    """The family's HF config of ``cfg``, or ``ConfigError`` naming what it cannot hold: a
    component its HF config has no setting for (told by the family's preset), then every
    forward setting lost on the way there and back."""
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


def without_special_tokens(hf: Any) -> Any:
    """tlab's tokenizers have no special tokens: no BOS, EOS or padding id in the model's
    config or its generation config (a family's defaults, e.g. LLaMA's EOS id 2, would end
    ``generate`` at a text's own token 2)."""
    for config in (hf.config, getattr(hf, "generation_config", None)):
        if config is not None:
            config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    return hf


def check_same_logits(model: TransformerModel, hf: Any, cfg: DictConfig) -> float:
    """The largest difference between tlab's and the HF model's logits on a seeded probe batch
    (2, ``PROBE_LENGTH``); ``ConfigError`` when it exceeds fp32 rounding of logits of that size
    (relative 1e-4, summed over a few layers' matmuls and norms)."""
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


def exported_model(model: TransformerModel, cfg: DictConfig) -> Any:
    """``to_hf`` of a trained decoder after the checks above: a ``transformers`` causal LM with
    no special tokens whose logits equal tlab's."""
    check_expressible(cfg, causal_family(cfg))
    hf = without_special_tokens(to_hf(model, cfg))
    check_same_logits(model, hf, cfg)
    return hf
