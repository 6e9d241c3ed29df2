"""``tlab extrapolate``: train at one length, evaluate at longer ones (RoPE scalings, fine-tune)."""

from __future__ import annotations

from typing import Annotated

import typer

from transformer_lab.cli.common import (
    Arch,
    FromHf,
    FromRun,
    Multirun,
    Out,
    Overrides,
    Resume,
    TrustCode,
    hydra_list,
    launch,
)


def extrapolate(
    overrides: Overrides = None,
    pe: Annotated[str | None, typer.Option(
        "--pe", help="Positional encodings to compare, comma-separated (e.g. "
        "none,sinusoidal,rope,alibi); default: the pe group (rope).")] = None,
    train_len: Annotated[int | None, typer.Option(
        "--train-len", help="Training length (task.seq_len; a decoder sees 2x that for "
        "reverse/copy). Default: task.seq_len (reverse/copy 4, lm 32).")] = None,
    eval_lens: Annotated[str | None, typer.Option(
        "--eval-lens", help="Evaluation lengths: multiples of --train-len (2x) or token counts "
        "(24), comma-separated. Default 1x,2x,4x.")] = None,
    task: Annotated[str | None, typer.Option(
        "--task", help="reverse, copy or lm (text with task.path=FILE). Default reverse.")] = None,
    scaling: Annotated[str | None, typer.Option(
        "--scaling", help="RoPE scalings to evaluate, comma-separated: none, linear, ntk, "
        "dynamic, yarn (factor: yarn:4; default L'/L), base:500000. Default none.")] = None,
    seeds: Annotated[int | None, typer.Option(
        "--seeds", help="Number of seeds (one model per pe and seed). Default 1.")] = None,
    finetune_steps: Annotated[int | None, typer.Option(
        "--finetune-steps", help="Also fine-tune this many steps at each longer length, then "
        "evaluate (position interpolation recipe). Default 0.")] = None,
    steps: Annotated[int | None, typer.Option(
        "--steps", help="Training steps at the training length (train.steps, default 600).")
    ] = None,
    arch: Arch = None,
    from_hf: FromHf = None,
    from_run: FromRun = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
    trust_code: TrustCode = False,
) -> None:
    """Train each positional encoding at --train-len, evaluate at --eval-lens without retraining;
    writes extrapolation.csv and extrapolation.png. --from-hf DIR / --from-run RUN: evaluate
    that checkpoint (a trained tlab run's model) instead (no training) at --eval-lens with each
    --scaling."""
    options = {
        "from_hf": from_hf, "from_run": from_run, "task": task, "arch": arch,
        "routine.pes": hydra_list(pe),
        "routine.train_len": train_len, "routine.eval_lens": hydra_list(eval_lens),
        "routine.scalings": hydra_list(scaling), "routine.seeds": seeds,
        "routine.finetune_steps": finetune_steps, "train.steps": steps,
    }
    launch("extrapolate", options, overrides, multirun, out, resume=resume,
           trust_code=trust_code)
