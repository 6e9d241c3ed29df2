"""Hydra sweeps (issue 4): real sweeps with the basic, joblib and submitit_local launchers, the
sweep layout and sweep.csv, failure isolation, the sweep's exit code computed from the jobs'
recorded statuses, ``--resume``, and clear errors for bad sweeps.

Jobs are ``experiment=smoke`` (tiny model, 10 steps). Torch runs one thread per process here:
on a loaded 2-core machine two intra-op threads per tiny job are ~10x slower, not faster.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.app.hydra_app import main
from transformer_lab.app.sweeps import SWEEP_COLUMNS, append_row, quote_value
from transformer_lab.cli import app


def run_json(path: Path) -> dict:
    return json.loads((path / "run.json").read_text())


def cli(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def basic_sweep(smoke_sweep) -> Path:
    """4 jobs with the basic launcher, default sweep layout under out_root (conftest.py)."""
    return smoke_sweep


def needs_launcher(name: str) -> None:
    """Skip where the launcher's extra is not installed (``make setup`` installs both; a bare
    environment, e.g. a GPU machine, may not have them)."""
    pytest.importorskip(f"hydra_plugins.hydra_{name}_launcher",
                        reason=f"the {name} extra is not installed")


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory) -> tuple[Path, object]:
    """2 jobs through `tlab smoke -m` with joblib (2 workers); model.n_heads=3 cannot split
    d_model=8, which preflight does not see (it checks the first value of each sweep)."""
    needs_launcher("joblib")
    sweep_dir = tmp_path_factory.mktemp("joblib") / "sweep"
    result = cli("smoke", "-m", "model.n_heads=2,3", "hydra/launcher=joblib",
                 "hydra.launcher.n_jobs=2", "--out", sweep_dir)
    return sweep_dir, result


def test_basic_sweep_layout_and_sweep_csv(basic_sweep):
    assert basic_sweep.parent.name == "smoke" and basic_sweep.parent.parent.name == "multirun"
    rows = read_csv(basic_sweep / "sweep.csv")
    assert list(rows[0]) == SWEEP_COLUMNS
    assert sorted(int(r["job"]) for r in rows) == [0, 1, 2, 3]
    expected = {"0": "pe=none seed=0", "1": "pe=none seed=1", "2": "pe=rope seed=0",
                "3": "pe=rope seed=1"}
    for row in rows:
        job_dir = basic_sweep / row["job"]
        assert set(row["overrides"].split()) == {"experiment=smoke", *expected[row["job"]].split(),
                                                 f"out_root={basic_sweep.parents[2]}"}
        assert row["status"] == "passed" and row["exit_code"] == "0" and row["attempt"] == "1"
        for name in ("run.json", "config.yaml", "metrics.csv", "summary.csv", "smoke.csv"):
            assert (job_dir / name).exists(), name
        summary = read_csv(job_dir / "summary.csv")[0]
        assert run_json(job_dir)["status"] == "passed"
        assert summary["pe"] == expected[row["job"]].split()[0].split("=")[1]
        assert summary["seed"] == expected[row["job"]].split()[1].split("=")[1]
        assert float(row["final_loss"]) == pytest.approx(float(summary["final_loss"]))
    assert (basic_sweep / "multirun.yaml").exists()


@pytest.mark.slow
def test_joblib_sweep_isolates_the_failing_job(failing_sweep):
    sweep_dir, result = failing_sweep
    assert result.exit_code == 2, result.output  # one job had an invalid configuration
    rows = {r["job"]: r for r in read_csv(sweep_dir / "sweep.csv")}
    assert set(rows) == {"0", "1"}
    assert rows["0"]["status"] == "passed" and rows["0"]["exit_code"] == "0"
    assert rows["1"]["status"] == "error" and rows["1"]["exit_code"] == "2"
    assert "model.n_heads=3" in rows["1"]["error"] and "model.n_heads=3" in rows["1"]["overrides"]
    assert run_json(sweep_dir / "1")["status"] == "error"
    assert read_csv(sweep_dir / "0" / "summary.csv")[0]["status"] == "passed"
    # the jobs ran in joblib's worker processes, not in this one
    assert os.getpid() not in {run_json(sweep_dir / job)["pid"] for job in "01"}
    assert "1 error" in result.output


@pytest.mark.slow
def test_report_groups_the_failing_sweep_by_the_swept_value(failing_sweep, tmp_path):
    from transformer_lab.results.report import make_report

    sweep_dir, _ = failing_sweep
    report = make_report(sweep_dir, tmp_path)
    assert report.gathered.group_keys == ["model.n_heads"]
    pivot = report.pivot.set_index("model.n_heads")
    assert (pivot.loc["2", "n_passed"], pivot.loc["3", "n_passed"]) == (1, 0)
    assert "not divisible" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_submitit_local_sweep_records_statuses_from_other_processes(tmp_path):
    needs_launcher("submitit")
    sweep_dir = tmp_path / "submitit"
    code = main(["-m", "experiment=smoke", "model.n_heads=2,3", "hydra/launcher=submitit_local",
                 f"hydra.sweep.dir={sweep_dir}"])
    assert code == 2  # computed from sweep.csv: no job ran in this process
    rows = {r["job"]: r for r in read_csv(sweep_dir / "sweep.csv")}
    assert rows["0"]["status"] == "passed" and rows["1"]["status"] == "error"
    assert (sweep_dir / ".submitit").is_dir()
    assert read_csv(sweep_dir / "0" / "summary.csv")[0]["n_heads"] == "2"


def test_resume_skips_passed_jobs_and_reruns_missing_or_failed_ones(basic_sweep, tmp_path):
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(basic_sweep, sweep_dir)
    kept = (sweep_dir / "0" / "metrics.csv").read_bytes()
    kept_mtime = (sweep_dir / "0" / "metrics.csv").stat().st_mtime_ns
    shutil.rmtree(sweep_dir / "1")  # job 1 never ran (e.g. its node died first)
    info = run_json(sweep_dir / "2")  # job 2 crashed
    info.update(status="error", error="killed by the scheduler")
    (sweep_dir / "2" / "run.json").write_text(json.dumps(info))
    failed_metrics = (sweep_dir / "2" / "metrics.csv").read_bytes()

    result = cli("smoke", "--resume", sweep_dir)
    assert result.exit_code == 0, result.output
    assert (sweep_dir / "0" / "metrics.csv").read_bytes() == kept
    assert (sweep_dir / "0" / "metrics.csv").stat().st_mtime_ns == kept_mtime
    assert "passed in an earlier attempt: skipped" in result.output
    for job in "123":
        assert run_json(sweep_dir / job)["status"] == "passed"
    assert read_csv(sweep_dir / "1" / "summary.csv")[0]["seed"] == "1"
    moved = sweep_dir / "2.failed-1"  # the failed attempt is kept, not deleted
    assert run_json(moved)["error"] == "killed by the scheduler"
    assert (moved / "metrics.csv").read_bytes() == failed_metrics
    rows = read_csv(sweep_dir / "sweep.csv")
    assert sorted((r["job"], r["attempt"], r["status"]) for r in rows[4:]) == [
        ("1", "1", "passed"), ("2", "2", "passed")]
    assert (sweep_dir / "multirun-1.yaml").exists()  # Hydra's earlier multirun.yaml is kept
    # the basic sweep itself is untouched
    assert not (basic_sweep / "2.failed-1").exists() and (basic_sweep / "1").exists()

    # nothing left to do: every job is skipped, nothing is appended
    assert main(["--resume", str(sweep_dir)]) == 0
    assert len(read_csv(sweep_dir / "sweep.csv")) == 6


@pytest.mark.slow
def test_resume_reruns_a_failed_job_and_still_fails(failing_sweep):
    sweep_dir, _ = failing_sweep
    code = main(["--resume", str(sweep_dir), "hydra/launcher=basic"])  # launcher may change
    assert code == 2
    assert run_json(sweep_dir / "1.failed-1")["status"] == "error"
    rows = read_csv(sweep_dir / "sweep.csv")
    assert [(r["job"], r["attempt"], r["status"]) for r in rows[2:]] == [("1", "2", "error")]
    assert run_json(sweep_dir / "0")["pid"] != os.getpid()  # job 0 was not run again


@pytest.mark.parametrize(("args", "message"), [
    (["--resume"], "needs a sweep directory"),
    (["--resume", "{tmp}/nothing"], "no such directory"),
    (["--resume", "{tmp}"], "no multirun.yaml"),
])
def test_resume_bad_input(tmp_path, tlab, args, message):
    code, _, err = tlab(*[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and message in err and "Traceback" not in err


def test_resume_refuses_an_override_that_is_not_part_of_the_sweep(basic_sweep, tlab):
    code, _, err = tlab("--resume", basic_sweep, "pe=alibi")
    assert code == 2 and "pe=alibi is not part of the sweep" in err
    code, _, err = tlab("--resume", basic_sweep, f"hydra.sweep.dir={basic_sweep}")
    assert code == 2 and "already names the sweep directory" in err


@pytest.mark.parametrize(("override", "message"), [
    ("model.foo=1,2", "unknown key 'model.foo'"),
    ("pe=rope,bogus", "unknown pe 'bogus'; valid:"),
    ("seed=range(0,0)", "has no values"),
    ("pe=choice()", "has no values"),
    ("seed=1,", "a sweep value is missing"),
    ("hydra/launcher=ray", "pip install 'transformer_lab[ray]'"),
    ("hydra/sweeper=nope", "hydra/sweeper=nope is not available"),
    ("hydra.launcher.n_jobz=2", "unknown key 'hydra.launcher.n_jobz'"),
])
def test_bad_sweeps_are_one_line_errors_and_write_nothing(tmp_path, tlab, override, message):
    sweep_dir = tmp_path / "never"
    extra = []
    if "n_jobz" in override:
        needs_launcher("joblib")
        extra = ["hydra/launcher=joblib"]
    code, out, err = tlab("-m", "experiment=smoke", *extra, override,
                          f"hydra.sweep.dir={sweep_dir}")
    assert code == 2, err
    assert message in err and "Traceback" not in err + out
    assert not sweep_dir.exists()


def test_slurm_launcher_without_slurm_is_a_clear_error(tmp_path, tlab, monkeypatch):
    import transformer_lab.app.arguments as preflight

    monkeypatch.setattr(preflight.shutil, "which", lambda command: None)
    code, _, err = tlab("-m", "experiment=smoke", "seed=0,1", "hydra/launcher=slurm",
                        f"hydra.sweep.dir={tmp_path / 'never'}")
    assert code == 2 and "'srun' is not on PATH" in err and "submitit_local" in err
    assert not (tmp_path / "never").exists()


def test_sweep_into_a_directory_with_runs_is_refused(basic_sweep, tlab):
    code, _, err = tlab("-m", "experiment=smoke", "seed=0,1", f"hydra.sweep.dir={basic_sweep}")
    assert code == 2 and "already holds" in err


def test_hydra_flags_through_tlab_run_and_a_command(tlab, tmp_path):
    code, out, _ = tlab("experiment=smoke", "pe=alibi", "--cfg", "job")
    assert code == 0 and "routine:" in out and "alibi" in out
    result = cli("smoke", "--pe", "alibi", "--cfg", "job")
    assert result.exit_code == 0 and "routine:" in result.output and "alibi" in result.output
    # with --out (an override the command appends) and a Hydra flag passed as an extra argument
    result = cli("smoke", "--pe", "alibi", "--cfg", "job", "--out", tmp_path / "a")
    assert result.exit_code == 0 and "routine:" in result.output, result.output
    examples = Path(__file__).resolve().parents[1] / "examples" / "configs"
    result = cli("smoke", "--out", tmp_path / "b", "--config-dir", examples, "pe=my_sinusoidal",
                 "--cfg", "job")
    assert result.exit_code == 0 and "MySinusoidalPE" in result.output, result.output
    code, out, _ = tlab("--info", "plugins")
    assert code == 0 and "JoblibLauncher" in out and "SubmititLauncher" in out
    code, _, err = tlab("-m", "experiment=smoke", "seed=0,1", "--cfg", "job")
    assert code == 2 and "drop -m" in err
    result = cli("run", "hydra/launcher=slurm", "experiment=smoke", "--cfg", "hydra")
    assert result.exit_code == 0 and "SlurmLauncher" in result.output
    assert "cpus_per_task: 2" in result.output


def _append_many(path: str, worker: int, n: int) -> None:
    for i in range(n):
        append_row(Path(path), {"job": worker, "attempt": 1, "status": "passed", "exit_code": 0,
                                "overrides": f"seed={i} note=\"a, b\"" + "x" * 3000})


def test_parallel_appends_to_sweep_csv_never_interleave(tmp_path):
    path = tmp_path / "sweep.csv"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(str(path), w, 40)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
    rows = read_csv(path)
    assert len(rows) == 160 and list(rows[0]) == SWEEP_COLUMNS
    assert sorted(r["job"] for r in rows) == sorted(str(w) for w in range(4) for _ in range(40))
    assert all(r["overrides"].endswith("x" * 3000) for r in rows)
    assert path.read_text().count("job,attempt") == 1


def test_quote_value_keeps_paths_parseable():
    assert quote_value("/tmp/a_b-1/2026-01-01_12-00-00") == "/tmp/a_b-1/2026-01-01_12-00-00"
    assert quote_value("/tmp/with space,comma") == "'/tmp/with space,comma'"
