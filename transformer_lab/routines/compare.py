"""``tlab compare --vary KEY=V1,V2,...`` and ``tlab compare-activations`` (``--vary ffn=...``,
validate's step 4): the same run once per value, every variant over the same seeds, with a
paired verdict against the baseline. Setup, columns and ``--seeds auto``: docs/routines.md.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import torch
from rich.table import Table
from torch import nn

from transformer_lab.config.architecture import check_architecture
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.knowledge import declared
from transformer_lab.config.schema import POSITIVE_INT, Rule, number_rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.variants import choices, is_group, with_value
from transformer_lab.errors import ConfigError
from transformer_lab.measures.sequential import SequentialTest
from transformer_lab.measures.statistics import (
    BASELINE,
    NO_DIFFERENCE,
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.model import build_checked_model, build_model
from transformer_lab.results.check_rows import CheckRow, Stopwatch, status
from transformer_lab.results.console import cell, console, print_table, result_table
from transformer_lab.results.curve_metrics import early_loss, late_loss_std
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog, weights_path
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.objective import Objective, chosen_variant_loss
from transformer_lab.routines.study import SeedRun, Study, run_study, study
from transformer_lab.routines.train import mean_or_nan, perplexity
from transformer_lab.tasks import Task
from transformer_lab.training.checkpoint import save_weights
from transformer_lab.training.optimizers import check_optimizer
from transformer_lab.training.schedules import schedule
from transformer_lab.training.trainer import Trainer, count_parameters

# --- the variation and its checks -----------------------------------------------------------------

def variant_specs(spec: RunSpec) -> list[tuple[str, RunSpec]]:
    """(name, spec) of every variant, in the order given."""
    vary = study(spec)
    return [(name, with_value(spec, vary.key, value))
            for name, value in zip(vary.names, vary.values, strict=True)]


# The routine's own keys (``routines.check_settings``); ``loss_target`` null: the loss every
# run reaches.
SETTINGS = {"activations": Rule("list", item=Rule("str"), min_items=1),
            "vary.key": Rule("str", nullable=True),
            "vary.values": Rule("list", min_items=1, nullable=True),
            "baseline": Rule("any", nullable=True),  # one of the values: check_config
            "steps": POSITIVE_INT, "seeds": Rule("any"),  # N or auto[:MAX]: study
            "shared_init": Rule("bool"),
            "loss_target": number_rule(0, open_low=True, nullable=True)}
STEPS = "routine.steps"  # its training length (``routines.check_unread``)


check_values = study  # before the task is built: the study (seeds, variants, baseline) holds


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight: a variation with values, and every variant's config passing the run's own
    checks."""
    vary = study(spec)
    if not vary.values:  # (an empty routine.activations breaks its SETTINGS rule)
        raise ConfigError("tlab compare needs --vary KEY=V1,V2,... (a config group or key and "
                          "its values), e.g. --vary pe=rope,alibi,t5 or --vary train.lr=1e-3,3e-3")
    for name, value in zip(vary.names, vary.values, strict=True):
        check_variant(spec, vary, name, value)


def check_variant(spec: RunSpec, vary: Study, name: str, value: Any) -> None:
    """The pre-flight of one variant: ``ConfigError`` prefixed with ``KEY=VALUE``."""
    what = "activation" if vary.option == "--activations" else vary.key
    try:
        if is_group(spec, vary.key) and not isinstance(value, str):
            raise ConfigError(f"a {vary.key} choice is a name; valid: "
                              f"{', '.join(choices(spec, vary.key))}")
        variant = with_value(spec, vary.key, value)
        schedule(variant.train.schedule)
        check_architecture(variant.model)
        task = build_task(variant)
        model = build_checked_model(variant.with_vocab(task.vocab_size).model,
                                    task.model_seq_len, variant.seed)
        check_optimizer(variant.train.optimizer, model)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith(f"unknown {vary.key} "):  # an unknown choice: say where it was
            message = message.replace(f"unknown {vary.key} ", f"unknown {what} ", 1)
            message = message.replace(";", f" in {vary.option};", 1)
            raise ConfigError(message) from None
        raise ConfigError(f"{vary.option}={name}: {message}") from None


# --- the training ---------------------------------------------------------------------------------

