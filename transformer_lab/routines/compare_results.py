"""The numbers of ``tlab compare-activations`` (``compare.py``) and ``tlab validate`` step 4:
one activation trained with one seed (:class:`SeedRun`, its ``compare_runs.csv`` row,
:data:`RUN_COLUMNS`), the ``comparison.csv`` rows (:data:`COMPARISON_COLUMNS`: seeds averaged,
the verdict columns against the baseline), the verdicts in words and one check per activation.
The terminal table and the plot are in ``compare_output.py``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformer_lab.measures.statistics import (
    BASELINE,
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.results.check_rows import CheckRow, status
from transformer_lab.results.curve_metrics import early_loss, late_loss_std
from transformer_lab.routines.compare_output import SMOOTHING

COMPARISON_COLUMNS = ["activation", "params", "ffn_params", "tokens_per_s", "rel_speed",
                      "final_loss", "final_ppl", "grad_norm_mean", "grad_norm_std",
                      "steps_to_target", "seeds", "loss_target", "final_loss_std",
                      "first_loss", "steps", "final_loss_ci_low", "final_loss_ci_high",
                      *VERDICT_COLUMNS, "early_loss", "late_loss_std"]
RUN_COLUMNS = ["activation", "seed", "params", "ffn_params", "tokens_per_s", "final_loss",
               "final_train_loss", "first_loss", "grad_norm_mean", "grad_norm_std", "steps",
               "wall_s", "early_loss", "late_loss_std"]


@dataclass
class SeedRun:
    """One activation trained with one seed."""

    activation: str
    seed: int
    params: int
    ffn_params: int
    steps: int
    final_loss: float  # held-out cross-entropy after the last step
    wall_s: float
    train_losses: list[float] = field(default_factory=list)  # one per logged step
    logged_steps: list[int] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    tokens_per_s: float = 0.0  # median over log intervals

    @property
    def smoothed(self) -> list[float]:
        return ema(self.train_losses, SMOOTHING)

    @property
    def early_loss(self) -> float:
        """Mean training loss over the first 10% of the steps (``curve_metrics``)."""
        return early_loss(self.logged_steps, self.train_losses)

    @property
    def late_loss_std(self) -> float:
        """Std of the training loss over the last 30% of the steps (``curve_metrics``)."""
        return late_loss_std(self.logged_steps, self.train_losses)

    def as_row(self) -> dict:
        return {"activation": self.activation, "seed": self.seed, "params": self.params,
                "ffn_params": self.ffn_params, "tokens_per_s": self.tokens_per_s,
                "final_loss": _exact(self.final_loss),
                "final_train_loss": self.smoothed[-1] if self.train_losses else math.nan,
                "first_loss": self.train_losses[0] if self.train_losses else math.nan,
                "grad_norm_mean": _mean(self.grad_norms),
                "grad_norm_std": _std(self.grad_norms), "steps": self.steps,
                "wall_s": self.wall_s, "early_loss": _exact(self.early_loss),
                "late_loss_std": _exact(self.late_loss_std)}


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average ``s_t = (1 - w) s_{t-1} + w v_t`` with ``s_0 = v_0``."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else (1 - weight) * smoothed[-1] + weight * value)
    return smoothed


def _exact(value: float) -> float | str:
    """``value`` in full precision (the shortest text that reads back as the same float): the
    CSV's 6 significant digits would blur paired differences of 1e-4 between activations."""
    return repr(float(value)) if math.isfinite(value) else value


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _std(values: Sequence[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def steps_to_target(run: SeedRun, target: float) -> int | None:
    """First logged step whose smoothed training loss is at or below ``target``."""
    for step, loss in zip(run.logged_steps, run.smoothed, strict=True):
        if loss <= target:
            return step
    return None


def comparison_rows(runs: list[SeedRun], loss_target: float | None,
                    baseline: str | None = None) -> list[dict]:
    """One ``comparison.csv`` row per activation (in the order first seen), seeds averaged, with
    the verdict columns against ``baseline`` (default the first activation), paired by seed."""
    finals = [r.smoothed[-1] for r in runs if r.train_losses]
    target = loss_target if loss_target is not None else max(finals, default=math.nan)
    by_activation: dict[str, list[SeedRun]] = {}
    for run in runs:
        by_activation.setdefault(run.activation, []).append(run)
    rows = []
    for activation, seed_runs in by_activation.items():
        reached = [steps_to_target(r, target) for r in seed_runs]
        norms = [g for r in seed_runs for g in r.grad_norms]
        final = [r.final_loss for r in seed_runs]
        rows.append({
            "activation": activation, "params": seed_runs[0].params,
            "ffn_params": seed_runs[0].ffn_params,
            "tokens_per_s": _mean([r.tokens_per_s for r in seed_runs]),
            "final_loss": _mean(final), "final_ppl": _exp(_mean(final)),
            "grad_norm_mean": _mean(norms), "grad_norm_std": _std(norms),
            "steps_to_target": None if None in reached else statistics.median(reached),
            "seeds": len(seed_runs), "loss_target": target, "final_loss_std": _std(final),
            "first_loss": _mean([r.train_losses[0] for r in seed_runs if r.train_losses]),
            "steps": seed_runs[0].steps,
            "early_loss": _mean([r.early_loss for r in seed_runs]),
            "late_loss_std": _mean([r.late_loss_std for r in seed_runs]),
        })
    first_speed = rows[0]["tokens_per_s"] if rows else math.nan
    for row in rows:
        row["rel_speed"] = row["tokens_per_s"] / first_speed if first_speed else math.nan
    if runs:
        import pandas as pd

        per_seed = pd.DataFrame([{"activation": r.activation, "seed": r.seed,
                                  "final_loss": r.final_loss} for r in runs])
        verdicts = verdict_table(per_seed, "activation", baseline=baseline)
        for row in rows:
            row.update(verdicts.loc[row["activation"]].to_dict())
    return rows


def baseline_name(rows: list[dict]) -> str:
    """The activation whose ``verdict`` is ``baseline`` (the first row if none is marked)."""
    return next((r["activation"] for r in rows if r.get("verdict") == BASELINE),
                rows[0]["activation"])


def verdict_lines(rows: list[dict]) -> list[str]:
    """One plain-language line per activation against the baseline (``statistics.describe``)."""
    baseline = baseline_name(rows)
    return [describe(row["activation"], row, baseline) for row in rows if has_verdict(row)]


def _exp(loss: float) -> float:
    return math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf


def comparison_checks(rows: list[dict], step: int = 4) -> list[CheckRow]:
    """One check per activation: it trained to a finite loss and the loss fell. The numbers
    are a comparison (speed, perplexity, gradient-norm spread), not a verdict on quality."""
    checks = []
    baseline = baseline_name(rows) if rows else None
    for row in rows:
        finite = math.isfinite(row["final_loss"]) and math.isfinite(row["grad_norm_mean"])
        fell = finite and row["final_loss"] < row["first_loss"]
        detail = (f"loss {row['first_loss']:.3f} -> {row['final_loss']:.3f} (ppl "
                  f"{row['final_ppl']:.3g}), {row['tokens_per_s']:.0f} tok/s ("
                  f"{row['rel_speed']:.2f}x), grad norm {row['grad_norm_mean']:.3g} +- "
                  f"{row['grad_norm_std']:.2g}; a comparison: PASS = finite and falling")
        if not finite:
            detail += "; non-finite loss or gradients: lower train.lr or check the FFN"
        elif not fell:
            detail += "; the loss did not fall: check the FFN's forward and its initialisation"
        if has_verdict(row):
            detail += f"; {describe(row['activation'], row, baseline)}"
        checks.append(CheckRow(step, f"activation_{row['activation']}", status(fell),
                               "final_loss", row["final_loss"], "< first loss", 0.0, detail))
    return checks
