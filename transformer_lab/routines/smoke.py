"""``tlab smoke``: steps 1 and 2 of the validation routine (docs/routines.md)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import replace

import torch

from transformer_lab.config.instantiate import build_task
from transformer_lab.config.schema import POSITIVE_INT, int_rule, number_rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.measures.gradient_flow import idle_parameters, task_gradient
from transformer_lab.measures.model_properties import model_properties
from transformer_lab.measures.parameters import parameter_breakdown
from transformer_lab.measures.property_result import PropertyResult
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.check_rows import (
    CHECK_COLUMNS,
    CheckRow,
    Stopwatch,
    check_counts,
    check_table,
    share_wall,
    status,
)
from transformer_lab.results.console import print_table
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome, Workload
from transformer_lab.routines.attribution import culprits
from transformer_lab.routines.objective import Objective, final_loss
from transformer_lab.routines.study import run_study, study
from transformer_lab.tasks import Batch, Task
from transformer_lab.training.trainer import Trainer, count_parameters, sequence_loss

PE_SWAMP_RATIO = 5.0  # PE norm this many times the embedding norm swamps the tokens


def pe_to_embedding_ratio(model: TransformerModel, batch: Batch) -> float | None:
    """Mean per-position norm of (pe_scale * PE) over that of (embed_scale * token embedding)."""
    if model.pe_kind != "additive":
        return None
    positions = torch.arange(batch.inputs.shape[1])
    with torch.no_grad():
        pe = model.pe_scale * model.positional(positions)  # (T, D)
        tokens = model.embed_scale * model.token_embedding(batch.inputs)  # (B, T, D)
    return (pe.norm(dim=-1).mean() / tokens.norm(dim=-1).mean().clamp_min(1e-12)).item()


def _property_row(result: PropertyResult, pe_kind: str) -> CheckRow:
    if result.name == "position_injectivity" and pe_kind == "none":
        return CheckRow(1, result.name, "SKIP", "relative_gap", result.value, result.tolerance,
                        detail="pe=none: positions indistinguishable, as expected (the control)")
    state = "SKIP" if result.passed is None else status(result.passed)
    return CheckRow(1, result.name, state, "", result.value, result.tolerance,
                    detail=result.detail)


def property_rows(spec: RunSpec, model: TransformerModel) -> list[CheckRow]:
    """Step 1's forward-pass properties (``measures.model_properties``), one row each; a
    failing row's detail ends with its culprit (``routines.attribution``)."""
    clock = Stopwatch()
    # how far positions are checked: routine.max_len, else pe.max_len, else None (the PE's own
    # max_len attribute, else 256)
    given = spec.routine.get("max_len") or spec.model.pe.get("max_len")
    max_len = int(given) if isinstance(given, int) and not isinstance(given, bool) else None

    def measure(built: TransformerModel) -> list[PropertyResult]:
        return model_properties(built, spec.model.vocab_size, max_len, spec.train.precision)

    rows = [_property_row(r, model.pe_kind) for r in measure(model)]
    failing = {row.check for row in rows if row.status == "FAIL"}
    if failing:
        named = culprits(spec, model, failing, measure)
        for row in rows:
            if named.get(row.check):
                row.detail = f"{row.detail}; {named[row.check]}"
    return share_wall(rows, clock.lap())


def forward_backward_check(spec: RunSpec, model: TransformerModel,
                           batch: Batch) -> list[CheckRow]:
    """Step 1 checks on one batch, after the forward-pass properties (a failing dtype check
    stops here: the forward below would raise)."""
    rows: list[CheckRow] = property_rows(spec, model)
    if any(r.status == "FAIL" for r in rows if r.check == "output_dtype"):
        return rows
    clock = Stopwatch()
    start = len(rows)
    logits = model(batch.inputs)
    expected = (*batch.inputs.shape, spec.model.vocab_size)
    rows.append(CheckRow(1, "output_shape", status(tuple(logits.shape) == expected),
                         detail=f"{tuple(logits.shape)} (expected {expected})"))
    loss = sequence_loss(logits, batch.targets)
    rows.append(CheckRow(1, "loss_finite", status(bool(torch.isfinite(loss))), "loss",
                         loss.item(), "finite"))
    model.zero_grad(set_to_none=True)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    bad = [n for n, p in model.named_parameters()
           if p.grad is not None and not torch.isfinite(p.grad).all()]
    rows.append(CheckRow(1, "gradients_finite", status(not missing and not bad),
                         "params_without_grad", float(len(missing) + len(bad)), 0,
                         detail=", ".join(missing + bad)[:200] or "every parameter"))
    rows.append(_property_row(task_gradient(model, [(batch.inputs, batch.targets)],
                                            sequence_loss), model.pe_kind))
    params = count_parameters(model)
    formula = parameter_breakdown(spec.model)["total"]
    rows.append(CheckRow(1, "param_count", "SKIP" if formula is None else status(formula == params),
                         "params", float(params), formula,
                         detail=f"no formula (a custom component declares no count): the model "
                         f"has {params:,}" if formula is None
                         else f"model {params:,} vs formula {formula:,}"))
    return rows[:start] + share_wall(rows[start:], clock.lap())