def train_seed(spec: RunSpec, task: Task, seed: int, log: CsvLog | None,
               variant: str | None = None,
               initial: dict[int, dict[str, torch.Tensor]] | None = None
               ) -> tuple[SeedRun, nn.Module]:
    """Train one variant (``spec``, with ``task``'s vocabulary; ``variant``: its name, default
    its ffn) with ``seed`` for ``routine.steps``; the run and its model. ``initial`` (seed ->
    parameter values) shares initial weights between variants."""
    activation = str(spec.model.ffn.name)
    variant = variant or activation
    settings = spec.train
    init_seed, data_seed = spec.seed_sources(seed)
    model = build_model(spec.model, seed=init_seed)
    if initial is not None:
        if seed in initial:
            start_from(model, initial[seed])
        else:
            initial[seed] = {name: p.detach().clone() for name, p in model.named_parameters()}
    parts = parameter_parts(model)
    logged: list[tuple[int, float]] = []  # (step, perf_counter) at each logged step
    trainer = Trainer(model, task, settings, data_seed,
                      TaggedLog(log, stage="compare", variant=variant, seed=seed))
    result = trainer.fit(int(spec.routine.steps), on_step=lambda step, loss:
                         logged.append((step, time.perf_counter())))
    tokens_per_step = settings.batch_size * task.model_seq_len
    speeds = [tokens_per_step * (s1 - s0) / (t1 - t0)
              for (s0, t0), (s1, t1) in zip(logged, logged[1:], strict=False) if t1 > t0]
    if speeds:  # the median over log intervals
        result = replace(result, tokens_per_s=statistics.median(speeds))
    tags = {"activation": activation,
            "gated_ffn": declared(spec.model.ffn, "weight_matrices") == 3}
    return SeedRun(variant, seed, result, count_parameters(model), tags,
                   [step for step, _ in logged], parts), model


def start_from(model: nn.Module, initial: dict[str, torch.Tensor]) -> list[str]:
    """Copy into ``model`` every parameter of ``initial`` with the same name and shape;
    returns the names copied."""
    copied = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            value = initial.get(name)
            if value is not None and value.shape == parameter.shape:
                parameter.copy_(value)
                copied.append(name)
    return copied


# Where a parameter lives, by the first part of its name below ``blocks.<i>.`` (or at the top).
MODEL_PARTS = {"token_embedding": "embedding", "positional": "pe", "attention": "attention",
               "feedforward": "ffn", "lm_head": "head"}


def parameter_parts(model: nn.Module) -> dict[str, int]:
    """Parameter counts by part (``MODEL_PARTS``; any other name counts as ``norms``)."""
    parts: Counter[str] = Counter()
    for name, parameter in model.named_parameters():
        words = name.split(".")
        word = words[2] if words[0] == "blocks" and len(words) > 2 else words[0]
        parts[MODEL_PARTS.get(word, "norms")] += parameter.numel()
    return dict(parts)


def train_variants(spec: RunSpec, run: RunDirectory, keep_weights: bool = False
                   ) -> tuple[list[SeedRun], SequentialTest | None]:
    """Every variant's seeds trained (``study.run_study``), each appended to
    ``compare_runs.csv`` as it finishes and (``keep_weights``) its final weights kept in
    ``models/<variant>/seed<k>.safetensors``: the runs, and the test with ``auto[:MAX]``."""
    vary, specs = study(spec), dict(variant_specs(spec))

    task_of = cache(lambda name: build_task(specs[name]))
    initial: dict[int, dict[str, torch.Tensor]] | None = \
        {} if spec.routine.get("shared_init", False) else None
    runs_log, steps, trained = run.log("compare_runs", RUN_COLUMNS), int(spec.routine.steps), []

    def train_one(name: str, seed: int) -> SeedRun:
        task = task_of(name)
        variant = specs[name].with_vocab(task.vocab_size)
        seed_run, model = train_seed(variant, task, seed, run.metrics, name, initial)
        if keep_weights:
            save_weights(model, weights_path(run.path, seed, name), variant, seed,
                         index=len(trained), variant=name, varied=vary.key,
                         tokenizer=getattr(task, "tokenizer", None))
        trained.append(seed_run)
        runs_log.write(seed_row(seed_run))
        return seed_run

    def bar(name: str, seeds: list[int]) -> tuple[str, int]:
        label = name if vary.key == "ffn" else f"{vary.key}={name}"
        which = (f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}" if seeds[0] == spec.seed
                 else f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}")
        return f"{label}, {which}: {steps} steps", steps * len(seeds)

    return run_study(vary, train_one, run.metrics, bar)


