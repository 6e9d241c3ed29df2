"""``tlab extrapolate``: train at one length, evaluate at longer ones, with RoPE scalings and
fine-tuning (the article's pitfall 6.2; docs/routines.md)."""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from transformer_lab.config.schema import COUNT, POSITIVE_INT, Rule, int_rule, number_rule
from transformer_lab.errors import ConfigError, Diverged
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.console import console, print_warning
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome, Workload
from transformer_lab.routines.extrapolate.lengths import (
    config_for,
    evaluate,
    positions_reachable,
    scaled_model,
    tasks_by_length,
)
from transformer_lab.routines.extrapolate.plan import (
    Plan,
    Scaling,
    make_plan,
    parse_eval_length,
    supports_scaling,
)
from transformer_lab.routines.extrapolate.tables import (
    EXTRAPOLATION_COLUMNS,
    plot_extrapolation,
    results_table,
    verdict_lines,
    with_verdicts,
)
from transformer_lab.routines.variants import seed_sources, train_settings
from transformer_lab.tasks import Task
from transformer_lab.training.pretrained import load_pretrained, pretrained_option
from transformer_lab.training.trainer import Trainer, TrainSettings, count_parameters

# The routine's own keys (``routines.check_settings``; what ties them together: ``make_plan``).
SETTINGS = {"pes": Rule("list", nullable=True), "train_len": int_rule(1, nullable=True),
            "eval_lens": Rule("list", min_items=1), "scalings": Rule("list", min_items=1),
            "seeds": POSITIVE_INT, "finetune_steps": COUNT,
            "finetune_lr": number_rule(0, open_low=True, nullable=True),
            "max_len": int_rule(1, nullable=True)}


