"""``tlab validate``: the four-step validation routine on one configuration."""

from __future__ import annotations

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
    hydra_list,
    launch,
)
from transformer_lab.cli.compare_activations import Activations
from transformer_lab.cli.reverse_task import MaxSteps, SeqLen, Target, Vocab


def validate(
    overrides: Overrides = None,
    pe: Pe = None,
    norm: Norm = None,
    activation: Activation = None,
    arch: Arch = None,
    seq_len: SeqLen = None,
    vocab: Vocab = None,
    max_steps: MaxSteps = None,
    target: Target = None,
    activations: Activations = None,
    seeds: Seeds = None,
    config_dir: ConfigDir = None,
    multirun: Multirun = False,
    out: Out = None,
    resume: Resume = None,
) -> None:
    """Steps 1-4 in order (forward/backward, smoke training, reversal with a NoPE control,
    activation comparison); one PASS/FAIL table and validation.csv; exit 0 only if all pass."""
    options = {"pe": pe, "block": norm, "ffn": activation, "arch": arch,
               "task.seq_len": seq_len, "task.vocab_size": vocab, "routine.max_steps": max_steps,
               "routine.target": target,
               "routine.compare.routine.activations": hydra_list(activations),
               "routine.compare.routine.seeds": seeds}
    launch("validate", options, overrides, multirun, out, resume=resume,
           config_dir=config_dir)