def write_comparison(spec: RunSpec, run: RunDirectory, runs: list[SeedRun],
                     test: SequentialTest | None) -> list[dict]:
    """The rows and verdicts of trained variants, written as ``comparison.csv``."""
    vary = study(spec)
    rows = comparison_rows(runs, spec.routine.get("loss_target"), vary.baseline, vary.key, test)
    run.write_table("comparison", rows, COMPARISON_COLUMNS)
    return rows


# --- a seed's run, the rows, the verdicts and the checks ------------------------------------------

SMOOTHING = 0.1  # EMA weight of the newest training loss in the smoothed curve

PARAMS_TOLERANCE = 0.05  # variants whose parameter count differs more from the baseline's: flagged

# The columns of compare-activations first, in their order; then a comparison's own.
COMPARISON_COLUMNS = ["variant", "varied", "activation", "params", "ffn_params",
                      "tokens_per_s", "rel_speed", "final_loss", "final_ppl", "grad_norm_mean",
                      "grad_norm_std", "steps_to_target", "seeds", "loss_target",
                      "final_loss_std", "first_loss", "steps", "final_loss_ci_low",
                      "final_loss_ci_high", *VERDICT_COLUMNS, "early_loss", "late_loss_std",
                      "params_vs_baseline", "params_note", "seeds_used", "stopped_because",
                      "e_value", "sequential_design"]
RUN_COLUMNS = ["activation", "seed", "params", "ffn_params", "tokens_per_s", "final_loss",
               "final_train_loss", "first_loss", "grad_norm_mean", "grad_norm_std", "steps",
               "wall_s", "early_loss", "late_loss_std", "variant"]


def smoothed(run: SeedRun) -> list[float]:
    """The run's training losses, exponentially smoothed (``SMOOTHING``)."""
    return ema(run.result.train_losses, SMOOTHING)


def seed_row(run: SeedRun) -> dict:
    """The run's row of ``compare_runs.csv``."""
    r, losses = run.result, run.result.train_losses
    return {"variant": run.variant, "activation": run.tags["activation"], "seed": run.seed,
            "params": run.params, "ffn_params": run.parts.get("ffn", 0),
            "tokens_per_s": r.tokens_per_s, "final_loss": _exact(r.final_loss),
            "final_train_loss": smoothed(run)[-1] if losses else math.nan,
            "first_loss": losses[0] if losses else math.nan,
            "grad_norm_mean": mean_or_nan(r.grad_norms), "grad_norm_std": _std(r.grad_norms),
            "steps": r.steps, "wall_s": r.wall_s,
            "early_loss": _exact(early_loss(run.logged_steps, losses)),
            "late_loss_std": _exact(late_loss_std(run.logged_steps, losses))}


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average ``s_t = (1 - w) s_{t-1} + w v_t`` with ``s_0 = v_0``."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else (1 - weight) * smoothed[-1] + weight * value)
    return smoothed


def _exact(value: float) -> float | str:
    """``value`` in full precision (the CSV's 6 digits would blur small paired differences)."""
    return repr(float(value)) if math.isfinite(value) else value


