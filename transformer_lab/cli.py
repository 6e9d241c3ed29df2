"""The ``tlab`` command line (Typer). Each command lives in ``transformer_lab.commands``."""

from __future__ import annotations

import typer

from transformer_lab.commands import listing, run, smoke

app = typer.Typer(
    name="tlab",
    help="tlab: check and compare Transformer components (positional encodings, FFN "
    "activations, normalisation) on small models. Results go to CSV tables and PNG plots.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("smoke")(smoke.smoke)
app.command("run", context_settings=run.CONTEXT)(run.run)
app.command("list")(listing.list_choices)


if __name__ == "__main__":
    app()
