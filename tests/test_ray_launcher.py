"""Issue 15 item 6: a real 2-job sweep through ``hydra/launcher=ray`` on a local Ray cluster.

Ray lives in an environment of its own (README, "Sweeps and clusters"); ``.ci/ray_sweep.sh``
creates it and runs this test there. In the main environment it is skipped.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray


def test_two_job_sweep_on_a_local_ray_cluster(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "ray-sweep"
    command = [sys.executable, "-m", "transformer_lab", "smoke", "-m", "seed=0,1",
               "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
               "+hydra.launcher.ray.init.include_dashboard=false", "--out", str(sweep)]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=env)
    print(done.stdout[-4000:], done.stderr[-4000:])  # the sweep's output, with -s / -rA
    assert done.returncode == 0, done.stderr[-2000:]
    with (sweep / "sweep.csv").open(newline="") as f:
        rows = {r["job"]: r for r in csv.DictReader(f)}
    assert sorted(rows) == ["0", "1"]
    assert {r["status"] for r in rows.values()} == {"passed"}
    pids = {(sweep / job / "run.json").read_text().split('"pid": ')[1].split(",")[0]
            for job in rows}
    assert str(os.getpid()) not in pids  # the jobs ran in Ray's worker processes