def _std(values: Sequence[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def runs_by_variant(runs: list[SeedRun]) -> dict[str, list[SeedRun]]:
    """Each variant's runs, variants in the order first seen."""
    return {name: [run for run in runs if run.variant == name]
            for name in dict.fromkeys(run.variant for run in runs)}


def steps_to_target(run: SeedRun, target: float) -> int | None:
    """First logged step whose smoothed training loss is at or below ``target``."""
    for step, loss in zip(run.logged_steps, smoothed(run), strict=True):
        if loss <= target:
            return step
    return None


def comparison_rows(runs: list[SeedRun], loss_target: float | None,
                    baseline: str | None = None, varied: str = "ffn",
                    test: SequentialTest | None = None) -> list[dict]:
    """One ``comparison.csv`` row per variant (in the order first seen), seeds averaged, with
    the verdict columns against ``baseline`` (default the first variant; ``test``: those of
    ``--seeds auto``'s sequential test)."""
    finals = [smoothed(r)[-1] for r in runs if r.result.train_losses]
    target = loss_target if loss_target is not None else max(finals, default=math.nan)
    by_variant = runs_by_variant(runs)
    rows = []
    for name, seed_runs in by_variant.items():
        reached = [steps_to_target(r, target) for r in seed_runs]
        norms = [g for r in seed_runs for g in r.result.grad_norms]
        final = [r.result.final_loss for r in seed_runs]
        rows.append({
            "variant": name, "activation": seed_runs[0].tags["activation"],
            "params": seed_runs[0].params, "ffn_params": seed_runs[0].parts.get("ffn", 0),
            "tokens_per_s": mean_or_nan([r.result.tokens_per_s for r in seed_runs]),
            "final_loss": mean_or_nan(final), "final_ppl": perplexity(mean_or_nan(final)),
            "grad_norm_mean": mean_or_nan(norms), "grad_norm_std": _std(norms),
            "steps_to_target": None if None in reached else statistics.median(reached),
            "seeds": len(seed_runs), "loss_target": target, "final_loss_std": _std(final),
            "first_loss": mean_or_nan([r.result.train_losses[0] for r in seed_runs
                                       if r.result.train_losses]),
            "steps": seed_runs[0].result.steps,
            "early_loss": mean_or_nan([early_loss(r.logged_steps, r.result.train_losses)
                                       for r in seed_runs]),
            "late_loss_std": mean_or_nan([late_loss_std(r.logged_steps, r.result.train_losses)
                                          for r in seed_runs]), "varied": varied,
            "seeds_used": len(seed_runs), "stopped_because": STOPPED_FIXED,
        })
    first_speed = rows[0]["tokens_per_s"] if rows else math.nan
    for row in rows:
        row["rel_speed"] = row["tokens_per_s"] / first_speed if first_speed else math.nan
    if runs:
        import pandas as pd

        per_seed = pd.DataFrame([{"variant": r.variant, "seed": r.seed,
                                  "final_loss": r.result.final_loss} for r in runs])
        verdicts = verdict_table(per_seed, "variant", baseline=baseline, test=test)
        for row in rows:
            row.update(verdicts.loc[row["variant"]].to_dict())
        reference = by_variant[baseline_name(rows)][0]
        for row in rows:
            model = by_variant[row["variant"]][0]
            row["params_vs_baseline"] = model.params / reference.params - 1
            row["params_note"] = parameter_note(model, reference, varied)
    return rows


STOPPED_FIXED = "fixed"  # stopped_because of a fixed --seeds N comparison


# What sizes each part of the model (``parameter_parts``), to match a variant's parameters.
SIZING_KNOBS = {"ffn": "model.d_ff (MoE: ffn.n_experts)",
                "attention": "model.n_heads, model.n_kv_heads or model.head_dim",
                "pe": "the PE's own size (model.max_len for a learned table; T5: "
                      "pe.num_buckets)",
                "embedding": "model.d_model or the task's vocabulary",
                "head": "model.tie_embeddings or the task's vocabulary",
                "norms": "norm_layer= (its gains and biases)"}
# Varied keys (and the keys below them) that size the model themselves: a different parameter
# count is what is compared.
SIZING_GROUPS = ("model", "preset", "task")


def parameter_note(run: SeedRun, baseline: SeedRun, varied: str) -> str:
    """Empty within ``PARAMS_TOLERANCE`` of the baseline's parameters, else how far off and
    how to match them."""
    change = run.params / baseline.params - 1
    if abs(change) <= PARAMS_TOLERANCE:
        return ""
    head = (f"{abs(change):.0%} {'more' if change > 0 else 'fewer'} parameters than "
            f"{baseline.variant}")
    if varied.split(".")[0] in SIZING_GROUPS:
        return f"{head}: {varied} sizes the model (the difference is the point)"
    parts = set(run.parts) | set(baseline.parts)
    part = max(parts, key=lambda p: abs(run.parts.get(p, 0) - baseline.parts.get(p, 0)))
    low, high = sorted((run.parts.get("ffn", 0), baseline.parts.get("ffn", 0)))
    gating_differs = run.tags["gated_ffn"] != baseline.tags["gated_ffn"]
    # a gated FFN against a two-matrix one of the same d_ff: about 3/2 the parameters
    if part == "ffn" and gating_differs and low > 0 and 1.25 <= high / low <= 1.75:
        return f"{head}: match them with model.gated_match_params=true (gated FFNs at 2/3 d_ff)"
    return f"{head}, most in its {part}: match them with {SIZING_KNOBS.get(part, part)}"


def baseline_name(rows: list[dict]) -> str:
    """The variant whose ``verdict`` is ``baseline`` (the first row if none is marked)."""
    return next((r["variant"] for r in rows if r.get("verdict") == BASELINE),
                rows[0]["variant"])


def comparison_checks(rows: list[dict]) -> list[CheckRow]:
    """One check per variant (``activation_gelu``; ``pe=alibi``): a finite, falling loss."""
    checks = []
    baseline = baseline_name(rows) if rows else None
    for row in rows:
        varied, name = row.get("varied", "ffn"), row["variant"]
        check, label = (f"activation_{name}", f"the FFN ({name})") if varied == "ffn" \
            else (f"{varied}={name}",) * 2
        finite = math.isfinite(row["final_loss"]) and math.isfinite(row["grad_norm_mean"])
        fell = finite and row["final_loss"] < row["first_loss"]
        detail = (f"loss {row['first_loss']:.3f} -> {row['final_loss']:.3f} (ppl "
                  f"{row['final_ppl']:.3g}), {row['tokens_per_s']:.0f} tok/s ("
                  f"{row['rel_speed']:.2f}x), grad norm {row['grad_norm_mean']:.3g} +- "
                  f"{row['grad_norm_std']:.2g}; a comparison: PASS = finite and falling")
        if not finite:
            detail += f"; non-finite loss or gradients: lower train.lr or check {label}"
        elif not fell:
            detail += f"; the loss did not fall: check {label}'s forward and its initialisation"
        if has_verdict(row):
            detail += f"; {describe(name, row, baseline)}"
        checks.append(CheckRow(4, check, status(fell), "final_loss", row["final_loss"],
                               "< first loss", 0.0, detail))
    return checks


# --- the terminal table and the plot --------------------------------------------------------------

TABLE_HEADERS = {"variant": "variant", "params": "params", "ffn_params": "ffn",
                 "tokens_per_s": "tok/s", "rel_speed": "speed", "final_loss": "loss",
                 "final_ppl": "ppl", "grad_norm_mean": "|g|", "grad_norm_std": "sd",
                 "steps_to_target": "steps*", "seeds": "n", "verdict": "verdict"}


def comparison_table(rows: list[dict], title: str) -> Table:
    """The rows in a terminal table; a parameter count off the baseline's marked ``!``."""
    varied = rows[0].get("varied", "ffn") if rows else "variant"
    table = result_table(
        title, "speed: tokens/s / the first's; |g|, sd: gradient norm mean and sd over "
        "steps; steps*: steps to the loss every run reaches; n: seeds; no diff.: no "
        f"detectable difference; !: parameters {PARAMS_TOLERANCE:.0%}+ off the baseline's")
    widest = max([len(varied), *(len(str(row["variant"])) for row in rows)])
    for column, header in TABLE_HEADERS.items():
        table.add_column(varied if column == "variant" else header,
                         justify="left" if column in ("variant", "verdict") else "right",
                         no_wrap=True, min_width=widest if column == "variant" else None)
    for row in rows:
        cells = [cell(row.get(c)) for c in TABLE_HEADERS]
        if row.get("params_note"):
            cells[1] += f" {row['params_vs_baseline']:+.0%}!"
        if cells[-1] == NO_DIFFERENCE:  # the table's short form (comparison.csv: in full)
            cells[-1] = "no diff."
        table.add_row(*cells)
    return table


def plot_loss_curves(runs: list[SeedRun], path: Path, title: str) -> Path:
    """Smoothed training loss per variant: mean over seeds, min-max band."""
    from transformer_lab.results.plots import plt, save

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, seed_runs in runs_by_variant(runs).items():
        length = min(len(smoothed(r)) for r in seed_runs)
        steps = seed_runs[0].logged_steps[:length]
        curves = torch.tensor([smoothed(r)[:length] for r in seed_runs])  # (seeds, logged)
        label = f"{name} ({len(seed_runs)} seed{'s' if len(seed_runs) > 1 else ''})"
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


def run_compare(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    """Train every variant, write the tables and plot, print the verdicts; PASS when every
    variant trained to a finite, falling loss."""
    clock = Stopwatch()
    vary = study(spec)
    runs, test = train_variants(spec, run, keep_weights=True)
    rows = write_comparison(spec, run, runs, test)
    arch = "decoder" if spec.model.causal else "encoder"
    plot_loss_curves(runs, run.path / "loss_curves.png",
                     f"{spec.task.name}, {arch}, {vary.key}: {spec.routine.steps} steps")
    command = "compare-activations" if vary.option == "--activations" else \
        f"compare --vary {vary.key}"
    print_table(comparison_table(rows, f"tlab {command} - {run.path}"))
    for row in rows:
        if row.get("params_note"):
            console.print(f"! {vary.key}={row['variant']}: {row['params_note']}", markup=False)
    for row in filter(has_verdict, rows):
        console.print(describe(row["variant"], row, baseline_name(rows)), markup=False)
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
