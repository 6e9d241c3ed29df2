"""Parameter counts by formula, independent of the modules, for the built-in components.

    token embedding      V * D                      output head     D * V (no bias)
    attention (fused)    4 D^2 (+ 4 D bias)         FFN             2 D F (+ F + D bias)
    gated FFN            3 D H (+ 2 H + D bias), H = F or round(2F/3)
    norms                LayerNorm / BatchNorm 2 D, RMSNorm D; 2 per block (4 for sandwich),
                         plus a final one for pre / sandwich
    PE                   learned: max_len * D, T5: num_buckets * n_heads, others 0

Returns None for a component it does not know (a user's own ``_target_``).
"""

from __future__ import annotations

from omegaconf import DictConfig

from transformer_lab.components.feedforward import gated_hidden_size

_PKG = "transformer_lab.components"


def attention_params(d_model: int, bias: bool) -> int:
    return 4 * d_model * d_model + (4 * d_model if bias else 0)


def feedforward_params(d_model: int, d_ff: int, bias: bool) -> int:
    return 2 * d_model * d_ff + ((d_ff + d_model) if bias else 0)


def gated_feedforward_params(d_model: int, d_ff: int, bias: bool, match_params: bool) -> int:
    hidden = gated_hidden_size(d_ff, match_params)
    return 3 * d_model * hidden + ((2 * hidden + d_model) if bias else 0)


def _ffn(cfg: DictConfig) -> int | None:
    a = cfg.activation
    target = a.get("_target_")
    if target == f"{_PKG}.feedforward.FeedForward":
        return feedforward_params(a.d_model, a.d_ff, a.bias)
    if target == f"{_PKG}.feedforward.GatedFeedForward":
        return gated_feedforward_params(a.d_model, a.d_ff, a.bias, a.match_params)
    return None


_NORM_PARAMS = {f"{_PKG}.norms.LayerNorm": 2, f"{_PKG}.norms.RMSNorm": 1,
                f"{_PKG}.norms.SequenceBatchNorm": 2}
_NORMS_PER_BLOCK = {f"{_PKG}.block.PostNormBlock": (2, 0), f"{_PKG}.block.PreNormBlock": (2, 1),
                    f"{_PKG}.block.SandwichNormBlock": (4, 1),
                    f"{_PKG}.block.DeepNormBlock": (2, 0)}


def _pe(cfg: DictConfig) -> int | None:
    pe = cfg.pe
    target = pe.get("_target_", "")
    if target.endswith("LearnedPositionalEncoding"):
        return pe.max_len * pe.d_model
    if target.endswith("T5RelativeBias"):
        return pe.num_buckets * pe.n_heads
    if target.startswith(f"{_PKG}.positional"):
        return 0
    return None


def parameter_breakdown(cfg: DictConfig) -> dict[str, int | None]:
    """Parameters per component for ``cfg`` (vocab_size filled in); None where unknown."""
    m = cfg.model
    per_norm = _NORM_PARAMS.get(cfg.norm_layer.get("_target_"))
    placement = _NORMS_PER_BLOCK.get(cfg.norm.get("_target_"))
    norms = None
    if per_norm is not None and placement is not None:
        in_blocks, final = placement
        norms = per_norm * m.d_model * (in_blocks * m.n_layers + final)
    ffn = _ffn(cfg)
    parts = {
        "token_embedding": m.vocab_size * m.d_model,
        "positional": _pe(cfg),
        "attention": m.n_layers * attention_params(m.d_model, m.attn_bias),
        "feedforward": None if ffn is None else m.n_layers * ffn,
        "norms": norms,
        "output_head": m.d_model * m.vocab_size,
    }
    known = [v for v in parts.values() if v is not None]
    parts["total"] = sum(known) if len(known) == len(parts) else None
    return parts
