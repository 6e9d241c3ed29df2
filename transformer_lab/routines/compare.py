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

Here: the settings checks, the training and the routine; a seed's run, the rows, verdicts and
checks are in ``compare_results.py``, the terminal table and the plot in ``compare_output.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from omegaconf import DictConfig, ListConfig

from transformer_lab.config.instantiate import build_task
from transformer_lab.config.tree import group_choices, user_config_dirs
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_model
from transformer_lab.results.check_rows import Stopwatch
from transformer_lab.results.console import console
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome, compare_output
from transformer_lab.routines.compare_results import (
    COMPARISON_COLUMNS,
    RUN_COLUMNS,
    SeedRun,
    comparison_checks,
    comparison_rows,
    verdict_lines,
)
from transformer_lab.routines.objective import Objective, chosen_variant_loss
from transformer_lab.routines.variants import seed_list, stage_log, train_settings, with_choice
from transformer_lab.training.trainer import Trainer, count_parameters


def activation_list(cfg: DictConfig) -> list[str]:
    """``routine.activations`` as a list (a list, or a comma-separated string)."""
    value = cfg.routine.get("activations")
    if isinstance(value, ListConfig | list | tuple):
        return [str(v).strip() for v in value]
    return [a.strip() for a in str(value or "").split(",") if a.strip()]


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight checks of the routine's settings (called by ``validate_config``)."""
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
    steps = routine.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"routine.steps={steps} is not valid (--steps); it must be an "
                          "integer >= 1")
    baseline = routine.get("baseline")
    if baseline is not None and str(baseline) not in names:
        raise ConfigError(f"--baseline {baseline} is not among the compared activations; "
                          f"valid: {', '.join(names)}")
    seed_list(cfg)
    target = routine.get("loss_target")
    if target is not None and (not isinstance(target, int | float) or target <= 0):
        raise ConfigError(f"routine.loss_target={target} is not valid; use a positive loss or "
                          "null (the loss every run reaches)")


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


def run_compare(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    """Train every activation, write ``comparison.csv`` and ``loss_curves.png``, print the table
    and the verdicts; PASS when every activation trained to a finite, falling loss."""
    clock = Stopwatch()
    runs = compare_runs(cfg, run)
    rows = comparison_rows(runs, cfg.routine.get("loss_target"), cfg.routine.get("baseline"))
    run.write_table("comparison", rows, COMPARISON_COLUMNS)
    compare_output.plot_loss_curves(runs, run.path / "loss_curves.png",
                     f"{cfg.task.get('name')}, {'decoder' if cfg.arch.causal else 'encoder'}, "
                     f"pe={cfg.pe.get('name')}: {cfg.routine.steps} steps")
    console.print(compare_output.comparison_table(rows, f"tlab compare-activations - {run.path}"))
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
