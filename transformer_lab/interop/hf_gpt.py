"""GPT-2 and GPT-NeoX (Pythia) between ``transformers`` and tlab (``hf_families``; layouts:
docs/export.md)."""

from __future__ import annotations

from typing import Any

from transformer_lab.interop.hf_common import (
    State,
    Unsupported,
    ffn_choice,
    flag,
    layers,
    max_positions,
    rename,
    require,
    rope_overrides,
    rope_parameters,
    swapped,
)

# HF activation name -> tlab ffn choice (and back: the first HF name of each choice)
GELU_NAMES = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
              "relu": "relu"}


HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def hf_activation(cfg: Any) -> str:
    """The HF activation name of tlab's ``ffn`` choice; ``Unsupported`` for another FFN."""
    if cfg.ffn.name not in HF_ACTIVATIONS:
        raise Unsupported(f"ffn={cfg.ffn.name} (GPT-2 and GPT-NeoX have "
                          f"{', '.join(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[cfg.ffn.name]


# --------------------------------------------------------------------------------------------
# GPT-2


def gpt2_overrides(hc: Any) -> list[str]:
    require(hc, "scale_attn_weights", (True,), True)
    require(hc, "scale_attn_by_inverse_layer_idx", (False,), False)
    require(hc, "add_cross_attention", (False,), False)
    ffn = ffn_choice(hc.activation_function, GELU_NAMES, "activation_function")
    return ["preset=gpt2", f"ffn={ffn}", f"model.d_model={hc.n_embd}",
            f"model.n_heads={hc.n_head}", f"model.n_layers={hc.n_layer}",
            f"model.d_ff={hc.n_inner or 4 * hc.n_embd}", f"model.max_len={hc.n_positions}",
            f"norm_layer.eps={hc.layer_norm_epsilon}",
            flag("model.tie_embeddings", hc.tie_word_embeddings)]


def _gpt2_pairs(n_layers: range) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(HF, tlab) names: renamed as they are, and Conv1D weights that are transposed."""
    plain = [("transformer.wte.weight", "token_embedding.weight"),
             ("transformer.wpe.weight", "positional.weight"),
             ("lm_head.weight", "lm_head.weight")]
    plain += [(f"transformer.ln_f.{w}", f"final_norm.{w}") for w in ("weight", "bias")]
    conv = []
    for i in n_layers:
        hf, tl = f"transformer.h.{i}.", f"blocks.{i}."
        plain += [(hf + f"ln_{n}.{w}", tl + f"norm{n}.{w}") for n in (1, 2)
                  for w in ("weight", "bias")]
        for old, new in (("attn.c_attn", "attention.qkv_proj"),
                         ("attn.c_proj", "attention.out_proj"),
                         ("mlp.c_fc", "feedforward.up_proj"),
                         ("mlp.c_proj", "feedforward.down_proj")):
            plain.append((hf + old + ".bias", tl + new + ".bias"))
            conv.append((hf + old + ".weight", tl + new + ".weight"))
    return plain, conv


def gpt2_to_tlab(hc: Any, hf: State) -> State:
    plain, conv = _gpt2_pairs(layers(hc, "n_layer"))
    out = rename(hf, plain)
    out.update({new: hf[old].t() for old, new in conv})  # Conv1D (in, out) -> (out, in)
    return out


def gpt2_to_hf(cfg: Any, tl: State) -> State:
    plain, conv = _gpt2_pairs(layers(cfg))
    out = rename(tl, swapped(plain))
    out.update({old: tl[new].t() for old, new in conv})
    return out


def gpt2_config(cfg: Any) -> Any:
    from transformers import GPT2Config

    m = cfg.model
    return GPT2Config(vocab_size=m.vocab_size, n_positions=m.max_len, n_embd=m.d_model,
                      n_layer=m.n_layers, n_head=m.n_heads, n_inner=m.d_ff,
                      activation_function=hf_activation(cfg), resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0, layer_norm_epsilon=cfg.norm_layer.eps,
                      tie_word_embeddings=bool(m.tie_embeddings), bos_token_id=None,
                      eos_token_id=None)


# --------------------------------------------------------------------------------------------
# GPT-NeoX


def neox_overrides(hc: Any) -> list[str]:
    ffn = ffn_choice(hc.hidden_act, GELU_NAMES, "hidden_act")
    return ["preset=gpt_neox", f"ffn={ffn}", f"model.d_model={hc.hidden_size}",
            f"model.n_heads={hc.num_attention_heads}", f"model.n_layers={hc.num_hidden_layers}",
            f"model.d_ff={hc.intermediate_size}", f"model.max_len={hc.max_position_embeddings}",
            f"norm_layer.eps={hc.layer_norm_eps}",
            flag("model.attn_bias", getattr(hc, "attention_bias", True)),
            flag("model.parallel_block", hc.use_parallel_residual),
            flag("model.tie_embeddings", hc.tie_word_embeddings), *rope_overrides(hc)]


def fused_pairs(n_layers: range, prefix: str, attn: str) -> tuple[list, list]:
    """(pairs only renamed, fused Q/K/V pairs) of a NeoX-like block (NeoX, BLOOM) whose layers are
    ``prefix.{i}.`` and whose attention module is ``attn``."""
    pairs, qkv = [], []
    for i in n_layers:
        hf, tl = f"{prefix}.{i}.", f"blocks.{i}."
        for old, new in (("input_layernorm", "norm1"), ("post_attention_layernorm", "norm2"),
                         (f"{attn}.dense", "attention.out_proj"),
                         ("mlp.dense_h_to_4h", "feedforward.up_proj"),
                         ("mlp.dense_4h_to_h", "feedforward.down_proj")):
            pairs += [(hf + f"{old}.{w}", tl + f"{new}.{w}") for w in ("weight", "bias")]
        qkv += [(hf + f"{attn}.query_key_value.{w}", tl + f"attention.qkv_proj.{w}")
                for w in ("weight", "bias")]
    return pairs, qkv


def fused_convert(state: State, pairs: list, qkv: list, first: int, second: int) -> State:
    """``state`` renamed by ``pairs``, its fused Q/K/V regrouped from ``(first, second, Dh)`` rows
    to ``(second, first, Dh)``: per head (H, 3) to per projection (3, H) and back."""
    out = rename(state, pairs)
    for old, new in qkv:
        if old in state:
            t = state[old]
            out[new] = t.view(first, second, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
    return out


def _neox_pairs(n_layers: range) -> tuple[list, list]:
    pairs, qkv = fused_pairs(n_layers, "gpt_neox.layers", "attention")
    pairs += [("gpt_neox.embed_in.weight", "token_embedding.weight"),
              ("lm_head.weight", "lm_head.weight")]
    pairs += [(f"gpt_neox.final_layer_norm.{w}", f"final_norm.{w}") for w in ("weight", "bias")]
    return pairs, qkv


def neox_to_tlab(hc: Any, hf: State) -> State:
    pairs, qkv = _neox_pairs(layers(hc))
    return fused_convert(hf, pairs, qkv, hc.num_attention_heads, 3)


def neox_to_hf(cfg: Any, tl: State) -> State:
    pairs, qkv = _neox_pairs(layers(cfg))
    return fused_convert(tl, swapped(pairs), swapped(qkv), 3, cfg.model.n_heads)


def neox_config(cfg: Any) -> Any:
    from transformers import GPTNeoXConfig

    m = cfg.model
    rope = {**rope_parameters(cfg), "partial_rotary_factor": float(cfg.pe.rotary_fraction)}
    return GPTNeoXConfig(vocab_size=m.vocab_size, hidden_size=m.d_model,
                         num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                         intermediate_size=m.d_ff, hidden_act=hf_activation(cfg),
                         max_position_embeddings=max_positions(cfg),
                         layer_norm_eps=cfg.norm_layer.eps,
                         use_parallel_residual=bool(m.parallel_block),
                         attention_bias=bool(m.attn_bias),
                         tie_word_embeddings=bool(m.tie_embeddings), rope_parameters=rope,
                         bos_token_id=None, eos_token_id=None)
