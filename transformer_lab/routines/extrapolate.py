"""``tlab extrapolate``: train at one length, evaluate at longer ones, with RoPE scalings and
fine-tuning (the article's pitfall 6.2; docs/routines.md). Top to bottom: the plan, the configs
and models at each length, the routine, its curves, plot, table and verdicts."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from rich.table import Table

from transformer_lab.components.positional.rope_scaling import ROPE_SCALINGS
from transformer_lab.config.instantiate import build_task, instantiate_component
from transformer_lab.config.schema import COUNT, POSITIVE_INT, Rule, int_rule, number_rule
from transformer_lab.config.spec import Component, RunSpec
from transformer_lab.config.variants import as_list, merged, pe_spec, with_value
from transformer_lab.errors import ConfigError, Diverged
from transformer_lab.measures.statistics import (
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.console import console, print_warning
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome, Workload
from transformer_lab.routines.study import study
from transformer_lab.tasks import Task
from transformer_lab.training.pretrained import load_pretrained, pretrained_option
from transformer_lab.training.trainer import (
    Trainer,
    TrainSettings,
    count_parameters,
    evaluate_model,
)

# The routine's own keys (``routines.check_settings``; what ties them together: ``make_plan``).
SETTINGS = {"pes": Rule("list", nullable=True), "train_len": int_rule(1, nullable=True),
            "eval_lens": Rule("list", min_items=1), "scalings": Rule("list", min_items=1),
            "seeds": POSITIVE_INT, "finetune_steps": COUNT,
            "finetune_lr": number_rule(0, open_low=True, nullable=True),
            "max_len": int_rule(1, nullable=True)}
EXTRAPOLATION_COLUMNS = [
    "pe", "scaling", "train_len", "eval_len", "loss", "accuracy", "exact_match", "seed",
    "factor", "base", "length_ratio", "model_seq_len", "finetune_steps", "train_steps",
    "status", "error", "baseline", "loss_ci_low", "loss_ci_high", *VERDICT_COLUMNS,
]
# Scalings whose factor defaults to the length ratio L'/L; ``dynamic`` computes it per length.
RATIO_SCALINGS = ("linear", "ntk", "yarn")
_MULTIPLE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*$")


# the plan: what to train and evaluate, read and checked from ``spec.routine``


@dataclasses.dataclass(frozen=True)
class Scaling:
    """One entry of ``routine.scalings``: ``name`` or ``name:value``."""

    name: str  # none | linear | ntk | dynamic | yarn | base
    value: float | None = None  # fixed factor, or the base for ``base``

    @property
    def label(self) -> str:
        return self.name if self.value is None else f"{self.name}:{self.value:g}"

    def pe_settings(self, ratio: float, original_max_len: int) -> dict[str, Any]:
        """Overrides of the RoPE config node at length ratio ``ratio = L'/L`` (``{}``: none)."""
        if self.name == "none":
            return {}
        if self.name == "base":
            return {"base": self.value}
        if self.value is not None:
            factor = self.value
        else:
            factor = max(1.0, ratio) if self.name in RATIO_SCALINGS else 1.0
        return {"scaling": self.name, "factor": factor, "original_max_len": original_max_len}


def parse_scaling(entry: Any) -> Scaling:
    """``"yarn"`` -> Scaling("yarn"); ``"linear:2"`` -> factor 2; ``"base:500000"`` -> base."""
    text = str(entry).strip()
    name, _, value_text = text.partition(":")
    if name not in (*ROPE_SCALINGS, "base"):
        raise ConfigError(f"routine.scalings: '{text}' is not a RoPE scaling; valid: "
                          f"{', '.join([*ROPE_SCALINGS, 'base:N'])} "
                          "(a factor may follow a colon, e.g. yarn:4)")
    if not value_text:
        if name == "base":
            raise ConfigError("routine.scalings: 'base' needs a value, e.g. base:500000")
        return Scaling(name)
    if name == "none":
        raise ConfigError(f"routine.scalings: '{text}' - 'none' takes no factor")
    try:
        value = float(value_text)
    except ValueError:
        raise ConfigError(f"routine.scalings: '{text}' - '{value_text}' is not a number") from None
    if name == "base" and not value > 1:
        raise ConfigError(f"routine.scalings: '{text}' - the RoPE base must be > 1")
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"routine.scalings: '{text}' - factor={value_text} is not valid; "
                          "the scaling factor must be > 0")
    return Scaling(name, value)


