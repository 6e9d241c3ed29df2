"""``tlab report DIR`` on a real sweep (conftest's ``smoke_sweep``: pe=none,rope x seed=0,1):
rows, grouping by the swept keys, mean ± std over seeds checked against the runs' own
summary.csv, partial sweeps, corrupt CSVs, folders without runs, no overwriting."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.results.gather import gather
from transformer_lab.results.report import free_prefix, make_report, mean_std

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"



def cli(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def sweep_copy(smoke_sweep, tmp_path) -> Path:
    target = tmp_path / "sweep"
    shutil.copytree(smoke_sweep, target)
    return target


def summary_of(sweep_dir: Path, job: str) -> dict[str, str]:
    return read_csv(sweep_dir / job / "summary.csv")[0]


def test_report_rows_grouping_and_mean_std(smoke_sweep, tmp_path):
    out = tmp_path / "report"
    result = cli("report", smoke_sweep, "--out", out)
    assert result.exit_code == 0, result.output
    runs = read_csv(out / "report.csv")
    assert len(runs) == 4
    assert {(r["pe"], r["seed"], r["status"]) for r in runs} == {
        ("none", "0", "passed"), ("none", "1", "passed"), ("rope", "0", "passed"),
        ("rope", "1", "passed")}
    pivot = {r["pe"]: r for r in read_csv(out / "report-pivot.csv")}
    assert set(pivot) == {"none", "rope"}  # grouped by the swept key, seeds averaged
    for pe, jobs in (("none", "01"), ("rope", "23")):
        losses = [float(summary_of(smoke_sweep, job)["final_loss"]) for job in jobs]
        assert [summary_of(smoke_sweep, job)["pe"] for job in jobs] == [pe, pe]
        row = pivot[pe]
        assert (row["n_runs"], row["n_passed"], row["seeds"]) == ("2", "2", "0,1")
        assert float(row["final_loss_mean"]) == pytest.approx(statistics.mean(losses))
        assert float(row["final_loss_std"]) == pytest.approx(statistics.stdev(losses))
        assert mean_std(statistics.mean(losses), statistics.stdev(losses)) in result.output
    markdown = (out / "report.md").read_text()
    assert "| pe | runs | passed | seeds | final_loss |" in markdown
    assert markdown.count("\n| none |") == 1 and "±" in markdown
    for name in ("report-final_loss.png", "report-loss.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert not (smoke_sweep / "report.csv").exists()  # --out: nothing written into the sweep


def test_a_second_report_does_not_overwrite_the_first(sweep_copy):
    assert cli("report", sweep_copy).exit_code == 0
    first = (sweep_copy / "report.csv").read_bytes()
    result = cli("report", sweep_copy)
    assert result.exit_code == 0
    assert (sweep_copy / "report.csv").read_bytes() == first
    assert (sweep_copy / "report-2.csv").exists() and (sweep_copy / "report-2.md").exists()
    assert free_prefix(sweep_copy) == "report-3"
    assert len(gather(sweep_copy).runs) == 4  # report files are not runs


def test_partial_sweep_counts_unfinished_and_skips_superseded_attempts(sweep_copy, tmp_path):
    job3 = sweep_copy / "3"
    (job3 / "summary.csv").unlink()  # job 3 is still running
    info = json.loads((job3 / "run.json").read_text())
    (job3 / "run.json").write_text(json.dumps({**info, "status": "running"}))
    shutil.copytree(sweep_copy / "2", sweep_copy / "2.failed-1")  # an attempt --resume kept
    report = make_report(sweep_copy, tmp_path / "out")
    runs = report.gathered.runs.set_index("run_dir")
    assert sorted(runs.index) == ["0", "1", "2", "3"]
    assert runs.loc["3", "status"] == "running" and runs.loc["3", "pe"] == "rope"
    assert report.gathered.superseded == 1
    rope = report.pivot.set_index("pe").loc["rope"]
    assert (rope["n_runs"], rope["n_passed"]) == (2, 1)
    job2_loss = float(summary_of(sweep_copy, "2")["final_loss"])
    assert rope["final_loss_mean"] == pytest.approx(job2_loss)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| 3 | rope | 1 | running |" in markdown and "1 superseded attempt" in markdown
    # a mean over fewer runs than the group has says so (job 3 has no final_loss yet)
    assert f"| rope | 2 | 1 | 0,1 | {job2_loss:.4g} (1 of 2) |" in markdown


def test_corrupt_csv_is_skipped_and_named(sweep_copy):
    (sweep_copy / "1" / "summary.csv").write_text('pe,seed\n"rope,0\nnone,1,2,3\n')
    (sweep_copy / "0" / "metrics.csv").write_bytes(b"\x00\xff\xfe\x00garbage")
    result = cli("report", sweep_copy)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())  # rich wraps long lines at spaces
    assert f"skipped {sweep_copy / '1' / 'summary.csv'}:" in flat
    assert f"skipped {sweep_copy / '0' / 'metrics.csv'}:" in flat
    assert "(loss curve left out)" in flat
    runs = read_csv(sweep_copy / "report.csv")
    assert sorted(r["run_dir"] for r in runs) == ["0", "2", "3"]
    assert "Traceback" not in result.output


def test_any_folder_of_runs_is_grouped_by_what_differs(smoke_sweep, tmp_path):
    """Runs without Hydra's .hydra folder (copied, renamed): grouped by the summary columns."""
    folder = tmp_path / "runs"
    for job, name in zip("0123", ("a", "b", "c", "d"), strict=True):
        shutil.copytree(smoke_sweep / job, folder / "nested" / name,
                        ignore=shutil.ignore_patterns(".hydra"))
    report = make_report(folder)
    assert report.gathered.group_keys == ["pe"]
    assert sorted(report.pivot["pe"]) == ["none", "rope"]
    assert list(report.pivot["n_runs"]) == [2, 2]


