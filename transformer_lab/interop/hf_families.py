"""Per-family maps between Hugging Face ``transformers`` models and tlab: the tlab overrides a
checkpoint's config stands for, and its weights renamed (and reshaped) both ways.

Each ``Family`` gives ``overrides(hf_config) -> list[str]`` (a preset plus the knob values),
``to_tlab(hf_config, hf_state) -> tlab_state`` and ``to_hf(cfg, tlab_state) -> hf_state``. A
setting tlab cannot express raises ``Unsupported`` naming it. Shapes are those of the state
dicts; ``L`` layers, ``D`` hidden size, ``H`` heads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

State = dict[str, torch.Tensor]


class Unsupported(ValueError):
    """A checkpoint setting tlab cannot express."""


def _require(hc: Any, key: str, allowed: tuple, default: Any = None) -> None:
    value = getattr(hc, key, default)
    if value not in allowed:
        raise Unsupported(f"{key}={value!r} (tlab supports {', '.join(map(repr, allowed))})")


def _rope_overrides(hc: Any) -> list[str]:
    """``rope_parameters`` (transformers >= 5) or ``rope_theta`` + ``rope_scaling`` -> pe.*."""
    params = dict(getattr(hc, "rope_parameters", None) or {})
    params.update(getattr(hc, "rope_scaling", None) or {})
    base = params.get("rope_theta", getattr(hc, "rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    names = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn",
             "llama3": "llama3"}
    if kind not in names:
        raise Unsupported(f"rope_type={kind!r} (tlab supports {', '.join(names)})")
    for key in ("mscale", "mscale_all_dim"):
        if params.get(key):
            raise Unsupported(f"rope {key}={params[key]!r} (tlab: attention_factor only)")
    if params.get("truncate") is False:
        raise Unsupported("rope truncate=False (tlab rounds YaRN's ramp bounds)")
    out = [f"pe.base={float(base)}", f"pe.scaling={names[kind]}",
           f"pe.rotary_fraction={float(params.get('partial_rotary_factor', 1.0))}"]
    if kind != "default":
        out.append(f"pe.factor={float(params['factor'])}")
    original = params.get("original_max_position_embeddings")
    if kind == "dynamic":  # transformers' dynamic NTK starts past max_position_embeddings
        original = hc.max_position_embeddings
    if original is not None:
        out.append(f"pe.original_max_len={int(original)}")
    for key in ("beta_fast", "beta_slow", "attention_factor", "low_freq_factor",
                "high_freq_factor"):
        if params.get(key) is not None:
            out.append(f"pe.{key}={float(params[key])}")
    return out


def _rope_parameters(cfg: Any) -> dict:
    pe = cfg.pe
    kind = {"none": "default"}.get(pe.scaling, pe.scaling)
    params = {"rope_type": kind, "rope_theta": float(pe.base)}
    if pe.get("rotary_fraction", 1.0) != 1.0:
        params["partial_rotary_factor"] = float(pe.rotary_fraction)
    if kind != "default":
        params["factor"] = float(pe.factor)
    if pe.scaling in ("yarn", "llama3") and pe.original_max_len is not None:
        params["original_max_position_embeddings"] = int(pe.original_max_len)
    if pe.scaling == "yarn":
        params.update(beta_fast=float(pe.beta_fast), beta_slow=float(pe.beta_slow))
        if pe.attention_factor is not None:
            params["attention_factor"] = float(pe.attention_factor)
    if pe.scaling == "llama3":
        params.update(low_freq_factor=float(pe.low_freq_factor),
                      high_freq_factor=float(pe.high_freq_factor))
    return params


def _layers(cfg_or_hc: Any) -> range:
    n = getattr(cfg_or_hc, "num_hidden_layers", None)
    return range(n if n is not None else cfg_or_hc.model.n_layers)


def _rename(state: State, pairs: list[tuple[str, str]]) -> State:
    return {new: state[old] for old, new in pairs if old in state}


# --------------------------------------------------------------------------------------------
# LLaMA / Mixtral (Mistral and Qwen2 share the layout)


def _llama_overrides(hc: Any) -> list[str]:
    _require(hc, "hidden_act", ("silu",))
    head_dim = getattr(hc, "head_dim", None)
    moe = getattr(hc, "num_local_experts", None)
    attn_bias = bool(getattr(hc, "attention_bias", False))
    out = [f"preset={'mixtral' if moe else 'llama'}", f"model.d_model={hc.hidden_size}",
           f"model.n_heads={hc.num_attention_heads}",
           f"model.n_kv_heads={hc.num_key_value_heads or hc.num_attention_heads}",
           f"model.head_dim={head_dim if head_dim else 'null'}",
           f"model.n_layers={hc.num_hidden_layers}", f"model.d_ff={hc.intermediate_size}",
           f"model.attn_bias={attn_bias}".lower(), f"model.out_bias={attn_bias}".lower(),
           f"model.ffn_bias={bool(getattr(hc, 'mlp_bias', False))}".lower(),
           f"model.tie_embeddings={bool(hc.tie_word_embeddings)}".lower(),
           f"model.max_len={hc.max_position_embeddings}", f"norm_layer.eps={hc.rms_norm_eps}",
           *_rope_overrides(hc)]
    if getattr(hc, "model_type", "") == "qwen2":  # Q/K/V bias, no output bias
        out += ["model.qkv_bias=true", "model.out_bias=false"]
    if moe:
        out += [f"ffn.n_experts={moe}", f"ffn.top_k={hc.num_experts_per_tok}",
                "ffn.expert=swiglu", "ffn.router=softmax_then_topk", "ffn.normalize_topk=true",
                f"ffn.load_balance_coef={getattr(hc, 'router_aux_loss_coef', 0.0)}",
                "ffn.z_loss_coef=0.0"]
    return out


def _llama_pairs(layers: range, moe: bool) -> list[tuple[str, str]]:
    """(HF name, tlab name) of the tensors that are only renamed."""
    pairs = [("model.embed_tokens.weight", "token_embedding.weight"),
             ("model.norm.weight", "final_norm.weight"), ("lm_head.weight", "lm_head.weight")]
    for i in layers:
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
    out = _rename(hf, _llama_pairs(_layers(hc), moe))
    for i in _layers(hc):
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
    out = {hf: tl[name] for hf, name in _llama_pairs(_layers(cfg), moe) if name in tl}
    m = cfg.model
    sizes = [m.n_heads * m.head_dim] + [(m.n_kv_heads or m.n_heads) * m.head_dim] * 2 \
        if m.head_dim else None
    for i in _layers(cfg):
        attn = f"model.layers.{i}.self_attn."
        for w in ("weight", "bias"):
            fused = tl.get(f"blocks.{i}.attention.qkv_proj.{w}")
            if fused is None:
                continue
            q, k, v = fused.split(sizes or _qkv_sizes(m))
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
                  max_position_embeddings=(cfg.pe.original_max_len if cfg.pe.scaling == "dynamic"
                                           else m.max_len), rms_norm_eps=cfg.norm_layer.eps,
                  tie_word_embeddings=bool(m.tie_embeddings), attention_bias=bool(m.attn_bias),
                  rope_parameters=_rope_parameters(cfg))
    if cfg.ffn.get("n_experts") is not None:
        return MixtralConfig(**common, num_local_experts=cfg.ffn.n_experts,
                             num_experts_per_tok=cfg.ffn.top_k,
                             router_aux_loss_coef=cfg.ffn.load_balance_coef)
    return LlamaConfig(**common, mlp_bias=bool(m.ffn_bias))


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps onto tlab."""

    preset: str
    hf_class: str  # the transformers class ``to_hf`` builds and ``from_hf`` loads
    overrides: Callable[[Any], list[str]]
    to_tlab: Callable[[Any, State], State]
    to_hf: Callable[[Any, State], State]
    hf_config: Callable[[Any], Any]
    output_head: bool = True


FAMILIES: dict[str, Family] = {
    "llama": Family("llama", "LlamaForCausalLM", _llama_overrides, _llama_to_tlab,
                    _llama_to_hf, _llama_config),
    "mistral": Family("llama", "MistralForCausalLM", _llama_overrides, _llama_to_tlab,
                      _llama_to_hf, _llama_config),
    "qwen2": Family("llama", "Qwen2ForCausalLM", _llama_overrides, _llama_to_tlab,
                    _llama_to_hf, _llama_config),
    "mixtral": Family("mixtral", "MixtralForCausalLM", _llama_overrides, _llama_to_tlab,
                      _llama_to_hf, _llama_config),
}
