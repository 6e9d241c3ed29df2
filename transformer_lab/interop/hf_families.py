"""Per-family maps between ``transformers`` and tlab: each ``Family`` gives the overrides a
checkpoint's config stands for and its weights renamed (and reshaped) both ways; a setting tlab
cannot express raises ``Unsupported``."""

from __future__ import annotations

from typing import Any

import torch

from transformer_lab.interop.hf_bloom import (
    bloom_config,
    bloom_overrides,
    bloom_to_hf,
    bloom_to_tlab,
)
from transformer_lab.interop.hf_common import (
    Family,
    State,
    Unsupported,
    flag,
    layers,
    max_positions,
    rename,
    require,
    rope_overrides,
    rope_parameters,
    swapped,
)
from transformer_lab.interop.hf_encoders import (
    bert_config,
    bert_overrides,
    bert_to_hf,
    bert_to_tlab,
    t5_config,
    t5_overrides,
    t5_to_hf,
    t5_to_tlab,
)
from transformer_lab.interop.hf_gpt import (
    gpt2_config,
    gpt2_overrides,
    gpt2_to_hf,
    gpt2_to_tlab,
    neox_config,
    neox_overrides,
    neox_to_hf,
    neox_to_tlab,
)

# --------------------------------------------------------------------------------------------
# LLaMA / Mixtral (Mistral and Qwen2 share the layout)


def _llama_overrides(hc: Any) -> list[str]:
    require(hc, "hidden_act", ("silu",))
    head_dim = getattr(hc, "head_dim", None)
    moe = getattr(hc, "num_local_experts", None)
    attn_bias = bool(getattr(hc, "attention_bias", False))
    out = [f"preset={'mixtral' if moe else 'llama'}", f"model.d_model={hc.hidden_size}",
           f"model.n_heads={hc.num_attention_heads}",
           f"model.n_kv_heads={hc.num_key_value_heads or hc.num_attention_heads}",
           f"model.head_dim={head_dim if head_dim else 'null'}",
           f"model.n_layers={hc.num_hidden_layers}", f"model.d_ff={hc.intermediate_size}",
           flag("model.attn_bias", attn_bias), flag("model.out_bias", attn_bias),
           flag("model.ffn_bias", getattr(hc, "mlp_bias", False)),
           flag("model.tie_embeddings", hc.tie_word_embeddings),
           f"model.max_len={hc.max_position_embeddings}", f"norm_layer.eps={hc.rms_norm_eps}",
           *rope_overrides(hc)]
    if getattr(hc, "model_type", "") == "qwen2":  # Q/K/V bias, no output bias
        out += ["model.qkv_bias=true", "model.out_bias=false"]
    if moe:
        if hc.num_experts_per_tok == 1:  # HF renormalises one weight to 1, tlab keeps p_i
            raise Unsupported(TOP1_MOE)
        out += [f"ffn.n_experts={moe}", f"ffn.top_k={hc.num_experts_per_tok}",
                "ffn.expert=swiglu", "ffn.router=softmax_then_topk", "ffn.normalize_topk=true",
                f"ffn.load_balance_coef={getattr(hc, 'router_aux_loss_coef', 0.0)}",
                "ffn.z_loss_coef=0.0"]
    return out


# Mixtral renormalises the chosen experts' weights even for one expert (its weight is then 1,
# and the router learns nothing from the task); tlab's top-1 MoE keeps its softmax probability.
TOP1_MOE = ("ffn.top_k=1 (Mixtral gives a single chosen expert the weight 1; tlab gives it its "
            "router probability, as Switch does)")


def _llama_pairs(n_layers: range, moe: bool) -> list[tuple[str, str]]:
    """(HF name, tlab name) of the tensors that are only renamed."""
    pairs = [("model.embed_tokens.weight", "token_embedding.weight"),
             ("model.norm.weight", "final_norm.weight"), ("lm_head.weight", "lm_head.weight")]
    for i in n_layers:
        hf, tl = f"model.layers.{i}.", f"blocks.{i}."
        pairs += [(hf + "self_attn.o_proj.weight", tl + "attention.out_proj.weight"),
                  (hf + "self_attn.o_proj.bias", tl + "attention.out_proj.bias"),
                  (hf + "input_layernorm.weight", tl + "norm1.weight"),
                  (hf + "post_attention_layernorm.weight", tl + "norm2.weight")]
        if moe:
            pairs.append((hf + "mlp.gate.weight", tl + "feedforward.gate.weight"))
        else:
            pairs += [(hf + f"mlp.{p}_proj.{w}", tl + f"feedforward.{p}_proj.{w}")
                      for p in ("gate", "up", "down") for w in ("weight", "bias")]
    return pairs


