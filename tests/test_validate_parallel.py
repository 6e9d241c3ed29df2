"""tlab validate's step 4 on a second thread beside steps 1-3 (``routine.parallel``): the same
numbers and files as one step after another; a failing step 1, an error or a divergence on the
thread; Ctrl-C (exit 130, the thread stopped, no step-4 file)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time

import pytest
from helpers import TLAB, assert_refused, read_csv

from transformer_lab.config.compose import compose
from transformer_lab.routines import validate
from transformer_lab.training.threads import available_cores, torch_threads

pytestmark = pytest.mark.skipif(available_cores() < 2,
                                reason="step 4 runs beside steps 1-3 with 2+ cores")

FAST = ["experiment=validate", "routine.compare.routine.steps=20", "task.eval_size=128"]
TIMING = {"wall_s", "tokens_per_s", "elapsed_s", "rel_speed"}
STEP4_FILES = ("comparison.csv", "compare_runs.csv", "loss_curves.png")


@pytest.fixture
def threads_started(monkeypatch) -> list[validate.StepBeside]:
    """The ``StepBeside`` objects a run makes (its constructor spied on)."""
    made: list[validate.StepBeside] = []
    init = validate.StepBeside.__init__

    def spy(self, step, run):
        init(self, step, run)
        made.append(self)

    monkeypatch.setattr(validate.StepBeside, "__init__", spy)
    return made


def _without_timings(rows: list[dict]) -> list[dict]:
    """Rows minus their timing columns (and the tok/s figures in check details)."""
    return [{k: re.sub(r"[\d.]+ tok/s \([\d.]+x\)", "tok/s", v) for k, v in row.items()
             if k not in TIMING} for row in rows]


def test_same_numbers_and_files_as_one_step_after_another(tlab, tmp_path, threads_started):
    outs = {}
    for parallel in ("true", "false"):
        outs[parallel] = tmp_path / parallel
        code, stdout, _ = tlab(*FAST, "pe=sinusoidal", f"routine.parallel={parallel}",
                               f"hydra.run.dir={outs[parallel]}")
        assert code == 0, stdout
    assert len(threads_started) == 1  # only the parallel run
    assert not threads_started[0].future.running()
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
    assert all(float(r["wall_s"]) > 0 for r in step4)  # the thread's own time


def test_failing_step_1_stops_the_thread_and_leaves_no_step_4_file(tlab, tmp_path,
                                                                   monkeypatch,
                                                                   threads_started):
    from transformer_lab.results.check_rows import CheckRow

    real = validate.forward_backward_check

    def broken(cfg, model, batch):
        rows = real(cfg, model, batch)
        rows[0] = CheckRow(1, "loss_finite", "FAIL", "loss", float("nan"), "finite")
        return rows

    monkeypatch.setattr(validate, "forward_backward_check", broken)
    out = tmp_path / "step1"
    code, _, _ = tlab(*FAST, "routine.compare.routine.steps=100000", f"hydra.run.dir={out}")
    assert code == 1 and len(threads_started) == 1
    assert threads_started[0].future.done()  # stopped at its next row, not after 100000 steps
    assert isinstance(threads_started[0].future.exception(), validate.StepCancelled)
    rows = read_csv(out / "validation.csv")
    assert [(r["step"], r["status"]) for r in rows if r["step"] != "1"] == [
        ("2", "SKIP"), ("3", "SKIP"), ("4", "SKIP")]
    assert not any((out / name).exists()
                   for name in (*STEP4_FILES, validate.StepBeside.STAGING))
    assert not (out / "metrics.csv").exists()  # nothing trained, as one after another


def _step4_fails(tlab, tmp_path, monkeypatch, fail) -> tuple[int, str, str, dict]:
    from transformer_lab.routines import compare

    monkeypatch.setattr(compare, "train_seeds", fail)
    out = tmp_path / "thread"
    code, stdout, err = tlab(*FAST, "pe=sinusoidal", f"hydra.run.dir={out}")
    (row,) = [r for r in read_csv(out / "validation.csv") if r["step"] == "4"]
    assert "Traceback" not in stdout + err
    assert not (out / validate.StepBeside.STAGING).exists()
    return code, stdout, err, row


def test_an_exception_on_the_thread_is_a_fail_row_of_step_4(tlab, tmp_path, monkeypatch,
                                                            threads_started):
    def boom(*args, **kwargs):
        assert threading.current_thread() is not threading.main_thread()
        raise RuntimeError("boom in the FFN")

    code, stdout, _, row = _step4_fails(tlab, tmp_path, monkeypatch, boom)
    assert code == 1 and len(threads_started) == 1
    assert (row["check"], row["status"]) == ("activations_train", "FAIL")
    assert "RuntimeError: boom in the FFN" in row["detail"]
    assert "step 4 failed" in stdout


def test_a_divergence_on_the_thread_is_a_fail_row_of_step_4(tlab, tmp_path, monkeypatch,
                                                            threads_started):
    from transformer_lab.errors import Diverged

    def diverge(*args, **kwargs):
        raise Diverged("loss is nan at step 3")

    code, _, _, row = _step4_fails(tlab, tmp_path, monkeypatch, diverge)
    assert len(threads_started) == 1  # it diverged on the thread
    assert code == 1 and row["status"] == "FAIL"
    assert row["detail"] == "diverged: loss is nan at step 3"


def test_models_built_on_both_threads_get_their_own_seeds_weights():
    """build_model seeds torch's global generator: two threads building at once must each
    get the weights of their own seed."""
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.model import build_model

    cfg = compose(["experiment=smoke"])
    build_task(cfg)
    expected = {seed: build_model(cfg, seed=seed).lm_head.weight.clone() for seed in (1, 2)}
    mismatches: list[int] = []

    def build_many(seed: int) -> None:
        for _ in range(30):
            if not build_model(cfg, seed=seed).lm_head.weight.equal(expected[seed]):
                mismatches.append(seed)

    threads = [threading.Thread(target=build_many, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert mismatches == []


def test_parallel_setting(tmp_path, tlab, monkeypatch):
    cfg = compose(["experiment=validate"])
    with torch_threads(1):  # as the runner sets it from train.threads (1 by default)
        assert validate.comparison_beside(cfg)
    from transformer_lab.training import threads

    monkeypatch.setattr(threads, "available_cores", lambda: 1)
    assert not validate.comparison_beside(cfg)  # no core to spare
    monkeypatch.undo()
    assert not validate.comparison_beside(compose(["experiment=validate",
                                                   "routine.parallel=false"]))
    for override in ("train.threads=2", "model.dropout.ffn=0.1"):
        with torch_threads(1):
            assert not validate.comparison_beside(compose(["experiment=validate", override]))
    out = tmp_path / "bad"
    assert_refused(tlab("experiment=validate", "routine.parallel=sometimes",
                        f"hydra.run.dir={out}"), out, "routine.parallel=sometimes",
                   "true or false")


def test_ctrl_c_stops_the_thread_and_exits_130(tmp_path):
    out = tmp_path / "int"
    process = subprocess.Popen([TLAB, "validate", "--out", str(out),
                                "routine.compare.routine.steps=100000"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + 60
    staging = out / validate.StepBeside.STAGING
    while time.monotonic() < deadline and process.poll() is None and not staging.exists():
        time.sleep(0.05)
    time.sleep(1.0)  # both threads training
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert not any((out / name).exists() for name in (*STEP4_FILES, staging.name))
