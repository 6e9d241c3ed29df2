"""Data-parallel training over several processes (``torchrun`` or ``tlab train --nproc N``, DDP):
only rank 0 writes the run directory (docs/scale.md)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from transformer_lab.errors import ConfigError

if TYPE_CHECKING:
    import torch



@dataclass(frozen=True)
class World:
    """This process's place among the ranks torchrun started (one process: rank 0 of 1)."""

    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


def world() -> World:
    """From torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``)."""
    return World(*(int(os.environ.get(key, default)) for key, default in
                   (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))))


def resolve_device(name: str) -> torch.device:
    """``train.device`` as this process's device: ``auto`` is CUDA when torch sees one, else the
    CPU; ``cuda`` under torchrun is ``cuda:LOCAL_RANK``. ``ConfigError`` for a name not auto,
    cpu, cuda or cuda:K, or CUDA where torch sees none."""
    import torch

    name = str(name)
    if name not in ("auto", "cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"train.device='{name}' is not valid; use auto, cpu or cuda")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device='{name}' but torch sees no CUDA device; use cpu or "
                          "auto")
    if name.startswith("cuda:") and world().size > 1:
        raise ConfigError(f"train.device={name} under torchrun puts every process on one GPU; "
                          "use cuda or auto (each process on cuda:LOCAL_RANK)")
    if name == "cuda" and world().size > 1:
        local_rank, gpus = world().local_rank, torch.cuda.device_count()
        if local_rank >= gpus:
            raise ConfigError(f"process LOCAL_RANK={local_rank} has no GPU of its own: torch "
                              f"sees {gpus}; start at most {gpus} processes per machine")
        return torch.device("cuda", local_rank)
    return torch.device(name)


def joined() -> bool:
    """True inside a process group of more than one rank (the trainer then uses DDP)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def process_group(device_name: str) -> Iterator[None]:
    """Within the block, this process is in its torchrun job's group (NCCL on CUDA, else gloo)."""
    import torch
    import torch.distributed as dist

    if world().size == 1 or joined():
        yield
        return
    device = resolve_device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    try:
        yield
    finally:
        dist.destroy_process_group()


def check_distributed(routine: str, single_run: bool) -> None:
    """Under torchrun: only a single ``tlab train`` run (``ConfigError`` otherwise)."""
    size = world().size
    if size > 1 and not single_run:
        raise ConfigError(f"a sweep (-m) cannot run under torchrun (WORLD_SIZE={size}); run "
                          "each job with torchrun, or sweep with hydra/launcher=slurm "
                          "(docs/scale.md)")
    if size > 1 and routine != "train":  # the one routine that trains a single model with Trainer
        raise ConfigError(f"routine={routine} cannot run on several processes (WORLD_SIZE="
                          f"{size}); only train can")


@contextmanager
def follower_directory(resumed: Path | None) -> Iterator[Path]:
    """A throwaway run directory for a rank > 0; with ``resumed`` (the leader's run directory), its
    checkpoint, ``metrics.csv`` and ``run.json`` copied in."""
    from transformer_lab.results.run_directory import CHECKPOINT_FILE, reclaim_directory

    with tempfile.TemporaryDirectory(prefix=f"tlab-rank{world().rank}-") as folder:
        path = Path(folder) / "run"
        path.mkdir()
        if resumed is not None:
            for name in (CHECKPOINT_FILE, "metrics.csv", "run.json"):
                if (resumed / name).is_file():
                    shutil.copyfile(resumed / name, path / name)
            reclaim_directory(path)  # claimed by this process, resuming: reopened as the leader's
        yield path


def all_reduce_sum(value: torch.Tensor) -> torch.Tensor:
    """``value`` summed over the ranks (itself for one process)."""
    import torch.distributed as dist

    if joined():
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def launch(nproc: int, arguments: list[str]) -> int:
    """Run ``python -m transformer_lab.app.hydra_app ARGUMENTS`` on ``nproc`` local processes (as
    ``torchrun --standalone``); other ranks' output is shown only when one fails on its own. Returns
    rank 0's exit code if it failed, else the first failed rank's (128 + signal), else 0."""
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from transformer_lab.errors import EXIT_USAGE
    from transformer_lab.results.console import print_error

    if "--multirun" in arguments:
        print_error(f"--nproc {nproc} runs one training on several processes, not a sweep (-m); "
                    "sweep with hydra/launcher=slurm, one GPU per job (docs/scale.md)")
        return EXIT_USAGE
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # codes say it
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: train.threads sets each rank's
    with tempfile.TemporaryDirectory(prefix="tlab-ranks-") as logs:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
            logs_specs=DefaultLogsSpecs(log_dir=logs, redirects={
                rank: Std.ALL for rank in range(1, nproc)}))
        try:
            elastic_launch(config, sys.executable)("-m", "transformer_lab.app.hydra_app",
                                                   *arguments)
        except ChildFailedError as exc:
            leader = exc.failures.get(0)
            if leader is not None and leader.exitcode > 0:
                return leader.exitcode  # its error is on the terminal
            _, failure = exc.get_first_failure()
            for path in Path(logs).glob(f"**/{failure.local_rank}/stderr.log"):
                lines = path.read_text(errors="replace").strip().splitlines()[-5:]
                print("\n".join([f"rank {failure.rank} (exit {failure.exitcode}):", *lines]),
                      file=sys.stderr)
            return failure.exitcode if failure.exitcode >= 0 else 128 - failure.exitcode
    return 0
