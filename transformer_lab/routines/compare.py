"""``tlab compare-activations``: step 4 of the validation routine, the article's activation table
(ReLU / GELU / Swish / LeakyReLU: parameters, speed, perplexity, gradient stability) made
runnable.

For every activation of ``routine.activations`` (choices of the ``ffn`` config group) and
every seed ``seed, seed+1, .., seed+routine.seeds-1``, the run's model is built with that FFN
and trained for ``routine.steps`` steps (one model after another). Within a seed every activation
starts from the same ``torch.manual_seed`` (same initial attention/embedding weights; the FFN
weights too where the shapes match) and sees the same batches in the same order (the trainer's
generator is seeded with the seed), so the curves differ by the activation only.

Default task: 8-token reversal (vocabulary 16) in an encoder, at the ``small`` model. The
synthetic language-model task (``task=lm arch=decoder``) was the first choice, since it gives a
perplexity the way the article's table means it, but its corpus is an order-1 Markov chain: the
embedding and output head learn the bigram table and the FFN hardly matters. Measured at 200
steps: relu, gelu, swish and leaky_relu all plateau at held-out ppl 3.63 by step ~100 with
indistinguishable curves (near the chain's floor: exp of its entropy rate is 3.46). 8-token
reversal needs the FFN and is still being learned at step 200, so final loss, perplexity
(``exp`` of the held-out cross-entropy per target token) and the gradient-norm spread differ
between activations. Any task works: ``task=lm arch=decoder``
for a language model; inside ``tlab validate`` step 4 uses the run's own task.

``comparison.csv`` (one row per activation, numbers averaged over seeds):

    params          parameters of the whole model        ffn_params      of all FFN blocks
    tokens_per_s    median training throughput            rel_speed       / first activation's
    final_loss      held-out cross-entropy at the end     final_ppl       exp(final_loss)
    grad_norm_mean  mean of the per-step gradient norm (before clipping) over all steps
    grad_norm_std   its standard deviation: the stability figure (spikes make it large)
    steps_to_target first step whose smoothed training loss (EMA, ``SMOOTHING``) reaches
                    ``loss_target`` (median over seeds; empty if a seed never does)
    seeds           number of seeds
    early_loss      mean training loss over the first 10% of the steps (``results.curve_metrics``)
    late_loss_std   std of the training loss over the last 30% of the steps: the oscillation

``routine.loss_target: null`` means "the loss every run reaches": the highest final smoothed
training loss among all runs, so ``steps_to_target`` says who got there first.
Against the baseline activation (``routine.baseline``, ``--baseline``; default the first listed),
paired by seed (``measures.statistics``): ``final_loss_ci_low/high`` (95% t-interval over seeds),
``diff_vs_baseline`` (activation - baseline) with ``diff_ci_low/high``, ``p_value`` (exact
sign-flip permutation test), ``p_adjusted`` (Holm over the activations), ``verdict`` (better |
worse | no detectable difference at 0.05; the baseline's is ``baseline``), ``seeds_needed`` (80%
power for the observed difference), ``paired_seeds`` and ``note``. A verdict needs 6+ seeds (7+
for three activations against the baseline): the smallest sign-flip p over n seeds is 2 / 2^n.
``compare_runs.csv`` has one row per (activation, seed) (``final_loss`` in full precision, so
the verdict columns can be recomputed exactly; ``early_loss`` and ``late_loss_std`` of that
seed's curve, which ``tlab report --metric early_loss`` also computes from metrics.csv),
written as each activation's seeds finish (an interrupted comparison keeps its finished
activations); ``loss_curves.png`` plots the smoothed training loss, mean over seeds with the
min-max band.

In this order: the settings checks, the training, a seed's run with the rows, verdicts and
checks, the terminal table and the plot, the routine.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, ListConfig
from rich import box
from rich.table import Table

from transformer_lab.config.instantiate import build_task
from transformer_lab.config.schema import POSITIVE_INT, Rule, number_rule
from transformer_lab.config.tree import group_choices, user_config_dirs
from transformer_lab.errors import ConfigError
from transformer_lab.measures.statistics import (
    BASELINE,
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.model import build_model
from transformer_lab.results.check_rows import CheckRow, Stopwatch, status
from transformer_lab.results.console import console
from transformer_lab.results.curve_metrics import early_loss, late_loss_std
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.objective import Objective, chosen_variant_loss
from transformer_lab.routines.variants import seed_list, stage_log, train_settings, with_choice
from transformer_lab.training.trainer import Trainer, count_parameters


def activation_list(cfg: DictConfig) -> list[str]:
    """``routine.activations`` as a list (a list, or a comma-separated string)."""
    value = cfg.routine.get("activations")
    if isinstance(value, ListConfig | list | tuple):
        return [str(v).strip() for v in value]
    return [a.strip() for a in str(value or "").split(",") if a.strip()]


# The routine's own keys (``routines.check_settings``; the activations' choices and the baseline
# among them: ``check_config``). ``loss_target``: a positive loss, or null (the loss every run
# reaches).
SETTINGS = {"activations": Rule("list", item=Rule("str"), min_items=1), "steps": POSITIVE_INT,
            "seeds": POSITIVE_INT, "baseline": Rule("str", nullable=True),
            "loss_target": number_rule(0, open_low=True, nullable=True)}


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight: every activation is a choice of the ``ffn`` group, listed once; the
    baseline is one of them."""
    routine = cfg.routine
    names = activation_list(cfg)
    valid = group_choices("ffn", user_config_dirs(cfg))
    if not names:
        raise ConfigError(f"routine.activations is empty; give one or more of: {', '.join(valid)}")
    for name in names:
        if name not in valid:
            raise ConfigError(f"unknown activation '{name}' in --activations; valid: "
                              f"{', '.join(valid)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--activations lists an activation twice: {','.join(names)}")
    baseline = routine.get("baseline")
    if baseline is not None and str(baseline) not in names:
        raise ConfigError(f"--baseline {baseline} is not among the compared activations; "
                          f"valid: {', '.join(names)}")


