"""Parameter counts, activation memory and FLOPs by formula, independent of the modules: each
component's count is what its class declares (:mod:`transformer_lab.config.knowledge`); None
where a class declares nothing (a user's own ``_target_``)."""

from __future__ import annotations

from transformer_lab.components.attention import MultiHeadAttention, projection_sizes
from transformer_lab.components.feedforward import FeedForward
from transformer_lab.config.knowledge import component_class, declared
from transformer_lab.config.spec import Component, ModelSpec


def attention_params(d_model: int, bias: bool) -> int:
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def attention_knob_values(m: ModelSpec) -> dict:
    """The model's attention knobs beyond the original Transformer's (None: the default)."""
    return {"n_kv_heads": m.n_kv_heads, "head_dim": m.head_dim, "qkv_bias": m.qkv_bias,
            "out_bias": m.out_bias}


def feedforward_params(d_model: int, d_ff: int, bias: bool) -> int:
    """The two-matrix FFN (``FeedForward.count_parameters``)."""
    return FeedForward.count_parameters(d_model, d_ff, bias)


def _count(node: Component, attribute: str, **kwargs: object) -> int | None:
    """What ``node``'s class declares as ``attribute`` (called with ``kwargs``), as an int;
    None when undeclared or not an int."""
    value = declared(node, attribute, **kwargs)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def ffn_weight_matrices(model: ModelSpec) -> int | None:
    """Weight matrices of the FFN that multiply activations (2; gated 3), as declared."""
    return _count(model.ffn, "weight_matrices")


def norms_per_layer(model: ModelSpec) -> tuple[int | None, int | None]:
    """(norms inside one block, norms after the last block) as the block class declares them
    (``norms_per_block``; a final one when it ``needs_final_norm``); (None, None) if undeclared."""
    in_block = _count(model.block, "norms_per_block")
    cls = component_class(model.block)  # not None where the count is declared
    if in_block is None or _inherited_by_a_new_constructor(cls, "norms_per_block"):
        return None, None
    return in_block, int(bool(getattr(cls, "needs_final_norm", False)))


def _inherited_by_a_new_constructor(cls: type, attribute: str) -> bool:
    """Whether ``cls`` inherits ``attribute`` past an ``__init__`` of its own: a subclass that
    may add parameters the parent's count does not know (its count is then unknown)."""
    for klass in cls.__mro__:
        if attribute in vars(klass) or "__init__" in vars(klass):
            return attribute not in vars(klass)
    return False


