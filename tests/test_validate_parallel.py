"""tlab validate's step 4 in a second process beside steps 1-3 (``routine.parallel``): the same
numbers and files as one step after another, a failing step 1 or an error in the child, and
signals (Ctrl-C ends both processes, exit 130, no orphan)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TLAB, assert_refused, default_ctrl_c, read_csv

from transformer_lab.config.compose import compose
from transformer_lab.config.spec import RunSpec
from transformer_lab.routines import validate
from transformer_lab.training.threads import available_cores, torch_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or available_cores() < 2,
                                reason="step 4 runs beside steps 1-3 on Linux with 2+ cores")

FAST = ["experiment=validate", "routine.compare.routine.steps=20", "task.eval_size=128"]
TIMING = {"wall_s", "tokens_per_s", "elapsed_s", "rel_speed"}
STEP4_FILES = ("comparison.csv", "compare_runs.csv", "loss_curves.png")


@pytest.fixture
def children(monkeypatch) -> list[int]:
    """The pids of the step-4 children started (``StepBeside.__init__`` spied on)."""
    pids: list[int] = []
    init = validate.StepBeside.__init__

    def spy(self, step, run):
        init(self, step, run)
        pids.append(self.process.pid)

    monkeypatch.setattr(validate.StepBeside, "__init__", spy)
    return pids


def _without_timings(rows: list[dict]) -> list[dict]:
    """Rows minus their timing columns (and the tok/s figures in check details)."""
    return [{k: re.sub(r"[\d.]+ tok/s \([\d.]+x\)", "tok/s", v) for k, v in row.items()
             if k not in TIMING} for row in rows]


def _gone(pid: int, within: float = 10.0) -> bool:
    """True once ``pid`` no longer runs: no such process, or a zombie that is not this test
    process's to reap (its parent has exited and init reaps it)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            return True
        if fields[0] in ("Z", "X") and int(fields[1]) != os.getpid():
            return True
        time.sleep(0.05)
    return False


def test_same_numbers_and_files_as_one_step_after_another(tlab, tmp_path, children):
    outs = {}
    for parallel in ("true", "false"):
        outs[parallel] = tmp_path / parallel
        code, stdout, _ = tlab(*FAST, "pe=sinusoidal", f"routine.parallel={parallel}",
                               f"hydra.run.dir={outs[parallel]}")
        assert code == 0, stdout
    assert len(children) == 1  # only the parallel run forked
    assert _gone(children[0])
    beside, after = outs["true"], outs["false"]
    for name in ("validation.csv", "comparison.csv", "compare_runs.csv", "metrics.csv",
                 "reverse.csv"):
        rows_beside, rows_after = read_csv(beside / name), read_csv(after / name)
        assert list(rows_beside[0]) == list(rows_after[0]), name
        assert _without_timings(rows_beside) == _without_timings(rows_after), name
    assert {r["stage"] for r in read_csv(beside / "metrics.csv")[-5:]} == {"compare"}
    assert (beside / "loss_curves.png").stat().st_size > 0
    assert not (beside / validate.StepBeside.STAGING).exists()
    step4 = [r for r in read_csv(beside / "validation.csv") if r["step"] == "4"]
    assert all(float(r["wall_s"]) > 0 for r in step4)  # the child's own time


def test_failing_step_1_stops_the_child_and_leaves_no_step_4_file(tlab, tmp_path, monkeypatch,
                                                                  children):
    from transformer_lab.results.check_rows import CheckRow

    real = validate.forward_backward_check

    def broken(spec, model, batch):
        rows = real(spec, model, batch)
        rows[0] = CheckRow(1, "loss_finite", "FAIL", "loss", float("nan"), "finite")
        return rows

    monkeypatch.setattr(validate, "forward_backward_check", broken)
    out = tmp_path / "step1"
    code, _, _ = tlab(*FAST, f"hydra.run.dir={out}")
    assert code == 1 and len(children) == 1
    assert _gone(children[0])
    rows = read_csv(out / "validation.csv")
    assert [(r["step"], r["status"]) for r in rows if r["step"] != "1"] == [
        ("2", "SKIP"), ("3", "SKIP"), ("4", "SKIP")]
    assert not any((out / name).exists() for name in (*STEP4_FILES, validate.StepBeside.STAGING))
    assert not (out / "metrics.csv").exists()  # nothing trained, as one after another


