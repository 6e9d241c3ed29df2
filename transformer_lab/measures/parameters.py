"""Parameter counts by formula, independent of the modules.

    token embedding      V * D                      output head     D * V (no bias; 0 when
                                                                    tied to the embedding)
    attention (fused)    D (H + 2 H_kv) Dh + H Dh D (+ biases): 4 D^2 (+ 4 D) by default
                         (``MultiHeadAttention.count_parameters``)
    embedding norm       one norm layer (``model.embed_norm``)

The chosen components' counts are what their classes declare
(:mod:`transformer_lab.config.knowledge`), e.g. for the built-ins:

    FFN                  ``FeedForward.count_parameters``: 2 D F (+ F + D bias)
    gated FFN            ``GatedFeedForward.count_parameters``: 3 D H (+ 2 H + D bias),
                         H = F or round(2F/3)
    norms                ``count_parameters`` of the norm layer (LayerNorm / BatchNorm 2 D,
                         RMSNorm D) times the block's ``norms_per_block`` (2, 4 for sandwich),
                         plus a final one where the block ``needs_final_norm`` (pre / sandwich);
                         unknown for a block subclass that inherits ``norms_per_block`` but
                         has a constructor of its own (it may add parameters)
    PE                   ``count_parameters`` of the PE: learned max_len * D,
                         T5 num_buckets * n_heads, others 0

Returns None for a component whose class declares nothing (a user's own ``_target_``).
"""

from __future__ import annotations

from omegaconf import DictConfig

from transformer_lab.components.attention import MultiHeadAttention, projection_sizes
from transformer_lab.components.feedforward import FeedForward
from transformer_lab.config.knowledge import component_class, declared


def attention_params(d_model: int, bias: bool) -> int:
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def attention_knob_values(m: DictConfig) -> dict:
    """``cfg.model``'s attention knobs (None where a model config does not have them)."""
    return {"n_kv_heads": m.get("n_kv_heads"), "head_dim": m.get("head_dim"),
            "qkv_bias": m.get("qkv_bias"), "out_bias": m.get("out_bias")}


def model_attention_params(m: DictConfig) -> int:
    """One layer's attention for ``cfg.model`` (``MultiHeadAttention.count_parameters``)."""
    return MultiHeadAttention.count_parameters(m.d_model, m.n_heads, m.attn_bias,
                                               **attention_knob_values(m))


def feedforward_params(d_model: int, d_ff: int, bias: bool) -> int:
    """The two-matrix FFN (``FeedForward.count_parameters``)."""
    return FeedForward.count_parameters(d_model, d_ff, bias)


def _count(declared_value: object) -> int | None:
    """A declared count as an int; None for anything else (undeclared)."""
    if isinstance(declared_value, bool) or not isinstance(declared_value, int):
        return None
    return int(declared_value)


def _ffn(cfg: DictConfig) -> int | None:
    """Parameters of one FFN, as its class declares them (``count_parameters``)."""
    return _count(declared(cfg.ffn, "count_parameters"))


def ffn_weight_matrices(cfg: DictConfig) -> int | None:
    """Weight matrices of the FFN that multiply activations (2; gated 3), as declared."""
    return _count(declared(cfg.ffn, "weight_matrices"))


def norms_per_layer(cfg: DictConfig) -> tuple[int | None, int | None]:
    """(norms inside one block, norms after the last block) as the block class declares them
    (``norms_per_block``; a final one when it ``needs_final_norm``); (None, None) if undeclared."""
    in_block = _count(declared(cfg.block, "norms_per_block"))
    cls = component_class(cfg.block)  # not None where the count is declared
    if in_block is None or _inherited_by_a_new_constructor(cls, "norms_per_block"):
        return None, None
    return in_block, int(bool(getattr(cls, "needs_final_norm", False)))


def _inherited_by_a_new_constructor(cls: type, attribute: str) -> bool:
    """Whether ``cls`` inherits ``attribute`` from a parent class while defining an
    ``__init__`` of its own on the way: a subclass that may add parameters (a gate, per-head
    scales, QK norms) the parent's count does not know. Its count is then unknown (``param_count``
    SKIPs and counts the model) rather than the parent's."""
    for klass in cls.__mro__:
        if attribute in vars(klass):
            return False
        if "__init__" in vars(klass):
            return True
    return False