def _llama_to_tlab(hc: Any, hf: State) -> State:
    moe = bool(getattr(hc, "num_local_experts", None))
    out = rename(hf, _llama_pairs(layers(hc), moe))
    for i in layers(hc):
        attn = f"model.layers.{i}.self_attn."
        for w in ("weight", "bias"):
            if attn + f"q_proj.{w}" in hf:
                out[f"blocks.{i}.attention.qkv_proj.{w}"] = torch.cat(
                    [hf[attn + f"{p}_proj.{w}"] for p in "qkv"])
        if moe:
            gate_up, down = (hf[f"model.layers.{i}.mlp.experts.{n}"]
                             for n in ("gate_up_proj", "down_proj"))  # (E, 2I, D), (E, D, I)
            for e in range(gate_up.shape[0]):
                gate, up = gate_up[e].chunk(2, dim=0)
                tl = f"blocks.{i}.feedforward.experts.{e}."
                out.update({tl + "gate_proj.weight": gate, tl + "up_proj.weight": up,
                            tl + "down_proj.weight": down[e]})
    return out


def _llama_to_hf(cfg: Any, tl: State) -> State:
    moe = cfg.ffn.get("n_experts") is not None
    out = rename(tl, swapped(_llama_pairs(layers(cfg), moe)))
    sizes = _qkv_sizes(cfg.model)
    for i in layers(cfg):
        attn = f"model.layers.{i}.self_attn."
        for w in ("weight", "bias"):
            fused = tl.get(f"blocks.{i}.attention.qkv_proj.{w}")
            if fused is None:
                continue
            q, k, v = fused.split(sizes)
            out.update({attn + f"q_proj.{w}": q, attn + f"k_proj.{w}": k,
                        attn + f"v_proj.{w}": v})
        if moe:
            experts = range(cfg.ffn.n_experts)
            pre = f"blocks.{i}.feedforward.experts."
            out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([tl[f"{pre}{e}.gate_proj.weight"], tl[f"{pre}{e}.up_proj.weight"]])
                 for e in experts])
            out[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack(
                [tl[f"{pre}{e}.down_proj.weight"] for e in experts])
    return out


def _qkv_sizes(m: Any) -> list[int]:
    head_dim = m.head_dim or m.d_model // m.n_heads
    return [m.n_heads * head_dim] + [(m.n_kv_heads or m.n_heads) * head_dim] * 2


def _llama_config(cfg: Any) -> Any:
    from transformers import LlamaConfig, MixtralConfig

    m = cfg.model
    common = dict(vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.d_ff,
                  num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                  num_key_value_heads=m.n_kv_heads or m.n_heads,
                  head_dim=m.head_dim or m.d_model // m.n_heads,
                  max_position_embeddings=max_positions(cfg), rms_norm_eps=cfg.norm_layer.eps,
                  tie_word_embeddings=bool(m.tie_embeddings), attention_bias=bool(m.attn_bias),
                  rope_parameters=rope_parameters(cfg))
    if cfg.ffn.get("n_experts") is not None:
        if int(cfg.ffn.top_k) == 1:
            raise Unsupported(TOP1_MOE)
        return MixtralConfig(**common, num_local_experts=cfg.ffn.n_experts,
                             num_experts_per_tok=cfg.ffn.top_k,
                             router_aux_loss_coef=cfg.ffn.load_balance_coef)
    return LlamaConfig(**common, mlp_bias=bool(m.ffn_bias))


def _llama_family(hf_class: str, preset: str = "llama") -> Family:
    """A family with LLaMA's layout (one map, its own HF class)."""
    return Family(preset, hf_class, _llama_overrides, _llama_to_tlab, _llama_to_hf,
                  _llama_config)


FAMILIES: dict[str, Family] = {
    "llama": _llama_family("LlamaForCausalLM"),
    "mistral": _llama_family("MistralForCausalLM"),
    "qwen2": _llama_family("Qwen2ForCausalLM"),
    "mixtral": _llama_family("MixtralForCausalLM", preset="mixtral"),
    "gpt2": Family("gpt2", "GPT2LMHeadModel", gpt2_overrides, gpt2_to_tlab, gpt2_to_hf,
                   gpt2_config),
    "gpt_neox": Family("gpt_neox", "GPTNeoXForCausalLM", neox_overrides, neox_to_tlab,
                       neox_to_hf, neox_config),
    "bloom": Family("bloom", "BloomForCausalLM", bloom_overrides, bloom_to_tlab, bloom_to_hf,
                    bloom_config),
    "bert": Family("bert", "BertModel", bert_overrides, bert_to_tlab, bert_to_hf, bert_config,
                   output_head=False, hf_init=(("add_pooling_layer", False),)),
    "t5": Family("t5_encoder", "T5EncoderModel", t5_overrides, t5_to_tlab, t5_to_hf, t5_config,
                 output_head=False),
}
