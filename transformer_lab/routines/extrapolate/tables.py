"""The outputs of ``tlab extrapolate`` besides its CSV: curves averaged over seeds, the plot
(metric against evaluation length) and the terminal table. Rows are those of
``extrapolation.csv`` (:data:`EXTRAPOLATION_COLUMNS`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

EXTRAPOLATION_COLUMNS = [
    "pe", "scaling", "train_len", "eval_len", "loss", "accuracy", "exact_match", "seed",
    "factor", "base", "length_ratio", "model_seq_len", "finetune_steps", "train_steps",
    "status", "error",
]


def curve_label(row: Mapping[str, Any]) -> str:
    """``rope``, ``rope+yarn``, ``rope+linear ft200``: one curve per label."""
    label = str(row["pe"])
    if row["scaling"] != "none":
        label += f"+{row['scaling']}"
    if row.get("finetune_steps"):
        label += f" ft{row['finetune_steps']}"
    return label


def mean_curves(rows: list[Mapping[str, Any]], metric: str
                ) -> dict[str, list[tuple[int, float]]]:
    """label -> [(eval_len, mean of ``metric`` over seeds)] for rows with status ok."""
    grouped: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        value = row.get(metric)
        if row["status"] != "ok" or value is None or math.isnan(value):
            continue
        grouped.setdefault(curve_label(row), {}).setdefault(row["eval_len"], []).append(value)
    return {label: sorted((length, sum(v) / len(v)) for length, v in by_len.items())
            for label, by_len in grouped.items()}


def plot_extrapolation(rows: list[Mapping[str, Any]], path: Path, train_len: int) -> Path | None:
    """Token accuracy, exact match (if any) and loss against evaluation length: one colour per
    PE (+scaling), dashed after fine-tuning, mean over seeds; a dotted line marks the training
    length. Returns None (no file) when no row has a number."""
    panels = {metric.replace("_", " "): curves for metric in ("accuracy", "exact_match", "loss")
              if (curves := mean_curves(rows, metric))}
    if not panels:
        return None
    from transformer_lab.results.plots import length_curves

    lengths = sorted({r["eval_len"] for r in rows})
    return length_curves(path, panels, lengths, mark=train_len,
                         unit_panels=("accuracy", "exact match"))


def results_table(rows: list[Mapping[str, Any]], title: str) -> Table:
    """Terminal table: one line per curve, one column per evaluation length (mean over seeds):
    exact match / token accuracy for seq2seq tasks, token accuracy / loss for LM."""
    has_match = any(r["status"] == "ok" and not math.isnan(r.get("exact_match", math.nan))
                    for r in rows)
    first, second = ("exact_match", "accuracy") if has_match else ("accuracy", "loss")
    lengths = sorted({r["eval_len"] for r in rows})
    table = Table(title=f"{title}\n{first} / {second} by evaluation length (mean over seeds)")
    table.add_column("pe (+scaling, fine-tune)")
    for length in lengths:
        table.add_column(str(length), justify="right")
    curves = {m: mean_curves(rows, m) for m in (first, second)}
    labels = list(dict.fromkeys(curve_label(r) for r in rows))
    for label in labels:
        cells = []
        for length in lengths:
            a = dict(curves[first].get(label, [])).get(length)
            b = dict(curves[second].get(label, [])).get(length)
            errors = [r for r in rows if curve_label(r) == label and r["eval_len"] == length
                      and r["status"] == "error"]
            if a is None and b is None:
                cells.append("[red]error[/]" if errors else "")
            else:
                cells.append(f"{_fmt(a)} / {_fmt(b)}")
        table.add_row(label, *cells)
    return table


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
