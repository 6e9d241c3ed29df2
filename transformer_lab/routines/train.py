"""``tlab train``: one configuration trained on its task, each seed a run of its own, with its
weights and resumable state kept (docs/routines.md)."""

from __future__ import annotations

import math
import signal
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from rich.table import Table
from torch import nn

from transformer_lab.config.schema import POSITIVE_INT
from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import Interrupted
from transformer_lab.measures.parameters import training_flops_per_token
from transformer_lab.model import build_model
from transformer_lab.results.check_rows import Stopwatch
from transformer_lab.results.console import cell, print_table, result_table
from transformer_lab.results.run_directory import (
    CHECKPOINT_FILE,
    CsvLog,
    RunDirectory,
    TaggedLog,
    weights_path,
)
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.objective import Objective, final_loss
from transformer_lab.routines.study import SeedRun, run_study, study
from transformer_lab.tasks import Task
from transformer_lab.tasks.language import LanguageModelTask
from transformer_lab.training.checkpoint import config_yaml, load_state, save_state, save_weights
from transformer_lab.training.distributed import joined, resolve_device, world
from transformer_lab.training.pretrained import load_pretrained
from transformer_lab.training.throughput import model_flops_utilisation, peak_flops
from transformer_lab.training.trainer import (
    Trainer,
    TrainResult,
    count_parameters,
    stop_between_steps,
)

STAGE = "train"  # the ``stage`` of its rows in metrics.csv

# The routine's own keys (``routines.check_settings``); its length is ``train.steps``.
SETTINGS = {"seeds": POSITIVE_INT}
KEEPS_CHECKPOINTS = True  # train.checkpoint, train.checkpoint_every (``check_unread``)


# --- one seed ------------------------------------------------------------------------------

class HeldOutLog:
    """A seed's metrics rows: held-out rows gain ``ppl`` on a language task; ``last`` is the
    last held-out row."""

    def __init__(self, log: Any, task: Task) -> None:
        self.log = log
        self.language = isinstance(task, LanguageModelTask)
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


def seed_state(run: SeedRun) -> dict[str, Any]:
    """A trained seed as the resumable state keeps it (``seed_from_state`` reads it back)."""
    return {"seed": run.seed, "result": asdict(run.result), "params": run.params,
            "held_out": dict(run.held_out), "trainer": run.trainer}


def seed_from_state(state: Mapping[str, Any]) -> SeedRun:
    return SeedRun("", int(state["seed"]), TrainResult(**state["result"]), int(state["params"]),
                   held_out=dict(state["held_out"]), trainer=state.get("trainer"))


def seed_numbers(run: SeedRun, language: bool) -> dict[str, Any]:
    """What a one-seed run of this seed puts in ``summary.csv`` (and ``seeds.csv``)."""
    r = run.result
    numbers = {"params": run.params, "steps": r.steps, "final_loss": r.final_loss,
               "final_accuracy": run.held_out.get("accuracy", math.nan)}
    if language:
        numbers["final_ppl"] = perplexity(r.final_loss)
    else:
        numbers["final_exact_match"] = run.held_out.get("exact_match", math.nan)
        numbers["best_exact_match"] = r.best_exact_match
    return {**numbers, "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s,
            "step_ms": r.step_ms, "steady_tokens_per_s": r.steady_tokens_per_s}


def apart(spec: RunSpec, seed: int) -> dict[str, int]:
    """``seed_init`` and ``seed_data`` of a row when the run sets either apart, else nothing."""
    if spec.seed_init is None and spec.seed_data is None:
        return {}
    return dict(zip(("seed_init", "seed_data"), spec.seed_sources(seed), strict=True))


# --- the kept models and state ---------------------------------------------------------------

class RunCheckpoints:
    """Each seed's final weights and the run's resumable state (``checkpoint.pt``)."""

    def __init__(self, spec: RunSpec, run: RunDirectory, task: Task, seeds: Sequence[int]
                 ) -> None:
        self.spec, self.run, self.task, self.seeds = spec, run, task, list(seeds)
        self.path = run.path / CHECKPOINT_FILE
        self.enabled = spec.train.checkpoint
        self.periodic = self.enabled and spec.train.checkpoint_every > 0
        self.writes = world().leader  # under torchrun only rank 0 keeps files
        self.config = config_yaml(spec) if self.enabled else ""  # once (the YAML costs more
        # than torch.save of a small model)

    def resume_point(self, steps: int) -> tuple[dict[int, dict[str, Any]], dict[int, SeedRun]]:
        """Seed -> the state it goes on from (the interrupted seed's, and a finished seed's
        that trained fewer than ``steps``: the run is extended), and seed -> finished run;
        both empty for a new run. ``metrics.csv`` is cut back to match."""
        if not self.path.is_file():
            return {}, {}
        state = load_state(self.path)
        self.run.metrics.keep_first(int(state["metric_rows"]))
        states = {int(s["seed"]): s for s in state["done"] if s["result"]["steps"] < steps}
        if state["current"] is not None:  # seed, trainer (Trainer.state_dict), result, held_out
            states[int(state["current"]["seed"])] = state["current"]
        return states, {int(s["seed"]): seed_from_state(s) for s in state["done"]}

    def save_progress(self, done: Sequence[SeedRun], current: dict[str, Any] | None) -> None:
        """The finished seeds, the current one's state (None between seeds) and the rows
        ``metrics.csv`` has now."""
        if self.enabled and self.writes:
            save_state(self.path, {"config": self.config,
                                   "done": [seed_state(s) for s in done], "current": current,
                                   "metric_rows": self.run.metrics.rows})

    def keep_weights(self, model: nn.Module, seed: int) -> None:
        """A seed's final weights (``model.safetensors``, or ``models/seed<k>.safetensors``)."""
        if not self.writes:
            return
        path = weights_path(self.run.path, seed, several=len(self.seeds) > 1)
        save_weights(model, path, self.spec, seed, index=self.seeds.index(seed),
                     tokenizer=getattr(self.task, "tokenizer", None))


