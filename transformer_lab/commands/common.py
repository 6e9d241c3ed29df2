"""Options shared by the commands, and the one way every command runs: the Hydra app."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer

Overrides = Annotated[
    list[str] | None,
    typer.Argument(help="Hydra overrides, e.g. model.d_model=16 train.lr=3e-3 (sweeps with -m).",
                   show_default=False),
]
Multirun = Annotated[bool, typer.Option("--multirun", "-m", help="Run a Hydra sweep over the "
                                        "comma-separated values in the overrides.")]
Out = Annotated[Path | None, typer.Option("--out", help="Run directory (sweep directory with "
                                          "-m); it must not already hold a run.")]
Pe = Annotated[str | None, typer.Option("--pe", help="Positional encoding (tlab list).")]
Norm = Annotated[str | None, typer.Option("--norm", help="Norm placement: post, pre, sandwich, "
                                          "deepnorm.")]
Activation = Annotated[str | None, typer.Option("--activation", help="FFN activation (tlab list).")]
Arch = Annotated[str | None, typer.Option("--arch", help="encoder or decoder.")]


def overrides_from(options: dict[str, object]) -> list[str]:
    """``{"pe": "rope", "norm": None}`` -> ``["pe=rope"]`` (None values are left out)."""
    return [f"{key}={value}" for key, value in options.items() if value is not None]


def launch(experiment: str, options: dict[str, object], overrides: list[str] | None,
           multirun: bool = False, out: Path | None = None) -> NoReturn:
    """Run ``experiment`` through the Hydra app and exit with its code."""
    args = [f"experiment={experiment}", *overrides_from(options), *(overrides or [])]
    if out is not None:
        args.append(f"hydra.{'sweep' if multirun else 'run'}.dir={out}")
    if multirun:
        args.insert(0, "--multirun")
    from transformer_lab.run import main

    raise typer.Exit(main(args))
