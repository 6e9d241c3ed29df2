"""The parameter rows of ``tlab budget`` (``budget.py``): the formula of every component
(:mod:`transformer_lab.measures.parameters`) against ``sum(p.numel())`` of the built model, per
layer (every layer compared) and in all, with a Mixture-of-Experts FFN's active parameters."""

from __future__ import annotations

from omegaconf import DictConfig
from torch import nn

from transformer_lab.measures.parameters import (
    active_ffn_params,
    attention_knob_values,
    attention_projection_params,
    embedding_norm_params,
    ffn_hidden_size,
    ffn_weight_matrices,
    norm_params_per_layer,
    parameter_breakdown,
)
from transformer_lab.model import TransformerModel
from transformer_lab.routines.budget_rows import BudgetRow, compare


def numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def qkv_slices(attention: nn.Module) -> dict[str, int]:
    """Parameters of Q, K, V (slices of the fused ``qkv_proj``: H Dh, H_kv Dh, H_kv Dh rows)
    and O of one attention."""
    d_model = attention.out_proj.weight.shape[0]
    sizes = {name: getattr(attention, size, d_model)
             for name, size in (("q", "q_size"), ("k", "kv_size"), ("v", "kv_size"))}
    counts, start = {}, 0
    for name in "qkv":
        rows = slice(start, start + sizes[name])
        start += sizes[name]
        weight = attention.qkv_proj.weight[rows].numel()
        bias = attention.qkv_proj.bias
        counts[name] = weight + (0 if bias is None else bias[rows].numel())
    counts["o"] = numel(attention.out_proj)
    return counts