def parameter_breakdown(model: ModelSpec) -> dict[str, int | None]:
    """Parameters per component of ``model`` (vocab_size filled in); None where unknown."""
    m = model
    block_norms, final_norm = norm_params_per_layer(model)
    norms = None if block_norms is None else block_norms * m.n_layers + final_norm
    if norms is not None and m.embed_norm:
        norms += embedding_norm_params(model) or 0
    ffn = _count(model.ffn, "count_parameters")
    parts = {
        "token_embedding": m.vocab_size * m.d_model,
        "positional": _count(model.pe, "count_parameters"),
        "attention": m.n_layers * MultiHeadAttention.count_parameters(
            m.d_model, m.n_heads, m.attn_bias, **attention_knob_values(m)),
        "feedforward": None if ffn is None else m.n_layers * ffn,
        "norms": norms,
        "output_head": 0 if m.tie_embeddings else m.d_model * m.vocab_size,
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
    """Q, K, V and O: by default each ``D * D`` weights (+ ``D`` bias), summing to
    ``attention_params``; with GQA / a head size Q ``D H Dh``, K and V ``D H_kv Dh``, O
    ``H Dh D``."""
    q, k, v = projection_sizes(d_model, n_heads, n_kv_heads, head_dim)
    qkv_bias = bias if qkv_bias is None else qkv_bias
    out_bias = bias if out_bias is None else out_bias
    return {"q": d_model * q + (q if qkv_bias else 0), "k": d_model * k + (k if qkv_bias else 0),
            "v": d_model * v + (v if qkv_bias else 0),
            "o": q * d_model + (d_model if out_bias else 0)}


def embedding_norm_params(model: ModelSpec) -> int | None:
    """Parameters of the embedding norm (``model.embed_norm``): one norm layer, else 0."""
    if not model.embed_norm:
        return 0
    return _count(model.norm_layer, "count_parameters", d_model=model.d_model)


def active_ffn_params(model: ModelSpec) -> int | None:
    """Parameters of one FFN a token uses: ``active_parameters`` where the FFN declares it
    (Mixture of Experts: router + top_k experts), else all of them."""
    active = _count(model.ffn, "active_parameters")
    return active if active is not None else _count(model.ffn, "count_parameters")


def ffn_hidden_size(model: ModelSpec) -> int | None:
    """Width of the FFN hidden activation, as the FFN class declares it (``hidden_size``)."""
    return _count(model.ffn, "hidden_size")


def norm_params_per_layer(model: ModelSpec) -> tuple[int | None, int | None]:
    """(parameters of the norms inside one block, parameters of the final norm)."""
    per_norm = _count(model.norm_layer, "count_parameters", d_model=model.d_model)
    in_blocks, final = norms_per_layer(model)
    if per_norm is None or in_blocks is None or final is None:
        return None, None
    return per_norm * in_blocks, per_norm * final


def matmul_weight_params(model: ModelSpec) -> int | None:
    """N of the ``6N`` rule: weights that multiply activations (attention Q/K/V/O, FFN
    matrices, output head). Embedding tables are lookups and biases / norm gains are
    element-wise, so they are left out. None for an unknown FFN."""
    m = model
    hidden = ffn_hidden_size(model)
    n_ffn_matrices = ffn_weight_matrices(model)
    if hidden is None or n_ffn_matrices is None:
        return None
    q, k, v = projection_sizes(m.d_model, m.n_heads, m.n_kv_heads, m.head_dim)
    routing = _count(model.ffn, "routing_weights") or 0  # MoE router: D E
    per_layer = m.d_model * (q + k + v) + q * m.d_model + n_ffn_matrices * m.d_model * hidden
    return m.n_layers * (per_layer + routing) + m.d_model * m.vocab_size


def training_flops_per_token(model: ModelSpec, seq_len: int) -> dict[str, int | None]:
    """Forward + backward FLOPs per token: ``6 N`` for the weights (N =
    :func:`matmul_weight_params`; Kaplan et al. 2020, arXiv 2001.08361, sec. 2.1) and
    ``12 L T D`` for Q K^T and A V, no discount for a causal mask (PaLM, arXiv 2204.02311,
    app. B)."""
    n = matmul_weight_params(model)
    m = model
    q_size = projection_sizes(m.d_model, m.n_heads, m.n_kv_heads, m.head_dim)[0]
    attention = 12 * m.n_layers * seq_len * q_size  # q_size = H Dh (= D by default)
    return {"weights": None if n is None else 6 * n, "attention": attention,
            "total": None if n is None else 6 * n + attention}


def ffn_activation_bytes(batch: int, seq_len: int, d_ff: int, bytes_per_element: int) -> int:
    """The FFN hidden activation of one layer, ``B * T * d_ff * bytes``."""
    return batch * seq_len * d_ff * bytes_per_element


def attention_scores_bytes(batch: int, seq_len: int, n_heads: int,
                           bytes_per_element: int) -> int:
    """One layer's attention probabilities if materialised, ``B * H * T^2 * bytes``."""
    return batch * n_heads * seq_len * seq_len * bytes_per_element


def layer_activation_terms(model: ModelSpec, batch: int, seq_len: int,
                           bytes_per_element: int) -> dict[str, int] | None:
    """Activation bytes autograd keeps for one block, by formula (H: FFN hidden width; an
    estimate, fp32 norm statistics left out): the norms' inputs, the linear maps' inputs
    ``B T (3 D + H)``, q, k, v and the attention output (rotary q, k are new tensors; fused
    SDPA keeps no T x T matrix), the FFN hidden activation (gated: also its output and the up
    projection). None for an unknown norm or FFN."""
    hidden = ffn_hidden_size(model)
    n_norms, _ = norms_per_layer(model)
    n_ffn_matrices = ffn_weight_matrices(model)
    if hidden is None or n_norms is None or n_ffn_matrices is None:
        return None
    d = model.d_model
    tokens = batch * seq_len * bytes_per_element
    # a rotary PE (``kind = "rotary"``) returns rotated q and k: two new tensors
    rotary = 2 if getattr(component_class(model.pe), "kind", None) == "rotary" else 0
    gated = n_ffn_matrices == 3
    return {
        "norm_inputs": n_norms * tokens * d,
        "linear_inputs": tokens * (3 * d + hidden),
        "attention_qkv_out": tokens * d * (4 + rotary),
        "ffn_hidden": tokens * hidden * (3 if gated else 1),
    }
