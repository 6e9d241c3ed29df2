"""``tlab smoke``: steps 1-2 of the validation routine."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    Activation,
    Arch,
    Multirun,
    Norm,
    Out,
    Overrides,
    Pe,
    Resume,
    Seeds,
    launch,
)


def smoke(
    overrides: Overrides = None,
    pe: Pe = None,
    norm: Norm = None,
    activation: Activation = None,
    arch: Arch = None,
    steps: Annotated[int | None, typer.Option(help="Smoke-training steps (default 10).")] = None,
    seeds: Seeds = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
) -> None:
    """Tiny config forward/backward check, then <= 10-step smoke training on fixed batches."""
    options = {"pe": pe, "block": norm, "ffn": activation, "arch": arch,
               "routine.steps": steps, "routine.seeds": seeds}
    launch("smoke", options, overrides, multirun, out, resume)