def workload(cfg: DictConfig, task: Task, default: Workload) -> Workload:
    """Evaluated up to the longest of ``routine.eval_lens`` (a decoder sees source SEP target:
    its model length is a multiple of the task's)."""
    base = int(cfg.routine.get("train_len") or cfg.task.seq_len)
    longest = max((parse_eval_length(e, base) for e in cfg.routine.get("eval_lens") or []),
                  default=base)
    factor = max(1, default.train_len // max(base, 1))
    return dataclasses.replace(default, eval_len=max(default.train_len, longest * factor))


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight: the plan parses, every evaluation length can be made, every PE builds."""
    plan = make_plan(cfg)
    train_task = tasks_by_length(cfg, plan)[plan.train_len]
    option = pretrained_option(cfg)
    if option and plan.pes != [cfg.pe.get("name")]:
        raise ConfigError(f"--pe {','.join(plan.pes)}: {option} evaluates the checkpoint's own "
                          f"PE ({cfg.pe.get('name')}); drop --pe")
    for pe in plan.pes:
        cfg_pe = config_for(cfg, plan.pe_nodes[pe], plan.train_len,
                            model_max_len(cfg, plan, train_task.model_seq_len))
        cfg_pe.model.vocab_size = train_task.vocab_size
        build_model(cfg_pe)  # errors name the pe group


def model_max_len(cfg: DictConfig, plan: Plan, train_model_len: int) -> int | None:
    """``model.max_len`` of the models built: ``routine.max_len`` or the training model
    length; None (the checkpoint's) with ``--from-hf`` or ``--from-run``."""
    return None if pretrained_option(cfg) else plan.max_len or train_model_len


def run_extrapolate(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    started = time.perf_counter()
    plan = make_plan(cfg)
    device = torch.device(cfg.train.device)
    rows: list[dict[str, Any]] = []
    params: dict[str, int] = {}
    table = run.log("extrapolation", EXTRAPOLATION_COLUMNS)
    tasks = tasks_by_length(cfg, plan)
    scaled = [s.label for s in plan.scalings if s.name != "none"]
    unscalable = [pe for pe in plan.pes if not supports_scaling(plan.pe_nodes[pe])]
    if scaled and unscalable:
        print_warning(f"{', '.join(unscalable)}: no RoPE scaling, evaluated as trained only "
                      f"(not with {', '.join(scaled)})")
    for pe in plan.pes:
        for seed in plan.seeds:
            new_rows, params[pe] = _study_one_model(cfg, plan, tasks, pe, seed, device, run,
                                                    table)
            rows.extend(new_rows)
    rows = with_verdicts(rows)
    rewrite(table, rows)
    plot_path = plot_extrapolation(rows, run.path / "extrapolation.png", plan.train_len)
    console.print(results_table(rows, f"tlab extrapolate - {run.path}"))
    for line in verdict_lines(rows) if len(plan.seeds) > 1 else []:
        console.print(line, highlight=False, markup=False)
    console.print(f"wrote {table.path}" + (f" and {plot_path}" if plot_path else ""))
    ok_rows = [row for row in rows if row["status"] == "ok"]
    train_rows = [row for row in ok_rows if row["eval_len"] == plan.train_len
                  and row["scaling"] == "none" and not row["finetune_steps"]]
    return RoutineOutcome(
        passed=bool(ok_rows),
        summary={
            "pe": ",".join(plan.pes), "seq_len": plan.train_len,
            "params": max(params.values(), default=None),
            "steps": 0 if pretrained_option(cfg) else int(cfg.train.steps),
            "final_loss": _mean([row["loss"] for row in train_rows]),
            "best_exact_match": max((row["exact_match"] for row in ok_rows
                                     if not math.isnan(row["exact_match"])), default=None),
            "wall_s": time.perf_counter() - started,
        },
        message="" if ok_rows else "no evaluation could run; see extrapolation.csv",
    )


def rewrite(table: CsvLog, rows: list[dict[str, Any]]) -> None:
    """Write ``table``'s file again with ``rows`` (now with the verdict columns)."""
    table.close()
    CsvLog(table.path, table.columns).write_all(rows)


def _study_one_model(cfg: DictConfig, plan: Plan, tasks: Mapping[int, Task], pe: str, seed: int,
                     device: torch.device, run: RunDirectory, table: CsvLog
                     ) -> tuple[list[dict[str, Any]], int]:
    """Train one model at ``plan.train_len``; evaluate it at every length and scaling, each
    row written to ``table`` as soon as it exists."""
    node = plan.pe_nodes[pe]
    train_task = tasks[plan.train_len]
    original_max_len = train_task.model_seq_len
    cfg_pe = config_for(cfg, node, plan.train_len, model_max_len(cfg, plan, original_max_len))
    cfg_pe.model.vocab_size = train_task.vocab_size
    init_seed, data_seed = seed_sources(cfg, seed)
    model = build_model(cfg_pe, seed=init_seed)
    steps = int(cfg.train.steps)
    if pretrained_option(cfg):  # the checkpoint's weights, evaluated without training
        load_pretrained(model, cfg_pe)
        steps = 0
    model = model.to(device)
    base_row = {"pe": pe, "train_len": plan.train_len, "seed": seed, "train_steps": steps}
    log = TaggedLog(run.metrics, pe=pe, scaling="none", seed=seed, phase="train",
                    seq_len=plan.train_len)
    diverged = _fit(model, train_task, train_settings(cfg), data_seed, log, steps,
                    f"extrapolate: training pe={pe} seed={seed} at length {plan.train_len}")
    if diverged is not None:
        rows = [_error_row(base_row, scaling.label, length, f"training diverged: {diverged}")
                for scaling in plan.scalings_for(pe) for length in plan.eval_lens]
        table.write_all(rows)
        return rows, 0
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        table.write(row)
        rows.append(row)

    for length in plan.eval_lens:
        eval_task = tasks[length]
        ratio = length / plan.train_len
        for scaling in plan.scalings_for(pe):
            settings = scaling.pe_settings(ratio, original_max_len)
            row = {**base_row, "scaling": scaling.label, "eval_len": length,
                   "length_ratio": ratio, "model_seq_len": eval_task.model_seq_len,
                   "factor": settings.get("factor"),
                   "base": settings.get("base", node.get("base")) if supports_scaling(node)
                   else None}
            scaled = scaled_model(model, cfg_pe, settings)
            emit(_evaluated_row(row, scaled, eval_task, device, finetune_steps=0))
            if plan.finetune_steps and length > plan.train_len:
                tuned = copy.deepcopy(scaled)
                reason = positions_reachable(tuned, eval_task.model_seq_len)
                if reason is None:
                    reason = _finetune(cfg, plan, tuned, eval_task, seed, run, pe, scaling, length)
                emit(_evaluated_row(row, tuned, eval_task, device,
                                    finetune_steps=plan.finetune_steps, reason=reason))
    return rows, count_parameters(model)


def _finetune(cfg: DictConfig, plan: Plan, model: TransformerModel, task: Task, seed: int,
              run: RunDirectory, pe: str, scaling: Scaling, length: int) -> str | None:
    """Fine-tune ``model`` in place at ``length``; returns an error reason or None."""
    settings = dataclasses.replace(train_settings(cfg), lr=float(plan.finetune_lr), warmup=0)
    log = TaggedLog(run.metrics, pe=pe, scaling=scaling.label, seed=seed, phase="finetune",
                    seq_len=length)
    diverged = _fit(model, task, settings, seed_sources(cfg, seed)[1], log,
                    int(plan.finetune_steps),
                    f"extrapolate: fine-tuning pe={pe} {scaling.label} at length {length}")
    return None if diverged is None else f"fine-tuning diverged: {diverged}"


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


def _evaluated_row(row: dict[str, Any], model: TransformerModel, task: Task,
                   device: torch.device, finetune_steps: int,
                   reason: str | None = None) -> dict[str, Any]:
    row = {**row, "finetune_steps": finetune_steps}
    reason = reason or positions_reachable(model, task.model_seq_len)
    if reason is not None:
        return {**row, "status": "error", "error": reason}
    return {**row, **evaluate(model, task, device), "status": "ok"}


def _error_row(base_row: dict[str, Any], scaling: str, length: int, reason: str
               ) -> dict[str, Any]:
    return {**base_row, "scaling": scaling, "eval_len": length, "finetune_steps": 0,
            "length_ratio": length / base_row["train_len"], "status": "error", "error": reason}


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return sum(finite) / len(finite) if finite else None
