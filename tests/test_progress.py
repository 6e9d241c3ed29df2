"""Progress of training (issue 30, items 2 and 7): the bar counts the steps a language-model
``tlab train`` takes (its held-out rows, which carry ``ppl``, are no steps of their own) and
never passes its total; off a terminal, one flushed plain line per logged step, with the step,
the training and latest held-out loss, tokens/s and the time left; nothing with ``--quiet``."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from helpers import read_csv
from rich.console import Console

from transformer_lab.results.progress import RunProgress
from transformer_lab.results.run_directory import METRIC_COLUMNS, CsvLog
from transformer_lab.routines.train import train_seed

# A 64-token synthetic language (offline) on the tiny model: a fraction of a second a seed.
TINY_LM = ["experiment=train", "task=lm", "model=tiny", "task.eval_size=32",
           "train.batch_size=8", "train.steps=40", "train.eval_every=10", "train.log_every=5"]
STOP_SCRIPT = Path(__file__).with_name("stop_at_step.py")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LINE = re.compile(r"\| (?:seed=(\d+) )?step (\d+)(?:/(\d+)| \((\d+)/(\d+)\)) loss ([0-9.]+)"
                  r"(?: held-out ([0-9.]+) \(step (\d+)\))? ([0-9,]+) tok/s eta \d+:\d\d:\d\d$")


class Recorder:
    """A metrics listener that checks the bar's count after every row."""

    def __init__(self, progress: RunProgress) -> None:
        self.progress = progress
        self.counts: list[tuple[int, int]] = []  # (done, total) after each row
        self.rows: list[dict] = []

    def __call__(self, row: dict) -> None:
        self.progress.on_row(row)
        self.counts.append(self.progress.counted)
        self.rows.append(dict(row))


def test_the_bar_counts_the_steps_of_a_language_model_run(tmp_path, spec_for):
    """The rows two seeds of a real ``task=lm`` training write (train rows, held-out rows with
    ``ppl``) drive the bar: after each row its count is the steps taken so far, at most the
    total, and at the end exactly the steps of both seeds."""
    spec, task = spec_for(*TINY_LM)
    console = Console(file=io.StringIO(), force_terminal=True, width=200, record=True)
    progress = RunProgress(enabled=True, console=console)
    recorder = Recorder(progress)
    log = CsvLog(tmp_path / "metrics.csv", METRIC_COLUMNS, [recorder])
    with progress.phase("train: seeds 0-1, 40 steps", total=80):
        for seed in (0, 1):
            train_seed(spec, task, seed, log)
    val = [row for row in recorder.rows if row["split"] == "val"]
    assert len(val) == 8 and all("ppl" in row for row in val)  # the rows that broke the count
    taken = 0
    for row, (done, total) in zip(recorder.rows, recorder.counts, strict=True):
        if row["split"] == "train":
            taken = 40 * row["seed"] + row["step"]
        assert (done, total) == (taken, 80), row
    assert taken == 80
    text = ANSI.sub("", console.export_text())
    assert "80/80" in text
    shown = [int(n) for n in re.findall(r"(\d+)/80", text)]
    assert shown and max(shown) == 80
    last_val = val[-1]["loss"]
    assert f"held-out {last_val:.4f}" in text  # the latest held-out loss is on the bar


def test_a_terminal_bar_of_tlab_train_ends_at_its_steps(tmp_path):
    """A real ``tlab train`` whose stdout counts as a terminal (``TTY_COMPATIBLE=1``, rich's
    switch): the bar's count is never above the steps and ends at them."""
    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "transformer_lab", "train", *TINY_LM[1:],
                           "--out", str(tmp_path / "run")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = ANSI.sub("", done.stdout)
    counts = [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) loss", out)]
    assert counts and all(total == 40 and n <= 40 for n, total in counts), counts
    assert counts[-1] == (40, 40)
    assert "step 5/40" not in out  # a live bar, no plain lines


def plain_lines(out: str) -> list[tuple]:
    return [LINE.search(line).groups() for line in out.splitlines() if LINE.search(line)]


def test_off_a_terminal_each_logged_step_prints_a_line(tlab, tmp_path):
    """pytest's captured stdout is no terminal: a line every ``log_every`` steps with that step,
    its training loss (as in metrics.csv), the held-out loss of the latest held-out row before
    it, tokens/s and the time left; ``--quiet``: none."""
    code, out, err = tlab(*TINY_LM, "routine.seeds=2", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0, err
    lines = plain_lines(out)
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    train = [r for r in rows if r["split"] == "train"]
    assert len(lines) == len(train) == 16
    held_out: dict[str, tuple[str, str]] = {}
    for n, (line, row) in enumerate(zip(lines, train, strict=True)):
        seed, step, _, _, _, loss, held, held_step, _ = line
        assert int(step) == int(row["step"]) == 5 * (n % 8 + 1)
        assert seed == (None if n < 8 else "1")  # the first seed alone: its step is the count
        assert float(loss) == round(float(row["loss"]), 4)
        assert (held, held_step) == held_out.get(row["seed"], (None, None))
        # the held-out rows written after this train row (same step) show from the next line
        for val in (r for r in rows if r["split"] == "val" and r["step"] == row["step"]
                    and r["seed"] == row["seed"]):
            held_out[row["seed"]] = (f"{float(val['loss']):.4f}", val["step"])
    assert lines[-1][3:5] == ("80", "80")

    code, out, _ = tlab(*TINY_LM, "--quiet", f"hydra.run.dir={tmp_path / 'quiet'}")
    assert code == 0 and not plain_lines(out) and " tok/s eta " not in out


def test_plain_lines_arrive_while_the_run_goes_on(tmp_path):
    """``tlab train | tee``: stdout is a pipe. The child stops itself (SIGSTOP) before step 23;
    while it is stopped the pipe already holds the lines of steps 5 to 20 (flushed as written),
    and after SIGCONT the run ends with the rest."""
    env = {**os.environ, "STOP_AT": "23", "STOP_SIGNAL": "SIGSTOP"}
    child = subprocess.Popen([sys.executable, str(STOP_SCRIPT), *TINY_LM,
                              f"hydra.run.dir={tmp_path / 'run'}"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        _, status = os.waitpid(child.pid, os.WUNTRACED)  # until it has stopped itself
        assert os.WIFSTOPPED(status)
        fd = child.stdout.fileno()
        os.set_blocking(fd, False)
        before = os.read(fd, 1 << 20).decode()  # what the stopped child has written so far
        os.set_blocking(fd, True)
        assert [int(g[1]) for g in plain_lines(before)] == [5, 10, 15, 20]
        child.send_signal(signal.SIGCONT)
        rest = child.stdout.read().decode()
        assert child.wait(timeout=300) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert [int(g[1]) for g in plain_lines(rest)] == [25, 30, 35, 40]
