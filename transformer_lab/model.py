"""A Transformer assembled from the ``pe``, ``ffn``, ``block`` and ``norm_layer`` components
(KV-cache positions: docs/custom_components.md): tokens (B, T) -> embedding (+ additive PE)
-> blocks -> final norm -> head -> logits (B, T, V)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from transformer_lab.components.attention import AttentionInputs, KVCache, MultiHeadAttention
from transformer_lab.components.block import TransformerBlock
from transformer_lab.components.positional import check_positional_module
from transformer_lab.config.spec import ModelSpec, RunSpec
from transformer_lab.errors import ConfigError


def embedding_scale(setting: str | float, d_model: int) -> float:
    """``"sqrt"`` -> sqrt(d_model) (Vaswani et al. sec. 3.4), ``"none"`` -> 1, or a number."""
    if setting in ("none", None):
        return 1.0
    try:
        return math.sqrt(d_model) if setting == "sqrt" else float(setting)
    except (TypeError, ValueError):
        raise ValueError(
            f"model.embed_scale={setting!r} is not valid; use 'sqrt', 'none' or a number"
        ) from None


class TransformerModel(nn.Module):
    """Token embedding, positional encoding, a stack of blocks and an output head."""

    def __init__(self, vocab_size: int, d_model: int, positional: nn.Module,
                 blocks: list[TransformerBlock], final_norm: nn.Module | None, causal: bool,
                 embed_scale: float = 1.0, pe_scale: float = 1.0, embed_dropout: float = 0.0,
                 init_std: float = 0.02, embed_norm: nn.Module | None = None,
                 tie_embeddings: bool = False) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.positional = positional
        self.embed_dropout = nn.Dropout(embed_dropout)
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.causal = causal
        self.embed_scale = embed_scale
        self.pe_scale = pe_scale
        nn.init.normal_(self.token_embedding.weight, mean=0.0, std=init_std)
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=init_std)
        # knobs of real architectures (model.embed_norm, model.tie_embeddings; interop)
        if embed_norm is not None:
            self.embed_norm = embed_norm  # (BERT) a norm on the embeddings, before dropout
        if tie_embeddings:  # (GPT-2, T5) one matrix for the input and the output
            self.lm_head.weight = self.token_embedding.weight
        self.output_head = True  # False (interop): forward returns the final hidden states

    @property
    def pe_kind(self) -> str:
        return self.positional.kind

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Scaled token embeddings plus the additive PE: (B, T) -> (B, T, D)."""
        x = self.token_embedding(tokens)  # (B, T, D)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        if self.pe_kind == "additive":
            pe = self.positional(positions)  # (T, D)
            x = x + (pe if self.pe_scale == 1.0 else self.pe_scale * pe)
        if "embed_norm" in self._modules:
            x = self.embed_norm(x)
        if self.training and self.embed_dropout.p > 0.0:
            x = self.embed_dropout(x)
        return x

    def attention_mask(self, q_len: int, k_len: int,
                       device: torch.device) -> torch.Tensor | None:
        """The additive mask of every layer for the last ``q_len`` of ``k_len`` positions: PE bias
        (H, T_q, T_k) plus the causal mask, the causal mask alone (T_q, T_k) in cached decoding, or
        None where SDPA's ``is_causal`` (or no mask) does."""
        if self.pe_kind == "bias":
            mask = self.positional(q_len, k_len)  # (H, T_q, T_k)
            return mask + self._causal_mask(q_len, k_len, device) if self.causal else mask
        if self.causal and q_len > 1 and q_len != k_len:
            return self._causal_mask(q_len, k_len, device)  # (T_q, T_k)
        return None

    @staticmethod
    def _causal_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """(T_q, T_k) with queries at the last T_q positions: 0 where the key is not after the
        query, else -inf."""
        future = torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(k_len - q_len + 1)
        return torch.zeros(q_len, k_len, device=device).masked_fill(future, float("-inf"))

    def new_cache(self) -> KVCache:
        """An empty KV cache for :meth:`forward` (decoders only)."""
        if not self.causal:
            raise ConfigError("a KV cache (cached decoding, generate) needs a decoder "
                              "(arch=decoder); this model is an encoder (arch=encoder)")
        return KVCache.empty(len(self.blocks))

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, vocab), or hidden states (B, T, D) without
        ``output_head``. With a ``cache`` the tokens sit after the ``cache.length`` cached ones and
        their keys and values are added to it; ``need_weights``: each attention keeps (B, H, T, T_k)
        in ``last_weights``."""
        q_len = tokens.shape[1]
        offset = 0 if cache is None else cache.length
        k_len = offset + q_len
        window = self.context_window  # checked here, from ints: the PE need not read positions
        if window is not None and k_len > window:
            raise ValueError(f"sequence length {k_len} is longer than the model's context window "
                             f"({window} positions); use at most {window} tokens")
        positions = torch.arange(offset, k_len, device=tokens.device)  # (T,)
        x = self.embed(tokens, positions)  # (B, T, D)
        mask = self.attention_mask(q_len, k_len, tokens.device)  # (H, T, T_k), (T, T_k), None
        inputs = AttentionInputs(
            positions=positions,
            rotary=self.positional if self.pe_kind == "rotary" else None,
            mask=mask,
            is_causal=self.causal and mask is None and q_len == k_len,
            need_weights=need_weights,
            key_positions=None if cache is None else torch.arange(k_len, device=tokens.device),
        )
        for index, block in enumerate(self.blocks):
            layer_inputs = inputs if cache is None else replace(inputs, cache=cache.layers[index])
            x = block(x, layer_inputs)
        if not self.output_head:
            return self.final_norm(x)  # (B, T, D)
        return self.lm_head(self.final_norm(x))  # (B, T, vocab)

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Sum of the modules' ``aux_loss`` from the last forward (MoE load balancing), or None."""
        losses = [m.aux_loss for m in self._reporters
                  if isinstance(getattr(m, "aux_loss", None), torch.Tensor)]
        return torch.stack(losses).sum() if losses else None

    def auxiliary_metrics(self) -> dict[str, float]:
        """The modules' ``aux_metrics`` from the last forward, averaged per name."""
        gathered: dict[str, list[float]] = {}
        for module in self._reporters:
            for name, value in (getattr(module, "aux_metrics", None) or {}).items():
                gathered.setdefault(name, []).append(float(value))
        return {name: sum(v) / len(v) for name, v in gathered.items()}

    @functools.cached_property
    def _reporters(self) -> list[nn.Module]:
        """The modules with an ``aux_loss`` or ``aux_metrics``, found once."""
        return [m for m in self.modules() if hasattr(m, "aux_loss") or hasattr(m, "aux_metrics")]

    def attention_maps(self, tokens: torch.Tensor) -> list[torch.Tensor]:
        """Attention probabilities of every layer for ``tokens``: a list of (B, H, T, T)."""
        self.forward(tokens, need_weights=True)
        return [block.attention.last_weights for block in self.blocks]

    @property
    def context_window(self) -> int | None:
        """The most positions the model can encode: its PE's ``context_window`` (a learned table
        without ``interpolate``); None (or none declared): no limit."""
        return getattr(self.positional, "context_window", None)

    @torch.no_grad()
    def generate(self, prefix: torch.Tensor, n_new: int, *, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """The ``n_new`` tokens after ``prefix``, with a KV cache: (B, P) -> (B, n_new).

        ``temperature`` 0 is greedy; above 0 see :func:`next_token`. Call ``model.eval()`` first.
        Past ``context_window`` the context is cropped to its last tokens (as nanoGPT), each step a
        full forward."""
        if n_new < 0:
            raise ConfigError(f"n_new={n_new} is not valid; generate 0 or more tokens")
        if not self.output_head:
            raise ConfigError("generate needs logits; this model was built without an output "
                              "head (it returns hidden states)")
        if prefix.shape[1] < 1:
            raise ConfigError(f"prefix of shape {tuple(prefix.shape)} is empty; generation "
                              "needs at least one token to start from")
        window = self.context_window
        cache, sequence, fresh = self.new_cache(), prefix, prefix  # fresh: not yet in the cache
        for _ in range(n_new):
            if window is not None and sequence.shape[1] > window:  # positions from 0 again
                cache, fresh = None, sequence[:, -window:]  # (B, window)
            logits = self.forward(fresh, cache=cache)[:, -1]  # (B, vocab)
            fresh = next_token(logits, temperature, top_k, generator, top_p)  # (B, 1)
            sequence = torch.cat([sequence, fresh], dim=1)  # (B, P + tokens drawn)
        return sequence[:, prefix.shape[1]:]  # (B, n_new)


def next_token(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
               generator: torch.Generator | None = None,
               top_p: float | None = None) -> torch.Tensor:
    """One token per row of ``logits`` (B, vocab) -> (B, 1): the argmax at ``temperature`` 0, else a
    draw from ``softmax(logits / temperature)`` over the ``top_k`` largest, then the ``top_p``
    nucleus (Holtzman et al. 2019; the first token always stays)."""
    if temperature < 0:
        raise ConfigError(f"temperature={temperature} is not valid; use 0 (greedy) or more")
    if top_k is not None and top_k < 1:
        raise ConfigError(f"top_k={top_k} is not valid; use a whole number >= 1 or none")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"top_p={top_p} is not valid; use a probability in (0, 1] or none")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # (B, 1)
    scaled = logits.float() / temperature  # (B, vocab)
    if top_k is not None and top_k < scaled.shape[-1]:
        kth_largest = scaled.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = scaled.sort(dim=-1, descending=True)  # (B, vocab) each
        sorted_probabilities = ordered.softmax(dim=-1)  # (B, vocab)
        before = sorted_probabilities.cumsum(dim=-1) - sorted_probabilities  # mass above each
        beyond = before >= top_p  # (B, vocab), sorted order
        outside = torch.zeros_like(beyond).scatter(-1, order, beyond)  # back in vocab order
        scaled = scaled.masked_fill(outside, float("-inf"))
    probabilities = scaled.softmax(dim=-1)  # (B, vocab)
    return torch.multinomial(probabilities, 1, generator=generator)  # (B, 1)


