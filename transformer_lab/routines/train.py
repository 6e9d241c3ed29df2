"""``tlab train``: one configuration trained on its task, the researcher's everyday run.

The run's model (``build_model(cfg, seed)``) trains for ``train.steps`` steps with the
``optimizer`` group's optimiser and ``train.schedule``; every ``train.log_every`` steps a
``train`` row and every ``train.eval_every`` steps (and at the end) a held-out ``val`` row go
to ``metrics.csv``: the loss, token accuracy and, by task,

* a language task (``task=lm``, ``task=text``): ``ppl``, the perplexity ``exp(loss)`` of the
  held-out next-token cross-entropy;
* a sequence task (``task=reverse``, ``task=copy``): ``exact_match``, the fraction of held-out
  sequences predicted entirely right (greedy decoding in a decoder).

``routine.seeds`` = N > 1 (``--seeds``): seeds ``seed .. seed+N-1`` train one after another,
each built and trained as a run of its own (the same numbers as a one-seed run of that seed);
``seeds.csv`` has one row per seed with the numbers such a run puts in its summary, so that
``tlab report`` pairs the seeds of a sweep (``-m pe=rope,alibi``) and gives verdicts.
``summary.csv``: those numbers, averaged over the seeds (``steps``: the longest; ``wall_s``: the
whole run's).
The console prints one line per seed (and their mean).

In this order: the settings, one seed's training, the numbers and the table, the routine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig
from rich import box
from rich.table import Table
from torch import nn

from transformer_lab.config.schema import POSITIVE_INT
from transformer_lab.model import build_model
from transformer_lab.results.check_rows import Stopwatch
from transformer_lab.results.console import console
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.objective import Objective, final_loss
from transformer_lab.routines.variants import seed_list, train_settings
from transformer_lab.tasks import Task
from transformer_lab.tasks.language import LanguageModelTask
from transformer_lab.training.trainer import Trainer, TrainResult, count_parameters

STAGE = "train"  # the ``stage`` of its rows in metrics.csv

# The routine's own keys (``routines.check_settings``); its length is ``train.steps``.
SETTINGS = {"seeds": POSITIVE_INT}


# --- one seed ------------------------------------------------------------------------------

class HeldOutLog:
    """One seed's metrics rows on their way to ``metrics.csv``: on a language task each held-out
    (``val``) row gains ``ppl``; the last held-out row is kept (the run's final numbers)."""

    def __init__(self, log: Any, language: bool) -> None:
        self.log = log
        self.language = language
        self.last: dict[str, Any] = {}

    def write(self, row: Mapping[str, Any]) -> None:
        if row.get("split") == "val":
            if self.language:
                row = {**row, "ppl": perplexity(float(row["loss"]))}
            self.last = dict(row)
        self.log.write(row)


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a mean cross-entropy in nats (inf where it overflows)."""
    return math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf


@dataclass
class TrainedSeed:
    """One seed's model after training, with its training result and final held-out row."""

    seed: int
    result: TrainResult
    params: int
    held_out: dict[str, Any] = field(default_factory=dict)  # the last ``val`` row
    model: nn.Module | None = None  # the trained model: its final weights

    def numbers(self, language: bool) -> dict[str, Any]:
        """What a one-seed run of this seed puts in ``summary.csv`` (and ``seeds.csv``)."""
        r = self.result
        numbers = {"params": self.params, "steps": r.steps, "final_loss": r.final_loss,
                   "final_accuracy": self.held_out.get("accuracy", math.nan)}
        if language:
            numbers["final_ppl"] = perplexity(r.final_loss)
        else:
            numbers["final_exact_match"] = self.held_out.get("exact_match", math.nan)
            numbers["best_exact_match"] = r.best_exact_match
        return {**numbers, "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s}


def train_seed(cfg: DictConfig, task: Task, seed: int, log: CsvLog | None) -> TrainedSeed:
    """Build the model of ``cfg`` with ``seed`` and train it for ``train.steps`` steps, as a run
    of its own; its rows go to ``log`` tagged with the stage and seed."""
    settings = train_settings(cfg)
    model = build_model(cfg, seed=seed)
    held_out = HeldOutLog(TaggedLog(log, stage=STAGE, seed=seed), is_language(task))
    result = Trainer(model, task, settings, seed, held_out).fit(settings.steps)
    return TrainedSeed(seed, result, count_parameters(model), held_out.last, model)


def is_language(task: Task) -> bool:
    """Next-token prediction (``task=lm``, ``task=text``): perplexity, no exact match."""
    return isinstance(task, LanguageModelTask)


# --- the numbers and the table --------------------------------------------------------------

def run_summary(seeds: list[TrainedSeed], language: bool) -> dict[str, Any]:
    """``summary.csv``'s numbers: each seed's (``TrainedSeed.numbers``) averaged over the seeds;
    ``steps`` the longest, ``params`` the model's."""
    rows = [s.numbers(language) for s in seeds]
    summary = {key: _mean([row[key] for row in rows]) for key in rows[0]}
    summary.update(params=rows[0]["params"], steps=max(row["steps"] for row in rows))
    return summary


def _mean(values: list[Any]) -> float:
    numbers = [float(v) for v in values if v is not None]
    return statistics.fmean(numbers) if numbers else math.nan


TABLE_COLUMNS = {"seed": "seed", "steps": "steps", "final_loss": "held-out loss",
                 "final_ppl": "ppl", "final_exact_match": "exact match",
                 "final_accuracy": "accuracy", "tokens_per_s": "tok/s", "wall_s": "wall s"}


def train_table(rows: list[dict[str, Any]], title: str, caption: str) -> Table:
    """One line per seed (and the mean of several), the columns the rows have."""
    columns = [c for c in TABLE_COLUMNS if c in rows[0]]
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, show_edge=False,
                  padding=(0, 1, 0, 0))
    for column in columns:
        table.add_column(TABLE_COLUMNS[column], justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    return table


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def describe_run(cfg: DictConfig, params: int) -> str:
    """The configuration in one line: task, arch, components, optimiser, size."""
    arch = "decoder" if cfg.arch.causal else "encoder"
    optimizer = cfg.get("optimizer", {}).get("name", "adamw")
    return (f"task={cfg.task.get('name')} {arch} pe={cfg.pe.get('name')} "
            f"block={cfg.block.get('name')} norm_layer={cfg.norm_layer.get('name')} "
            f"ffn={cfg.ffn.get('name')} optimizer={optimizer}: {params:,} parameters")


# --- the routine ----------------------------------------------------------------------------

def run_train(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    """Train every seed one after another, print the table; PASS when every seed's held-out
    loss is finite (a diverging seed stops the run: ``Diverged``)."""
    clock = Stopwatch()
    task, seeds, steps = inputs.task, seed_list(cfg), int(cfg.train.steps)
    language = is_language(task)
    trained = []
    which = f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
    with progress_bar(run.metrics, f"train: {which}, {steps} steps", total=steps * len(seeds)):
        for seed in seeds:
            trained.append(train_seed(cfg, task, seed, run.metrics))
            # trained[-1].model holds this seed's final weights: where a run will keep them
    per_seed = [{"seed": s.seed, **s.numbers(language)} for s in trained]
    if len(per_seed) > 1:
        run.write_table("seeds", per_seed)
    summary = run_summary(trained, language)
    rows = per_seed + ([{"seed": "mean", **summary}] if len(per_seed) > 1 else [])
    console.print(train_table(rows, f"tlab train - {run.path}",
                              describe_run(cfg, trained[0].params)))
    finite = all(math.isfinite(s.result.final_loss) for s in trained)
    summary["wall_s"] = clock.lap()
    return RoutineOutcome(passed=finite, summary=summary,
                          message="" if finite else "a held-out loss is not finite")


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("final_loss", "minimize", final_loss)