def parse_eval_length(entry: Any, train_len: int) -> int:
    """``"2x"`` -> ``round(2 * train_len)``; ``24`` or ``"24"`` -> 24. Raises ``ConfigError``."""
    text = str(entry).strip()
    match = _MULTIPLE.match(text)
    try:
        length = round(float(match.group(1)) * train_len) if match else int(text)
    except ValueError:
        raise ConfigError(f"routine.eval_lens: '{text}' is not a length; use a number of tokens "
                          f"(24) or a multiple of the training length {train_len} (2x)") from None
    if length < 1:
        raise ConfigError(f"routine.eval_lens: '{text}' gives an evaluation length of {length}; "
                          "it must be at least 1")
    return length


def supports_scaling(pe_node: Mapping[str, Any]) -> bool:
    """A PE takes ``routine.scalings`` when its config has a ``scaling`` setting (RoPE)."""
    return "scaling" in pe_node


@dataclasses.dataclass(frozen=True)
class Plan:
    pes: list[str]
    pe_specs: dict[str, RunSpec]  # pe name -> the run's spec with that PE
    train_len: int
    eval_lens: list[int]  # sorted, unique
    scalings: list[Scaling]
    seeds: list[int]
    finetune_steps: int
    finetune_lr: float
    max_len: int | None  # learned table size; None = training model length
    pretrained: str | None  # --from-hf, --from-run: the checkpoint evaluated, not trained

    def scalings_for(self, pe: str) -> list[Scaling]:
        """The scalings a PE is evaluated with: all of them for RoPE, ``none`` otherwise."""
        return self.scalings if supports_scaling(self.pe_specs[pe].model.pe) else [Scaling("none")]


def make_plan(spec: RunSpec) -> Plan:
    """Read ``spec.routine`` and check what ties its keys to each other and to the task."""
    r = spec.routine
    if "seq_len" not in spec.task:
        raise ConfigError(f"task={spec.task.name} has no seq_len; extrapolate needs a task "
                          "whose length can be set (reverse, copy, lm, text)")
    pes = as_list(r.get("pes")) or [str(spec.model.pe.name)]
    if len(set(pes)) != len(pes):
        raise ConfigError(f"routine.pes={pes} names a pe twice; list each once")
    specs = {}
    for pe in pes:  # ``spec`` when it has that PE, else with its choice file
        try:
            specs[pe] = pe_spec(spec, pe)
        except ConfigError as exc:
            raise ConfigError(f"routine.pes: {exc}") from None
    train_len = r.get("train_len") or spec.task["seq_len"]
    entries = as_list(r.get("eval_lens")) or ["1x"]
    eval_lens = sorted({parse_eval_length(e, train_len) for e in entries})
    scalings = [parse_scaling(s) for s in as_list(r.get("scalings"))] or [Scaling("none")]
    if len({s.label for s in scalings}) != len(scalings):
        raise ConfigError(f"routine.scalings={[s.label for s in scalings]} lists one twice")
    scaled = [s.label for s in scalings if s.name != "none"]
    if scaled and not any(supports_scaling(s.model.pe) for s in specs.values()):
        raise ConfigError(f"routine.scalings={scaled} applies to RoPE only, and none of "
                          f"routine.pes={pes} is RoPE; add --pe rope or use --scaling none")
    return Plan(pes, specs, train_len, eval_lens, scalings, list(study(spec).seeds),
                r.get("finetune_steps", 0) or 0, float(r.get("finetune_lr") or spec.train.lr),
                r.get("max_len"), pretrained_option(spec))


