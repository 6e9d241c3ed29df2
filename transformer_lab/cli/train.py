"""``tlab train``: one configuration on a task, held-out metrics as it goes and at the end."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    Activation,
    Arch,
    ConfigDir,
    Multirun,
    Norm,
    Out,
    Overrides,
    Pe,
    Resume,
    Seeds,
    TrustCode,
    launch,
)

Task = Annotated[str | None, typer.Option(
    "--task", help="text (default: Tiny Shakespeare; task.path=FILE for your own), lm, reverse "
    "or copy.", show_default=False)]
Optimizer = Annotated[str | None, typer.Option(
    "--optimizer", help="adamw (default), adam, sgd, muon (tlab list).", show_default=False)]
Nproc = Annotated[int, typer.Option(
    "--nproc", min=1, help="Train data-parallel on N processes of this machine (torchrun "
    "--standalone; DDP, one GPU each, or gloo on the CPU): the global batch is split between "
    "them; rank 0 writes the run directory (docs/scale.md).")]
Steps = Annotated[int | None, typer.Option(
    "--steps", min=1, help="Training steps per seed (train.steps, default 300).",
    show_default=False)]


def train(
    overrides: Overrides = None,
    pe: Pe = None,
    norm: Norm = None,
    activation: Activation = None,
    arch: Arch = None,
    task: Task = None,
    optimizer: Optimizer = None,
    steps: Steps = None,
    seeds: Seeds = None,
    config_dir: ConfigDir = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
    trust_code: TrustCode = False,
    nproc: Nproc = 1,
) -> None:
    """Train one configuration (default: a small decoder on Tiny Shakespeare, characters);
    held-out loss and perplexity (language tasks) or exact match (reverse, copy) every
    train.eval_every steps and at the end; writes metrics.csv, summary.csv and, with --seeds
    N, seeds.csv (tlab report pairs the seeds of a sweep)."""
    options = {"pe": pe, "block": norm, "ffn": activation, "arch": arch, "task": task,
               "optimizer": optimizer, "train.steps": steps, "routine.seeds": seeds}
    launch("train", options, overrides, multirun, out, resume=resume, config_dir=config_dir,
           trust_code=trust_code, nproc=nproc)
