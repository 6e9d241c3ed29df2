"""``tlab reverse-task``: step 3 of the validation routine, sequence reversal.

The task (:class:`transformer_lab.tasks.ReverseTask`): a source ``x_0 .. x_{L-1}`` of random
symbols must come out reversed, ``y_i = x_{L-1-i}``.

* ``arch=encoder``: bidirectional attention, inputs (B, L) -> logits (B, L, V); position ``i``
  predicts ``x_{L-1-i}``. The model must know *where* each token is: without a positional
  encoding an encoder is permutation-equivariant (permuting the input permutes the outputs), so
  every position sees the same multiset of tokens and reversal is impossible beyond chance.
* ``arch=decoder``: causal attention on ``source SEP reversed`` (length 2L, shifted by one),
  loss on the L target tokens; exact match by greedy decoding from ``source SEP`` (not teacher
  forcing).

Training (``Trainer.fit``) stops at the first held-out evaluation (every ``train.eval_every``
steps) whose exact match reaches ``routine.target`` (default 0.99), or after
``routine.max_steps``. PASS when the target is reached.

Two checks more make the result mean something:

* ``nope_control`` (``routine.control=true``): the same model, seed and data without a PE
  (``pe=none``), trained for as many steps as the chosen PE used. It shows the PE is what makes
  the difference. In an encoder it must *not* solve the task; if it does, some component leaks
  position (e.g. an FFN or norm that mixes positions) and the check fails. In a decoder it is
  informational: the causal mask lets a NoPE decoder infer positions. Where a core is free it
  trains on a second thread beside the chosen PE, one step behind it (``Lockstep``;
  ``routine.control_thread``), with the numbers it would get trained after it
  (``nope_control.py``).
* ``rotary_relative`` (rotary PEs only, before training): with the same query and key vector at
  every position, the rotated scores ``q_m . k_n`` must depend on ``n - m`` only (Su et al. 2021,
  RoFormer, arXiv:2104.09864). RoPE with a different pairing (half vs interleaved) for q and k
  fails it, even when it still trains.

What each PE is expected to do, per architecture, is what its class declares
(``expected_reversal``: a dict arch -> text, or a classmethod of the arch and the PE's config
arguments, as ALiBi's depends on ``symmetric``); measured numbers are in
``experiments/reverse_expectations.md``.

``routine.seeds`` = N > 1 (``--seeds``): seeds ``seed .. seed+N-1`` train together
(``multiseed.fit_seeds``), then their controls, each for its own seed's number of steps; PASS
when every seed solves, one check row per seed and model.

With the control, ``reverse.csv`` also says whether the chosen PE beats it, paired by seed, on
held-out exact match (higher is better; ``measures.statistics``): ``best_exact_match_ci_low/high``
(95% interval over the seeds of the row's model) and, on the chosen PE's rows, ``diff_vs_baseline``
(chosen - NoPE) with its CI, ``p_value``, ``p_adjusted``, ``verdict`` (better | worse | no
detectable difference; ``baseline`` on the control's rows), ``seeds_needed``, ``paired_seeds``
and ``note``; the terminal prints the verdict in words. A verdict needs 6+ seeds.

Writes ``reverse.csv`` (:data:`REVERSE_COLUMNS`, one row per trained model), the training rows
of both models in ``metrics.csv`` (columns ``stage, variant, seed`` tell them apart) and
``summary.csv`` (``solved_step``, ``best_exact_match`` of the chosen PE).
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import build_task, instantiate_component
from transformer_lab.config.knowledge import declared
from transformer_lab.errors import ConfigError
from transformer_lab.measures.statistics import (
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.results.check_rows import CheckRow, Stopwatch, check_table, status
from transformer_lab.results.console import console
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.nope_control import (
    NOPE,
    control_on_thread,
    train_with_control,
)
from transformer_lab.routines.objective import Objective, steps_to_solve
from transformer_lab.routines.variants import seed_list, stage_log, with_choice
from transformer_lab.tasks.sequence import SequenceTransformTask
from transformer_lab.training.trainer import TrainResult, count_parameters

REVERSE_COLUMNS = ["role", "pe", "arch", "seed", "solved", "solved_step", "best_exact_match",
                   "target", "steps", "params", "wall_s", "tokens_per_s", "expected",
                   "best_exact_match_ci_low", "best_exact_match_ci_high", *VERDICT_COLUMNS]
# Chosen-PE exact match this close to the NoPE control's counts as "no better than NoPE".
NO_BETTER_MARGIN = 0.05
# A rotary PE's scores may differ between (m, n) and (m + 1, n + 1) by this fraction of their
# largest magnitude (float32 rounding of the rotation angles).
ROTARY_TOLERANCE = 1e-4

# The expected outcome of a PE whose class declares none (``expected_reversal``).
UNKNOWN_EXPECTATION = "unknown (your own component)"


def arch_name(cfg: DictConfig) -> str:
    return "decoder" if cfg.arch.causal else "encoder"


def pe_label(cfg: DictConfig) -> str:
    """The PE as a table shows it: its group name (the class name of a user's own
    ``_target_``), as the class's ``variant_label`` rewrites it where it declares one (ALiBi in
    an encoder: ``alibi(abs|split)``)."""
    target = str(cfg.pe.get("_target_", ""))
    name = str(cfg.pe.get("name"))
    if not target.startswith("transformer_lab."):
        name = target.rsplit(".", 1)[-1] or name
    label = declared(cfg.pe, "variant_label", name=name, arch=arch_name(cfg))
    return label if isinstance(label, str) else name


def expected_outcome(cfg: DictConfig) -> str:
    """What the PE is expected to do on reversal in this arch, as its class declares it
    (``expected_reversal``); ``UNKNOWN_EXPECTATION`` where it declares nothing."""
    arch = arch_name(cfg)
    expected = declared(cfg.pe, "expected_reversal", arch=arch)
    if isinstance(expected, Mapping):
        expected = expected.get(arch)
    return expected if isinstance(expected, str) else UNKNOWN_EXPECTATION


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight checks of the routine's settings (called by ``validate_config``)."""
    routine = cfg.routine
    target = routine.get("target")
    if isinstance(target, bool) or not isinstance(target, int | float) \
            or not 0.0 < target <= 1.0:
        raise ConfigError(f"routine.target={target} is not valid; it must be in (0, 1] "
                          "(a held-out exact-match fraction, e.g. 0.99)")
    max_steps = routine.get("max_steps")
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError(f"routine.max_steps={max_steps} is not valid; it must be an integer "
                          ">= 1")
    seed_list(cfg)
    if not isinstance(routine.get("control", True), bool):
        raise ConfigError(f"routine.control={routine.get('control')} is not valid; use true or "
                          "false")
    if routine.get("control_thread", "auto") not in ("auto", True, False):
        raise ConfigError(f"routine.control_thread={routine.get('control_thread')} is not "
                          "valid; use auto, true or false")
    if not isinstance(inputs.task, SequenceTransformTask):
        raise ConfigError(f"task={cfg.task.get('name')} has no exact match to reach; "
                          "reverse-task needs task=reverse (or task=copy)")


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


