"""``tlab plot-pe``: PE curves per dimension and a heat map, as PNG."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    FromHf,
    FromRun,
    Multirun,
    Out,
    Overrides,
    Pe,
    Resume,
    TrustCode,
    hydra_list,
    launch,
)


def plot_pe(
    overrides: Overrides = None,
    pe: Pe = None,
    max_len: Annotated[int | None, typer.Option("--max-len", help="Positions plotted "
                                                "(default 100).")] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", help="Model width (default "
                                                "128).")] = None,
    dims: Annotated[str | None, typer.Option("--dims", help="Comma-separated dimensions drawn "
                                             "as curves (default 0,1,3,7,15,31).")] = None,
    from_hf: FromHf = None,
    from_run: FromRun = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
    trust_code: TrustCode = False,
) -> None:
    """PE curves per dimension and a position x dimension heat map, as PNG.

    The article's figure (PE value vs position for a few dimensions); RoPE: score vs distance;
    ALiBi / T5: bias per head. PNGs and pe_values.csv in the run directory.
    --from-hf DIR / --from-run RUN: the checkpoint's (a trained tlab run's) PE (a learned table
    or bias as trained).
    """
    options = {"from_hf": from_hf, "from_run": from_run, "pe": pe, "routine.max_len": max_len,
               "model.d_model": d_model, "routine.dims": hydra_list(dims)}
    launch("plot_pe", options, overrides, multirun, out, resume=resume, trust_code=trust_code)
