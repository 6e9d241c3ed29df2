"""``tlab compare-activations``: step 4 of the validation routine, FFN activations side by side."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    Arch,
    ConfigDir,
    Multirun,
    Norm,
    Out,
    Overrides,
    Pe,
    Resume,
    SeedsOrAuto,
    hydra_list,
    launch,
)

Activations = Annotated[str | None, typer.Option(
    "--activations", help="Comma-separated choices of the activation group, e.g. "
    "relu,gelu,swish,leaky_relu (default relu,gelu; tlab list).", show_default=False)]
Baseline = Annotated[str | None, typer.Option(
    "--baseline", help="The activation the others are tested against, paired by seed "
    "(default the first of --activations).", show_default=False)]
Steps = Annotated[int | None, typer.Option(
    "--steps", min=1, help="Training steps per activation and seed (default 200).",
    show_default=False)]


def compare_activations(
    overrides: Overrides = None,
    activations: Activations = None,
    baseline: Baseline = None,
    steps: Steps = None,
    seeds: SeedsOrAuto = None,
    pe: Pe = None,
    norm: Norm = None,
    arch: Arch = None,
    config_dir: ConfigDir = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
) -> None:
    """Train the same model with each activation (same init seed, same batches) on the
    experiment's task (8-token reversal unless task= says otherwise); writes comparison.csv
    (with confidence intervals and a verdict against the baseline, paired by seed) and
    loss_curves.png."""
    options = {"routine.activations": hydra_list(activations), "routine.baseline": baseline,
               "routine.steps": steps,
               "routine.seeds": seeds, "pe": pe, "block": norm, "arch": arch}
    launch("compare_activations", options, overrides, multirun, out, resume=resume,
           config_dir=config_dir)
