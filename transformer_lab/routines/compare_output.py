"""What ``tlab compare-activations`` shows: the terminal table and the loss-curve plot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich import box
from rich.table import Table

if TYPE_CHECKING:
    from transformer_lab.routines.compare_results import SeedRun

SMOOTHING = 0.1  # EMA weight of the newest training loss in the smoothed curve

TABLE_HEADERS = {"activation": "activation", "params": "params", "ffn_params": "ffn",
                 "tokens_per_s": "tok/s", "rel_speed": "speed", "final_loss": "loss",
                 "final_ppl": "ppl", "grad_norm_mean": "|g|", "grad_norm_std": "sd",
                 "steps_to_target": "steps*", "seeds": "n"}


def comparison_table(rows: list[dict], title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False,
                  caption="speed: tokens/s / the first's; |g|, sd: gradient norm mean and sd over "
                  "steps; steps*: steps to the loss every run reaches; n: seeds")
    for column, header in TABLE_HEADERS.items():
        table.add_column(header, justify="left" if column == "activation" else "right",
                         no_wrap=True)
    for row in rows:
        table.add_row(*(_cell(row[c]) for c in TABLE_HEADERS))
    return table


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def plot_loss_curves(runs: list[SeedRun], path: Path, title: str) -> Path:
    """Smoothed training loss per activation: mean over seeds, min-max band."""
    from transformer_lab.results.plots import plt, save

    figure, axes = plt.subplots(figsize=(7, 4.5))
    by_activation: dict[str, list[SeedRun]] = {}
    for run in runs:
        by_activation.setdefault(run.activation, []).append(run)
    for activation, seed_runs in by_activation.items():
        length = min(len(r.smoothed) for r in seed_runs)
        steps = seed_runs[0].logged_steps[:length]
        curves = torch.tensor([r.smoothed[:length] for r in seed_runs])  # (seeds, logged)
        label = f"{activation} ({len(seed_runs)} seed{'s' if len(seed_runs) > 1 else ''})"
        (line,) = axes.plot(steps, curves.mean(0).tolist(), label=label)
        if len(seed_runs) > 1:
            axes.fill_between(steps, curves.min(0).values.tolist(),
                              curves.max(0).values.tolist(), color=line.get_color(), alpha=0.2)
    axes.set_xlabel("step")
    axes.set_ylabel(f"training loss (EMA {SMOOTHING})")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    return save(figure, path)
