"""Per-family maps between ``transformers`` and tlab: the overrides of a checkpoint's config, the
HF config of a tlab one, and the weights renamed (and reshaped) both ways (docs/export.md)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from transformer_lab.config.spec import ModelSpec

State = dict[str, torch.Tensor]
COMPONENTS = ("pe", "ffn", "block", "norm_layer")  # the groups a run chooses components in
# HF config key -> the tlab setting of the same value, in every family
SIZES = {"hidden_size": "model.d_model", "num_attention_heads": "model.n_heads",
         "num_hidden_layers": "model.n_layers"}
# ... and in several (LLaMA, GPT-NeoX, BERT; GPT-2, BLOOM)
D_FF_MAX_LEN = {"intermediate_size": "model.d_ff", "max_position_embeddings": "model.max_len"}
EPS_TIED = {"layer_norm_epsilon": "norm_layer.eps", "tie_word_embeddings": "model.tie_embeddings"}
# HF activation name -> tlab ffn choice, and back (the first HF name of each choice)
GELU_NAMES = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
              "relu": "relu"}
HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# Mixtral renormalises the chosen experts' weights even for one expert (its weight is then 1,
# and the router learns nothing from the task); tlab's top-1 MoE keeps its softmax probability.
TOP1_MOE = ("ffn.top_k=1 (Mixtral gives a single chosen expert the weight 1; tlab gives it its "
            "router probability, as Switch does)")


class Unsupported(ValueError):
    """A checkpoint setting tlab cannot express."""


def _matches(module: str, state: State) -> Iterator[tuple[str, str | None, str]]:
    """(key, layer, weight or bias) of the tensors of ``state`` in ``module`` (``{i}``: a layer)."""
    pattern = re.escape(module).replace(r"\{i\}", r"(?P<i>\d+)") + r"\.(?P<leaf>weight|bias)"
    for key in state:
        if match := re.fullmatch(pattern, key):
            yield key, match.groupdict().get("i"), match["leaf"]


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps onto tlab. ``names``: HF module -> tlab module (``{i}``: a
    layer); ``qkv``: HF's Q, K and V modules (concatenated in tlab's ``qkv_proj``), or one module
    fused per head, ``(H, 3, Dh)`` rows where tlab has ``(3, H, Dh)``."""

    preset: str
    hf_class: str  # the transformers class ``to_hf`` builds and ``from_hf`` loads
    same: dict[str, str]  # HF config key -> the tlab setting of the same value (beyond SIZES)
    knobs: Callable[[Any], list[str]]  # HF config -> the other overrides beyond the preset
    config_knobs: Callable[[ModelSpec], dict[str, Any]]  # -> the other HF config keywords
    names: dict[str, str]
    qkv: tuple[str, ...] = ()
    conv1d: tuple[str, ...] = ()  # HF modules with (in, out) weights
    extra_to_tlab: Callable[[Any, State], State] | None = None
    extra_to_hf: Callable[[ModelSpec, State], State] | None = None
    output_head: bool = True  # False: the HF model returns hidden states (BertModel, T5 encoder)
    hf_init: tuple[tuple[str, Any], ...] = ()  # keywords of ``hf_class(config, ...)`` in to_hf

    def overrides(self, hc: Any) -> list[str]:
        """The tlab overrides of a HF config."""
        same = [flag(tl, getattr(hc, hf)) if isinstance(getattr(hc, hf), bool) else
                f"{tl}={getattr(hc, hf)}" for hf, tl in (SIZES | self.same).items()]
        return [f"preset={self.preset}", *same, *self.knobs(hc)]

    def hf_config(self, spec: ModelSpec) -> Any:
        """The HF config of a tlab model."""
        import transformers

        config_class = getattr(transformers, self.hf_class).config_class
        same = {hf: setting(spec, tl) for hf, tl in (SIZES | self.same).items()}
        return config_class(vocab_size=spec.vocab_size, **same | self.config_knobs(spec))

    def _renamed(self, state: State, to_hf: bool) -> State:
        out = {}
        for hf_name, tl_name in self.names.items():
            old, new = (tl_name, hf_name) if to_hf else (hf_name, tl_name)
            for key, i, leaf in _matches(old, state):
                flip = hf_name in self.conv1d and leaf == "weight"  # (in, out) <-> (out, in)
                out[f"{new.format(i=i)}.{leaf}"] = state[key].t() if flip else state[key]
        return out

    def to_tlab(self, hc: Any, hf: State) -> State:
        """A checkpoint's state dict with tlab's names and layouts."""
        out = self._renamed(hf, to_hf=False)
        for key, i, leaf in _matches(self.qkv[0], hf) if self.qkv else ():
            fused = f"blocks.{i}.attention.qkv_proj.{leaf}"
            if len(self.qkv) == 3:
                out[fused] = torch.cat([hf[f"{p.format(i=i)}.{leaf}"] for p in self.qkv])
            else:
                out[fused] = _regroup(hf[key], hc.num_attention_heads, 3)
        return out | (self.extra_to_tlab(hc, hf) if self.extra_to_tlab else {})

    def to_hf(self, spec: ModelSpec, tl: State) -> State:
        """A tlab state dict with the family's names and layouts."""
        out = self._renamed(tl, to_hf=True)
        head_dim = spec.head_dim or spec.d_model // spec.n_heads
        sizes = [spec.n_heads * head_dim] + [(spec.n_kv_heads or spec.n_heads) * head_dim] * 2
        for key, i, leaf in _matches("blocks.{i}.attention.qkv_proj", tl) if self.qkv else ():
            if len(self.qkv) == 3:
                out.update({f"{p.format(i=i)}.{leaf}": t
                            for p, t in zip(self.qkv, tl[key].split(sizes), strict=True)})
            else:
                out[f"{self.qkv[0].format(i=i)}.{leaf}"] = _regroup(tl[key], 3, spec.n_heads)
        return out | (self.extra_to_hf(spec, tl) if self.extra_to_hf else {})


