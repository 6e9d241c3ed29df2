"""``tlab smoke``: steps 1-2 of the validation routine."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.commands.common import (
    Activation,
    Arch,
    Multirun,
    Norm,
    Out,
    Overrides,
    Pe,
    Resume,
    launch,
)


def smoke(
    overrides: Overrides = None,
    pe: Pe = None,
    norm: Norm = None,
    activation: Activation = None,
    arch: Arch = None,
    steps: Annotated[int | None, typer.Option(help="Smoke-training steps (default 10).")] = None,
    seeds: Annotated[int | None, typer.Option(
        "--seeds", min=1, help="Train seeds seed..seed+N-1 together, as one vectorised model where "
        "that pays (default 1).",
        show_default=False)] = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
) -> None:
    """Tiny config forward/backward check, then <= 10-step smoke training on fixed batches."""
    options = {"pe": pe, "norm": norm, "activation": activation, "arch": arch,
               "routine.steps": steps, "routine.seeds": seeds}
    launch("smoke", options, overrides, multirun, out, resume)
