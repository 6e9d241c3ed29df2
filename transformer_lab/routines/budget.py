"""``tlab budget``: parameters, activation memory and FLOPs of a configuration by formula,
checked against the model built from it (docs/routines.md)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, fields

import torch
from rich.table import Table
from torch import nn

from transformer_lab.config.schema import POSITIVE_INT, Rule
from transformer_lab.config.spec import ModelSpec, RoutineSettings, RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.measures.memory import extrapolate_batch, matmul_flops, saved_activation_bytes
from transformer_lab.measures.parameters import (
    DTYPE_BYTES,
    active_ffn_params,
    attention_knob_values,
    attention_params,
    attention_projection_params,
    attention_scores_bytes,
    embedding_norm_params,
    feedforward_params,
    ffn_activation_bytes,
    ffn_hidden_size,
    ffn_weight_matrices,
    layer_activation_terms,
    norm_params_per_layer,
    parameter_breakdown,
    training_flops_per_token,
)
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.check_rows import check_counts
from transformer_lab.results.console import console, print_table, result_table
from transformer_lab.results.run_directory import RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# The routine's own keys (``routines.check_settings``; --dtype's choices: ``budget_settings``).
SETTINGS = {"vocab_size": POSITIVE_INT, "seq_len": POSITIVE_INT, "batch_size": POSITIVE_INT,
            "measure_batch": POSITIVE_INT, "measure": Rule("bool"), "dtype": Rule("str")}
STEPS = None  # it trains no model (``routines.check_unread``)


def budget_settings(r: RoutineSettings) -> tuple[int, int, int, str]:
    """(vocab, seq_len, batch, dtype) from ``routine.*``; ConfigError for an unknown dtype."""
    if r.dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {r.dtype} is not known; valid: {', '.join(DTYPE_BYTES)}")
    return int(r.vocab_size), int(r.seq_len), int(r.batch_size), str(r.dtype)


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight (``routines.check_routine``): the routine's sizes and dtype."""
    budget_settings(spec.routine)


# a row of budget.csv

@dataclass
class BudgetRow:
    section: str  # parameters | activations | flops | article
    component: str
    scope: str  # "layer (xL)" | "per layer" | "layer i" | "model" | "per token" | "article layer"
    formula: str
    expected: float | None
    measured: float | None
    unit: str
    status: str = ""  # PASS | FAIL | SKIP | INFO (no check) | DIFF (an article figure differs)
    detail: str = ""


BUDGET_COLUMNS = [f.name for f in fields(BudgetRow)]


def compare(expected: float | None, measured: float | None) -> str:
    """PASS when formula and measurement agree exactly, FAIL when not, SKIP without a formula."""
    if expected is None or measured is None:
        return "SKIP"
    return "PASS" if expected == measured else "FAIL"


def params_row(component: str, scope: str, formula: str, expected: float | None,
               measured: float | None, detail: str = "") -> BudgetRow:
    """A row of the parameters section; the status compares formula and model."""
    return BudgetRow("parameters", component, scope, formula, expected, measured, "params",
                     compare(expected, measured), detail)


# parameters


