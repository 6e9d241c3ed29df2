"""``tlab run``: the bare Hydra application (same as ``python -m transformer_lab.run``)."""

from __future__ import annotations

import typer


def run(ctx: typer.Context) -> None:
    """Run the Hydra app with any Hydra arguments: experiment=..., -m, --cfg job, --info,
    hydra/launcher=..."""
    from transformer_lab.app.hydra_app import main

    raise typer.Exit(main(list(ctx.args)))


CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}