# --- one seed ------------------------------------------------------------------------------

def train_seed(spec: RunSpec, task: Task, seed: int, log: CsvLog | None,
               checkpoint: Callable[[dict[str, Any]], None] | None = None,
               resume: Mapping[str, Any] | None = None) -> tuple[SeedRun, nn.Module]:
    """Build the model of ``spec`` (with ``task``'s vocabulary) with ``seed`` and train it for
    ``train.steps`` steps (from ``resume``, a state ``checkpoint`` got); its numbers and its
    trained model."""
    settings = spec.train
    init_seed, data_seed = spec.seed_sources(seed)
    model = build_model(spec.model, seed=init_seed)
    load_pretrained(model, spec)  # from_run= / from_hf=: fine-tune from those weights
    held_out = HeldOutLog(TaggedLog(log, stage=STAGE, seed=seed), task)
    trainer = Trainer(model, task, settings, data_seed, held_out)
    result = None
    if resume is not None:
        trainer.load_state_dict(resume["trainer"])
        result, held_out.last = TrainResult(**resume["result"]), dict(resume["held_out"])

    def save(progress: TrainResult) -> None:
        if checkpoint is not None:
            checkpoint({"seed": seed, "trainer": trainer.state_dict(),
                        "result": asdict(progress), "held_out": dict(held_out.last)})

    result = trainer.fit(settings.steps - trainer.step_count, on_checkpoint=save, result=result)
    final = on_cpu(trainer.state_dict())
    return SeedRun("", seed, result, count_parameters(model), held_out=held_out.last,
                   trainer=final), model


