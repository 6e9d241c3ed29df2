"""``seed`` sets both the initial weights and the data order; ``seed_init=`` / ``seed_data=``
set one apart. A real ``tlab train`` sweep over both, then ``tlab report``'s variance by source
(report-variance.csv) on its runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import read_csv

from transformer_lab.config.compose import compose
from transformer_lab.config.spec import RunSpec
from transformer_lab.results.report import make_report

TRAIN = ["experiment=train", "task=lm", "model=tiny", "task.eval_size=32", "train.steps=6",
         "train.batch_size=8", "train.eval_every=0", "logger.progress=false"]


def tlab_main(*args: str | Path) -> int:
    from transformer_lab.app.hydra_app import main

    handlers = list(logging.root.handlers)
    try:
        return main([str(a) for a in args])
    finally:
        logging.root.handlers[:] = handlers


def test_seed_sources_move_together_and_apart():
    spec = RunSpec.of(compose(["experiment=train", "seed=2"]))
    assert spec.seed_sources(2) == (2, 2) and spec.seed_sources(4) == (4, 4)
    spec = RunSpec.of(compose(["experiment=train", "seed=2", "seed_init=7"]))
    assert spec.seed_sources(2) == (7, 2) and spec.seed_sources(3) == (8, 3)
    spec = RunSpec.of(compose(["experiment=train", "seed_data=5"]))
    assert spec.seed_sources(0) == (0, 5)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seed_sources")
    assert tlab_main("-m", *TRAIN, "seed_init=0,1", "seed_data=0,1,2",
                     f"hydra.sweep.dir={root / 'crossed'}") == 0
    assert tlab_main(*TRAIN, "seed=1", f"hydra.run.dir={root / 'seed1'}") == 0
    return root


def final_loss(run: Path) -> float:
    return float(read_csv(run / "summary.csv")[0]["final_loss"])


def test_each_source_changes_the_run_and_seed_sets_both(sweep):
    runs = {}
    for job in (sweep / "crossed").iterdir():
        if (job / "summary.csv").exists():
            config = (job / "config.yaml").read_text()
            init = int(config.split("seed_init: ")[1].split()[0])
            data = int(config.split("seed_data: ")[1].split()[0])
            runs[init, data] = final_loss(job)
    assert len(runs) == 6
    assert runs[1, 1] == final_loss(sweep / "seed1")  # seed=1 is seed_init=1 seed_data=1
    assert runs[0, 0] != runs[1, 0] and runs[0, 0] != runs[0, 1]  # each source matters


def test_report_splits_the_sweeps_variance_by_source(sweep):
    make_report(sweep / "crossed", metric="final_loss")
    (row,) = read_csv(sweep / "crossed" / "report-variance.csv")
    assert (row["n_init"], row["n_data"]) == ("2", "3") and float(row["var_total"]) > 0
    shares = [float(row[k]) for k in ("share_init", "share_data", "share_residual")]
    assert sum(shares) == pytest.approx(1) and all(0 <= s <= 1 for s in shares)
    assert "Variance by source" in (sweep / "crossed" / "report.md").read_text()
