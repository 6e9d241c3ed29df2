"""tlab reverse-task: reverse.csv and summary.csv, PASS for PEs that can reverse, FAIL for the
NoPE encoder, the NoPE control, the rotary relative-position check, bad input."""

from __future__ import annotations

import time

import pytest
from helpers import assert_refused, read_csv

from transformer_lab.routines.check import rotary_relative_check
from transformer_lab.routines.reverse import expected_outcome, reversal_runs
from transformer_lab.routines.reverse_results import REVERSE_COLUMNS

# Encoder reversal of 4 tokens at the reverse-task defaults, with a smaller held-out set.
FAST = ["task.eval_size=128"]



def test_reverse_task_passes_with_sinusoidal_and_writes_tables(tlab, tmp_path):
    out = tmp_path / "rev"
    code, stdout, _ = tlab("experiment=reverse", "pe=sinusoidal", *FAST, f"hydra.run.dir={out}")
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
    assert {r["stage"] for r in metrics} == {"reverse"}
    assert "nope_control" in stdout


def test_nope_encoder_fails_and_says_why(tlab, tmp_path):
    out = tmp_path / "nope"
    code, stdout, _ = tlab("experiment=reverse", "pe=none", "routine.max_steps=60", *FAST,
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
def test_pe_that_can_reverse_does(cfg_for, pe, arch):
    cfg = cfg_for("experiment=reverse", *pe.split(), f"arch={arch}", "routine.control=false",
                  *FAST)
    rows, runs = reversal_runs(cfg)
    (chosen,) = runs
    assert chosen.solved, (pe, arch, chosen.exact_match, chosen.result.steps)
    assert all(row.passed for row in rows)
    assert expected_outcome(cfg).startswith("solves")


def test_rotary_relative_check_catches_mismatched_pairing(cfg_for, monkeypatch):
    cfg = cfg_for("experiment=reverse", "pe=rope")
    row = rotary_relative_check(cfg)
    assert row is not None and row.status == "PASS"

    from transformer_lab.components.positional import apply_rotary, rotary

    class Mismatched(rotary.RotaryPositionalEncoding):
        def forward(self, q, k, positions):
            return (apply_rotary(q, positions, style="half"),
                    apply_rotary(k, positions, style="interleaved"))

    monkeypatch.setattr(rotary, "RotaryPositionalEncoding", Mismatched)
    cfg.pe._target_ = "transformer_lab.components.positional.rotary.RotaryPositionalEncoding"
    row = rotary_relative_check(cfg)
    assert row.status == "FAIL"
    assert "positions" in row.detail and "pairing" in row.detail
    assert rotary_relative_check(cfg_for("experiment=reverse", "pe=sinusoidal")) is None


def test_control_failing_to_be_blind_is_flagged(cfg_for, monkeypatch):
    """A NoPE encoder that reverses means a component leaks position: the control fails."""
    from transformer_lab.routines import reverse

    cfg = cfg_for("experiment=reverse", "pe=sinusoidal", "routine.max_steps=10", *FAST)
    real = reverse.train_with_control

    def leaky(*args):
        chosen, result, control, control_result = real(*args)
        control_result.solved_step, control_result.best_exact_match = 10, 1.0
        return chosen, result, control, control_result

    monkeypatch.setattr(reverse, "train_with_control", leaky)
    rows, _ = reversal_runs(cfg)
    control = next(row for row in rows if row.check == "nope_control")
    assert control.status == "FAIL"
    assert "mixes positions" in control.detail


@pytest.mark.parametrize(("max_steps", "schedule"), [
    (20, "constant"), (300, "constant"), (300, "warmup_cosine")],
    ids=["chosen-runs-out", "chosen-solves", "chosen-solves-cosine"])
def test_control_on_a_second_thread_equals_control_after(cfg_for, max_steps, schedule):
    """The NoPE control beside the chosen PE (Lockstep) takes exactly the steps and gets exactly
    the numbers it gets when trained after it (with the chosen PE's schedule, planned for
    routine.max_steps, in both cases)."""
    runs = {}
    for on_thread in ("true", "false"):
        cfg = cfg_for("experiment=reverse", "pe=sinusoidal", f"routine.max_steps={max_steps}",
                      f"routine.control_thread={on_thread}", f"train.schedule={schedule}",
                      "train.warmup=10", *FAST)
        runs[on_thread] = reversal_runs(cfg)[1]
    (chosen, control), (chosen_serial, control_serial) = runs["true"], runs["false"]
    assert control.result.steps == (chosen.result.solved_step or max_steps)
    assert (chosen.result.solved_step is None) == (max_steps == 20)
    for threaded, serial in ((chosen, chosen_serial), (control, control_serial)):
        assert threaded.result.steps == serial.result.steps
        assert threaded.result.train_losses == serial.result.train_losses
        assert threaded.result.best_exact_match == serial.result.best_exact_match


@pytest.mark.parametrize("batch", [16, 256], ids=["vectorised", "one-after-another"])
def test_seeds_together_match_runs_of_their_own(cfg_for, batch):
    """reverse-task --seeds 3: each seed's chosen PE and NoPE control get the numbers of a
    one-seed run; each control trains for as many steps as its own seed's chosen PE."""
    common = ["experiment=reverse", "pe=learned", "routine.max_steps=40",
              f"train.batch_size={batch}", *FAST]
    started = time.perf_counter()
    rows, runs = reversal_runs(cfg_for(*common, "routine.seeds=3", "seed=3"))
    elapsed = time.perf_counter() - started
    if batch == 256:  # one after another: each run's wall time is its own, not cumulative
        assert sum(r.result.wall_s for r in runs) <= elapsed
    assert [(r.role, r.seed) for r in runs] == [(role, seed) for seed in (3, 4, 5)
                                               for role in ("chosen", "nope_control")]
    assert [row.check for row in rows if row.check != "rotary_relative"] == [
        "reverse_exact_match", "nope_control"] * 3
    assert all(row.detail.startswith("seed ") for row in rows)
    for together in runs:
        if together.role == "chosen":
            overrides = ["pe=learned"]
        else:  # the control's budget: the steps its own seed's chosen PE took
            chosen = next(r for r in runs if r.role == "chosen" and r.seed == together.seed)
            assert together.result.steps == (chosen.result.solved_step or chosen.result.steps)
            overrides = ["pe=none", f"routine.max_steps={together.result.steps}"]
        _, (alone,) = reversal_runs(cfg_for(*common, f"seed={together.seed}", *overrides,
                                            "routine.control=false"))
        assert together.result.steps == alone.result.steps
        assert together.result.train_losses == pytest.approx(alone.result.train_losses,
                                                             rel=1e-5, abs=1e-6)
        assert together.exact_match == pytest.approx(alone.exact_match, abs=1e-9)


def test_ctrl_c_with_the_control_on_a_thread_keeps_both_models_rows(tlab, tmp_path,
                                                                      monkeypatch):
    """Ctrl-C reaches the main thread (the chosen PE): the control stops at the same step,
    both models' rows are kept, the run says interrupted, exit 130, and nothing hangs."""
    import threading

    from transformer_lab.training.trainer import Trainer

    real_step = Trainer.train_step

    def step_then_interrupt(self, batch):
        if threading.current_thread() is threading.main_thread() and self.step_count == 25:
            raise KeyboardInterrupt
        return real_step(self, batch)

    monkeypatch.setattr(Trainer, "train_step", step_then_interrupt)
    out = tmp_path / "int"
    code, _, err = tlab("experiment=reverse", "pe=sinusoidal", "routine.control_thread=true",
                        "train.log_every=5", *FAST, f"hydra.run.dir={out}")
    assert code == 130
    assert "interrupted" in err
    (summary,) = read_csv(out / "summary.csv")
    assert summary["status"] == "interrupted"
    steps = {}
    for row in read_csv(out / "metrics.csv"):
        if row["split"] == "train":
            steps.setdefault(row["variant"], []).append(int(row["step"]))
    assert steps["sinusoidal"][-1] == 25 and steps["none"][-1] == 25, steps


@pytest.mark.parametrize(("overrides", "cores", "expected"), [
    ([], 2, True),
    ([], 1, False),                                   # no core to spare
    (["train.threads=2"], 2, False),                  # the chosen PE uses both
    (["model.dropout.ffn=0.1"], 2, False),            # dropout draws from the global RNG
    (["routine.control_thread=true"], 1, True),
    (["routine.control_thread=false"], 8, False),
])
def test_when_the_control_gets_a_thread(cfg_for, monkeypatch, overrides, cores, expected):
    from transformer_lab.routines import nope_control

    monkeypatch.setattr(nope_control, "available_cores", lambda: cores)
    assert nope_control.control_on_thread(cfg_for("experiment=reverse", *overrides)) is expected


def test_lockstep_follower_stops_where_a_failing_leader_stopped():
    """A leader that dies at step 7 must not leave the follower waiting: it stops at 7."""
    import threading

    from transformer_lab.training.lockstep import Lockstep

    lockstep, taken = Lockstep(), []

    def follower() -> None:
        step = 1
        while lockstep.may_take(step):
            taken.append(step)
            step += 1

    thread = threading.Thread(target=follower)
    thread.start()
    try:
        for step in range(1, 100):
            lockstep.took(step)
            if step == 7:
                raise RuntimeError("leader failed")
    except RuntimeError:
        pass
    finally:
        lockstep.stopped(7)
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert taken == list(range(1, 8))


@pytest.mark.parametrize(("args", "message"), [
    (["routine.target=1.5"], "routine.target=1.5"),
    (["task.seq_len=1"], "task.seq_len=1"),
    (["routine.seeds=0"], "routine.seeds=0"),
    (["routine.control_thread=maybe"], "routine.control_thread=maybe"),
    (["task=lm", "arch=decoder"], "task=reverse"),
    (["pe._target_=no_such_module.MyPE"], "no_such_module"),
])
def test_bad_input_exits_2_before_writing(tlab, tmp_path, args, message):
    out = tmp_path / "bad"
    assert_refused(tlab("experiment=reverse", *args, f"hydra.run.dir={out}"), out, message)


@pytest.mark.parametrize(("option", "value"), [("--target", "1.5"), ("--target", "0"),
                                               ("--seq-len", "1"), ("--max-steps", "0")])
def test_cli_options_are_checked(tmp_path, option, value):
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    result = CliRunner().invoke(app, ["reverse-task", option, value, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert option in result.output
    assert not (tmp_path / "x").exists()


def test_reverse_is_deterministic(cfg_for):
    cfg = cfg_for("experiment=reverse", "pe=learned", "routine.max_steps=20",
                  "routine.control=false", *FAST)
    first = reversal_runs(cfg)[1][0].result
    second = reversal_runs(cfg)[1][0].result
    assert first.train_losses == second.train_losses
    assert first.best_exact_match == second.best_exact_match
