"""Issue 16: every bad input refused up front (typed schema, resource estimate), output
directories claimed atomically, a dead sweep worker isolated, I/O errors recorded, and the
wrong-result bugs (report loss curve, smoke diagnosis, task.path messages)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TLAB, assert_refused, read_csv

from transformer_lab.errors import ConfigError
from transformer_lab.results.run_directory import CLAIM_FILE, claim_directory


@pytest.mark.parametrize("args, expected", [
    (["seed=abc"], "seed=abc is not valid; it must be an integer >= 0"),
    (["seed=1.5"], "seed=1.5 is not valid"),
    (["model.d_model=8.0"], "model.d_model=8.0 is not valid; it must be a positive number"),
    (["model.n_layers=1.5"], "model.n_layers=1.5 is not valid"),
    (["train.batch_size=abc"], "train.batch_size=abc is not valid"),
    (["model.embed_scale=abc"], "model.embed_scale=abc is not valid; it must be sqrt, none"),
    (["model.dropout.attention=1.5"], "model.dropout.attention=1.5 is not valid"),
    (["~model"], "the config group 'model' is required"),
    (["~pe"], "the config group 'pe' is required"),
    (["~train.lr"], "train.lr is required and cannot be deleted"),
    (["train.warmup=-5"], "train.warmup=-5 is not valid"),
    (["model.vocab_size=1"], "model.vocab_size=1 is not valid"),
    (["model.vocab_size=7"], "model.vocab_size=7 is not used"),
    (["train.grad_clip=-1"], "train.grad_clip=-1 is not valid"),
    (["train.lr=nan"], "train.lr=nan is not valid"),
    (["model.d_model=16384", "model.n_layers=64"], "this run needs about"),
    (["model.d_model=16384", "model.n_layers=64"], "model.d_model=16384, model.n_layers=64"),
    (["model.d_model=65536"], "this run needs about"),
    (["+model.x=1"], "model.x is not a key of model; valid: attn_bias"),
    (["+train.foo=2"], "train.foo is not a key of train"),
    (["+routine.bar=3"], "routine.bar is not a key of routine; valid: batch_size"),
])
def test_bad_values_are_refused_in_preflight(tlab, tmp_path, args, expected):
    out = tmp_path / "run"
    err = assert_refused(tlab("experiment=smoke", *args, f"hydra.run.dir={out}"), out, expected)
    assert len(err.strip().splitlines()) <= 2


@pytest.mark.parametrize("experiment, args, expected", [
    ("extrapolate", ["routine.train_len=0"], "routine.train_len=0 is not valid"),
    ("extrapolate", ["routine.eval_lens=[]"], "routine.eval_lens=[] is not valid"),
    ("plot_pe", ["routine.dims=[a,b]"], "routine.dims=[a,b] is not valid"),
    ("reverse_task", ["task.seq_len=20000"], "task.seq_len=20000 (--seq-len) is too long"),
    ("extrapolate", ["routine.eval_lens=[100000]"], "(routine.eval_lens=[100000])"),
])
def test_bad_routine_settings_are_refused(tlab, tmp_path, experiment, args, expected):
    out = tmp_path / "run"
    assert_refused(tlab(f"experiment={experiment}", *args, f"hydra.run.dir={out}"), out, expected)


def test_force_runs_what_the_estimate_refuses(tlab, tmp_path, monkeypatch):
    from transformer_lab.app import resources

    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 1000)
    out = tmp_path / "run"
    assert_refused(tlab("experiment=smoke", f"hydra.run.dir={out}"), out, "--force")
    code, _, err = tlab("experiment=smoke", "--force", f"hydra.run.dir={out}")
    assert code == 0, err


def test_claim_is_exclusive_and_names_the_owner(tmp_path):
    claim_directory(tmp_path / "run")
    owner = json.loads((tmp_path / "run" / CLAIM_FILE).read_text())
    with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
        claim_directory(tmp_path / "run")
    assert owner["pid"] == os.getpid()


def test_simultaneous_runs_into_one_out_exactly_one_wins(tmp_path):
    out, n = tmp_path / "same", 4
    procs = [subprocess.Popen([TLAB, "smoke", "--out", str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(n)]
    results = [(p.wait(timeout=240), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0] + [2] * (n - 1), results
    for code, err in results:
        if code == 2:
            assert "Traceback" not in err and "pid" in err, err
    winner = json.loads((out / "run.json").read_text())
    assert winner["status"] == "passed"
    assert json.loads((out / CLAIM_FILE).read_text())["pid"] == winner["pid"]
    steps = [row["step"] for row in read_csv(out / "metrics.csv") if row["split"] == "train"]
    assert steps == sorted(steps, key=int) and len(steps) == len(set(steps))


def test_out_onto_a_folder_of_a_users_files_is_refused(tlab, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    code, _, err = tlab("experiment=smoke", f"hydra.run.dir={folder}")
    assert code == 2 and "holds files but no run (notes.txt)" in err
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # nothing written there


def test_out_paths_that_cannot_be_a_run_directory(tlab, tmp_path, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_refused(tlab("experiment=smoke", f"hydra.run.dir={a_file}"), tmp_path / "no",
                   "is a file")
    assert a_file.read_text() == "x"
    assert_refused(tlab("experiment=smoke", f"hydra.run.dir={a_file}/below"), tmp_path / "no",
                   "is below the file")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}")
    assert_refused(tlab("experiment=smoke", f"hydra.run.dir={sweep}"), sweep / "x",
                   "is a sweep's folder")

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    out = tmp_path / "locked"
    code, _, err = tlab("experiment=smoke", f"hydra.run.dir={out}")
    assert code == 2 and "cannot write in output directory" in err and "Traceback" not in err


def test_disk_full_ends_the_run_as_error_and_keeps_flushed_rows(tlab, tmp_path, monkeypatch):
    from transformer_lab.results.run_directory import CsvLog

    real_write, written = CsvLog.write, []

    def write(self, row):
        if self.path.name == "metrics.csv" and len(written) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        if self.path.name == "metrics.csv":
            written.append(row)
        return real_write(self, row)

    monkeypatch.setattr(CsvLog, "write", write)
    out = tmp_path / "run"
    code, stdout, err = tlab("experiment=smoke", f"hydra.run.dir={out}")
    assert code == 1 and "Traceback" not in err + stdout
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "error" and "No space left on device" in info["error"]
    assert len(read_csv(out / "metrics.csv")) == 3


def test_dead_worker_is_one_failed_job(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    (tmp_path / "cfg" / "pe").mkdir(parents=True)
    (tmp_path / "killer.py").write_text(
        "import os, signal\nfrom torch import nn\n"
        "class KillPE(nn.Module):\n    kind = 'none'\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "cfg" / "pe" / "killer.yaml").write_text("name: killer\n_target_: killer.KillPE\n")
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [TLAB, "smoke", "-m", "pe=none,killer,rope", "hydra/launcher=joblib",
         "hydra.launcher.n_jobs=2", "--config-dir", str(tmp_path / "cfg"), "--out", str(sweep)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "TerminatedWorkerError" not in result.stdout + result.stderr
    statuses = {r["job"]: (r["status"], r["error"]) for r in read_csv(sweep / "sweep.csv")}
    assert statuses["0"][0] == "passed" and statuses["2"][0] == "passed"
    assert statuses["1"][0] == "error" and "SIGKILL" in statuses["1"][1]
    assert json.loads((sweep / "1" / "run.json").read_text())["signal"] == 9


def test_dead_joblib_worker_process_is_one_failed_job_and_the_sweep_goes_on(tmp_path):
    """kill -9 of a loky worker process itself (not its job's child): loky breaks the pool;
    the job is recorded as error naming its worker's death, the others all run and pass."""
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    (tmp_path / "cfg" / "pe").mkdir(parents=True)
    (tmp_path / "worker_killer.py").write_text(  # in a worker's job child only, not pre-flight
        "import os, signal, time\nfrom pathlib import Path\nfrom torch import nn\n"
        "def in_worker():\n    launcher = os.environ.get('TLAB_LAUNCHER_PID')\n"
        "    return launcher not in (None, str(os.getpid()), str(os.getppid()))\n"
        "class SlowPE(nn.Module):  # still running when the pool breaks\n    kind = 'none'\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        if in_worker() and not Path('sweep/0.failed-1').exists():\n"
        "            time.sleep(4)\n"
        "class KillWorkerPE(nn.Module):\n    kind = 'none'\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        if in_worker():\n"
        "            while not Path('sweep/0/run.json').exists():\n"
        "                time.sleep(0.05)\n"
        "            os.kill(os.getppid(), signal.SIGKILL)  # the job's worker process\n"
        "            signal.pause()\n")
    for name, target in (("wkiller", "KillWorkerPE"), ("slow", "SlowPE")):
        (tmp_path / "cfg" / "pe" / f"{name}.yaml").write_text(
            f"name: {name}\n_target_: worker_killer.{target}\n")
    sweep = tmp_path / "sweep"
    result = subprocess.run(
        [TLAB, "smoke", "-m", "pe=slow,wkiller,rope,sinusoidal", "hydra/launcher=joblib",
         "hydra.launcher.n_jobs=2", "--config-dir", str(tmp_path / "cfg"), "--out", str(sweep)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output and "TerminatedWorkerError:" in output, output
    assert "job 1 recorded as error; job 0 stopped with it" in " ".join(output.split()), output
    latest = {r["job"]: r for r in read_csv(sweep / "sweep.csv")}
    assert sorted(latest) == ["0", "1", "2", "3"]
    assert {job: r["status"] for job, r in latest.items()} == \
        {"0": "passed", "1": "error", "2": "passed", "3": "passed"}
    assert "its worker process" in latest["1"]["error"] and "died" in latest["1"]["error"]
    for run_json in sweep.glob("*/run.json"):  # kept attempts too: nothing left running
        assert json.loads(run_json.read_text())["status"] != "running", run_json
    assert json.loads((sweep / "1" / "run.json").read_text())["worker_died"] > 0
    kept = json.loads((sweep / "0.failed-1" / "run.json").read_text())  # job 0's first attempt
    assert kept["status"] == "error" and "stopped when a worker process" in kept["error"]


def test_resume_touches_nothing_in_passed_or_kept_jobs(smoke_sweep, tmp_path, tlab):
    sweep = tmp_path / "sweep"
    shutil.copytree(smoke_sweep, sweep)
    info = json.loads((sweep / "1" / "run.json").read_text())
    info.update(status="error", error="injected")
    (sweep / "1" / "run.json").write_text(json.dumps(info))

    def snapshot(job: str) -> dict[str, tuple[int, bytes]]:
        return {str(p.relative_to(sweep)): (p.stat().st_mtime_ns, p.read_bytes())
                for p in (sweep / job).rglob("*") if p.is_file()}

    failed_before = snapshot("1")
    assert tlab("--resume", sweep)[0] == 0
    passed = snapshot("0")
    kept = {k.replace("1.failed-1", "1", 1): v for k, v in snapshot("1.failed-1").items()}
    assert {k: v for k, v in kept.items() if not k.endswith(".log")} == \
        {k: v for k, v in failed_before.items() if not k.endswith(".log")}
    assert (sweep / "1" / ".hydra" / "overrides.yaml").exists()  # the new attempt's own
    assert tlab("--resume", sweep)[0] == 0  # all passed now: nothing inside is rewritten
    assert snapshot("0") == passed


def test_report_loss_curve_leaves_out_the_nope_control(tmp_path):
    from transformer_lab.results.gather import read_curve

    (tmp_path / "metrics.csv").write_text(
        "step,split,loss,stage,variant,seed\n10,train,1.0,reverse,rope,0\n"
        "10,train,3.0,reverse,none,0\n20,train,0.5,reverse,rope,0\n")
    assert read_curve(tmp_path, "rope")["loss"].tolist() == [1.0, 0.5]


def test_readme_pe_swamp_example_names_the_ratio(tlab, tmp_path):
    code, out, err = tlab("experiment=smoke", "pe=sinusoidal", "model.embed_scale=none",
                          "model.pe_scale=20", f"hydra.run.dir={tmp_path / 'r'}")
    assert "token-embedding norm" in " ".join((out + err).split())


@pytest.mark.parametrize("content, expected", [
    (b"", "is empty"), (b"ab\xff\xfecd" * 40, "is not UTF-8 text"), (b"hello", "the training text"),
])
def test_text_file_messages_name_the_file(tlab, tmp_path, content, expected):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    out = tmp_path / "run"
    assert_refused(tlab("experiment=smoke", "task=text", "arch=decoder", f"task.path={path}",
                        f"hydra.run.dir={out}"), out, f"task.path='{path}'", expected)


def test_own_component_from_a_directory_outside_the_repository(tmp_path):
    shutil.copy(Path(__file__).parents[1] / "examples" / "my_components.py",
                tmp_path / "my_module.py")
    result = subprocess.run([TLAB, "smoke", "pe=none", "pe._target_=my_module.MySinusoidalPE",
                             "+pe.d_model=8", "--out", str(tmp_path / "run")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == 0, result.stderr
    assert sys.path[0] != str(tmp_path)
