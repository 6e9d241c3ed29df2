"""tlab reverse-task: reverse.csv and summary.csv, PASS for PEs that can reverse, FAIL for the
NoPE encoder, the NoPE control, the rotary relative-position check, bad input."""

from __future__ import annotations

import time

import pytest
from helpers import assert_refused, read_csv

from transformer_lab.routines.check import rotary_relative_check
from transformer_lab.routines.reverse_task import REVERSE_COLUMNS, expected_outcome, reversal_runs

# Encoder reversal of 4 tokens at the reverse-task defaults, with a smaller held-out set.
FAST = ["task.eval_size=128"]



def test_reverse_task_passes_with_sinusoidal_and_writes_tables(tlab, tmp_path):
    out = tmp_path / "rev"
    code, stdout, _ = tlab("experiment=reverse_task", "pe=sinusoidal", *FAST,
                           f"hydra.run.dir={out}")
    assert code == 0, stdout
    rows = read_csv(out / "reverse.csv")
    assert list(rows[0]) == REVERSE_COLUMNS
    chosen, control = rows
    assert (chosen["role"], chosen["pe"], chosen["solved"]) == ("chosen", "sinusoidal", "True")
    assert float(chosen["best_exact_match"]) >= 0.99
    # The control trains exactly as long as the chosen PE needed, and cannot reverse.
    assert (control["role"], control["pe"], control["solved"]) == ("nope_control", "none",
                                                                   "False")
    assert control["steps"] == chosen["solved_step"] == chosen["steps"]
    assert float(control["best_exact_match"]) < 0.3
    (summary,) = read_csv(out / "summary.csv")
    assert summary["status"] == "passed"
    assert summary["solved_step"] == chosen["solved_step"]
    assert float(summary["best_exact_match"]) >= 0.99
    metrics = read_csv(out / "metrics.csv")
    assert {r["variant"] for r in metrics} == {"sinusoidal", "none"}
    assert {r["stage"] for r in metrics} == {"reverse_task"}
    assert "nope_control" in stdout


def test_nope_encoder_fails_and_says_why(tlab, tmp_path):
    out = tmp_path / "nope"
    code, stdout, _ = tlab("experiment=reverse_task", "pe=none", "routine.max_steps=60", *FAST,
                           f"hydra.run.dir={out}")
    assert code == 1
    (row,) = read_csv(out / "reverse.csv")  # no control: the chosen PE is the control
    assert row["solved"] == "False" and float(row["best_exact_match"]) < 0.3
    (summary,) = read_csv(out / "summary.csv")
    assert summary["status"] == "failed"
    assert "positions" in summary["error"]


# PEs that reverse at the reverse-task defaults (experiments/reverse_expectations.md).
SOLVERS = [  # sinusoidal-encoder: test_reverse_task_passes_with_sinusoidal_and_writes_tables
    ("pe=learned", "encoder"),
    ("pe=sinusoidal_learned", "encoder"),
    ("pe=rope", "encoder"),
    ("pe=t5", "encoder"),
    ("pe=sinusoidal", "decoder"),
    ("pe=rope", "decoder"),
]


@pytest.mark.parametrize(("pe", "arch"), SOLVERS)
def test_pe_that_can_reverse_does(spec_for, pe, arch):
    spec, _ = spec_for("experiment=reverse_task", *pe.split(), f"arch={arch}",
                       "routine.control=false", *FAST)
    rows, runs = reversal_runs(spec)
    (chosen,) = runs
    assert chosen.result.solved_step is not None, (pe, arch, chosen.result)
    assert all(row.passed for row in rows)
    assert expected_outcome(spec).startswith("solves")


def test_rotary_relative_check_catches_mismatched_pairing(spec_for, monkeypatch):
    from transformer_lab.config.variants import with_value

    spec, _ = spec_for("experiment=reverse_task", "pe=rope")
    row = rotary_relative_check(spec)
    assert row is not None and row.status == "PASS"

    from transformer_lab.components.positional import apply_rotary, rotary

    class Mismatched(rotary.RotaryPositionalEncoding):
        def forward(self, q, k, positions):
            return (apply_rotary(q, positions, style="half"),
                    apply_rotary(k, positions, style="interleaved"))

    monkeypatch.setattr(rotary, "RotaryPositionalEncoding", Mismatched)
    spec = with_value(spec, "pe._target_",
                      "transformer_lab.components.positional.rotary.RotaryPositionalEncoding")
    row = rotary_relative_check(spec)
    assert row.status == "FAIL"
    assert "positions" in row.detail and "pairing" in row.detail
    assert rotary_relative_check(spec_for("experiment=reverse_task", "pe=sinusoidal")[0]) is None


