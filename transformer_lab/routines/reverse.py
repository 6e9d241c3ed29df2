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
``summary.csv`` (``solved_step``, ``best_exact_match`` of the chosen PE; over several seeds the
worst exact match, the median solved step) and, with several seeds, ``seeds.csv``: one row per
seed with the numbers a one-seed run of that seed puts in its summary but ``tokens_per_s``
(the seeds share one throughput; ``tlab report`` counts each row as a seed).

Here: the settings checks and the training; the rows, ``reverse.csv`` and the verdict are in
``reverse_results.py``, the rotary check in ``rotary_check.py``, the control's training beside
the chosen PE in ``nope_control.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import build_task
from transformer_lab.config.knowledge import declared
from transformer_lab.errors import ConfigError
from transformer_lab.results.check_rows import CheckRow, Stopwatch, check_table
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
from transformer_lab.routines.reverse_results import (
    REVERSE_COLUMNS,
    ReversalRun,
    chosen_row,
    control_row,
    reversal_summary,
    reverse_rows,
    seed_rows,
    verdict_line,
)
from transformer_lab.routines.rotary_check import rotary_relative_check
from transformer_lab.routines.variants import seed_list, stage_log, with_choice
from transformer_lab.tasks.sequence import SequenceTransformTask
from transformer_lab.training.trainer import count_parameters

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


def run_reverse(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    clock = Stopwatch()
    rows, runs = reversal_runs(cfg, run.metrics)
    table = reverse_rows(runs)
    run.write_table("reverse", table, REVERSE_COLUMNS)
    if len(per_seed := seed_rows(runs)) > 1:
        run.write_table("seeds", per_seed)
    console.print(check_table(rows, f"tlab reverse-task - {run.path}"))
    if (line := verdict_line(table)) is not None:
        console.print(line, highlight=False, markup=False)
    failed = [r for r in rows if not r.passed]
    summary = {**reversal_summary(runs), "wall_s": clock.lap()}
    message = "; ".join(f"{r.check}: {r.detail}" for r in failed)
    return RoutineOutcome(passed=not failed, summary=summary, message=message)


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("steps_to_solve", "minimize", steps_to_solve)
