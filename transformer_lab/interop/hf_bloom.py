"""BLOOM (ALiBi) between ``transformers`` and tlab (``hf_families``; why the slopes and Q/K/V layout
match: docs/export.md)."""

from __future__ import annotations

from typing import Any

from transformer_lab.interop.hf_common import State, flag, layers, require, swapped
from transformer_lab.interop.hf_gpt import fused_convert, fused_pairs


def bloom_overrides(hc: Any) -> list[str]:
    require(hc, "apply_residual_connection_post_layernorm", (False,), False)
    return ["preset=bloom", f"model.d_model={hc.hidden_size}", f"model.n_heads={hc.n_head}",
            f"model.n_layers={hc.n_layer}", f"model.d_ff={4 * hc.hidden_size}",
            f"norm_layer.eps={hc.layer_norm_epsilon}",
            flag("model.tie_embeddings", hc.tie_word_embeddings)]


def _bloom_pairs(n_layers: range) -> tuple[list, list]:
    pairs, qkv = fused_pairs(n_layers, "transformer.h", "self_attention")
    pairs += [("transformer.word_embeddings.weight", "token_embedding.weight"),
              ("lm_head.weight", "lm_head.weight")]
    for old, new in (("transformer.word_embeddings_layernorm", "embed_norm"),
                     ("transformer.ln_f", "final_norm")):
        pairs += [(f"{old}.{w}", f"{new}.{w}") for w in ("weight", "bias")]
    return pairs, qkv


def bloom_to_tlab(hc: Any, hf: State) -> State:
    pairs, qkv = _bloom_pairs(layers(hc, "n_layer"))
    return fused_convert(hf, pairs, qkv, hc.n_head, 3)


def bloom_to_hf(cfg: Any, tl: State) -> State:
    pairs, qkv = _bloom_pairs(layers(cfg))
    return fused_convert(tl, swapped(pairs), swapped(qkv), 3, cfg.model.n_heads)


def bloom_config(cfg: Any) -> Any:
    from transformers import BloomConfig

    m = cfg.model
    return BloomConfig(vocab_size=m.vocab_size, hidden_size=m.d_model, n_layer=m.n_layers,
                       n_head=m.n_heads, layer_norm_epsilon=cfg.norm_layer.eps,
                       tie_word_embeddings=bool(m.tie_embeddings), bos_token_id=None,
                       eos_token_id=None)
