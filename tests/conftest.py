"""Shared test helpers: compose configs and run the CLI in-process."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from transformer_lab.config.compose import compose
from transformer_lab.results.console import console, err_console

# Tiny models run fastest on one thread, and the suite shares small machines; subprocesses
# (the `tlab` console-script tests) inherit the variable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)


@pytest.fixture
def cfg_for():
    """``cfg_for("pe=rope", ...)`` -> a composed config (experiment=smoke unless overridden)."""

    def make(*overrides: str):
        return compose(["experiment=smoke", *overrides])

    return make


@pytest.fixture
def spec_for():
    """``spec_for("pe=rope", ...)`` -> (the ``RunSpec`` of ``cfg_for``'s config with the task's
    vocabulary, the task)."""
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.config.spec import RunSpec

    def make(*overrides: str):
        spec = RunSpec.of(compose(["experiment=smoke", *overrides]))
        task = build_task(spec)
        return spec.with_vocab(task.vocab_size), task

    return make


@pytest.fixture
def tlab(capsys):
    """Run ``transformer_lab.app.hydra_app.main(args)``
    in-process; returns (exit code, stdout, stderr)."""
    from transformer_lab.app.hydra_app import main

    def call(*args: str | Path) -> tuple[int, str, str]:
        handlers = list(logging.root.handlers)
        try:
            code = main([str(a) for a in args])
        finally:  # Hydra (e.g. --info) may leave handlers on capsys's streams, closed later
            logging.root.handlers[:] = handlers
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return call


_ROOT_HANDLERS = list(logging.root.handlers)  # as the session starts


@pytest.fixture(autouse=True)
def _root_log_handlers_restored():
    """A run configures logging as Hydra does (handlers on the root logger writing to the
    streams of the moment), and so does a session fixture's run: every test starts and ends
    with the session's first handlers, so no log record (a forked child's included) reaches a
    stream that an earlier test's capture has closed."""
    logging.root.handlers[:] = _ROOT_HANDLERS
    yield
    logging.root.handlers[:] = _ROOT_HANDLERS


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """Rich wraps at the terminal width; make captured output predictable."""
    monkeypatch.setattr(console, "_width", 200, raising=False)
    monkeypatch.setattr(err_console, "_width", 200, raising=False)


@pytest.fixture(scope="session")
def smoke_sweep(tmp_path_factory) -> Path:
    """A real 4-job sweep (basic launcher, default layout under out_root): pe=none,rope x
    seed=0,1 of experiment=smoke. Shared by test_sweeps and test_report; do not modify it (copy
    it first). Each job runs on train.threads=1, the default."""
    from transformer_lab.app.hydra_app import main

    root = tmp_path_factory.mktemp("smoke_sweep")
    code = main(["-m", "experiment=smoke", "pe=none,rope", "seed=0,1", f"out_root={root}"])
    assert code == 0
    (sweep_dir,) = (root / "multirun" / "smoke").iterdir()
    return sweep_dir