def train_seeds(cfg: DictConfig, seeds: Sequence[int], log: CsvLog | None,
                stage: str = "compare") -> list[SeedRun]:
    """Train the model of ``cfg`` (one activation) with each of ``seeds`` for ``routine.steps``,
    one after another, each as a run of its own. Throughput is the median over log intervals
    of one seed's tokens per second (robust to the first steps' warm-up and to other
    processes), so every activation of a comparison is measured the same way.
    """
    activation = str(cfg.ffn.get("name"))
    task, settings = build_task(cfg), train_settings(cfg)
    tokens_per_step = settings.batch_size * task.model_seq_len
    runs = []
    for seed in seeds:
        model = build_model(cfg, seed=seed)
        logged: list[tuple[int, float]] = []  # (step, perf_counter) at each logged step
        trainer = Trainer(model, task, settings, seed, stage_log(log, stage, activation, seed))
        result = trainer.fit(int(cfg.routine.steps), on_step=lambda step, loss, logged=logged:
                             logged.append((step, time.perf_counter())))
        speeds = [tokens_per_step * (s1 - s0) / (t1 - t0)
                  for (s0, t0), (s1, t1) in zip(logged, logged[1:], strict=False) if t1 > t0]
        ffn_params = sum(p.numel() for block in model.blocks
                         for p in block.feedforward.parameters())
        runs.append(SeedRun(activation, seed, count_parameters(model), ffn_params,
                            result.steps, result.final_loss, result.wall_s,
                            result.train_losses, [step for step, _ in logged], result.grad_norms,
                            statistics.median(speeds) if speeds else result.tokens_per_s))
    return runs


def compare_runs(cfg: DictConfig, run: RunDirectory, stage: str = "compare") -> list[SeedRun]:
    """Train every activation with seeds ``seed .. seed + routine.seeds - 1`` (``train_seeds``);
    each activation's finished (activation, seed) pairs are appended to ``compare_runs.csv``."""
    activations, seeds = activation_list(cfg), seed_list(cfg)
    runs_log = run.log("compare_runs", RUN_COLUMNS)
    runs: list[SeedRun] = []
    for activation in activations:
        variant = with_choice(cfg, "ffn", activation)
        with progress_bar(run.metrics, f"{activation}, {len(seeds)} seed"
                          f"{'s' if len(seeds) > 1 else ''}: {cfg.routine.steps} steps",
                          total=int(cfg.routine.steps) * len(seeds)):
            seed_runs = train_seeds(variant, seeds, run.metrics, stage)
        runs.extend(seed_runs)
        runs_log.write_all(r.as_row() for r in seed_runs)
    return runs


# --------------------------------------------------------------------------------------------
# a seed's run, the rows, the verdicts and the checks


SMOOTHING = 0.1  # EMA weight of the newest training loss in the smoothed curve

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


# --------------------------------------------------------------------------------------------
# the terminal table and the plot


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


def run_compare(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    """Train every activation, write ``comparison.csv`` and ``loss_curves.png``, print the table
    and the verdicts; PASS when every activation trained to a finite, falling loss."""
    clock = Stopwatch()
    runs = compare_runs(cfg, run)
    rows = comparison_rows(runs, cfg.routine.get("loss_target"), cfg.routine.get("baseline"))
    run.write_table("comparison", rows, COMPARISON_COLUMNS)
    plot_loss_curves(runs, run.path / "loss_curves.png",
                     f"{cfg.task.get('name')}, {'decoder' if cfg.arch.causal else 'encoder'}, "
                     f"pe={cfg.pe.get('name')}: {cfg.routine.steps} steps")
    console.print(comparison_table(rows, f"tlab compare-activations - {run.path}"))
    for line in verdict_lines(rows):
        console.print(line, highlight=False, markup=False)
    checks = comparison_checks(rows)
    failed = [c for c in checks if not c.passed]
    first = rows[0]
    summary = {"params": first["params"], "steps": first["steps"],
               "final_loss": first["final_loss"], "wall_s": clock.lap(),
               "tokens_per_s": first["tokens_per_s"]}
    return RoutineOutcome(passed=not failed, summary=summary,
                          message="; ".join(f"{c.check}: {c.detail}" for c in failed))


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("final_loss", "minimize", chosen_variant_loss)
