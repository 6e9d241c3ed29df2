"""What a reversal run reports (``tlab reverse-task``, ``tlab validate`` step 3): one trained
model (:class:`ReversalRun`), its PASS/FAIL rows (the chosen PE, the NoPE control), the rows of
``reverse.csv`` (:data:`REVERSE_COLUMNS`) with the verdict against the control, the verdict in
words, the numbers ``summary.csv`` gets and, with several seeds, each seed's own in
``seeds.csv``. The training is in ``reverse.py``."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from transformer_lab.measures.statistics import (
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.results.check_rows import CheckRow, status
from transformer_lab.routines.nope_control import NOPE
from transformer_lab.training.trainer import TrainResult

REVERSE_COLUMNS = ["role", "pe", "arch", "seed", "solved", "solved_step", "best_exact_match",
                   "target", "steps", "params", "wall_s", "tokens_per_s", "expected",
                   "best_exact_match_ci_low", "best_exact_match_ci_high", *VERDICT_COLUMNS]
# Chosen-PE exact match this close to the NoPE control's counts as "no better than NoPE".
NO_BETTER_MARGIN = 0.05


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
    """``reverse.csv``: one row per model; with NoPE controls, the interval over seeds of each
    model's held-out exact match and the chosen PE's paired verdict against its control."""
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
    """The chosen PE's numbers; with several seeds: the worst seed's exact match, the median
    solved step (when every seed solved), the longest run."""
    chosen = [run for run in runs if run.role == "chosen"]
    solved = [run.result.solved_step for run in chosen]
    return {"params": chosen[0].params, "steps": max(run.result.steps for run in chosen),
            "final_loss": statistics.fmean(run.result.final_loss for run in chosen),
            "best_exact_match": min(run.exact_match for run in chosen),
            "solved_step": None if None in solved else statistics.median(solved),
            "tokens_per_s": statistics.fmean(run.result.tokens_per_s for run in chosen)}


def seed_rows(runs: list[ReversalRun]) -> list[dict]:
    """``seeds.csv``: one row per seed of the chosen PE, with the numbers a one-seed run of
    that seed puts in its ``summary.csv`` (:func:`reversal_summary` of that seed alone), less
    ``tokens_per_s``: seeds trained together share one throughput (``multiseed.fit_seeds``)."""
    return [{"seed": run.seed, **{key: value for key, value in reversal_summary([run]).items()
                                  if key != "tokens_per_s"}}
            for run in runs if run.role == "chosen"]
