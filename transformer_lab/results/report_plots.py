"""The plots of ``tlab report`` (``report.py``): the final metric per group (mean, std error
bars) and the training-loss curves per group (mean over seeds, std band)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from transformer_lab.results.gather import Gathered


def _group_labels(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per row of ``frame``: its group as ``key=value, ...`` (``all runs`` without keys)."""
    if not keys:
        return pd.Series(["all runs"] * len(frame), index=frame.index)
    return frame[keys].astype(str).apply(
        lambda row: ", ".join(f"{k}={v}" for k, v in zip(keys, row, strict=False)), axis=1)


def plot_metric(pivot: pd.DataFrame, keys: list[str], metric: str, path: Path) -> Path:
    """One bar per group of ``pivot``: the mean of ``metric`` over its samples, std error bars."""
    from transformer_lab.results.plots import plt, save

    labels = _group_labels(pivot, keys).tolist()
    means = pivot[f"{metric}_mean"].to_numpy(dtype=float)
    stds = pivot[f"{metric}_std"].fillna(0.0).to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(labels) + 2), 4))
    ax.bar(range(len(labels)), means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 3 else 0, ha="right"
                  if len(labels) > 3 else "center", fontsize=8)
    ax.set_ylabel(f"{metric} (mean ± std over seeds)")
    ax.set_title(f"{metric} at the end of each run, per choice")
    return save(fig, path)


def plot_loss_curves(gathered: Gathered, path: Path) -> Path | None:
    """Per group, the mean training loss at each step over every curve of its runs (each seed
    of a multi-seed run is one curve), std band; None without curves."""
    if gathered.curves.empty:
        return None
    from transformer_lab.results.plots import distinct_styles, plt, save

    labels = _group_labels(gathered.runs.drop_duplicates("run_dir"), gathered.group_keys)
    label_of = dict(zip(gathered.runs.drop_duplicates("run_dir")["run_dir"], labels,
                        strict=False))
    curves = gathered.curves.assign(group=gathered.curves["run_dir"].map(label_of))
    groups = list(curves.groupby("group", sort=False))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (group, rows), style in zip(groups, distinct_styles(len(groups)), strict=True):
        by_step = rows.groupby("step")["loss"]
        mean, std = by_step.mean(), by_step.std(ddof=1).fillna(0.0)
        ax.plot(mean.index, mean.to_numpy(), label=str(group), **style)
        ax.fill_between(mean.index, (mean - std).to_numpy(), (mean + std).to_numpy(),
                        color=style["color"], alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over seeds)")
    ax.set_title("loss curves per group")
    ax.legend(fontsize=7)
    return save(fig, path)