def numel(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def qkv_slices(attention: nn.Module) -> dict[str, int]:
    """Parameters of Q, K, V (rows of the fused ``qkv_proj``) and O of one attention."""
    d_model = attention.out_proj.weight.shape[0]
    sizes = [getattr(attention, "q_size", d_model), *[getattr(attention, "kv_size", d_model)] * 2]
    counts, start = {}, 0
    for name, size in zip("qkv", sizes, strict=True):
        bias = attention.qkv_proj.bias
        counts[name] = attention.qkv_proj.weight[start:start + size].numel() + (
            0 if bias is None else bias[start:start + size].numel())
        start += size
    return {**counts, "o": numel(attention.out_proj)}


def parameter_rows(m: ModelSpec, model: TransformerModel) -> list[BudgetRow]:
    """Formula vs ``sum(p.numel())`` per component, per layer (every layer compared) and total."""
    formulas = parameter_breakdown(m)
    d, layers = m.d_model, m.n_layers
    rows = [params_row("token_embedding", "model", "V*D", formulas["token_embedding"],
                       numel(model.token_embedding)),
            params_row("positional", "model", f"pe={m.pe.name}",
                       formulas["positional"], numel(model.positional))]

    def per_layer(component: str, formula: str, expected: int | None, measure) -> BudgetRow:
        measured = [measure(block) for block in model.blocks]
        bad = [i for i, value in enumerate(measured) if value != expected]
        row = params_row(component, f"layer (x{layers})", formula, expected,
                         measured[0] if measured else None)
        if expected is not None and bad:
            row.status = "FAIL"
            row.detail = f"layers {bad} differ from the formula: {[measured[i] for i in bad]}"
        return row

    knobs = attention_knob_values(m)
    default = all(knobs[k] is None for k in knobs)  # the original Transformer's attention
    projections = (attention_projection_params(d, m.attn_bias) if default
                   else attention_projection_params(d, m.attn_bias, m.n_heads, **knobs))
    formulas_qkvo = {"q": "D*H*Dh", "k": "D*H_kv*Dh", "v": "D*H_kv*Dh", "o": "H*Dh*D"}
    for name in "qkvo":
        formula = f"D*D{' + D' if m.attn_bias else ''}" if default \
            else formulas_qkvo[name] + " (+ bias)"
        rows.append(per_layer(f"attention.{name}", formula, projections[name],
                              lambda block, name=name: qkv_slices(block.attention)[name]))
    attention = sum(projections.values())
    rows.append(per_layer("attention", f"4*D*D{' + 4*D' if m.attn_bias else ''}" if default
                          else "Q + K + V + O", attention, lambda block: numel(block.attention)))
    ffn = None if formulas["feedforward"] is None else formulas["feedforward"] // max(layers, 1)
    hidden = ffn_hidden_size(m)
    gated = ffn_weight_matrices(m) == 3  # gate, up, down (as the FFN class declares)
    ffn_formula = (f"3*D*H{' + 2*H + D' if m.ffn_bias else ''}, H={hidden}" if gated
                   else f"2*D*F{' + F + D' if m.ffn_bias else ''}")
    if ffn is not None and active_ffn_params(m) != ffn:  # Mixture of Experts
        ffn_formula = f"D*E + E*expert, E={m.ffn.get('n_experts')}"
    rows.append(per_layer("feedforward", ffn_formula, ffn, lambda block: numel(block.feedforward)))
    block_norms, final_norm = norm_params_per_layer(m)
    rows.append(per_layer("norms", f"block={m.block.name}, "
                          f"{m.norm_layer.name}", block_norms,
                          lambda block: numel(block) - numel(block.attention)
                          - numel(block.feedforward)))
    layer = None if None in (ffn, block_norms) else attention + ffn + block_norms
    rows.append(per_layer("layer", "attention + feedforward + norms", layer, numel))
    final = model.final_norm if not isinstance(model.final_norm, nn.Identity) else None
    rows.append(params_row("final_norm", "model", "pre/sandwich only", final_norm, numel(final)))
    embed_norm = getattr(model, "embed_norm", None)
    if m.embed_norm:
        rows.append(params_row("embed_norm", "model", "model.embed_norm",
                               embedding_norm_params(m), numel(embed_norm)))
    tied = model.lm_head.weight is model.token_embedding.weight
    rows.append(params_row("output_head", "model", "0 (tied to the embedding)"
                           if m.tie_embeddings else "D*V (no bias)",
                           formulas["output_head"], 0 if tied else numel(model.lm_head)))
    rows += moe_rows(m, model, formulas)
    total = numel(model)
    rows.append(params_row("total", "model", "sum of the above", formulas["total"], total))
    parts = (model.token_embedding, model.positional, *model.blocks, final, model.lm_head,
             embed_norm)
    counted = {id(q): q.numel() for part in parts if part is not None for q in part.parameters()}
    unaccounted = total - sum(counted.values())  # a tied matrix counted once
    rows.append(params_row("unaccounted", "model", "total - components", 0, unaccounted,
                           detail="parameters outside the listed components" if unaccounted
                           else ""))
    ffn_total = sum(numel(block.feedforward) for block in model.blocks)
    rows.append(BudgetRow("parameters", "ffn_share", "model", "FFN / total", None,
                          round(100 * ffn_total / max(total, 1), 2), "%", "INFO",
                          f"FFN {ffn_total:,} of {total:,}"))
    if model.blocks:
        share = 100 * numel(model.blocks[0].feedforward) / max(numel(model.blocks[0]), 1)
        rows.append(BudgetRow("parameters", "ffn_share", "per layer", "FFN / layer", None,
                              round(share, 2), "%", "INFO", "the source article: about 2/3"))
    return rows


def moe_rows(m: ModelSpec, model: TransformerModel,
             formulas: dict[str, int | None]) -> list[BudgetRow]:
    """An MoE FFN: the parameters a token uses (router + top_k experts), formula vs built."""
    active = active_ffn_params(m)
    layers = m.n_layers
    if not model.blocks or active is None or active == formulas["feedforward"] // max(layers, 1):
        return []
    ffn = model.blocks[0].feedforward
    top_k = int(getattr(ffn, "top_k", 0))
    experts = getattr(ffn, "experts", None)
    measured = None if experts is None else numel(ffn.gate) + top_k * numel(experts[0])
    total_active = None if formulas["total"] is None else (
        formulas["total"] - layers * (formulas["feedforward"] // max(layers, 1) - active))
    measured_total = None if measured is None else numel(model) - layers * (
        numel(ffn) - measured)
    return [params_row("feedforward (active per token)", f"layer (x{layers})",
                       f"D*E + top_k*expert, top_k={top_k}", active, measured),
            params_row("total (active per token)", "model", "total - L*(FFN - active FFN)",
                       total_active, measured_total,
                       detail=f"of {formulas['total']:,} in all" if formulas["total"] else "")]


# activation memory and FLOPs


def measure_activations(model: TransformerModel, batch: int, seq_len: int, vocab: int,
                        measure_batch: int) -> dict[str, int]:
    """Saved bytes per module at ``batch``, extrapolated from ``measure_batch`` and one more."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (measure_batch + 1, seq_len), generator=generator)
    small = saved_activation_bytes(model, tokens[:measure_batch].clone())
    if batch == measure_batch:
        return small
    large = saved_activation_bytes(model, tokens)
    return extrapolate_batch(small, large, measure_batch, batch)


def activation_rows(m: ModelSpec, measured: dict[str, int] | None, batch: int, seq_len: int,
                    dtype: str, measure_batch: int) -> list[BudgetRow]:
    size = DTYPE_BYTES[dtype]
    hidden = ffn_hidden_size(m)
    how = (f"saved-tensor hooks, measured at batch {measure_batch} and {measure_batch + 1}, "
           f"extrapolated to {batch}" if measure_batch != batch else "saved-tensor hooks")

    def saved(prefix: str) -> int | None:
        if measured is None:
            return None
        return sum(v for k, v in measured.items() if k == prefix or k.startswith(prefix + "."))

    first = None if hidden is None else ffn_activation_bytes(batch, seq_len, hidden, size)
    act = measured.get("blocks.0.feedforward.act") if m.n_layers and measured else None
    core = measured.get("blocks.0.attention") if m.n_layers and measured else None
    rows = [BudgetRow("activations", "ffn_hidden (first FFN activation)", "layer 0",
                      f"B*T*H*bytes = {batch}*{seq_len}*{hidden}*{size}", first, act, "bytes",
                      compare(first, act), "the tensor the FFN activation keeps; " + how),
            BudgetRow("activations", "attention_scores (if materialised)", "layer 0",
                      f"B*H*T^2*bytes = {batch}*{m.n_heads}*{seq_len}^2*{size}",
                      attention_scores_bytes(batch, seq_len, m.n_heads, size), core, "bytes",
                      "INFO", "measured: what attention itself keeps (fused SDPA: q, k, v, "
                      "output and the log-sum-exp, no T x T matrix)")]
    terms = layer_activation_terms(m, batch, seq_len, size)
    formula = None if terms is None else sum(terms.values())
    for i in range(m.n_layers):
        value = saved(f"blocks.{i}")
        ratio = "" if None in (value, formula) else f"measured/formula {value / formula:.3f}; "
        rows.append(BudgetRow("activations", "layer", f"layer {i}",
                              "B*T*bytes*(norms*D + 7*D + 2*H (+2*D rotary, +2*H gated))",
                              formula, value, "bytes", "INFO",
                              ratio + ("" if terms is None else ", ".join(
                                  f"{k} {v:,}" for k, v in terms.items()))))
    if measured is not None:
        logits = measured.get("", 0)
        rows.append(BudgetRow("activations", "loss (log-probabilities)", "model",
                              "B*T*V*4", batch * seq_len * m.vocab_size * 4, logits, "bytes",
                              "INFO", "cross-entropy keeps fp32 log-softmax"))
        rows.append(BudgetRow("activations", "peak", "model", "sum of saved tensors", None,
                              sum(measured.values()), "bytes", "INFO",
                              f"{sum(measured.values()) / 2**20:,.1f} MiB; " + how))
    return rows


def flop_rows(m: ModelSpec, model: TransformerModel, seq_len: int,
              measure: bool) -> list[BudgetRow]:
    flops = training_flops_per_token(m, seq_len)
    counted = None
    if measure:
        short = min(seq_len, 32)
        tokens = torch.randint(0, m.vocab_size, (1, short), generator=torch.Generator())
        counted = matmul_flops(model, tokens) // short
    return [
        BudgetRow("flops", "weights", "per token", "6*N, N = matmul weights", flops["weights"],
                  counted, "FLOPs", compare(flops["weights"], counted),
                  "measured: torch.utils.flop_counter, aten.mm + aten.addmm"),
        BudgetRow("flops", "attention", "per token", f"12*L*T*D = 12*{m.n_layers}*{seq_len}*"
                  f"{m.d_model}", flops["attention"], None, "FLOPs", "INFO",
                  "Q K^T and A V, forward + backward (PaLM, app. B)"),
        BudgetRow("flops", "total", "per token", "6*N + 12*L*T*D", flops["total"], None, "FLOPs",
                  "INFO", ""),
    ]


# The source article's printed figures (README, "Checking the source articles' claims").
ARTICLE_FFN_WITH_BIAS = 4_721_664


def article_rows() -> list[BudgetRow]:
    """The article's figures next to tlab's formulas at its sizes: DIFF, not FAIL, where they
    differ (its FFN-with-biases sum leaves out the output bias)."""
    ffn_bias = feedforward_params(768, 3072, True)
    figures = [  # component, formula, the article's figure, tlab's formula, unit
        ("attention Q,K,V,O without bias", "4*768^2", 2_359_296, attention_params(768, False),
         "params"),
        ("FFN 768-3072-768 without bias", "2*768*3072", 4_718_592,
         feedforward_params(768, 3072, False), "params"),
        ("FFN 768-3072-768 with biases", "768*3072 + 3072 + 3072*768 + 768",
         ARTICLE_FFN_WITH_BIAS, ffn_bias, "params"),
        ("first FFN activation", "8*512*3072*4", 50_331_648,
         ffn_activation_bytes(8, 512, 3072, 4), "bytes"),
    ]
    rows = [BudgetRow("article", component, "article layer", formula, expected, measured, unit,
                      "PASS" if expected == measured else "DIFF",
                      "expected: the source article's figure; measured: tlab's formula")
            for component, formula, expected, measured, unit in figures]
    rows[2].detail += (f"; the source article's own sum is {ffn_bias:,}: its "
                       f"{ARTICLE_FFN_WITH_BIAS:,} leaves out the output bias "
                       f"({ffn_bias - ARTICLE_FFN_WITH_BIAS})")
    return rows


# the terminal table


def budget_table(rows: list[BudgetRow], title: str) -> Table:
    table = result_table(title)
    for column in ("component", "scope", "expected", "measured", "unit", "status"):
        table.add_column(column, justify="right" if column in ("expected", "measured") else "left")
    colours = {"PASS": "green", "FAIL": "bold red", "SKIP": "yellow", "INFO": "dim",
               "DIFF": "magenta"}

    def text(value: float | None) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        return f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"

    section = rows[0].section if rows else ""
    for row in rows:
        if row.section != section:
            table.add_section()
            section = row.section
        table.add_row(f"{row.section}: {row.component}", row.scope, text(row.expected),
                      text(row.measured), row.unit, f"[{colours[row.status]}]{row.status}[/]")
    return table


def run_budget(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    started = time.perf_counter()
    vocab, seq_len, batch, dtype = budget_settings(spec.routine)
    m = spec.with_vocab(vocab).model  # the budget's vocabulary, not the task's
    model = build_model(m, seed=spec.seed)
    rows = parameter_rows(m, model)
    measure, measure_batch = bool(spec.routine.measure), int(spec.routine.measure_batch)
    measured = None
    if measure:
        model = model.to(TORCH_DTYPES[dtype])
        with console.status(f"measuring activations ({dtype}, T={seq_len})"):
            measured = measure_activations(model, batch, seq_len, vocab, measure_batch)
    rows += activation_rows(m, measured, batch, seq_len, dtype, measure_batch)
    rows += flop_rows(m, model, seq_len, measure)
    rows += article_rows()
    run.write_table("budget", [asdict(r) for r in rows], BUDGET_COLUMNS)
    print_table(budget_table(rows, f"tlab budget - {run.path}"))
    failed = [f"{r.component} ({r.scope})" for r in rows if r.status == "FAIL"]
    total = next(r.measured for r in rows if r.component == "total")
    return RoutineOutcome(
        passed=not failed,
        summary={"params": total, "seq_len": seq_len, "vocab_size": vocab,
                 "wall_s": time.perf_counter() - started},
        message="" if not failed else "formula and model disagree: " + ", ".join(failed),
        result=check_counts([r.status for r in rows if r.status in ("PASS", "FAIL", "SKIP")]),
    )