# specs, tasks and (scaled) models at each length


def task_at(spec: RunSpec, seq_len: int, what: str) -> Task:
    """The task at ``seq_len`` (same ``data_seed``); ``ConfigError`` naming ``what`` if it
    cannot be made."""
    try:
        return build_task(with_value(spec, "task.seq_len", seq_len))
    except ConfigError as exc:
        raise ConfigError(f"{what} ({seq_len} tokens) cannot be generated: {exc}") from None


def tasks_by_length(spec: RunSpec, plan: Plan) -> dict[int, Task]:
    """The training task and one task per evaluation length, all with the same ``data_seed``."""
    tasks = {plan.train_len: task_at(spec, plan.train_len, "the training length")}
    for length in plan.eval_lens:
        if length not in tasks:
            tasks[length] = task_at(spec, length, f"evaluation length {length}")
    return tasks


def training_spec(plan: Plan, pe: str, train_task: Task) -> RunSpec:
    """The spec of ``pe``'s model at the training length; ``model.max_len`` is
    ``routine.max_len`` or the training model length (the checkpoint's with ``--from-hf`` or
    ``--from-run``)."""
    max_len = None if plan.pretrained else plan.max_len or train_task.model_seq_len
    patch = {"task": {"seq_len": plan.train_len}}
    if max_len is not None:
        patch["model"] = {"max_len": max_len}
    return merged(plan.pe_specs[pe], patch).with_vocab(train_task.vocab_size)


def positions_reachable(model: TransformerModel, length: int) -> str | None:
    """None if the model's PE can encode ``length`` positions, else the PE's reason."""
    if model.pe_kind != "additive":
        return None
    try:
        model.positional(torch.arange(length))
    except ValueError as exc:
        return str(exc)
    return None


def scaled_model(model: TransformerModel, pe: Component, settings: Mapping[str, Any]
                 ) -> TransformerModel:
    """``model`` with its RoPE rebuilt from its node ``pe`` plus ``settings``, sharing the
    trained weights (``model`` itself when ``settings`` is empty)."""
    if not settings:
        return model
    scaled = copy.copy(model)  # shallow: shares the trained weights
    scaled._modules = dict(model._modules)
    scaled._modules["positional"] = instantiate_component({**pe, **settings}, "pe")
    return scaled


# the routine