def _child_fails(tlab, tmp_path, monkeypatch, fail) -> tuple[int, str, str, dict]:
    from transformer_lab.routines import compare

    monkeypatch.setattr(compare, "train_seed", fail)
    out = tmp_path / "child"
    code, stdout, err = tlab(*FAST, "pe=sinusoidal", f"hydra.run.dir={out}")
    (row,) = [r for r in read_csv(out / "validation.csv") if r["step"] == "4"]
    assert "Traceback" not in stdout + err
    assert not (out / validate.StepBeside.STAGING).exists()
    return code, stdout, err, row


def test_an_exception_in_the_child_is_a_fail_row_of_step_4(tlab, tmp_path, monkeypatch, children):
    def boom(*args, **kwargs):
        raise RuntimeError("boom in the FFN")

    code, stdout, _, row = _child_fails(tlab, tmp_path, monkeypatch, boom)
    assert code == 1 and len(children) == 1
    assert (row["check"], row["status"]) == ("activations_train", "FAIL")
    assert "RuntimeError: boom in the FFN" in row["detail"]
    assert "step 4 failed" in stdout


def test_a_divergence_in_the_child_is_a_fail_row_of_step_4(tlab, tmp_path, monkeypatch,
                                                           children):
    from transformer_lab.errors import Diverged

    def diverge(*args, **kwargs):
        raise Diverged("loss is nan at step 3")

    code, _, _, row = _child_fails(tlab, tmp_path, monkeypatch, diverge)
    assert len(children) == 1  # it diverged in the child, not in a one-after-another run
    assert code == 1 and row["status"] == "FAIL"
    assert row["detail"] == "diverged: loss is nan at step 3"


def test_a_killed_child_is_a_fail_row_naming_the_signal(tlab, tmp_path, monkeypatch):
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    code, _, _, row = _child_fails(tlab, tmp_path, monkeypatch, killed)
    assert code == 1 and row["status"] == "FAIL"
    assert "killed by SIGKILL" in row["detail"]


def test_parallel_setting(tmp_path, tlab, monkeypatch):
    def spec(*overrides: str) -> RunSpec:
        return RunSpec.of(compose(["experiment=validate", *overrides]))

    with torch_threads(1):  # as the runner sets it from train.threads (1 by default)
        assert validate.comparison_beside(spec())
        assert not validate.comparison_beside(spec("routine.parallel=false"))
        for override in ("train.threads=2", "train.threads=null", "train.device=cuda"):
            assert not validate.comparison_beside(spec(override)), override
    with torch_threads(2):
        assert not validate.comparison_beside(spec())
    monkeypatch.setattr(sys, "platform", "darwin")
    with torch_threads(1):
        assert not validate.comparison_beside(spec())
    monkeypatch.undo()
    out = tmp_path / "bad"
    assert_refused(tlab("experiment=validate", "routine.parallel=sometimes",
                        f"hydra.run.dir={out}"), out, "routine.parallel=sometimes",
                   "true or false")


def _start(out: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """``tlab validate`` whose step 4 runs long, started in a session of its own; returns
    the process and its step-4 child's pid once the child exists."""
    process = subprocess.Popen([TLAB, "validate", "--out", str(out), *args,
                                "routine.compare.routine.steps=100000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=default_ctrl_c)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        kids = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        pids = [int(p) for p in kids.read_text().split()] if kids.exists() else []
        if pids and (out / validate.StepBeside.STAGING).exists():
            return process, pids[0]
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"no step-4 child appeared: {process.communicate()}")


@pytest.mark.parametrize("group", [False, True], ids=["parent_only", "process_group"])
def test_ctrl_c_ends_both_processes(tmp_path, group):
    out = tmp_path / "int"
    process, child = _start(out)
    if group:  # Ctrl-C at a terminal: the whole foreground group gets SIGINT
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=60)
    finally:  # never leave a validate with a 100000-step step 4 running after a failure
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert _gone(child)
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert not any((out / name).exists() for name in (*STEP4_FILES, validate.StepBeside.STAGING))


def test_the_child_dies_with_a_killed_parent(tmp_path):
    process, child = _start(tmp_path / "killed")
    process.kill()
    process.communicate(timeout=60)
    assert _gone(child)