def swamp_hint(spec: RunSpec, ratio: float) -> str:
    """What to change when the PE swamps the token embeddings (ratio at initialisation)."""
    remedy = ("lower model.pe_scale or raise model.init_std"
              if str(spec.model.embed_scale) == "sqrt"
              else "set model.embed_scale=sqrt or lower model.pe_scale")
    return f"PE norm is {ratio:.1f}x the token-embedding norm at init (PE swamps the tokens): " \
        + remedy


def diagnose(spec: RunSpec, model: TransformerModel, batch: Batch, drop: float,
             init_ratio: float | None = None) -> str:
    """The source article's suspects when the smoke loss does not fall (``init_ratio``: the
    PE-to-embedding norm ratio before training, the one the article's pitfall is about)."""
    hints = []
    lr = float(spec.train.lr)
    if drop < 0:
        hints.append(f"loss rose: train.lr={lr:g} may be too high")
    elif lr < 1e-3:
        hints.append(f"train.lr={lr:g} may be too low for {spec.routine.steps} steps")
    ratio = init_ratio if init_ratio is not None else pe_to_embedding_ratio(model, batch)
    if ratio is not None and ratio > PE_SWAMP_RATIO:
        hints.append(swamp_hint(spec, ratio))
    model.zero_grad(set_to_none=True)
    sequence_loss(model(batch.inputs), batch.targets).backward()
    dead = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.any()]
    if dead:
        hints.append(f"zero gradients in {len(dead)} tensors: {', '.join(dead[:4])}")
    return "; ".join(hints) or "no obvious cause: check the component's forward pass"


def smoke_training(spec: RunSpec, model: TransformerModel, task, metrics: CsvLog | TaggedLog,
                   batches: list[Batch]) -> tuple[list[CheckRow], dict[int, float]]:
    """Step 2: train each seed on its fixed batches (``model`` and ``batches``: the first
    seed's, whose ``parameters_move`` row is measured too) and check that the loss falls; the
    rows and seed -> loss after training."""
    plan = study(spec)
    seeds, steps = plan.seeds, int(spec.routine.steps)
    several, min_drop = len(seeds) > 1, spec.routine.min_drop
    label = f"{len(seeds)} seeds x {steps} steps" if several else f"{steps} steps"
    afters, moved = {}, []

    def train_one(_: str, seed: int) -> CheckRow:
        seed_model, fixed, watch = model, batches, seed == seeds[0]
        init_seed, data_seed = spec.seed_sources(seed)
        if not watch:  # one model in memory at a time (the pre-flight's estimate)
            seed_model = build_model(spec.model, seed=init_seed)
            fixed = fixed_batches(spec, task, data_seed)
        clock = Stopwatch()
        log = TaggedLog(metrics, seed=seed) if several else metrics
        trainer = Trainer(seed_model, task, spec.train, data_seed, log)
        before = _fixed_loss(trainer, fixed)
        # at init: a few optimiser steps grow the embeddings (11x in 10 steps at lr 5e-2), so
        # the ratio after training hides a PE that swamped the tokens when training began
        ratio = pe_to_embedding_ratio(seed_model, fixed[0])
        initial = {n: p.detach().clone() for n, p in seed_model.named_parameters()} if watch \
            else {}
        # an expert no token chose may stay as it was
        with idle_parameters(seed_model) if watch else nullcontext(set()) as idle:
            trainer.fit(steps, batches=fixed)
        wall = clock.lap()
        if watch:
            moved.append(parameters_move(seed_model, initial, idle))
        after = afters[seed] = _fixed_loss(trainer, fixed)
        drop = (before - after) / before if before > 0 else 0.0
        ok = math.isfinite(after) and drop >= min_drop
        detail = (f"seed {seed}: loss {before:.4f} -> {after:.4f}" if several
                  else f"loss {before:.4f} -> {after:.4f} in {steps} steps")
        if not ok:
            detail += f"; {diagnose(spec, seed_model, fixed[0], drop, ratio)}"
        elif ratio is not None and ratio > PE_SWAMP_RATIO:
            detail += f"; but {swamp_hint(spec, ratio)}"
        elif ratio is not None:
            detail += f"; PE/embedding norm ratio at init {ratio:.2g}"
        return CheckRow(2, f"smoke_loss_falls[seed={seed}]" if several else "smoke_loss_falls",
                        status(ok), "relative_drop", drop, min_drop, wall, detail)

    rows, _ = run_study(plan, train_one, metrics, lambda *_: (f"smoke training: {label}",
                                                              steps * len(seeds)))
    return rows + moved, afters


