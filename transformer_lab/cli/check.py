"""``tlab check``: correctness checks of the positional encodings."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    FromHf,
    FromRun,
    Multirun,
    Out,
    Overrides,
    Resume,
    TrustCode,
    launch,
)


def check(
    overrides: Overrides = None,
    pe: Annotated[str | None, typer.Option("--pe", help="Only this PE's checks (default: all "
                                           "PEs with checks).")] = None,
    trained: Annotated[bool, typer.Option("--trained", help="Also run the swap test on a "
                                          "model just trained on reversal.")] = False,
    steps: Annotated[int | None, typer.Option(help="Training steps for --trained (default "
                                              "300).")] = None,
    from_hf: FromHf = None,
    from_run: FromRun = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
    trust_code: TrustCode = False,
) -> None:
    """Correctness checks of the positional encodings (checks.csv; exit 1 if one fails).

    RoPE relative-position and pairing checks, the sinusoidal shift map, NoPE permutation
    equivariance and the source article's swap test (--trained: also after training on reversal).
    --from-hf DIR / --from-run RUN: the checkpoint's (a trained tlab run's) PE and weights (run
    without the causal mask).
    """
    pretrained = {"from_hf": from_hf, "from_run": from_run}
    if from_hf is not None or from_run is not None:
        pretrained["arch"] = "encoder"
    options = {**pretrained, "pe": pe, "routine.pe": pe, "routine.trained": trained or None,
               "routine.train_steps": steps}
    launch("check", options, overrides, multirun, out, resume=resume, trust_code=trust_code)