def _regroup(t: torch.Tensor, first: int, second: int) -> torch.Tensor:
    """Fused Q/K/V rows ``(first, second, Dh)`` -> ``(second, first, Dh)``."""
    return t.view(first, second, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)


def _names(top: dict[str, str], layer: str, blocks: dict[str, str]) -> dict[str, str]:
    """``top`` and the modules of each layer ``{layer}.{i}.`` (tlab: ``blocks.{i}.``)."""
    return top | {f"{layer}.{{i}}.{hf}": f"blocks.{{i}}.{tl}" for hf, tl in blocks.items()}


def setting(spec: ModelSpec, key: str) -> Any:
    """The value of a tlab key (``model.d_model``, ``norm_layer.eps``) in ``spec`` (None for a
    component's key it does not have)."""
    group, name = key.split(".", 1)
    return getattr(spec, name) if group == "model" else spec.component(group).get(name)


def require(hc: Any, key: str, allowed: tuple, default: Any = None) -> None:
    """Raise ``Unsupported`` unless the config's ``key`` is one of ``allowed``."""
    value = getattr(hc, key, default)
    if value not in allowed:
        raise Unsupported(f"{key}={value!r} (tlab supports {', '.join(map(repr, allowed))})")


def ffn_choice(hc: Any, key: str) -> str:
    """``ffn=...``: the tlab choice of the HF activation ``key``; ``Unsupported`` for another."""
    require(hc, key, tuple(GELU_NAMES))
    return f"ffn={GELU_NAMES[getattr(hc, key)]}"


def hf_activation(spec: ModelSpec) -> str:
    """The HF activation name of tlab's ``ffn`` choice; ``Unsupported`` for another FFN."""
    if spec.ffn.name not in HF_ACTIVATIONS:
        raise Unsupported(f"ffn={spec.ffn.name} (GPT-2 and GPT-NeoX have "
                          f"{', '.join(HF_ACTIVATIONS)})")
    return HF_ACTIVATIONS[spec.ffn.name]


def flag(name: str, value: Any) -> str:
    """``model.x=true``: an override with a lower-case boolean."""
    return f"{name}={str(bool(value)).lower()}"