def test_control_failing_to_be_blind_is_flagged(spec_for, monkeypatch):
    """A NoPE encoder that reverses means a component leaks position: the control fails."""
    from transformer_lab.routines import reverse_task

    spec, _ = spec_for("experiment=reverse_task", "pe=sinusoidal", "routine.max_steps=10", *FAST)
    real = reverse_task.train_reversal

    def leaky(spec, role, *args):
        run = real(spec, role, *args)
        if role == "nope_control":
            run.result.solved_step, run.result.best_exact_match = 10, 1.0
        return run

    monkeypatch.setattr(reverse_task, "train_reversal", leaky)
    rows, _ = reversal_runs(spec)
    control = next(row for row in rows if row.check == "nope_control")
    assert control.status == "FAIL"
    assert "mixes positions" in control.detail


@pytest.mark.parametrize(("max_steps", "schedule"), [
    (20, "constant"), (300, "warmup_cosine")], ids=["chosen-runs-out", "chosen-solves-cosine"])
def test_the_control_takes_the_chosen_pes_steps_on_its_schedule(spec_for, max_steps, schedule):
    """The NoPE control trains for as many steps as the chosen PE took, with the chosen PE's
    schedule planned for routine.max_steps: its numbers are a run of its own with that budget
    and that horizon."""
    common = ["experiment=reverse_task", f"train.schedule={schedule}", "train.warmup=10", *FAST]
    chosen, control = reversal_runs(spec_for(*common, "pe=sinusoidal",
                                             f"routine.max_steps={max_steps}")[0])[1]
    assert (chosen.result.solved_step is None) == (max_steps == 20)
    assert control.result.steps == (chosen.result.solved_step or max_steps)
    from transformer_lab.routines.reverse_task import train_reversal

    alone = train_reversal(spec_for(*common, "pe=none", f"routine.max_steps={max_steps}")[0],
                           "nope_control", 0, control.result.steps, None)
    assert alone.result.train_losses == control.result.train_losses
    assert alone.result.best_exact_match == control.result.best_exact_match


def test_seeds_match_runs_of_their_own(spec_for):
    """reverse-task --seeds 3: each seed's chosen PE and NoPE control get the numbers of a
    one-seed run; each control trains for as many steps as its own seed's chosen PE."""
    common = ["experiment=reverse_task", "pe=learned", "routine.max_steps=40", *FAST]
    started = time.perf_counter()
    rows, runs = reversal_runs(spec_for(*common, "routine.seeds=3", "seed=3")[0])
    elapsed = time.perf_counter() - started
    assert sum(r.result.wall_s for r in runs) <= elapsed  # each run's wall time is its own
    assert sorted((r.seed, r.variant) for r in runs) == [(seed, role) for seed in (3, 4, 5)
                                                     for role in ("chosen", "nope_control")]
    assert [row.check for row in rows if row.check != "rotary_relative"] == [
        "reverse_exact_match", "nope_control"] * 3
    assert all(row.detail.startswith("seed ") for row in rows)
    for together in runs:
        if together.variant == "chosen":
            overrides = ["pe=learned"]
        else:  # the control's budget: the steps its own seed's chosen PE took
            chosen = next(r for r in runs if r.variant == "chosen" and r.seed == together.seed)
            assert together.result.steps == (chosen.result.solved_step or chosen.result.steps)
            overrides = ["pe=none", f"routine.max_steps={together.result.steps}"]
        _, (alone,) = reversal_runs(spec_for(*common, f"seed={together.seed}", *overrides,
                                             "routine.control=false")[0])
        assert together.result.steps == alone.result.steps
        assert together.result.train_losses == alone.result.train_losses  # (a constant lr)
        assert together.result.best_exact_match == alone.result.best_exact_match


@pytest.mark.parametrize(("args", "message"), [
    (["routine.target=1.5"], "routine.target=1.5"),
    (["task.seq_len=1"], "task.seq_len=1"),
    (["routine.seeds=0"], "routine.seeds=0"),
    (["task=lm", "arch=decoder"], "task=reverse"),
    (["pe._target_=no_such_module.MyPE"], "no_such_module"),
])
def test_bad_input_exits_2_before_writing(tlab, tmp_path, args, message):
    out = tmp_path / "bad"
    assert_refused(tlab("experiment=reverse_task", *args, f"hydra.run.dir={out}"), out, message)


@pytest.mark.parametrize(("option", "value"), [("--target", "1.5"), ("--target", "0"),
                                               ("--seq-len", "1"), ("--max-steps", "0")])
def test_cli_options_are_checked(tmp_path, option, value):
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    result = CliRunner().invoke(app, ["reverse-task", option, value, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert option in result.output
    assert not (tmp_path / "x").exists()


def test_reverse_is_deterministic(spec_for):
    spec, _ = spec_for("experiment=reverse_task", "pe=learned", "routine.max_steps=20",
                       "routine.control=false", *FAST)
    first = reversal_runs(spec)[1][0].result
    second = reversal_runs(spec)[1][0].result
    assert first.train_losses == second.train_losses
    assert first.best_exact_match == second.best_exact_match
