"""``tlab reverse-task``: step 3 of the validation routine, reversal beside a NoPE control."""

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
    launch,
)

SeqLen = Annotated[int | None, typer.Option(
    "--seq-len", min=2, help="Tokens to reverse (task.seq_len, default 4).", show_default=False)]
Vocab = Annotated[int | None, typer.Option(
    "--vocab", min=3, help="Vocabulary incl. the SEP token (task.vocab_size, default 10).",
    show_default=False)]
MaxSteps = Annotated[int | None, typer.Option(
    "--max-steps", min=1, help="Give up after this many steps (routine.max_steps, default 600).",
    show_default=False)]


def _fraction(value: float | None) -> float | None:
    if value is not None and not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"{value} is not in (0, 1]; e.g. 0.99")
    return value


Target = Annotated[float | None, typer.Option(
    "--target", callback=_fraction, help="Held-out exact match to reach, in (0, 1] "
    "(routine.target, default 0.99).", show_default=False)]


def reverse_task(
    overrides: Overrides = None,
    pe: Pe = None,
    norm: Norm = None,
    activation: Activation = None,
    arch: Arch = None,
    seq_len: SeqLen = None,
    vocab: Vocab = None,
    max_steps: MaxSteps = None,
    target: Target = None,
    seeds: Seeds = None,
    config_dir: ConfigDir = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
) -> None:
    """Train sequence reversal until held-out exact match >= --target (PASS) or --max-steps
    (FAIL), beside the same model without a PE; writes reverse.csv."""
    options = {"pe": pe, "block": norm, "ffn": activation, "arch": arch,
               "task.seq_len": seq_len, "task.vocab_size": vocab, "routine.max_steps": max_steps,
               "routine.target": target, "routine.seeds": seeds}
    launch("reverse_task", options, overrides, multirun, out, resume=resume,
           config_dir=config_dir)