def rope_overrides(hc: Any) -> list[str]:
    """``rope_parameters`` (transformers >= 5: with ``rope_theta``) -> pe.*."""
    params = hc.rope_parameters or {}
    base, kind = params.get("rope_theta", 10000.0), params.get("rope_type", "default")
    kinds = ("default", "linear", "dynamic", "yarn", "llama3")  # tlab's pe.scaling, default: none
    if kind not in kinds:
        raise Unsupported(f"rope_type={kind!r} (tlab supports {', '.join(kinds)})")
    for key in ("mscale", "mscale_all_dim"):
        if params.get(key):
            raise Unsupported(f"rope {key}={params[key]!r} (tlab: attention_factor only)")
    if params.get("truncate") is False:
        raise Unsupported("rope truncate=False (tlab rounds YaRN's ramp bounds)")
    out = [f"pe.base={float(base)}", f"pe.scaling={'none' if kind == 'default' else kind}",
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


def rope_config(spec: ModelSpec) -> dict[str, Any]:
    """tlab's RoPE settings (``spec.pe``) as HF ``rope_parameters``, and the
    ``max_position_embeddings`` (``pe.original_max_len`` under dynamic NTK: transformers' starts
    past it)."""
    pe = spec.pe
    kind = {"none": "default"}.get(pe["scaling"], pe["scaling"])
    params = {"rope_type": kind, "rope_theta": float(pe["base"]),
              "partial_rotary_factor": float(pe.get("rotary_fraction", 1.0))}
    if kind != "default":
        params["factor"] = float(pe["factor"])
    if kind in ("yarn", "llama3") and pe["original_max_len"] is not None:
        params["original_max_position_embeddings"] = int(pe["original_max_len"])
    keys = {"yarn": ("beta_fast", "beta_slow", "attention_factor"),
            "llama3": ("low_freq_factor", "high_freq_factor")}.get(kind, ())
    params.update({key: float(pe[key]) for key in keys if pe[key] is not None})
    return {"rope_parameters": params, "max_position_embeddings":
            pe["original_max_len"] if kind == "dynamic" else spec.max_len}


# --------------------------------------------------------------------------------------------
# LLaMA / Mixtral (Mistral and Qwen2 share the layout)


def _llama_knobs(hc: Any) -> list[str]:
    require(hc, "hidden_act", ("silu",))
    moe = getattr(hc, "num_local_experts", None)
    attn_bias = bool(getattr(hc, "attention_bias", False))
    out = [f"model.n_kv_heads={hc.num_key_value_heads or hc.num_attention_heads}",
           f"model.head_dim={getattr(hc, 'head_dim', None) or 'null'}",
           flag("model.attn_bias", attn_bias), flag("model.out_bias", attn_bias),
           flag("model.ffn_bias", getattr(hc, "mlp_bias", False)), *rope_overrides(hc)]
    if hc.model_type == "qwen2":  # Q/K/V bias, no output bias
        out += ["model.qkv_bias=true", "model.out_bias=false"]
    if moe:
        if hc.num_experts_per_tok == 1:  # HF renormalises one weight to 1, tlab keeps p_i
            raise Unsupported(TOP1_MOE)
        out += [f"ffn.n_experts={moe}", f"ffn.top_k={hc.num_experts_per_tok}",
                "ffn.expert=swiglu", "ffn.router=softmax_then_topk", "ffn.normalize_topk=true",
                f"ffn.load_balance_coef={getattr(hc, 'router_aux_loss_coef', 0.0)}",
                "ffn.z_loss_coef=0.0"]
    return out


def _llama_config(spec: ModelSpec) -> dict[str, Any]:
    ffn = spec.ffn
    common = dict(num_key_value_heads=spec.n_kv_heads or spec.n_heads,
                  attention_bias=spec.attn_bias,
                  head_dim=spec.head_dim or spec.d_model // spec.n_heads, **rope_config(spec))
    if ffn.get("n_experts") is None:
        return common | {"mlp_bias": spec.ffn_bias}
    if int(ffn["top_k"]) == 1:
        raise Unsupported(TOP1_MOE)
    return common | {"num_local_experts": ffn["n_experts"], "num_experts_per_tok": ffn["top_k"],
                     "router_aux_loss_coef": ffn["load_balance_coef"]}


def _experts_to_tlab(hc: Any, hf: State) -> State:
    out = {}
    for key, gate_up in hf.items():  # gate_up (E, 2I, D), down (E, D, I)
        if match := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj", key):
            down = hf[f"model.layers.{match[1]}.mlp.experts.down_proj"]
            for e in range(len(gate_up)):
                tl = f"blocks.{match[1]}.feedforward.experts.{e}."
                gate, up = gate_up[e].chunk(2)
                out |= {tl + "gate_proj.weight": gate, tl + "up_proj.weight": up,
                        tl + "down_proj.weight": down[e]}
    return out


def _experts_to_hf(spec: ModelSpec, tl: State) -> State:
    out = {}
    for i in range(spec.n_layers):
        experts = [f"blocks.{i}.feedforward.experts.{e}." for e in range(spec.ffn["n_experts"])]
        out[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([tl[e + "gate_proj.weight"], tl[e + "up_proj.weight"]]) for e in experts])
        out[f"model.layers.{i}.mlp.experts.down_proj"] = torch.stack(
            [tl[e + "down_proj.weight"] for e in experts])
    return out


LLAMA_NAMES = _names(
    {"model.embed_tokens": "token_embedding", "model.norm": "final_norm", "lm_head": "lm_head"},
    "model.layers", {"self_attn.o_proj": "attention.out_proj", "input_layernorm": "norm1",
                     "post_attention_layernorm": "norm2", "mlp.gate": "feedforward.gate",
                     **{f"mlp.{p}_proj": f"feedforward.{p}_proj" for p in ("gate", "up", "down")}})


def _llama_family(hf_class: str, preset: str = "llama") -> Family:
    """A family with LLaMA's layout (one map, its own HF class)."""
    same = D_FF_MAX_LEN | {"rms_norm_eps": "norm_layer.eps",
                           "tie_word_embeddings": "model.tie_embeddings"}
    return Family(preset, hf_class, same, _llama_knobs, _llama_config, LLAMA_NAMES,
                  qkv=tuple(f"model.layers.{{i}}.self_attn.{p}_proj" for p in "qkv"),
                  extra_to_tlab=_experts_to_tlab if preset == "mixtral" else None,
                  extra_to_hf=_experts_to_hf if preset == "mixtral" else None)


# --------------------------------------------------------------------------------------------
# GPT-2, GPT-NeoX (Pythia), BLOOM (ALiBi; why the slopes match: docs/export.md)


def _gpt2_knobs(hc: Any) -> list[str]:
    require(hc, "scale_attn_weights", (True,), True)
    require(hc, "scale_attn_by_inverse_layer_idx", (False,), False)
    require(hc, "add_cross_attention", (False,), False)
    return [ffn_choice(hc, "activation_function"), f"model.d_ff={hc.n_inner or 4 * hc.n_embd}"]


def _gpt2_config(spec: ModelSpec) -> dict[str, Any]:
    return dict(n_inner=spec.d_ff, activation_function=hf_activation(spec), resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)


GPT2_CONV1D = {"attn.c_attn": "attention.qkv_proj", "attn.c_proj": "attention.out_proj",
               "mlp.c_fc": "feedforward.up_proj", "mlp.c_proj": "feedforward.down_proj"}
GPT2_NAMES = _names({"transformer.wte": "token_embedding", "transformer.wpe": "positional",
                     "lm_head": "lm_head", "transformer.ln_f": "final_norm"},
                    "transformer.h", {"ln_1": "norm1", "ln_2": "norm2", **GPT2_CONV1D})


def _neox_knobs(hc: Any) -> list[str]:
    return [ffn_choice(hc, "hidden_act"), *rope_overrides(hc),
            flag("model.attn_bias", getattr(hc, "attention_bias", True))]


def _neox_config(spec: ModelSpec) -> dict[str, Any]:
    return dict(hidden_act=hf_activation(spec), attention_bias=spec.attn_bias,
                bos_token_id=None, eos_token_id=None, **rope_config(spec))


# the modules of a NeoX-like block (NeoX, BLOOM), but its attention's output
NEOX_BLOCK = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2",
              "mlp.dense_h_to_4h": "feedforward.up_proj",
              "mlp.dense_4h_to_h": "feedforward.down_proj"}
