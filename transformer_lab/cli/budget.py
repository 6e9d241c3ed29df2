"""``tlab budget``: parameter count, activation memory and FLOPs, by formula vs the model."""

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
    launch,
)


def _size(help_text: str) -> object:
    return typer.Option(help=help_text, show_default=False)


def budget(
    overrides: Overrides = None,
    d_model: Annotated[int | None, _size("Model width (default 768).")] = None,
    d_ff: Annotated[int | None, _size("FFN hidden width (default 3072).")] = None,
    n_heads: Annotated[int | None, _size("Attention heads (default 12).")] = None,
    n_layers: Annotated[int | None, _size("Blocks (default 1).")] = None,
    vocab: Annotated[int | None, _size("Vocabulary size (default 1000).")] = None,
    seq_len: Annotated[int | None, _size("Sequence length (default 512).")] = None,
    batch: Annotated[int | None, _size("Batch size (default 8).")] = None,
    dtype: Annotated[str | None, _size("fp32, bf16 or fp16 (default fp32).")] = None,
    pe: Pe = None,
    norm: Norm = None,
    activation: Activation = None,
    arch: Arch = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
) -> None:
    """Parameter count, activation memory and FLOPs, by formula vs the built model.

    Parameters per component (a formula that disagrees with the model fails, exit 1),
    activation memory per layer (formula and measured on CPU) and FLOPs per token.
    Writes budget.csv.
    """
    options = {"model.d_model": d_model, "model.d_ff": d_ff, "model.n_heads": n_heads,
               "model.n_layers": n_layers, "routine.vocab_size": vocab,
               "routine.seq_len": seq_len, "routine.batch_size": batch, "routine.dtype": dtype,
               "pe": pe, "block": norm, "ffn": activation, "arch": arch}
    launch("budget", options, overrides, multirun, out, resume=resume)
