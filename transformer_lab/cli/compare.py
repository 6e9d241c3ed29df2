"""``tlab compare --vary KEY=V1,V2,...``: the same run with one config group or key varied."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    ConfigDir,
    Multirun,
    Out,
    Overrides,
    Resume,
    SeedsOrAuto,
    launch,
    refuse,
    train_overrides,
    with_training_options,
)

Vary = Annotated[list[str] | None, typer.Option(
    "--vary", help="KEY=V1,V2,...: a config group (pe, ffn, block, norm_layer, optimizer, task, "
    "preset, ...) or a key (train.lr, model.n_layers) and its values, each a variant of the "
    "same run, e.g. --vary pe=rope,alibi,t5 (read by tlab, not a Hydra sweep; -m sweeps the "
    "other overrides).", show_default=False)]
Baseline = Annotated[str | None, typer.Option(
    "--baseline", help="The value the others are tested against, paired by seed (default the "
    "first of --vary).", show_default=False)]
Steps = Annotated[int | None, typer.Option(
    "--steps", min=1, help="Training steps per variant and seed (default 200).",
    show_default=False)]


def vary_overrides(texts: list[str] | None) -> dict[str, str | None]:
    """``["pe=rope,alibi"]`` -> ``{"routine.vary.key": "pe", "routine.vary.values":
    "[rope,alibi]"}``: the values become one Hydra list (its grammar: numbers, quoted strings,
    nested lists), never a sweep. A malformed or repeated --vary: one line, exit code 2."""
    if not texts:
        return {}
    if len(texts) > 1:
        keys = ", ".join(text.split("=", 1)[0] for text in texts)
        refuse(f"--vary is given {len(texts)} times ({keys}); vary one key per comparison "
               "(sweep another with -m)")
    key, equals, values = texts[0].partition("=")
    key = key.strip()
    if not equals or not key or not values.strip() or key.startswith(("+", "~")):
        refuse(f"--vary '{texts[0]}' is not KEY=V1,V2,...; e.g. --vary pe=rope,alibi,t5 or "
               "--vary train.lr=1e-3,3e-3")
    return {"routine.vary.key": key, "routine.vary.values": f"[{values.strip()}]"}


@with_training_options("compare", leave_out=("steps",))
def compare(
    overrides: Overrides = None,
    vary: Vary = None,
    baseline: Baseline = None,
    steps: Steps = None,
    seeds: SeedsOrAuto = None,
    config_dir: ConfigDir = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
    **settings: object,
) -> None:
    """Train the same run once per value of --vary KEY=V1,V2,... (same model, seeds, data order
    and, where shapes allow, initial weights; default setup: tlab train's small decoder on Tiny
    Shakespeare); writes comparison.csv (a verdict per variant against the baseline, paired by
    seed), compare_runs.csv and loss_curves.png."""
    options = {**vary_overrides(vary), "routine.baseline": baseline, "routine.steps": steps,
               "routine.seeds": seeds, **train_overrides(settings)}
    launch("compare", options, overrides, multirun, out, resume=resume, config_dir=config_dir)
