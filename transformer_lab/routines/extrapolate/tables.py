"""``tlab extrapolate``'s curves (mean over seeds), plot, terminal table and verdict columns
(each curve against its baseline curve, paired by seed: docs/routines.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table

from transformer_lab.measures.statistics import (
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)

EXTRAPOLATION_COLUMNS = [
    "pe", "scaling", "train_len", "eval_len", "loss", "accuracy", "exact_match", "seed",
    "factor", "base", "length_ratio", "model_seq_len", "finetune_steps", "train_steps",
    "status", "error", "baseline", "loss_ci_low", "loss_ci_high", *VERDICT_COLUMNS,
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
    """Token accuracy, exact match (if any) and loss against evaluation length, mean over seeds;
    None (no file) when no row has a number."""
    panels = {metric.replace("_", " "): curves for metric in ("accuracy", "exact_match", "loss")
              if (curves := mean_curves(rows, metric))}
    if not panels:
        return None
    from transformer_lab.results.plots import length_curves

    lengths = sorted({r["eval_len"] for r in rows})
    return length_curves(path, panels, lengths, mark=train_len,
                         unit_panels=("accuracy", "exact match"))


def results_table(rows: list[Mapping[str, Any]], title: str) -> Table:
    """One line per curve, one column per evaluation length (mean over seeds)."""
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


def baselines(rows: list[Mapping[str, Any]]) -> dict[str, str]:
    """Curve label -> the label of the curve it is tested against."""
    curves: dict[str, list[str]] = {}  # pe -> its curve labels, in order of appearance
    for row in rows:
        labels = curves.setdefault(row["pe"], [])
        if (label := curve_label(row)) not in labels:
            labels.append(label)

    def reference(pe: str) -> str:
        plain = curve_label({"pe": pe, "scaling": "none", "finetune_steps": 0})
        return plain if plain in curves[pe] else curves[pe][0]

    first = reference(next(iter(curves))) if curves else None
    return {label: first if label == reference(pe) else reference(pe)
            for pe, labels in curves.items() for label in labels}


def with_verdicts(rows: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the ``baseline``, ``loss_ci_*`` and verdict columns, per evaluation length
    and baseline (an error row counts as a missing seed)."""
    out = [dict(row) for row in rows]
    against = baselines(out)
    for row in out:
        row["baseline"] = against[curve_label(row)]
    for length in dict.fromkeys(row["eval_len"] for row in out):
        at_length = [row for row in out if row["eval_len"] == length]
        for baseline in dict.fromkeys(row["baseline"] for row in at_length):
            family = [row for row in at_length
                      if row["baseline"] == baseline or curve_label(row) == baseline]
            frame = pd.DataFrame({
                "curve": [curve_label(row) for row in family],
                "seed": [row["seed"] for row in family],
                "loss": [row.get("loss", math.nan) if row["status"] == "ok" else math.nan
                         for row in family]})
            if baseline not in set(frame["curve"]):
                continue
            table = verdict_table(frame, "curve", "loss", baseline=baseline)
            for row, label in zip(family, frame["curve"], strict=True):
                if row["baseline"] == baseline:  # a reference's own row: from its family
                    row.update(table.loc[label].to_dict())
    return out


def verdict_lines(rows: list[Mapping[str, Any]]) -> list[str]:
    """One line per (curve, evaluation length) tested against a baseline (with several seeds)."""
    seen, lines = set(), []
    for row in rows:
        key = (curve_label(row), row["eval_len"])
        if key in seen or not has_verdict(row) or row["baseline"] == key[0]:
            continue
        seen.add(key)
        lines.append(f"at {row['eval_len']} tokens: "
                     + describe(key[0], row, row["baseline"], value="loss"))
    return lines