def parameters_move(model: TransformerModel, initial: dict[str, torch.Tensor],
                    idle: set[str] = frozenset()) -> CheckRow:
    """Step 2: every trainable parameter changed in training, but those of ``idle`` modules
    (an expert no token chose)."""
    still = [name for name, p in model.named_parameters() if p.requires_grad
             and name not in idle
             and (name not in initial or torch.equal(p.detach(), initial[name]))]
    new = [name for name in still if name not in initial]
    detail = "every trainable parameter changed"
    if still:
        detail = (f"{len(still)} trainable parameters did not change in training: "
                  f"{', '.join(still[:4])}" + (f" ({', '.join(new[:2])} appeared during "
                                                "training: the optimiser never saw it)"
                                                if new else ""))
    return CheckRow(2, "parameters_move", status(not still), "unchanged", float(len(still)), 0,
                    detail=detail)


# The routine's own keys (``routines.check_settings``).
SETTINGS = {"steps": POSITIVE_INT, "n_batches": POSITIVE_INT, "batch_size": POSITIVE_INT,
            "min_drop": number_rule(), "seeds": POSITIVE_INT, "max_len": int_rule(1, nullable=True)}
STEPS = "routine.steps"  # its training length (``routines.check_unread``)


def workload(spec: RunSpec, task: Task, default: Workload) -> Workload:
    """One model at a time (seeds train one after another) at ``routine.batch_size``."""
    return replace(default, batch=int(spec.routine.batch_size))


def _fixed_loss(trainer: Trainer, batches: list[Batch]) -> float:
    losses = [trainer.evaluate(b, exact_match=False)["loss"] for b in batches]
    return sum(losses) / len(losses)


def smoke_setup(spec: RunSpec, inputs: JobInputs | None = None
                ) -> tuple[Task, TransformerModel, list[Batch]]:
    """The task, the model (initialised and batches drawn with ``seed_sources`` of ``spec.seed``)
    and the fixed batches of steps 1-2; ``inputs``: the task and model already built for
    ``spec`` (by the pre-flight, with the same initialisation seed)."""
    init_seed, data_seed = spec.seed_sources(spec.seed)
    if inputs is None:
        task = build_task(spec)
        model = build_model(spec.with_vocab(task.vocab_size).model, seed=init_seed)
        inputs = JobInputs(spec=spec, task=task, model=model)
    return inputs.task, inputs.model, fixed_batches(spec, inputs.task, data_seed)


def fixed_batches(spec: RunSpec, task: Task, data_seed: int) -> list[Batch]:
    """The ``routine.n_batches`` training batches a seed trains on in step 2."""
    generator = torch.Generator().manual_seed(data_seed)
    return [task.train_batch(spec.routine.batch_size, generator)
            for _ in range(spec.routine.n_batches)]


def run_smoke(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    clock = Stopwatch()
    task, model, batches = smoke_setup(spec, inputs)
    rows = forward_backward_check(spec, model, batches[0])
    smoke_rows, losses = smoke_training(spec, model, task, run.metrics, batches)
    rows += smoke_rows
    run.write_table("smoke", [r.as_row() for r in rows], CHECK_COLUMNS)
    print_table(check_table(rows, f"tlab smoke - {run.path}"))
    failed = [r.check for r in rows if not r.passed]
    return RoutineOutcome(
        passed=not failed,
        summary={"params": count_parameters(model), "steps": int(spec.routine.steps),
                 "final_loss": sum(losses.values()) / len(losses), "wall_s": clock.lap()},
        message="" if not failed else f"failed: {', '.join(failed)}",
        result=check_counts([r.status for r in rows]),
        seeds=[{"seed": seed, "steps": int(spec.routine.steps), "final_loss": loss}
               for seed, loss in losses.items()],
    )


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("final_loss", "minimize", final_loss)