NEOX_NAMES = _names({"gpt_neox.embed_in": "token_embedding", "lm_head": "lm_head",
                     "gpt_neox.final_layer_norm": "final_norm"},
                    "gpt_neox.layers", {"attention.dense": "attention.out_proj", **NEOX_BLOCK})


def _bloom_knobs(hc: Any) -> list[str]:
    require(hc, "apply_residual_connection_post_layernorm", (False,), False)
    return [f"model.d_ff={4 * hc.hidden_size}"]


def _bloom_config(spec: ModelSpec) -> dict[str, Any]:
    return dict(bos_token_id=None, eos_token_id=None)


BLOOM_NAMES = _names({"transformer.word_embeddings": "token_embedding", "lm_head": "lm_head",
                      "transformer.word_embeddings_layernorm": "embed_norm",
                      "transformer.ln_f": "final_norm"},
                     "transformer.h", {"self_attention.dense": "attention.out_proj", **NEOX_BLOCK})


# --------------------------------------------------------------------------------------------
# BERT and the T5 encoder, imported without an output head


def _bert_knobs(hc: Any) -> list[str]:
    require(hc, "position_embedding_type", ("absolute",), "absolute")
    require(hc, "is_decoder", (False,), False)
    return [ffn_choice(hc, "hidden_act"), "model.tie_embeddings=false"]


def _bert_config(spec: ModelSpec) -> dict[str, Any]:
    return dict(hidden_act=hf_activation(spec), hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, type_vocab_size=2)


def _bert_positions_to_tlab(hc: Any, hf: State) -> State:
    """Token type 0 (every token's without ``token_type_ids``) folded into the position table."""
    return {"positional.weight": hf["embeddings.position_embeddings.weight"]
            + hf["embeddings.token_type_embeddings.weight"][0]}  # (P, D)