def rotary_relative_check(cfg: DictConfig, n_positions: int = 16) -> CheckRow | None:
    """For a rotary PE: are the scores of one query/key pair a function of ``n - m`` only?

    Rotates the same random ``q`` and ``k`` (1, 1, T, Dh) at every position ``0..T-1`` and
    compares the score matrix ``S[m, n] = q_m . k_n`` with itself shifted by one position:
    ``S[m, n]`` must equal ``S[m + 1, n + 1]``. Returns None for other kinds of PE.
    """
    clock = Stopwatch()
    pe = instantiate_component(cfg, "pe")
    if getattr(pe, "kind", None) != "rotary":
        return None
    head_dim = cfg.model.d_model // cfg.model.n_heads
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(head_dim, generator=generator).expand(1, 1, n_positions, head_dim)
    k = torch.randn(head_dim, generator=generator).expand(1, 1, n_positions, head_dim)
    with torch.no_grad():
        q_rot, k_rot = pe(q.contiguous(), k.contiguous(), torch.arange(n_positions))
    scores = (q_rot @ k_rot.transpose(-2, -1))[0, 0].float()  # (T, T): S[m, n] = q_m . k_n
    drift = (scores[1:, 1:] - scores[:-1, :-1]).abs()  # (T-1, T-1): S[m+1, n+1] vs S[m, n]
    scale = scores.abs().max().clamp_min(1e-12).item()
    worst = drift.max().item()
    ok = worst <= ROTARY_TOLERANCE * scale
    m, n = divmod(int(drift.argmax()), n_positions - 1)
    if ok:
        detail = f"q.k depends on n-m only (largest drift {worst / scale:.1e} of |S|)"
    else:
        detail = (f"q.k at positions (m={m}, n={n}) is {scores[m, n]:.4g} but at "
                  f"({m + 1}, {n + 1}) it is {scores[m + 1, n + 1]:.4g}: a rotary PE must make "
                  "scores depend on n-m only; check that q and k get the same rotation (same "
                  "pairing half/interleaved, same angles per position)")
    return CheckRow(3, "rotary_relative", status(ok), "relative_drift", worst / scale,
                    ROTARY_TOLERANCE, clock.lap(), detail)


# Config groups whose classes may declare ``reversal_settings`` (later ones win on a clash).
DECLARING_GROUPS = ("pe", "block", "norm_layer", "ffn")


def with_declared_settings(cfg: DictConfig) -> tuple[DictConfig, str]:
    """``cfg`` with the reversal settings its components' classes declare (``reversal_settings``:
    dotted ``train.*`` / ``routine.max_steps`` keys, e.g. ALiBi's cosine schedule), which the
    NoPE control then shares; off with ``routine.declared_settings=false``. Also returns a note
    naming them ("" when there are none)."""
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