def build_model(spec: ModelSpec | Any, seed: int | None = None) -> TransformerModel:
    """The model ``spec`` describes; with ``seed``, ``torch.manual_seed(seed)`` first. Weights
    and embeddings N(0, model.init_std), zero biases, unit norm gains. ``spec``: a
    ``ModelSpec``, or (the Python API) a composed config with its ``model.vocab_size``."""
    if not isinstance(spec, ModelSpec):
        spec = RunSpec.of(spec).model
    if seed is not None:
        torch.manual_seed(int(seed))

    def component(group: str, **kwargs: Any) -> Any:
        return spec.component(group).build(**kwargs)

    model = assemble_model(spec.settings(), component, causal=spec.causal)
    try:
        check_positional_module(model.positional)
    except TypeError as exc:
        raise ConfigError(f"pe={spec.pe.name}: {exc}") from exc
    return model


def assemble_model(m: Mapping[str, Any], component: Callable[..., Any],
                   causal: bool) -> TransformerModel:
    """The model of the settings ``m`` (``ModelSpec.settings``), ``component(group, **kwargs)``
    building the ``pe``, ``norm_layer``, ``ffn`` and ``block`` components (an exported
    ``modeling_tlab.py`` runs this too)."""
    positional = component("pe")
    make_norm = component("norm_layer")  # a partial: d_model -> norm module
    blocks = []
    parallel = {"parallel": True} if m.get("parallel_block") else {}  # model.parallel_block
    for _ in range(m["n_layers"]):
        attention = MultiHeadAttention(
            m["d_model"], m["n_heads"], bias=m["attn_bias"], dropout=m["dropout"]["attention"],
            init_std=m["init_std"], **attention_knobs(m),
        )
        blocks.append(component("block", attention=attention, feedforward=component("ffn"),
                                make_norm=make_norm, **parallel))
    final_norm = make_norm(m["d_model"]) if blocks and blocks[0].needs_final_norm else None
    embed_norm = make_norm(m["d_model"]) if m.get("embed_norm") else None
    return TransformerModel(
        m["vocab_size"], m["d_model"], positional, blocks, final_norm, causal,
        embed_scale=embedding_scale(m["embed_scale"], m["d_model"]), pe_scale=m["pe_scale"],
        embed_dropout=m["dropout"]["embedding"], init_std=m["init_std"], embed_norm=embed_norm,
        tie_embeddings=bool(m.get("tie_embeddings", False)),
    )


def attention_knobs(m: Mapping[str, Any]) -> dict:
    """The attention keywords of the model settings ``m`` beyond the original Transformer's
    (GQA, head size...)."""
    return {"n_kv_heads": m.get("n_kv_heads"), "head_dim": m.get("head_dim"),
            "scale": m.get("attn_scale"), "qkv_bias": m.get("qkv_bias"),
            "out_bias": m.get("out_bias")}


def build_checked_model(spec: ModelSpec, seq_len: int, seed: int) -> TransformerModel:
    """``build_model(spec, seed)`` with each component run at ``seq_len`` against its protocol
    (``config.protocols``), leaving the model and torch's generator as ``build_model`` leaves
    them."""
    from transformer_lab.config.protocols import check_protocols

    model = build_model(spec, seed=seed)
    model.eval()  # e.g. BatchNorm's running statistics stay untouched
    with torch.random.fork_rng(devices=[]):
        check_protocols(spec, model, seq_len)  # a user's own pe / FFN / norm plugs in (shapes)
    return model.train()