def workload(spec: RunSpec, task: Task, default: Workload) -> Workload:
    """Evaluated up to the longest of ``routine.eval_lens`` (a decoder sees source SEP target:
    its model length is a multiple of the task's)."""
    base = int(spec.routine.get("train_len") or spec.task["seq_len"])
    longest = max((parse_eval_length(e, base) for e in spec.routine.get("eval_lens") or []),
                  default=base)
    factor = max(1, default.train_len // max(base, 1))
    return dataclasses.replace(default, eval_len=max(default.train_len, longest * factor))


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight: the plan parses, every evaluation length can be made, every PE builds."""
    plan = make_plan(spec)
    train_task = tasks_by_length(spec, plan)[plan.train_len]
    if plan.pretrained and plan.pes != [spec.model.pe.name]:
        raise ConfigError(f"--pe {','.join(plan.pes)}: {plan.pretrained} evaluates the "
                          f"checkpoint's own PE ({spec.model.pe.name}); drop --pe")
    for pe in plan.pes:
        build_model(training_spec(plan, pe, train_task).model)  # errors name the pe group


def run_extrapolate(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    started = time.perf_counter()
    plan = make_plan(spec)
    device = torch.device(spec.train.device)
    rows: list[dict[str, Any]] = []
    params: dict[str, int] = {}
    table = run.log("extrapolation", EXTRAPOLATION_COLUMNS)
    tasks = tasks_by_length(spec, plan)
    scaled = [s.label for s in plan.scalings if s.name != "none"]
    unscalable = [pe for pe in plan.pes if not supports_scaling(plan.pe_specs[pe].model.pe)]
    if scaled and unscalable:
        print_warning(f"{', '.join(unscalable)}: no RoPE scaling, evaluated as trained only "
                      f"(not with {', '.join(scaled)})")
    for pe in plan.pes:
        for seed in plan.seeds:
            new_rows, params[pe] = _study_one_model(spec, plan, tasks, pe, seed, device, run,
                                                    table)
            rows.extend(new_rows)
    rows = with_verdicts(rows)
    table.close()  # written again, now with the verdict columns
    CsvLog(table.path, table.columns).write_all(rows)
    plot_path = plot_extrapolation(rows, run.path / "extrapolation.png", plan.train_len)
    console.print(results_table(rows, f"tlab extrapolate - {run.path}"))
    for line in verdict_lines(rows) if len(plan.seeds) > 1 else []:
        console.print(line, highlight=False, markup=False)
    console.print(f"wrote {table.path}" + (f" and {plot_path}" if plot_path else ""))
    ok_rows = [row for row in rows if row["status"] == "ok"]
    train_losses = [row["loss"] for row in ok_rows if row["eval_len"] == plan.train_len
                    and row["scaling"] == "none" and not row["finetune_steps"]
                    and not math.isnan(row["loss"])]
    return RoutineOutcome(
        passed=bool(ok_rows),
        summary={
            "pe": ",".join(plan.pes), "seq_len": plan.train_len,
            "params": max(params.values(), default=None),
            "steps": 0 if plan.pretrained else spec.train.steps,
            "final_loss": sum(train_losses) / len(train_losses) if train_losses else None,
            "best_exact_match": max((row["exact_match"] for row in ok_rows
                                     if not math.isnan(row["exact_match"])), default=None),
            "wall_s": time.perf_counter() - started,
        },
        message="" if ok_rows else "no evaluation could run; see extrapolation.csv",
    )


def _study_one_model(spec: RunSpec, plan: Plan, tasks: Mapping[int, Task], pe: str, seed: int,
                     device: torch.device, run: RunDirectory, table: CsvLog
                     ) -> tuple[list[dict[str, Any]], int]:
    """Train one model at ``plan.train_len``; evaluate it at every length and scaling, each
    row written to ``table`` as soon as it exists."""
    train_task = tasks[plan.train_len]
    spec_pe = training_spec(plan, pe, train_task)
    node = spec_pe.model.pe
    init_seed, data_seed = spec.seed_sources(seed)
    model = build_model(spec_pe.model, seed=init_seed)
    steps = spec.train.steps
    if plan.pretrained:  # the checkpoint's weights, evaluated without training
        load_pretrained(model, spec_pe)
        steps = 0
    model = model.to(device)
    base_row = {"pe": pe, "train_len": plan.train_len, "seed": seed, "train_steps": steps}
    log = TaggedLog(run.metrics, pe=pe, scaling="none", seed=seed, phase="train",
                    seq_len=plan.train_len)
    diverged = _fit(model, train_task, spec.train, data_seed, log, steps,
                    f"extrapolate: training pe={pe} seed={seed} at length {plan.train_len}")
    if diverged is not None:
        rows = [{**base_row, "scaling": scaling.label, "eval_len": length, "finetune_steps": 0,
                 "length_ratio": length / plan.train_len, "status": "error",
                 "error": f"training diverged: {diverged}"}
                for scaling in plan.scalings_for(pe) for length in plan.eval_lens]
        table.write_all(rows)
        return rows, 0
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any], model: TransformerModel, finetune_steps: int,
             reason: str | None = None) -> None:
        """Evaluate ``model`` on ``eval_task`` into ``row`` (an error row when it cannot)."""
        row = {**row, "finetune_steps": finetune_steps}
        reason = reason or positions_reachable(model, eval_task.model_seq_len)
        if reason is not None:
            row.update(status="error", error=reason)
        else:
            row.update(evaluate_model(model, eval_task, eval_task.eval_batch().to(device)),
                       status="ok")
        table.write(row)
        rows.append(row)

    for length in plan.eval_lens:
        eval_task = tasks[length]
        ratio = length / plan.train_len
        for scaling in plan.scalings_for(pe):
            settings = scaling.pe_settings(ratio, train_task.model_seq_len)
            row = {**base_row, "scaling": scaling.label, "eval_len": length,
                   "length_ratio": ratio, "model_seq_len": eval_task.model_seq_len,
                   "factor": settings.get("factor"),
                   "base": settings.get("base", node.get("base")) if supports_scaling(node)
                   else None}
            scaled = scaled_model(model, node, settings)
            emit(row, scaled, finetune_steps=0)
            if plan.finetune_steps and length > plan.train_len:
                tuned = copy.deepcopy(scaled)
                reason = positions_reachable(tuned, eval_task.model_seq_len)
                if reason is None:
                    settings = dataclasses.replace(spec.train, lr=plan.finetune_lr, warmup=0)
                    log = TaggedLog(run.metrics, pe=pe, scaling=scaling.label, seed=seed,
                                    phase="finetune", seq_len=length)
                    diverged = _fit(tuned, eval_task, settings, data_seed, log,
                                    int(plan.finetune_steps), f"extrapolate: fine-tuning pe={pe} "
                                    f"{scaling.label} at length {length}")
                    reason = None if diverged is None else f"fine-tuning diverged: {diverged}"
                emit(row, tuned, finetune_steps=plan.finetune_steps, reason=reason)
    return rows, count_parameters(model)


def _fit(model: TransformerModel, task: Task, settings: TrainSettings, seed: int, log: TaggedLog,
         steps: int, title: str) -> str | None:
    """Train ``model`` in place for ``steps`` steps (0: its trainer only built); why it
    diverged, or None."""
    trainer = Trainer(model, task, settings, seed, log)
    if not steps:
        return None
    try:
        with progress_bar(log, title, total=steps):
            trainer.fit(steps)
    except Diverged as exc:
        return str(exc)
    return None


# curves (mean over seeds), plot, terminal table and verdict columns


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
    metrics = ("exact_match", "accuracy") if has_match else ("accuracy", "loss")
    lengths = sorted({r["eval_len"] for r in rows})
    table = Table(title=f"{title}\n{metrics[0]} / {metrics[1]} by evaluation length "
                        "(mean over seeds)")
    table.add_column("pe (+scaling, fine-tune)")
    for length in lengths:
        table.add_column(str(length), justify="right")
    curves = [{label: dict(points) for label, points in mean_curves(rows, m).items()}
              for m in metrics]
    errors = {(curve_label(r), r["eval_len"]) for r in rows if r["status"] == "error"}
    for label in dict.fromkeys(curve_label(r) for r in rows):
        cells = []
        for length in lengths:
            means = [curve.get(label, {}).get(length) for curve in curves]
            if means == [None, None]:
                cells.append("[red]error[/]" if (label, length) in errors else "")
            else:
                cells.append(" / ".join("-" if v is None else f"{v:.3f}" for v in means))
        table.add_row(label, *cells)
    return table


def baselines(rows: list[Mapping[str, Any]]) -> dict[str, str]:
    """Curve label -> the label of the curve it is tested against."""
    curves: dict[str, dict[str, None]] = {}  # pe -> its curve labels, in order of appearance
    for row in rows:
        curves.setdefault(row["pe"], {})[curve_label(row)] = None

    def reference(pe: str) -> str:
        plain = curve_label({"pe": pe, "scaling": "none", "finetune_steps": 0})
        return plain if plain in curves[pe] else next(iter(curves[pe]))

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
