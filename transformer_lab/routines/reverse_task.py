"""``tlab reverse-task``: step 3 of the validation routine, sequence reversal beside a NoPE
control (why, and what ``reverse.csv`` holds: docs/routines.md)."""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import build_task
from transformer_lab.config.knowledge import declared
from transformer_lab.config.schema import POSITIVE_INT, Rule, number_rule
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
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.check import rotary_relative_check
from transformer_lab.routines.objective import Objective, steps_to_solve
from transformer_lab.routines.variants import (
    seed_list,
    seed_sources,
    stage_log,
    train_settings,
    with_choice,
)
from transformer_lab.tasks.sequence import SequenceTransformTask
from transformer_lab.training.trainer import Trainer, TrainResult, count_parameters

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

def arch_name(cfg: DictConfig) -> str:
    return "decoder" if cfg.arch.causal else "encoder"


def pe_label(cfg: DictConfig) -> str:
    """The PE as a table shows it: its group name (a user's own class: the class name), or the
    class's ``variant_label`` (ALiBi in an encoder: ``alibi(abs|split)``)."""
    target = str(cfg.pe.get("_target_", ""))
    name = str(cfg.pe.get("name"))
    if not target.startswith("transformer_lab."):
        name = target.rsplit(".", 1)[-1] or name
    label = declared(cfg.pe, "variant_label", name=name, arch=arch_name(cfg))
    return label if isinstance(label, str) else name


def expected_outcome(cfg: DictConfig) -> str:
    """The PE class's ``expected_reversal`` in this arch (else ``UNKNOWN_EXPECTATION``)."""
    arch = arch_name(cfg)
    expected = declared(cfg.pe, "expected_reversal", arch=arch)
    if isinstance(expected, Mapping):
        expected = expected.get(arch)
    return expected if isinstance(expected, str) else UNKNOWN_EXPECTATION