def _bert_positions_to_hf(spec: ModelSpec, tl: State) -> State:
    return {"embeddings.position_embeddings.weight": tl["positional.weight"],
            "embeddings.token_type_embeddings.weight": torch.zeros(2, spec.d_model)}


BERT_NAMES = _names({"embeddings.word_embeddings": "token_embedding",
                     "embeddings.LayerNorm": "embed_norm"},
                    "encoder.layer", {"attention.output.dense": "attention.out_proj",
                                      "attention.output.LayerNorm": "norm1",
                                      "intermediate.dense": "feedforward.up_proj",
                                      "output.dense": "feedforward.down_proj",
                                      "output.LayerNorm": "norm2"})


def _t5_knobs(hc: Any) -> list[str]:
    if getattr(hc, "is_gated_act", False):
        raise Unsupported(f"feed_forward_proj={hc.feed_forward_proj!r} (a gated FFN as in T5 "
                          "v1.1; tlab's T5 map supports 'relu' and 'gelu')")
    return [ffn_choice(hc, "dense_act_fn"), f"model.head_dim={hc.d_kv}", "model.attn_scale=1.0"]


def _t5_config(spec: ModelSpec) -> dict[str, Any]:
    return dict(d_kv=spec.head_dim or spec.d_model // spec.n_heads, dropout_rate=0.0,
                feed_forward_proj=hf_activation(spec), use_cache=False)


T5_NAMES = _names({"shared": "token_embedding", "encoder.embed_tokens": "token_embedding",
                   "encoder.final_layer_norm": "final_norm",
                   # (buckets, H): one table, in the first layer, shared by all
                   "encoder.block.0.layer.0.SelfAttention.relative_attention_bias":
                       "positional.relative_attention_bias"},
                  "encoder.block", {"layer.0.SelfAttention.o": "attention.out_proj",
                                    "layer.0.layer_norm": "norm1",
                                    "layer.1.DenseReluDense.wi": "feedforward.up_proj",
                                    "layer.1.DenseReluDense.wo": "feedforward.down_proj",
                                    "layer.1.layer_norm": "norm2"})


FAMILIES: dict[str, Family] = {
    "llama": _llama_family("LlamaForCausalLM"),
    "mistral": _llama_family("MistralForCausalLM"),
    "qwen2": _llama_family("Qwen2ForCausalLM"),
    "mixtral": _llama_family("MixtralForCausalLM", preset="mixtral"),
    "gpt2": Family("gpt2", "GPT2LMHeadModel", {"n_positions": "model.max_len", **EPS_TIED},
                   _gpt2_knobs, _gpt2_config, GPT2_NAMES,
                   conv1d=tuple(f"transformer.h.{{i}}.{hf}" for hf in GPT2_CONV1D)),
    "gpt_neox": Family("gpt_neox", "GPTNeoXForCausalLM",
                       D_FF_MAX_LEN | {"layer_norm_eps": "norm_layer.eps",
                                       "use_parallel_residual": "model.parallel_block",
                                       "tie_word_embeddings": "model.tie_embeddings"},
                       _neox_knobs, _neox_config, NEOX_NAMES,
                       qkv=("gpt_neox.layers.{i}.attention.query_key_value",)),
    "bloom": Family("bloom", "BloomForCausalLM", EPS_TIED, _bloom_knobs, _bloom_config,
                    BLOOM_NAMES,
                    qkv=("transformer.h.{i}.self_attention.query_key_value",)),
    "bert": Family("bert", "BertModel",
                   D_FF_MAX_LEN | {"layer_norm_eps": "norm_layer.eps"}, _bert_knobs,
                   _bert_config, BERT_NAMES,
                   qkv=tuple(f"encoder.layer.{{i}}.attention.self.{p}"
                             for p in ("query", "key", "value")),
                   extra_to_tlab=_bert_positions_to_tlab, extra_to_hf=_bert_positions_to_hf,
                   output_head=False, hf_init=(("add_pooling_layer", False),)),
    "t5": Family("t5_encoder", "T5EncoderModel",
                 {"d_ff": "model.d_ff", "layer_norm_epsilon": "norm_layer.eps",
                  "relative_attention_num_buckets": "pe.num_buckets",
                  "relative_attention_max_distance": "pe.max_distance"},
                 _t5_knobs, _t5_config, T5_NAMES,
                 qkv=tuple(f"encoder.block.{{i}}.layer.0.SelfAttention.{p}" for p in "qkv"),
                 output_head=False),
}