def parameter_rows(cfg: DictConfig, model: TransformerModel) -> list[BudgetRow]:
    """Formula vs ``sum(p.numel())`` per component, per layer (every layer compared) and total."""
    m = cfg.model
    formulas = parameter_breakdown(cfg)
    d, layers = m.d_model, m.n_layers
    rows = [BudgetRow("parameters", "token_embedding", "model", "V*D", formulas[
        "token_embedding"], numel(model.token_embedding), "params")]
    rows.append(BudgetRow("parameters", "positional", "model", f"pe={cfg.pe.get('name')}",
                          formulas["positional"], numel(model.positional), "params"))

    def per_layer(component: str, formula: str, expected: int | None, measure) -> BudgetRow:
        measured = [measure(block) for block in model.blocks]
        bad = [i for i, value in enumerate(measured) if value != expected]
        row = BudgetRow("parameters", component, f"layer (x{layers})", formula, expected,
                        measured[0] if measured else None, "params")
        row.status = compare(expected, row.measured)
        if expected is not None and bad:
            row.status = "FAIL"
            row.detail = f"layers {bad} differ from the formula: {[measured[i] for i in bad]}"
        return row

    knobs = attention_knob_values(m)
    default = all(knobs[k] is None for k in knobs)  # the original Transformer's attention
    projections = (attention_projection_params(d, m.attn_bias) if default
                   else attention_projection_params(d, m.attn_bias, m.n_heads, **knobs))
    bias_text = " + D" if m.attn_bias else ""
    for name in "qkvo":
        formula = f"D*D{bias_text}" if default else (
            "D*H*Dh" if name == "q" else "H*Dh*D" if name == "o" else "D*H_kv*Dh") + " (+ bias)"
        rows.append(per_layer(f"attention.{name}", formula, projections[name],
                              lambda block, name=name: qkv_slices(block.attention)[name]))
    attention = sum(projections.values())
    rows.append(per_layer("attention", f"4*D*D{' + 4*D' if m.attn_bias else ''}" if default
                          else "Q + K + V + O", attention, lambda block: numel(block.attention)))
    ffn = None if formulas["feedforward"] is None else formulas["feedforward"] // max(layers, 1)
    hidden = ffn_hidden_size(cfg)
    gated = ffn_weight_matrices(cfg) == 3  # gate, up, down (as the FFN class declares)
    ffn_formula = (f"3*D*H{' + 2*H + D' if m.ffn_bias else ''}, H={hidden}" if gated
                   else f"2*D*F{' + F + D' if m.ffn_bias else ''}")
    if ffn is not None and active_ffn_params(cfg) != ffn:  # Mixture of Experts
        ffn_formula = f"D*E + E*expert, E={cfg.ffn.get('n_experts')}"
    rows.append(per_layer("feedforward", ffn_formula, ffn, lambda block: numel(block.feedforward)))
    block_norms, final_norm = norm_params_per_layer(cfg)
    rows.append(per_layer("norms", f"block={cfg.block.get('name')}, "
                          f"{cfg.norm_layer.get('name')}", block_norms,
                          lambda block: numel(block) - numel(block.attention)
                          - numel(block.feedforward)))
    layer = None if None in (ffn, block_norms) else attention + ffn + block_norms
    rows.append(per_layer("layer", "attention + feedforward + norms", layer, numel))
    final = model.final_norm if not isinstance(model.final_norm, nn.Identity) else None
    rows.append(BudgetRow("parameters", "final_norm", "model", "pre/sandwich only", final_norm,
                          numel(final), "params"))
    embed_norm = getattr(model, "embed_norm", None)
    if m.get("embed_norm"):
        rows.append(BudgetRow("parameters", "embed_norm", "model", "model.embed_norm",
                              embedding_norm_params(cfg), numel(embed_norm), "params"))
    tied = model.lm_head.weight is model.token_embedding.weight
    rows.append(BudgetRow("parameters", "output_head", "model",
                          "0 (tied to the embedding)" if m.get("tie_embeddings")
                          else "D*V (no bias)", formulas["output_head"],
                          0 if tied else numel(model.lm_head), "params"))
    rows += moe_rows(cfg, model, formulas)
    total = numel(model)
    rows.append(BudgetRow("parameters", "total", "model", "sum of the above", formulas["total"],
                          total, "params"))
    for row in rows:
        row.status = row.status or compare(row.expected, row.measured)
    parts = (model.token_embedding, model.positional, *model.blocks, final, model.lm_head,
             embed_norm)
    counted = {id(q): q.numel() for part in parts if part is not None for q in part.parameters()}
    unaccounted = total - sum(counted.values())  # a tied matrix counted once
    rows.append(BudgetRow("parameters", "unaccounted", "model", "total - components", 0,
                          unaccounted, "params", compare(0, unaccounted),
                          "parameters outside the listed components" if unaccounted else ""))
    ffn_total = sum(numel(block.feedforward) for block in model.blocks)
    rows.append(BudgetRow("parameters", "ffn_share", "model", "FFN / total", None,
                          round(100 * ffn_total / max(total, 1), 2), "%", "INFO",
                          f"FFN {ffn_total:,} of {total:,}"))
    if model.blocks:
        share = 100 * numel(model.blocks[0].feedforward) / max(numel(model.blocks[0]), 1)
        rows.append(BudgetRow("parameters", "ffn_share", "per layer", "FFN / layer", None,
                              round(share, 2), "%", "INFO", "the source article: about 2/3"))
    return rows


def moe_rows(cfg: DictConfig, model: TransformerModel,
             formulas: dict[str, int | None]) -> list[BudgetRow]:
    """A Mixture-of-Experts FFN (one that declares ``active_parameters``): the parameters a
    token uses (router + top_k experts) next to the total, formula vs the built layer."""
    active = active_ffn_params(cfg)
    if not model.blocks or active is None or active == formulas["feedforward"] // max(
            cfg.model.n_layers, 1):
        return []
    ffn = model.blocks[0].feedforward
    top_k = int(getattr(ffn, "top_k", 0))
    experts = getattr(ffn, "experts", None)
    measured = None if experts is None else numel(ffn.gate) + top_k * numel(experts[0])
    layers = cfg.model.n_layers
    rows = [BudgetRow("parameters", "feedforward (active per token)", f"layer (x{layers})",
                      f"D*E + top_k*expert, top_k={top_k}", active, measured, "params")]
    total_active = None if formulas["total"] is None else (
        formulas["total"] - layers * (formulas["feedforward"] // max(layers, 1) - active))
    measured_total = None if measured is None else numel(model) - layers * (
        numel(ffn) - measured)
    rows.append(BudgetRow("parameters", "total (active per token)", "model",
                          "total - L*(FFN - active FFN)", total_active, measured_total, "params",
                          detail=f"of {formulas['total']:,} in all" if formulas["total"] else ""))
    return rows