def _pe(cfg: DictConfig) -> int | None:
    """Parameters of the PE, as its class declares them (``count_parameters``)."""
    return _count(declared(cfg.pe, "count_parameters"))


def parameter_breakdown(cfg: DictConfig) -> dict[str, int | None]:
    """Parameters per component for ``cfg`` (vocab_size filled in); None where unknown."""
    m = cfg.model
    block_norms, final_norm = norm_params_per_layer(cfg)
    norms = None if block_norms is None else block_norms * m.n_layers + final_norm
    if norms is not None and m.get("embed_norm"):
        norms += embedding_norm_params(cfg) or 0
    ffn = _ffn(cfg)
    parts = {
        "token_embedding": m.vocab_size * m.d_model,
        "positional": _pe(cfg),
        "attention": m.n_layers * model_attention_params(m),
        "feedforward": None if ffn is None else m.n_layers * ffn,
        "norms": norms,
        "output_head": 0 if m.get("tie_embeddings") else m.d_model * m.vocab_size,
    }
    known = [v for v in parts.values() if v is not None]
    parts["total"] = sum(known) if len(known) == len(parts) else None
    return parts


# --------------------------------------------------------------------------------------------
# Per-projection counts, activation memory and FLOPs (used by ``tlab budget``).

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}


def attention_projection_params(d_model: int, bias: bool, n_heads: int = 1,
                                n_kv_heads: int | None = None, head_dim: int | None = None,
                                qkv_bias: bool | None = None,
                                out_bias: bool | None = None) -> dict[str, int]:
    """Q, K, V and O: by default each ``D * D`` weights (+ ``D`` bias). Their sum is
    ``attention_params``; for D = 768 without bias that is 4 * 768^2 = 2,359,296 (the source
    article's figure). With GQA / a head size: Q ``D H Dh``, K and V ``D H_kv Dh``, O ``H Dh D``."""
    q, k, v = projection_sizes(d_model, n_heads, n_kv_heads, head_dim)
    qkv_bias = bias if qkv_bias is None else qkv_bias
    out_bias = bias if out_bias is None else out_bias
    return {"q": d_model * q + (q if qkv_bias else 0), "k": d_model * k + (k if qkv_bias else 0),
            "v": d_model * v + (v if qkv_bias else 0),
            "o": q * d_model + (d_model if out_bias else 0)}


def embedding_norm_params(cfg: DictConfig) -> int | None:
    """Parameters of the embedding norm (``model.embed_norm``): one norm layer, else 0."""
    if not cfg.model.get("embed_norm"):
        return 0
    return _count(declared(cfg.norm_layer, "count_parameters", d_model=cfg.model.d_model))


def active_ffn_params(cfg: DictConfig) -> int | None:
    """Parameters of one FFN a token uses: ``active_parameters`` where the FFN declares it
    (Mixture of Experts: router + top_k experts), else all of them."""
    active = _count(declared(cfg.ffn, "active_parameters"))
    return active if active is not None else _ffn(cfg)


def ffn_hidden_size(cfg: DictConfig) -> int | None:
    """Width of the FFN hidden activation, as the FFN class declares it (``hidden_size``:
    ``d_ff``; gated: ``gated_hidden_size``)."""
    return _count(declared(cfg.ffn, "hidden_size"))


def norm_params_per_layer(cfg: DictConfig) -> tuple[int | None, int | None]:
    """(parameters of the norms inside one block, parameters of the final norm)."""
    per_norm = _count(declared(cfg.norm_layer, "count_parameters", d_model=cfg.model.d_model))
    in_blocks, final = norms_per_layer(cfg)
    if per_norm is None or in_blocks is None or final is None:
        return None, None
    return per_norm * in_blocks, per_norm * final