def on_cpu(state: Any) -> Any:
    """``state`` (dicts, lists, tensors) with its tensors on the CPU (no copy of a CPU one)."""
    if isinstance(state, torch.Tensor):
        return state.to("cpu")
    if isinstance(state, dict):
        return {key: on_cpu(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_cpu(value) for value in state)
    return state


# --- the numbers and the table --------------------------------------------------------------

def run_summary(seeds: list[SeedRun], language: bool) -> dict[str, Any]:
    """Each seed's ``seed_numbers`` averaged; ``steps`` the longest."""
    rows = [seed_numbers(s, language) for s in seeds]
    summary = {key: mean_or_nan([row[key] for row in rows]) for key in rows[0]}
    summary.update(params=rows[0]["params"], steps=max(row["steps"] for row in rows))
    return summary


def mean_or_nan(values: Sequence[Any]) -> float:
    """The mean of the values that are not None; NaN without any."""
    numbers = [float(v) for v in values if v is not None]
    return statistics.fmean(numbers) if numbers else math.nan


TABLE_COLUMNS = {"seed": "seed", "steps": "steps", "final_loss": "held-out loss",
                 "final_ppl": "ppl", "final_exact_match": "exact match",
                 "final_accuracy": "accuracy", "tokens_per_s": "tok/s", "step_ms": "ms/step",
                 "mfu": "MFU", "wall_s": "wall s"}


def train_table(rows: list[dict[str, Any]], title: str, caption: str) -> Table:
    """One line per seed (and the mean of several), the columns the rows have."""
    columns = [c for c in TABLE_COLUMNS if c in rows[0]]
    table = result_table(title, caption)
    for column in columns:
        table.add_column(TABLE_COLUMNS[column], justify="right", no_wrap=True)
    for row in rows:
        mfu = row.get("mfu")
        percent = f"{100 * mfu:.3g}%" if isinstance(mfu, float) and math.isfinite(mfu) else "-"
        table.add_row(*(percent if c == "mfu" else cell(row.get(c), 4, ",") for c in columns))
    return table


def describe_run(spec: RunSpec, params: int) -> str:
    """The configuration in one line: task, arch, components, optimiser, size."""
    m = spec.model
    return (f"task={spec.task.name} {'decoder' if m.causal else 'encoder'} pe={m.pe.name} "
            f"block={m.block.name} norm_layer={m.norm_layer.name} ffn={m.ffn.name} "
            f"optimizer={spec.train.optimizer.name}: {params:,} parameters")


@dataclass
class Utilisation:
    """The device a run trained on and its model FLOPs utilisation (``training.throughput``)."""

    device: Any
    ranks: int
    flops_per_token: int | None
    peak: float
    source: str

    @classmethod
    def of(cls, spec: RunSpec, task: Task) -> Utilisation:
        device = resolve_device(spec.train.device)
        peak, source = peak_flops(device, spec.train.precision, torch.get_num_threads())
        ranks = torch.distributed.get_world_size() if joined() else 1
        flops = training_flops_per_token(spec.model, task.model_seq_len)["total"]
        return cls(device, ranks, flops, peak, source)

    def numbers(self, numbers: dict[str, Any]) -> dict[str, Any]:
        """``numbers`` with ``mfu`` (from the steady tokens/s)."""
        tokens = float(numbers.get("steady_tokens_per_s", math.nan))
        return {**numbers, "mfu": model_flops_utilisation(tokens, self.flops_per_token,
                                                          self.peak, self.ranks)}

    def caption(self) -> str:
        where = f"{self.ranks} processes on {self.device}" if self.ranks > 1 else \
            str(self.device)
        per_token = "unknown" if self.flops_per_token is None else f"{self.flops_per_token:,}"
        return (f"{where}; MFU: {per_token} FLOPs/token (6N + 12LTD) over {self.peak:.3g} "
                f"FLOP/s, {self.source}")


# --- the routine ----------------------------------------------------------------------------

def interrupted(stop: Interrupted, run: RunDirectory, seed: int, seeds: Sequence[int],
                steps: int, kept: bool) -> Interrupted:
    """``stop`` (SIGINT, SIGTERM) saying where the run stopped and how to go on with it."""
    if stop.step is None or not kept:  # a second signal, or train.checkpoint=false
        return stop
    where = f"at step {stop.step} of {steps}" + (f" of seed {seed} ({len(seeds)} seeds)"
                                                 if len(seeds) > 1 else "")
    name = signal.Signals(stop.signum).name
    return Interrupted(f"{name}: interrupted {where}, its state kept in {CHECKPOINT_FILE}; "
                       f"continue with: tlab train --resume {run.path}", stop.signum, stop.step)


def run_train(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    """Train every seed one after another (going on from a kept ``checkpoint.pt``), print the
    table; PASS when every held-out loss is finite."""
    clock = Stopwatch()
    task, seeds, steps = inputs.task, list(study(spec).seeds), spec.train.steps
    language = isinstance(task, LanguageModelTask)
    kept = RunCheckpoints(spec, run, task, seeds)
    states, latest = kept.resume_point(steps)  # seed -> state to go on from, seed -> last run
    if kept.periodic and not (states or latest):
        kept.save_progress([], None)  # resumable from the start
    which = f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
    training = [s for s in seeds if s in states or s not in latest]  # (resumed: counts steps)

    def train_one(_: str, seed: int) -> SeedRun:
        # kept with this seed's state: every other seed's latest (one to extend as it was)
        done = [s for other, s in latest.items() if other != seed]
        try:
            trained, model = train_seed(
                spec, task, seed, run.metrics,
                checkpoint=lambda state: kept.save_progress(done, state),
                resume=states.get(seed))
        except Interrupted as exc:
            raise interrupted(exc, run, seed, seeds, steps, kept.enabled) from None
        kept.keep_weights(model, seed)
        latest[seed] = trained
        if kept.periodic:
            kept.save_progress(list(latest.values()), None)
        return trained

    with stop_between_steps():
        run_study(replace(study(spec), seeds=tuple(training)), train_one, run.metrics,
                  lambda *_: (f"train: {which}, {steps} steps", steps * len(training)))
    trained = [latest[seed] for seed in seeds]
    kept.save_progress(trained, None)  # the final state: --resume RUN train.steps=N goes on
    utilisation = Utilisation.of(spec, task)
    per_seed = [{"seed": s.seed, **apart(spec, s.seed),
                 **utilisation.numbers(seed_numbers(s, language))} for s in trained]
    summary = utilisation.numbers(run_summary(trained, language))
    summary.update(world_size=utilisation.ranks, device=str(utilisation.device),
                   peak_flop_per_s=utilisation.peak, peak_source=utilisation.source)
    run.info.update(device=str(utilisation.device), world_size=utilisation.ranks)
    rows = per_seed + ([{"seed": "mean", **summary}] if len(per_seed) > 1 else [])
    print_table(train_table(rows, f"tlab train - {run.path}",
                            f"{describe_run(spec, trained[0].params)}\n{utilisation.caption()}"))
    finite = all(math.isfinite(s.result.final_loss) for s in trained)
    summary["wall_s"] = clock.lap()
    return RoutineOutcome(passed=finite, summary=summary, seeds=per_seed,
                          message="" if finite else "a held-out loss is not finite")


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("final_loss", "minimize", final_loss)