def reversal_runs(cfg: DictConfig, log: CsvLog | None = None,
                  stage: str = "reverse") -> tuple[list[CheckRow], list[ReversalRun]]:
    """Step 3: the rotary check, the chosen PE's training and the NoPE control; training rows
    go to ``log`` tagged with ``stage``, the PE and the seed. The PE's declared reversal
    settings (:func:`with_declared_settings`) apply to both."""
    cfg, note = with_declared_settings(cfg)
    routine = cfg.routine
    target, max_steps = float(routine.target), int(routine.max_steps)
    rows: list[CheckRow] = []
    rotary = rotary_relative_check(cfg)
    if rotary is not None:
        rows.append(rotary)

    label, arch = pe_label(cfg), arch_name(cfg)
    with_control = bool(routine.get("control", True)) and label != NOPE
    seeds = seed_list(cfg)
    if len(seeds) > 1 or not with_control:
        pairs = seeded_reversals(cfg, seeds, log, stage, with_control)
    else:  # one seed with its control: the control may train beside it (nope_control.py)
        nope_cfg = with_choice(cfg, "pe", NOPE)
        on_thread = control_on_thread(cfg)
        with progress_bar(log, f"reversal: pe={label}, arch={arch}, NoPE control "
                          f"{'beside it' if on_thread else 'after it'}", total=2 * max_steps):
            chosen_trainer, result, control_trainer, control_result = train_with_control(
                cfg, nope_cfg, log, stage, max_steps, target, on_thread, label)
        pairs = [(ReversalRun("chosen", label, arch, int(cfg.seed), target, result,
                              count_parameters(chosen_trainer.model), expected_outcome(cfg)),
                  ReversalRun("nope_control", NOPE, arch, int(cfg.seed), target,
                              control_result, count_parameters(control_trainer.model),
                              expected_outcome(nope_cfg)))]
    runs = []
    for chosen, control in pairs:
        rows.append(chosen_row(chosen, control, with_seed=len(seeds) > 1))
        rows[-1].detail += f"; {note}" if note else ""
        runs.append(chosen)
        if control is not None:
            rows.append(control_row(control, with_seed=len(seeds) > 1))
            runs.append(control)
    return rows, runs


def seeded_reversals(cfg: DictConfig, seeds: list[int], log: CsvLog | None, stage: str,
                     with_control: bool) -> list[tuple[ReversalRun, ReversalRun | None]]:
    """The chosen PE with every seed (``multiseed.fit_seeds``: one vectorised model where that
    pays), then (``with_control``) the NoPE controls, each for as many steps as the chosen PE
    took with its seed."""
    chosen = train_seeds(cfg, "chosen", seeds, int(cfg.routine.max_steps), log, stage)
    if not with_control:
        return [(run, None) for run in chosen]
    budgets = {run.seed: run.result.solved_step or run.result.steps for run in chosen}
    controls = train_seeds(with_choice(cfg, "pe", NOPE), "nope_control", seeds, budgets, log,
                           stage)
    return list(zip(chosen, controls, strict=True))


def train_seeds(cfg: DictConfig, role: str, seeds: list[int], steps: int | dict[int, int],
                log: CsvLog | None, stage: str) -> list[ReversalRun]:
    """Every seed of ``cfg`` until solved or its budget (``steps``, or ``steps[seed]``), with
    the schedule planned for ``routine.max_steps`` as in a one-seed run."""
    from transformer_lab.training.multiseed import build_seeded_models, fit_seeds

    target, name, arch = float(cfg.routine.target), pe_label(cfg), arch_name(cfg)
    which = f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
    total = sum(steps.values()) if isinstance(steps, dict) else steps * len(seeds)
    with progress_bar(log, f"reversal: pe={name}, arch={arch}, {which}", total=total):
        task = build_task(cfg)  # (also sets model.vocab_size)
        models = build_seeded_models(cfg, seeds)
        results = fit_seeds(cfg, seeds, steps, task=task, models=models,
                            target_exact_match=target, horizon=int(cfg.routine.max_steps),
                            metrics={s: stage_log(log, stage, name, s) for s in seeds})
    return [ReversalRun(role, name, arch, seed, target, result, count_parameters(model),
                        expected_outcome(cfg))
            for seed, model, result in zip(seeds, models, results, strict=True)]


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


def run_reverse(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    clock = Stopwatch()
    rows, runs = reversal_runs(cfg, run.metrics)
    table = reverse_rows(runs)
    run.write_table("reverse", table, REVERSE_COLUMNS)
    console.print(check_table(rows, f"tlab reverse-task - {run.path}"))
    if (line := verdict_line(table)) is not None:
        console.print(line, highlight=False, markup=False)
    failed = [r for r in rows if not r.passed]
    summary = {**reversal_summary(runs), "wall_s": clock.lap()}
    message = "; ".join(f"{r.check}: {r.detail}" for r in failed)
    return RoutineOutcome(passed=not failed, summary=summary, message=message)


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("steps_to_solve", "minimize", steps_to_solve)