def matmul_weight_params(cfg: DictConfig) -> int | None:
    """N of the ``6N`` rule: weights that multiply activations (attention Q/K/V/O, FFN
    matrices, output head). Embedding tables are lookups and biases / norm gains are
    element-wise, so they are left out. None for an unknown FFN."""
    m = cfg.model
    hidden = ffn_hidden_size(cfg)
    n_ffn_matrices = ffn_weight_matrices(cfg)
    if hidden is None or n_ffn_matrices is None:
        return None
    q, k, v = projection_sizes(m.d_model, m.n_heads, m.get("n_kv_heads"), m.get("head_dim"))
    routing = _count(declared(cfg.ffn, "routing_weights")) or 0  # MoE router: D E
    per_layer = m.d_model * (q + k + v) + q * m.d_model + n_ffn_matrices * m.d_model * hidden
    return m.n_layers * (per_layer + routing) + m.d_model * m.vocab_size


def training_flops_per_token(cfg: DictConfig, seq_len: int) -> dict[str, int | None]:
    """Forward + backward FLOPs per token (Kaplan et al. 2020, arXiv 2001.08361, sec. 2.1;
    attention term as in Chowdhery et al. 2022, PaLM, arXiv 2204.02311, app. B):

        weights    6 N                  (2 N forward, 4 N backward; N = ``matmul_weight_params``)
        attention  12 * L * T * D       (Q K^T and A V: 2 * 2 * T * D forward per layer and
                                         token, times 3 for forward + backward; no discount
                                         for a causal mask)
    """
    n = matmul_weight_params(cfg)
    m = cfg.model
    q_size = projection_sizes(m.d_model, m.n_heads, m.get("n_kv_heads"), m.get("head_dim"))[0]
    attention = 12 * m.n_layers * seq_len * q_size  # q_size = H Dh (= D by default)
    return {"weights": None if n is None else 6 * n, "attention": attention,
            "total": None if n is None else 6 * n + attention}


def ffn_activation_bytes(batch: int, seq_len: int, d_ff: int, bytes_per_element: int) -> int:
    """The FFN hidden activation of one layer, ``B * T * d_ff * bytes``: at B 8, T 512,
    d_ff 3072, fp32 that is 50,331,648 bytes = 48 MiB (the source article's figure)."""
    return batch * seq_len * d_ff * bytes_per_element


def attention_scores_bytes(batch: int, seq_len: int, n_heads: int,
                           bytes_per_element: int) -> int:
    """One layer's attention probabilities if materialised, ``B * H * T^2 * bytes``."""
    return batch * n_heads * seq_len * seq_len * bytes_per_element


def layer_activation_terms(cfg: DictConfig, batch: int, seq_len: int,
                           bytes_per_element: int) -> dict[str, int] | None:
    """Activation memory autograd keeps for one block, by formula (B, T, D, H = FFN hidden):

        norm inputs        n_norms * B T D        (2 per block; 4 for sandwich)
        linear inputs      B T (3 D + H)          (QKV, output projection, FFN up, FFN down)
        attention          B T D (4 + 2 rotary)   (q, k, v and the output; rotary q, k are new
                                                  tensors; fused SDPA keeps no T x T matrix)
        FFN hidden         B T H (1, gated 3)     (the activation's input; gated: also the
                                                  activation's output and the up projection)

    all times ``bytes_per_element``, fp32 norm statistics left out. It is an estimate: the
    measurement counts tensors that share storage once. None for an unknown norm or FFN.
    """
    hidden = ffn_hidden_size(cfg)
    n_norms, _ = norms_per_layer(cfg)
    n_ffn_matrices = ffn_weight_matrices(cfg)
    if hidden is None or n_norms is None or n_ffn_matrices is None:
        return None
    d = cfg.model.d_model
    tokens = batch * seq_len * bytes_per_element
    # a rotary PE (``kind = "rotary"``) returns rotated q and k: two new tensors
    rotary = 2 if getattr(component_class(cfg.pe), "kind", None) == "rotary" else 0
    gated = n_ffn_matrices == 3
    return {
        "norm_inputs": n_norms * tokens * d,
        "linear_inputs": tokens * (3 * d + hidden),
        "attention_qkv_out": tokens * d * (4 + rotary),
        "ffn_hidden": tokens * hidden * (3 if gated else 1),
    }
