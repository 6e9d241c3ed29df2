"""BERT and the T5 encoder between ``transformers`` and tlab (``hf_families``), imported without an
output head (layouts: docs/export.md)."""

from __future__ import annotations

from typing import Any

import torch

from transformer_lab.interop.hf_common import (
    State,
    Unsupported,
    ffn_choice,
    layers,
    rename,
    require,
    swapped,
)
from transformer_lab.interop.hf_gpt import GELU_NAMES, hf_activation

# --------------------------------------------------------------------------------------------
# BERT


def bert_overrides(hc: Any) -> list[str]:
    require(hc, "position_embedding_type", ("absolute",), "absolute")
    require(hc, "is_decoder", (False,), False)
    ffn = ffn_choice(hc.hidden_act, GELU_NAMES, "hidden_act")
    return ["preset=bert", f"ffn={ffn}", f"model.d_model={hc.hidden_size}",
            f"model.n_heads={hc.num_attention_heads}", f"model.n_layers={hc.num_hidden_layers}",
            f"model.d_ff={hc.intermediate_size}", f"model.max_len={hc.max_position_embeddings}",
            f"norm_layer.eps={hc.layer_norm_eps}", "model.tie_embeddings=false"]


def _bert_pairs(n_layers: range) -> list[tuple[str, str]]:
    pairs = [("embeddings.word_embeddings.weight", "token_embedding.weight")]
    pairs += [(f"embeddings.LayerNorm.{w}", f"embed_norm.{w}") for w in ("weight", "bias")]
    for i in n_layers:
        hf, tl = f"encoder.layer.{i}.", f"blocks.{i}."
        for old, new in (("attention.output.dense", "attention.out_proj"),
                         ("attention.output.LayerNorm", "norm1"),
                         ("intermediate.dense", "feedforward.up_proj"),
                         ("output.dense", "feedforward.down_proj"), ("output.LayerNorm", "norm2")):
            pairs += [(hf + f"{old}.{w}", tl + f"{new}.{w}") for w in ("weight", "bias")]
    return pairs


def bert_to_tlab(hc: Any, hf: State) -> State:
    out = rename(hf, _bert_pairs(layers(hc)))
    out["positional.weight"] = (hf["embeddings.position_embeddings.weight"]
                                + hf["embeddings.token_type_embeddings.weight"][0])  # (P, D)
    for i in layers(hc):
        attn = f"encoder.layer.{i}.attention.self."
        for w in ("weight", "bias"):
            out[f"blocks.{i}.attention.qkv_proj.{w}"] = torch.cat(
                [hf[attn + f"{p}.{w}"] for p in ("query", "key", "value")])
    return out


def bert_to_hf(cfg: Any, tl: State) -> State:
    out = rename(tl, swapped(_bert_pairs(layers(cfg))))
    out["embeddings.position_embeddings.weight"] = tl["positional.weight"]
    out["embeddings.token_type_embeddings.weight"] = torch.zeros(2, cfg.model.d_model)
    for i in layers(cfg):
        attn = f"encoder.layer.{i}.attention.self."
        for w in ("weight", "bias"):
            for p, t in zip(("query", "key", "value"),
                            tl[f"blocks.{i}.attention.qkv_proj.{w}"].chunk(3), strict=True):
                out[attn + f"{p}.{w}"] = t
    return out


def bert_config(cfg: Any) -> Any:
    from transformers import BertConfig

    m = cfg.model
    return BertConfig(vocab_size=m.vocab_size, hidden_size=m.d_model,
                      num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                      intermediate_size=m.d_ff, hidden_act=hf_activation(cfg),
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      max_position_embeddings=m.max_len, type_vocab_size=2,
                      layer_norm_eps=cfg.norm_layer.eps)


# --------------------------------------------------------------------------------------------
# T5 encoder


def t5_overrides(hc: Any) -> list[str]:
    if getattr(hc, "is_gated_act", False):
        raise Unsupported(f"feed_forward_proj={hc.feed_forward_proj!r} (a gated FFN as in T5 "
                          "v1.1; tlab's T5 map supports 'relu' and 'gelu')")
    ffn = ffn_choice(hc.dense_act_fn, GELU_NAMES, "dense_act_fn")
    return ["preset=t5_encoder", f"ffn={ffn}", f"model.d_model={hc.d_model}",
            f"model.n_heads={hc.num_heads}", f"model.head_dim={hc.d_kv}",
            f"model.n_layers={hc.num_layers}", f"model.d_ff={hc.d_ff}", "model.attn_scale=1.0",
            f"norm_layer.eps={hc.layer_norm_epsilon}",
            f"pe.num_buckets={hc.relative_attention_num_buckets}",
            f"pe.max_distance={hc.relative_attention_max_distance}"]


def _t5_pairs(n_layers: range) -> list[tuple[str, str]]:
    pairs = [("shared.weight", "token_embedding.weight"),
             ("encoder.final_layer_norm.weight", "final_norm.weight"),
             ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
              "positional.relative_attention_bias.weight")]  # (buckets, H), layer 0 only
    for i in n_layers:
        hf, tl = f"encoder.block.{i}.layer.", f"blocks.{i}."
        pairs += [(hf + "0.SelfAttention.o.weight", tl + "attention.out_proj.weight"),
                  (hf + "0.layer_norm.weight", tl + "norm1.weight"),
                  (hf + "1.DenseReluDense.wi.weight", tl + "feedforward.up_proj.weight"),
                  (hf + "1.DenseReluDense.wo.weight", tl + "feedforward.down_proj.weight"),
                  (hf + "1.layer_norm.weight", tl + "norm2.weight")]
    return pairs


def t5_to_tlab(hc: Any, hf: State) -> State:
    out = rename(hf, _t5_pairs(layers(hc, "num_layers")))
    for i in layers(hc, "num_layers"):
        attn = f"encoder.block.{i}.layer.0.SelfAttention."
        out[f"blocks.{i}.attention.qkv_proj.weight"] = torch.cat(
            [hf[attn + f"{p}.weight"] for p in "qkv"])  # (3 H d_kv, D)
    return out


def t5_to_hf(cfg: Any, tl: State) -> State:
    out = rename(tl, swapped(_t5_pairs(layers(cfg))))
    out["encoder.embed_tokens.weight"] = tl["token_embedding.weight"]
    for i in layers(cfg):
        attn = f"encoder.block.{i}.layer.0.SelfAttention."
        for p, t in zip("qkv", tl[f"blocks.{i}.attention.qkv_proj.weight"].chunk(3),
                        strict=True):
            out[attn + f"{p}.weight"] = t
    return out


def t5_config(cfg: Any) -> Any:
    from transformers import T5Config

    m = cfg.model
    return T5Config(vocab_size=m.vocab_size, d_model=m.d_model,
                    d_kv=m.head_dim or m.d_model // m.n_heads, d_ff=m.d_ff, num_layers=m.n_layers,
                    num_heads=m.n_heads, relative_attention_num_buckets=cfg.pe.num_buckets,
                    relative_attention_max_distance=cfg.pe.max_distance, dropout_rate=0.0,
                    layer_norm_epsilon=cfg.norm_layer.eps, feed_forward_proj=hf_activation(cfg),
                    use_cache=False)