# The routine's own keys (``routines.check_settings``): ``target``, a held-out exact match.
SETTINGS = {"target": number_rule(0, 1, open_low=True), "max_steps": POSITIVE_INT,
            "seeds": POSITIVE_INT, "control": Rule("bool"), "declared_settings": Rule("bool")}


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight: the task must have an exact match to reach."""
    if not isinstance(inputs.task, SequenceTransformTask):
        raise ConfigError(f"task={cfg.task.get('name')} has no exact match to reach; "
                          "reverse-task needs task=reverse (or task=copy)")


def with_declared_settings(cfg: DictConfig) -> tuple[DictConfig, str]:
    """``cfg`` with the ``reversal_settings`` its components' classes declare (unless
    ``routine.declared_settings=false``), and a note naming them ("" without)."""
    settings, owners = {}, []
    for group in DECLARING_GROUPS:
        found = declared(cfg.get(group), "reversal_settings", arch=arch_name(cfg))
        if isinstance(found, Mapping) and found:
            settings.update(found)
            owners.append(f"{group}={cfg[group].get('name')}")
    if not settings or not cfg.routine.get("declared_settings", True):
        return cfg, ""
    variant = copy.deepcopy(cfg)
    for key, value in settings.items():
        if not (key.startswith("train.") or key == "routine.max_steps"):
            raise ConfigError(f"{', '.join(owners)} declares reversal setting {key}; only "
                              "train.* and routine.max_steps may be declared")
        OmegaConf.update(variant, key, value, force_add=True)
    named = ", ".join(f"{key}={value}" for key, value in settings.items())
    return variant, (f"with the settings {', '.join(owners)} declares for reversal: {named} "
                     "(routine.declared_settings=false: without)")


# --- one trained model ---------------------------------------------------------------------

@dataclass
class ReversalRun:
    """One trained model of the reversal step and its ``reverse.csv`` row."""

    role: str  # "chosen" or "nope_control"
    pe: str
    arch: str
    seed: int
    target: float
    result: TrainResult
    params: int
    expected: str

    @property
    def solved(self) -> bool:
        return self.result.solved_step is not None

    @property
    def exact_match(self) -> float:
        return self.result.best_exact_match or 0.0

    def as_row(self) -> dict:
        r = self.result
        return {"role": self.role, "pe": self.pe, "arch": self.arch, "seed": self.seed,
                "solved": self.solved, "solved_step": r.solved_step,
                "best_exact_match": self.exact_match, "target": self.target, "steps": r.steps,
                "params": self.params, "wall_s": r.wall_s, "tokens_per_s": r.tokens_per_s,
                "expected": self.expected}


def train_reversal(cfg: DictConfig, role: str, seeds: list[int], budgets: Mapping[int, int],
                   log: CsvLog | None, stage: str) -> list[ReversalRun]:
    """Every seed of ``cfg``, one after another, until solved or ``budgets[seed]`` steps
    (the schedule planned for ``routine.max_steps``)."""
    target, name, arch = float(cfg.routine.target), pe_label(cfg), arch_name(cfg)
    settings, task = train_settings(cfg), build_task(cfg)  # (build_task sets model.vocab_size)
    which = f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
    title = f"reversal: pe={name}, arch={arch}, {which}" if role == "chosen" else \
        f"reversal: NoPE control, arch={arch}, {which}"
    runs = []
    with progress_bar(log, title, total=sum(budgets[s] for s in seeds)):
        for seed in seeds:
            init_seed, data_seed = seed_sources(cfg, seed)
            model = build_model(cfg, seed=init_seed)
            trainer = Trainer(model, task, settings, data_seed,
                              stage_log(log, stage, name, seed))
            result = trainer.fit(budgets[seed], target_exact_match=target,
                                 horizon=int(cfg.routine.max_steps))
            runs.append(ReversalRun(role, name, arch, seed, target, result,
                                    count_parameters(model), expected_outcome(cfg)))
    return runs


def reversal_runs(cfg: DictConfig, log: CsvLog | None = None,
                  stage: str = STAGE) -> tuple[list[CheckRow], list[ReversalRun]]:
    """Step 3: the rotary check, the chosen PE's training (every seed), then the NoPE controls,
    each for as many steps as the chosen PE took with its seed."""
    cfg, note = with_declared_settings(cfg)
    rows: list[CheckRow] = []
    rotary = rotary_relative_check(cfg)
    if rotary is not None:
        rows.append(rotary)
    seeds = seed_list(cfg)
    chosen = train_reversal(cfg, "chosen", seeds, dict.fromkeys(seeds, int(cfg.routine.max_steps)),
                            log, stage)
    controls: list[ReversalRun | None] = [None] * len(chosen)
    if cfg.routine.get("control", True) and pe_label(cfg) != NOPE:
        budgets = {run.seed: run.result.solved_step or run.result.steps for run in chosen}
        controls = train_reversal(with_choice(cfg, "pe", NOPE), "nope_control", seeds,
                                  budgets, log, stage)
    several, runs = len(seeds) > 1, []
    for run, control in zip(chosen, controls, strict=True):
        rows.append(chosen_row(run, control, with_seed=several))
        rows[-1].detail += f"; {note}" if note else ""
        runs.append(run)
        if control is not None:
            rows.append(control_row(control, with_seed=several))
            runs.append(control)
    return rows, runs


# --- check rows, reverse.csv, summary -------------------------------------------------------

def chosen_row(chosen: ReversalRun, control: ReversalRun | None,
               with_seed: bool = False) -> CheckRow:
    r = chosen.result
    if chosen.solved:
        detail = f"pe={chosen.pe} reached {chosen.exact_match:.3f} at step {r.solved_step}"
    else:
        detail = f"pe={chosen.pe} reached only {chosen.exact_match:.3f} in {r.steps} steps"
    if control is not None:
        detail += f"; NoPE control {control.exact_match:.3f} in {control.result.steps} steps"
    if not chosen.solved:
        no_better = control is not None and (
            chosen.exact_match <= control.exact_match + NO_BETTER_MARGIN)
        if chosen.pe == NOPE:
            detail += (f"; as expected: pe={NOPE} is the control, a model told nothing about "
                       f"positions ({chosen.expected}); a correct PE must do better")
        elif no_better:
            detail += ("; no better than no PE at all: the model gets no usable position "
                       "information - check that the PE's output depends on its `positions` "
                       "argument")
        else:
            detail += (f"; expected for pe={chosen.pe} ({chosen.arch}): {chosen.expected}; "
                       "if it should solve it, try more routine.max_steps or another train.lr")
    if with_seed:
        detail = f"seed {chosen.seed}: {detail}"
    return CheckRow(3, "reverse_exact_match", status(chosen.solved), "exact_match",
                    chosen.exact_match, chosen.target, r.wall_s, detail)


def control_row(control: ReversalRun, with_seed: bool = False) -> CheckRow:
    r = control.result
    detail = f"NoPE {control.arch}: exact match {control.exact_match:.3f} in {r.steps} steps"
    if control.arch == "encoder":
        ok = not control.solved
        detail += ("; as expected, a NoPE encoder is permutation-equivariant" if ok else
                   "; a NoPE encoder should not be able to reverse: some component mixes "
                   "positions (an FFN or norm that is not position-wise?)")
    else:
        ok = True
        detail += " (informational: a causal decoder infers position from its mask)"
    if with_seed:
        detail = f"seed {control.seed}: {detail}"
    return CheckRow(3, "nope_control", status(ok), "exact_match", control.exact_match,
                    f"< {control.target}" if control.arch == "encoder" else None, r.wall_s,
                    detail)


def reverse_rows(runs: list[ReversalRun]) -> list[dict]:
    """``reverse.csv``: one row per model; with NoPE controls, the verdict columns."""
    rows = [run.as_row() for run in runs]
    if not any(run.role == "nope_control" for run in runs):
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


def reversal_summary(runs: list[ReversalRun]) -> dict:
    """The chosen PE's numbers; over seeds the worst exact match and the median solved step."""
    chosen = [run for run in runs if run.role == "chosen"]
    solved = [run.result.solved_step for run in chosen]
    return {"params": chosen[0].params, "steps": max(run.result.steps for run in chosen),
            "final_loss": statistics.fmean(run.result.final_loss for run in chosen),
            "best_exact_match": min(run.exact_match for run in chosen),
            "solved_step": None if None in solved else statistics.median(solved),
            "tokens_per_s": statistics.fmean(run.result.tokens_per_s for run in chosen)}


def run_reverse_task(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    clock = Stopwatch()
    rows, runs = reversal_runs(cfg, run.metrics)
    table = reverse_rows(runs)
    run.write_table("reverse", table, REVERSE_COLUMNS)
    print_table(check_table(rows, f"tlab reverse-task - {run.path}"))
    if (line := verdict_line(table)) is not None:
        console.print(line, highlight=False, markup=False)
    failed = [r for r in rows if not r.passed]
    summary = {**reversal_summary(runs), "wall_s": clock.lap()}
    message = "; ".join(f"{r.check}: {r.detail}" for r in failed)
    return RoutineOutcome(passed=not failed, summary=summary, message=message,
                          result=check_counts([r.status for r in rows]),
                          seeds=[{"seed": r.seed, **reversal_summary([r])} for r in runs
                                 if r.role == "chosen"])


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("steps_to_solve", "minimize", steps_to_solve)
