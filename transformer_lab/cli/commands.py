"""The commands that run an experiment through the Hydra app: each one's options and the
override each sets (``docs/cli.md``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from transformer_lab.cli.common import (
    ConfigDir,
    Opt,
    TrustCode,
    command,
    hydra_list,
    option,
    refuse,
    training_options,
)

OVERRIDES = Opt("overrides", Annotated[list[str] | None, typer.Argument(
    help="Hydra overrides, e.g. model.d_model=16 train.lr=3e-3 (sweeps with -m).",
    show_default=False)])
MULTIRUN = Opt("multirun", Annotated[bool, typer.Option(
    "--multirun", "-m", help="Run a Hydra sweep over the comma-separated values in the "
    "overrides.")], default=False)
OUT = Opt("out", Annotated[Path | None, typer.Option(
    "--out", help="Run directory (sweep directory with -m); it must not already hold a run.")])
RESUME = Opt("resume", Annotated[Path | None, typer.Option(
    "--resume", help="A sweep directory: run it again, jobs that passed are skipped, missing or "
    "failed ones run again (a failed attempt is renamed <job>.failed-<n>, never deleted). A run "
    "directory (tlab train): go on from its last checkpoint, in it; with train.steps=N, train "
    "a finished run on to N steps.", show_default=False)])
RUN = [MULTIRUN, OUT, RESUME]
CONFIG_DIR = Opt("config_dir", ConfigDir)
TRUST_CODE = Opt("trust_code", TrustCode, default=False)

PE = option("pe", "pe", "Positional encoding (tlab list).")
NORM = option("norm", "block", "Norm placement: post, pre, sandwich, deepnorm.")
ACTIVATION = option("activation", "ffn", "FFN activation (tlab list).")
ARCH = option("arch", "arch", "encoder or decoder.")
COMPONENTS = [PE, NORM, ACTIVATION, ARCH]
SEEDS = option("seeds", "routine.seeds", "Seeds seed..seed+N-1 (routine.seeds; the "
               "experiment's default), trained one after another: each seed gets the numbers of "
               "a run of its own.", int, min=1)
SEEDS_OR_AUTO = option(
    "seeds", "routine.seeds", "N: seeds seed..seed+N-1 (the experiment's default), each "
    "variant on the same ones; auto: seeds two at a time until an anytime-valid test gives every "
    "variant a verdict against the baseline (at most 32; anytime:MAX for another cap); auto:MAX: "
    "a group-sequential design planned to MAX seeds, a look after every seed.")
FROM_HF_HELP = ("A local Hugging Face model directory (save_pretrained): its architecture (a "
                "preset and knobs) and weights; never downloads.")
FROM_RUN_HELP = ("A tlab run's trained model (a run directory with one model, or one of its "
                 "weights files, e.g. RUN/models/rope/seed0.safetensors): its architecture and "
                 "weights.")
PRETRAINED = [option("from_hf", "from_hf", FROM_HF_HELP, Path),
              option("from_run", "from_run", FROM_RUN_HELP, Path)]


def _fraction(value: float | None) -> float | None:
    if value is not None and not 0.0 < value <= 1.0:
        raise typer.BadParameter(f"{value} is not in (0, 1]; e.g. 0.99")
    return value


REVERSAL = [  # tlab reverse-task and validate's step 3
    option("seq_len", "task.seq_len", "Tokens to reverse (task.seq_len, default 4).", int, min=2),
    option("vocab", "task.vocab_size", "Vocabulary incl. the SEP token (task.vocab_size, "
           "default 10).", int, min=3),
    option("max_steps", "routine.max_steps", "Give up after this many steps (routine.max_steps, "
           "default 600).", int, min=1),
    option("target", "routine.target", "Held-out exact match to reach, in (0, 1] "
           "(routine.target, default 0.99).", float, callback=_fraction)]
ACTIVATIONS_HELP = ("Comma-separated choices of the activation group, e.g. "
                    "relu,gelu,swish,leaky_relu (default relu,gelu; tlab list).")


def vary_overrides(texts: list[str]) -> dict[str, str]:
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


@command("train", [
    OVERRIDES, *COMPONENTS,
    option("task", "task", "text (default: Tiny Shakespeare; task.path=FILE for your own), lm, "
           "reverse or copy."),
    option("optimizer", "optimizer", "adamw (default), adam, sgd, muon (tlab list)."),
    SEEDS, CONFIG_DIR, *RUN, TRUST_CODE,
    Opt("nproc", Annotated[int, typer.Option(
        "--nproc", min=1, help="Train data-parallel on N processes of this machine (torchrun "
        "--standalone; DDP, one GPU each, or gloo on the CPU): the global batch is split between "
        "them; rank 0 writes the run directory (docs/scale.md).")], default=1),
    *training_options("train")])
def train() -> None:
    """Train one configuration (default: a small decoder on Tiny Shakespeare, characters);
    held-out loss and perplexity (language tasks) or exact match (reverse, copy) every
    train.eval_every steps and at the end; writes metrics.csv, summary.csv and, with --seeds
    N, seeds.csv (tlab report pairs the seeds of a sweep). Every training setting is an option
    (--lr sets train.lr)."""


@command("smoke", [OVERRIDES, *COMPONENTS,
                   option("steps", "routine.steps", "Smoke-training steps (default 10).", int),
                   SEEDS, *RUN])
def smoke() -> None:
    """Tiny config forward/backward check, then <= 10-step smoke training on fixed batches."""


@command("budget", [
    OVERRIDES,
    option("d_model", "model.d_model", "Model width (default 768).", int),
    option("d_ff", "model.d_ff", "FFN hidden width (default 3072).", int),
    option("n_heads", "model.n_heads", "Attention heads (default 12).", int),
    option("n_layers", "model.n_layers", "Blocks (default 1).", int),
    option("vocab", "routine.vocab_size", "Vocabulary size (default 1000).", int),
    option("seq_len", "routine.seq_len", "Sequence length (default 512).", int),
    option("batch", "routine.batch_size", "Batch size (default 8).", int),
    option("dtype", "routine.dtype", "fp32, bf16 or fp16 (default fp32)."),
    *COMPONENTS, *RUN])
def budget() -> None:
    """Parameter count, activation memory and FLOPs, by formula vs the built model.

    Parameters per component (a formula that disagrees with the model fails, exit 1),
    activation memory per layer (formula and measured on CPU) and FLOPs per token.
    Writes budget.csv.
    """


@command("check", [
    OVERRIDES,
    option("pe", "pe", "Only this PE's checks (default: all PEs with checks).",
           convert=lambda pe: {"pe": pe, "routine.pe": pe}),
    Opt("trained", Annotated[bool, typer.Option(
        "--trained", help="Also run the swap test on a model just trained on reversal.")],
        "routine.trained", False, convert=lambda trained: trained or None),
    option("steps", "routine.train_steps", "Training steps for --trained (default 300).", int),
    *(replace(o, convert=lambda path, key=o.key: {key: path, "arch": "encoder"})
      for o in PRETRAINED),  # a checkpoint's PE is checked without the causal mask
    *RUN, TRUST_CODE])
def check() -> None:
    """Correctness checks of the positional encodings (checks.csv; exit 1 if one fails).

    RoPE relative-position and pairing checks, the sinusoidal shift map, NoPE permutation
    equivariance and the source article's swap test (--trained: also after training on reversal).
    --from-hf DIR / --from-run RUN: the checkpoint's (a trained tlab run's) PE and weights (run
    without the causal mask).
    """


@command("compare", [
    OVERRIDES,
    option("vary", "routine.vary", "KEY=V1,V2,...: a config group (pe, ffn, block, norm_layer, "
           "optimizer, task, preset, ...) or a key (train.lr, model.n_layers) and its values, "
           "each a variant of the same run, e.g. --vary pe=rope,alibi,t5 (read by tlab, not a "
           "Hydra sweep; -m sweeps the other overrides).", list[str], convert=vary_overrides),
    option("baseline", "routine.baseline", "The value the others are tested against, paired by "
           "seed (default the first of --vary)."),
    option("steps", "routine.steps", "Training steps per variant and seed (default 200).", int,
           min=1),
    SEEDS_OR_AUTO, CONFIG_DIR, *RUN,
    *training_options("compare", leave_out=("steps", "checkpoint", "checkpoint_every"))])
def compare() -> None:
    """Train the same run once per value of --vary KEY=V1,V2,... (same model, seeds, data order
    and, where shapes allow, initial weights; default setup: tlab train's small decoder on Tiny
    Shakespeare); writes comparison.csv (a verdict per variant against the baseline, paired by
    seed), compare_runs.csv and loss_curves.png."""


@command("compare_activations", [
    OVERRIDES,
    option("activations", "routine.activations", ACTIVATIONS_HELP, convert=hydra_list),
    option("baseline", "routine.baseline", "The activation the others are tested against, "
           "paired by seed (default the first of --activations)."),
    option("steps", "routine.steps", "Training steps per activation and seed (default 200).",
           int, min=1),
    SEEDS_OR_AUTO, PE, NORM, ARCH, CONFIG_DIR, *RUN])
def compare_activations() -> None:
    """Train the same model with each activation (same init seed, same batches) on the
    experiment's task (8-token reversal unless task= says otherwise); writes comparison.csv
    (with confidence intervals and a verdict against the baseline, paired by seed) and
    loss_curves.png."""


@command("extrapolate", [
    OVERRIDES,
    option("pe", "routine.pes", "Positional encodings to compare, comma-separated (e.g. "
           "none,sinusoidal,rope,alibi); default: the pe group (rope).", convert=hydra_list),
    option("train_len", "routine.train_len", "Training length (task.seq_len; a decoder sees 2x "
           "that for reverse/copy). Default: task.seq_len (reverse/copy 4, lm 32).", int),
    option("eval_lens", "routine.eval_lens", "Evaluation lengths: multiples of --train-len (2x) "
           "or token counts (24), comma-separated. Default 1x,2x,4x.", convert=hydra_list),
    option("task", "task", "reverse, copy or lm (text with task.path=FILE). Default reverse."),
    option("scaling", "routine.scalings", "RoPE scalings to evaluate, comma-separated: none, "
           "linear, ntk, dynamic, yarn (factor: yarn:4; default L'/L), base:500000. Default "
           "none.", convert=hydra_list),
    option("seeds", "routine.seeds", "Number of seeds (one model per pe and seed). Default 1.",
           int),
    option("finetune_steps", "routine.finetune_steps", "Also fine-tune this many steps at each "
           "longer length, then evaluate (position interpolation recipe). Default 0.", int),
    option("steps", "train.steps", "Training steps at the training length (train.steps, default "
           "600).", int),
    ARCH, *PRETRAINED, *RUN, TRUST_CODE])
def extrapolate() -> None:
    """Train each positional encoding at --train-len, evaluate at --eval-lens without retraining;
    writes extrapolation.csv and extrapolation.png. --from-hf DIR / --from-run RUN: evaluate
    that checkpoint (a trained tlab run's model) instead (no training) at --eval-lens with each
    --scaling."""


@command("plot_pe", [
    OVERRIDES, PE,
    option("max_len", "routine.max_len", "Positions plotted (default 100).", int),
    option("d_model", "model.d_model", "Model width (default 128).", int),
    option("dims", "routine.dims", "Comma-separated dimensions drawn as curves (default "
           "0,1,3,7,15,31).", convert=hydra_list),
    *PRETRAINED, *RUN, TRUST_CODE])
def plot_pe() -> None:
    """PE curves per dimension and a position x dimension heat map, as PNG.

    The article's figure (PE value vs position for a few dimensions); RoPE: score vs distance;
    ALiBi / T5: bias per head. PNGs and pe_values.csv in the run directory.
    --from-hf DIR / --from-run RUN: the checkpoint's (a trained tlab run's) PE (a learned table
    or bias as trained).
    """


@command("reverse_task", [OVERRIDES, *COMPONENTS, *REVERSAL, SEEDS, CONFIG_DIR, *RUN])
def reverse_task() -> None:
    """Train sequence reversal until held-out exact match >= --target (PASS) or --max-steps
    (FAIL), beside the same model without a PE; writes reverse.csv."""


@command("validate", [
    OVERRIDES, *COMPONENTS, *REVERSAL,
    option("activations", "routine.compare.routine.activations", ACTIVATIONS_HELP,
           convert=hydra_list),
    Opt("seeds", SEEDS.kind, "routine.compare.routine.seeds"), CONFIG_DIR, *RUN])
def validate() -> None:
    """Steps 1-4 in order (forward/backward, smoke training, reversal with a NoPE control,
    activation comparison); one PASS/FAIL table and validation.csv; exit 0 only if all pass."""


@command("mutants", [
    OVERRIDES,
    option("directory", "routine.dir", "Your own mutants: a directory of *.py files, each "
           "defining MUTANTS, a list of transformer_lab.mutants.Mutant (the directory is "
           "importable: _target_: my_file.MyPE).", Path, "--dir",
           convert=lambda directory: str(directory.resolve())),
    Opt("negatives", Annotated[bool, typer.Option(
        help="Also run the built-in correct components (to count false alarms).")],
        "routine.negatives", True),
    Opt("reversal", Annotated[bool, typer.Option(
        help="Also train step 3's reversal and NoPE control (minutes per component).")],
        "routine.reversal", False),
    option("only", "routine.only", "Comma-separated component names: run only these.",
           convert=lambda only: f"'{only}'"),  # quoted: a comma is a sweep
    OUT])
def mutants() -> None:
    """Run the mutant suite (and the built-in components) through the pre-flight and the
    validation routine's steps 1-3; print the confusion matrix and the mutation score; write
    mutants.csv. Exit 0 only with no false alarm and every mutant caught at its expected step."""


def run(ctx: typer.Context) -> None:
    """Run the Hydra app with any Hydra arguments: experiment=..., -m, --cfg job, --info,
    hydra/launcher=..."""
    from transformer_lab.app.hydra_app import main

    raise typer.Exit(main(list(ctx.args)))
