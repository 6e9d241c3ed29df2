"""``tlab reverse-task``: step 3 of the validation routine, sequence reversal beside a NoPE
control (why, and what ``reverse.csv`` holds: docs/routines.md)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from transformer_lab.config.instantiate import build_task
from transformer_lab.config.knowledge import declared
from transformer_lab.config.schema import POSITIVE_INT, Rule, number_rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.variants import with_choice, with_value
from transformer_lab.errors import ConfigError
from transformer_lab.measures.statistics import (
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.model import build_model
from transformer_lab.results.check_rows import (
    CheckRow,
    Stopwatch,
    check_counts,
    check_table,
    status,
)
from transformer_lab.results.console import console, print_table
from transformer_lab.results.run_directory import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.check import rotary_relative_check
from transformer_lab.routines.objective import Objective, steps_to_solve
from transformer_lab.routines.study import SeedRun, run_study, study
from transformer_lab.tasks.sequence import SequenceTransformTask
from transformer_lab.training.trainer import Trainer, count_parameters

STAGE = "reverse_task"  # the ``stage`` of its rows in metrics.csv (also inside tlab validate)
NOPE = "none"  # the control's PE
# The expected outcome of a PE whose class declares none (``expected_reversal``).
UNKNOWN_EXPECTATION = "unknown (your own component)"
# Chosen-PE exact match this close to the NoPE control's counts as "no better than NoPE".
NO_BETTER_MARGIN = 0.05
# Config groups whose classes may declare ``reversal_settings`` (later ones win on a clash).
DECLARING_GROUPS = ("pe", "block", "norm_layer", "ffn")
REVERSE_COLUMNS = ["role", "pe", "arch", "seed", "solved", "solved_step", "best_exact_match",
                   "target", "steps", "params", "wall_s", "tokens_per_s", "expected",
                   "best_exact_match_ci_low", "best_exact_match_ci_high", *VERDICT_COLUMNS]


# --- what the PE is and what it should do --------------------------------------------------

def arch_name(spec: RunSpec) -> str:
    return "decoder" if spec.model.causal else "encoder"


def pe_label(spec: RunSpec) -> str:
    """The PE as a table shows it: its group name (a user's own class: the class name), or the
    class's ``variant_label`` (ALiBi in an encoder: ``alibi(abs|split)``)."""
    pe = spec.model.pe
    target, name = str(pe.get("_target_", "")), str(pe.name)
    if not target.startswith("transformer_lab."):
        name = target.rsplit(".", 1)[-1] or name
    label = declared(pe, "variant_label", name=name, arch=arch_name(spec))
    return label if isinstance(label, str) else name


def expected_outcome(spec: RunSpec) -> str:
    """The PE class's ``expected_reversal`` in this arch (else ``UNKNOWN_EXPECTATION``)."""
    arch = arch_name(spec)
    expected = declared(spec.model.pe, "expected_reversal", arch=arch)
    if isinstance(expected, Mapping):
        expected = expected.get(arch)
    return expected if isinstance(expected, str) else UNKNOWN_EXPECTATION


# The routine's own keys (``routines.check_settings``): ``target``, a held-out exact match.
SETTINGS = {"target": number_rule(0, 1, open_low=True), "max_steps": POSITIVE_INT,
            "seeds": POSITIVE_INT, "control": Rule("bool"), "declared_settings": Rule("bool")}
STEPS = "routine.max_steps"  # its training length (``routines.check_unread``)


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight: the task must have an exact match to reach."""
    if not isinstance(inputs.task, SequenceTransformTask):
        raise ConfigError(f"task={spec.task.name} has no exact match to reach; "
                          "reverse-task needs task=reverse (or task=copy)")


def with_declared_settings(spec: RunSpec) -> tuple[RunSpec, str]:
    """``spec`` with the ``reversal_settings`` its components' classes declare (unless
    ``routine.declared_settings=false``), and a note naming them ("" without)."""
    settings, owners = {}, []
    for group in DECLARING_GROUPS:
        component = spec.model.component(group)
        found = declared(component, "reversal_settings", arch=arch_name(spec))
        if isinstance(found, Mapping) and found:
            settings.update(found)
            owners.append(f"{group}={component.name}")
    if not settings or not spec.routine.get("declared_settings", True):
        return spec, ""
    variant = spec
    for key, value in settings.items():
        if not (key.startswith("train.") or key == "routine.max_steps"):
            raise ConfigError(f"{', '.join(owners)} declares reversal setting {key}; only "
                              "train.* and routine.max_steps may be declared")
        variant = with_value(variant, key, value)
    named = ", ".join(f"{key}={value}" for key, value in settings.items())
    return variant, (f"with the settings {', '.join(owners)} declares for reversal: {named} "
                     "(routine.declared_settings=false: without)")


# --- one trained model ---------------------------------------------------------------------

def solved(run: SeedRun) -> bool:
    return run.result.solved_step is not None


def exact_match(run: SeedRun) -> float:
    return run.result.best_exact_match or 0.0


def train_reversal(spec: RunSpec, role: str, seed: int, budget: int,
                   log: CsvLog | None) -> SeedRun:
    """``spec`` trained with ``seed`` until solved or ``budget`` steps (the schedule planned for
    ``routine.max_steps``)."""
    target, task = float(spec.routine.target), build_task(spec)
    init_seed, data_seed = spec.seed_sources(seed)
    model = build_model(spec.with_vocab(task.vocab_size).model, seed=init_seed)
    trainer = Trainer(model, task, spec.train, data_seed,
                      TaggedLog(log, stage=STAGE, variant=pe_label(spec), seed=seed))
    result = trainer.fit(budget, target_exact_match=target, horizon=int(spec.routine.max_steps))
    tags = {"pe": pe_label(spec), "arch": arch_name(spec), "target": target,
            "expected": expected_outcome(spec)}
    return SeedRun(role, seed, result, count_parameters(model), tags)


def reversal_runs(spec: RunSpec, log: CsvLog | None = None
                  ) -> tuple[list[CheckRow], list[SeedRun]]:
    """Step 3: the rotary check, the chosen PE's training (every seed), then the NoPE controls,
    each for as many steps as the chosen PE took with its seed."""
    spec, note = with_declared_settings(spec)
    rows = [row for row in [rotary_relative_check(spec)] if row is not None]
    plan, arch = study(spec), arch_name(spec)
    specs = {"chosen": spec}
    if spec.routine.get("control", True) and pe_label(spec) != NOPE:
        specs["nope_control"] = with_choice(spec, "pe", NOPE)
    chosen: dict[int, SeedRun] = {}

    def budget(role: str, seed: int) -> int:
        if role == "chosen":
            return int(spec.routine.max_steps)
        return chosen[seed].result.solved_step or chosen[seed].result.steps

    def train_one(role: str, seed: int) -> SeedRun:
        run = train_reversal(specs[role], role, seed, budget(role, seed), log)
        if role == "chosen":
            chosen[seed] = run
        return run

    def bar(role: str, seeds: list[int]) -> tuple[str, int]:
        which = f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
        title = f"reversal: pe={pe_label(spec)}, arch={arch}, {which}" if role == "chosen" \
            else f"reversal: NoPE control, arch={arch}, {which}"
        return title, sum(budget(role, seed) for seed in seeds)

    trained, _ = run_study(plan, train_one, log, bar, variants=list(specs))
    controls = {run.seed: run for run in trained if run.variant == "nope_control"}
    several, runs = len(plan.seeds) > 1, []
    for seed, run in chosen.items():
        rows.append(chosen_row(run, controls.get(seed), with_seed=several))
        rows[-1].detail += f"; {note}" if note else ""
        runs.append(run)
        if seed in controls:
            rows.append(control_row(controls[seed], with_seed=several))
            runs.append(controls[seed])
    return rows, runs


# --- check rows, reverse.csv, summary -------------------------------------------------------

def chosen_row(chosen: SeedRun, control: SeedRun | None, with_seed: bool = False) -> CheckRow:
    r, pe, matched = chosen.result, chosen.tags["pe"], exact_match(chosen)
    if solved(chosen):
        detail = f"pe={pe} reached {matched:.3f} at step {r.solved_step}"
    else:
        detail = f"pe={pe} reached only {matched:.3f} in {r.steps} steps"
    if control is not None:
        detail += f"; NoPE control {exact_match(control):.3f} in {control.result.steps} steps"
    if not solved(chosen):
        no_better = control is not None and (
            matched <= exact_match(control) + NO_BETTER_MARGIN)
        if pe == NOPE:
            detail += (f"; as expected: pe={NOPE} is the control, a model told nothing about "
                       f"positions ({chosen.tags['expected']}); a correct PE must do better")
        elif no_better:
            detail += ("; no better than no PE at all: the model gets no usable position "
                       "information - check that the PE's output depends on its `positions` "
                       "argument")
        else:
            detail += (f"; expected for pe={pe} ({chosen.tags['arch']}): "
                       f"{chosen.tags['expected']}; "
                       "if it should solve it, try more routine.max_steps or another train.lr")
    if with_seed:
        detail = f"seed {chosen.seed}: {detail}"
    return CheckRow(3, "reverse_exact_match", status(solved(chosen)), "exact_match", matched,
                    chosen.tags["target"], r.wall_s, detail)


def control_row(control: SeedRun, with_seed: bool = False) -> CheckRow:
    r, arch, target = control.result, control.tags["arch"], control.tags["target"]
    detail = f"NoPE {arch}: exact match {exact_match(control):.3f} in {r.steps} steps"
    if arch == "encoder":
        ok = not solved(control)
        detail += ("; as expected, a NoPE encoder is permutation-equivariant" if ok else
                   "; a NoPE encoder should not be able to reverse: some component mixes "
                   "positions (an FFN or norm that is not position-wise?)")
    else:
        ok = True
        detail += " (informational: a causal decoder infers position from its mask)"
    if with_seed:
        detail = f"seed {control.seed}: {detail}"
    return CheckRow(3, "nope_control", status(ok), "exact_match", exact_match(control),
                    f"< {target}" if arch == "encoder" else None, r.wall_s, detail)


def reverse_rows(runs: list[SeedRun]) -> list[dict]:
    """``reverse.csv``: one row per model (its ``role``: the run's variant, chosen or
    nope_control); with NoPE controls, the verdict columns."""
    rows = [{"role": run.variant, **run.tags, "seed": run.seed, "solved": solved(run),
             "solved_step": run.result.solved_step, "best_exact_match": exact_match(run),
             "steps": run.result.steps, "params": run.params, "wall_s": run.result.wall_s,
             "tokens_per_s": run.result.tokens_per_s} for run in runs]
    if not any(run.variant == "nope_control" for run in runs):
        return rows
    import pandas as pd

    verdicts = verdict_table(pd.DataFrame(rows), "role", "best_exact_match",
                             baseline="nope_control", lower_is_better=False)
    return [{**row, **verdicts.loc[row["role"]].to_dict()} for row in rows]


def verdict_line(rows: list[dict]) -> str | None:
    """The chosen PE against its NoPE control in words (None without a control)."""
    chosen = next((row for row in rows if row["role"] == "chosen"), None)
    if chosen is None or not has_verdict(chosen):
        return None
    return describe(f"pe={chosen['pe']}", chosen, f"pe={NOPE}", value="held-out exact match")


def reversal_summary(runs: list[SeedRun]) -> dict:
    """The chosen PE's numbers; over seeds the worst exact match and the median solved step."""
    chosen = [run for run in runs if run.variant == "chosen"]
    solved = [run.result.solved_step for run in chosen]
    return {"params": chosen[0].params, "steps": max(run.result.steps for run in chosen),
            "final_loss": statistics.fmean(run.result.final_loss for run in chosen),
            "best_exact_match": min(exact_match(run) for run in chosen),
            "solved_step": None if None in solved else statistics.median(solved),
            "tokens_per_s": statistics.fmean(run.result.tokens_per_s for run in chosen)}


def run_reverse_task(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    clock = Stopwatch()
    rows, runs = reversal_runs(spec, run.metrics)
    table = reverse_rows(runs)
    run.write_table("reverse", table, REVERSE_COLUMNS)
    print_table(check_table(rows, f"tlab reverse-task - {run.path}"))
    if (line := verdict_line(table)) is not None:
        console.print(line, markup=False)
    failed = [r for r in rows if not r.passed]
    summary = {**reversal_summary(runs), "wall_s": clock.lap()}
    message = "; ".join(f"{r.check}: {r.detail}" for r in failed)
    return RoutineOutcome(passed=not failed, summary=summary, message=message,
                          result=check_counts([r.status for r in rows]),
                          seeds=[{"seed": r.seed, **reversal_summary([r])} for r in runs
                                 if r.variant == "chosen"])


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("steps_to_solve", "minimize", steps_to_solve)