@pytest.mark.parametrize("make", ["empty", "missing", "only_junk"])
def test_no_runs_is_a_clear_error(tmp_path, make):
    target = tmp_path / "dir"
    if make != "missing":
        target.mkdir()
    if make == "only_junk":
        (target / "notes.txt").write_text("no runs here")
        (target / "sub").mkdir()
    result = cli("report", target)
    assert result.exit_code == 2
    assert ("no runs under" if make != "missing" else "is not a directory") in result.output
    assert "Traceback" not in result.output
    if target.exists():
        assert sorted(p.name for p in target.iterdir()) == sorted(
            {"empty": [], "only_junk": ["notes.txt", "sub"]}[make])


def test_unknown_metric_names_the_available_ones(smoke_sweep, tmp_path):
    result = cli("report", smoke_sweep, "--out", tmp_path, "--metric", "bleu")
    assert result.exit_code == 2
    assert "bleu" in result.output and "final_loss" in result.output


def test_the_report_summarises_every_number_of_summary_csv():
    from transformer_lab.results.gather import METRICS
    from transformer_lab.results.run_directory import NUMBER_COLUMNS

    assert sorted(METRICS) == sorted(NUMBER_COLUMNS)


def test_a_curve_with_an_empty_tag_column_is_read(tmp_path):
    """An all-empty ``variant`` column (a run that tags no variant): pandas reads it as NaN
    floats, which must join into the curve name as an empty tag, not fail."""
    from transformer_lab.results.gather import read_curve

    (tmp_path / "metrics.csv").write_text("step,loss,split,stage,variant,seed\n"
                                          "1,2.0,train,smoke,,0\n2,1.5,train,smoke,,0\n")
    curve = read_curve(tmp_path, "rope")
    assert list(curve["curve"]) == ["smoke//0"] * 2 and list(curve["loss"]) == [2.0, 1.5]
