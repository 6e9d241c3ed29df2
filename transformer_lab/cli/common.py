"""Options shared by the commands, and the one way every command runs: the Hydra app."""

from __future__ import annotations

from inspect import signature
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
Resume = Annotated[Path | None, typer.Option(
    "--resume", help="A sweep directory: run it again, jobs that passed are skipped, missing or "
    "failed ones run again (a failed attempt is renamed <job>.failed-<n>, never deleted). A run "
    "directory (tlab train): go on from its last checkpoint, in it; with train.steps=N, train "
    "a finished run on to N steps.",
    show_default=False)]
Pe = Annotated[str | None, typer.Option("--pe", help="Positional encoding (tlab list).")]
Norm = Annotated[str | None, typer.Option("--norm", help="Norm placement: post, pre, sandwich, "
                                          "deepnorm.")]
Activation = Annotated[str | None, typer.Option("--activation", help="FFN activation (tlab list).")]
Arch = Annotated[str | None, typer.Option("--arch", help="encoder or decoder.")]
Seeds = Annotated[int | None, typer.Option(
    "--seeds", min=1, help="Seeds seed..seed+N-1 (routine.seeds; the experiment's default), "
    "trained one after another: each seed gets the numbers of a run of its own.",
    show_default=False)]
SeedsOrAuto = Annotated[str | None, typer.Option(
    "--seeds", help="N: seeds seed..seed+N-1 (the experiment's default), each variant on the "
    "same ones; auto[:MAX]: seeds two at a time until an anytime-valid test gives every "
    "variant a verdict against the baseline, at most MAX (default 32).", show_default=False)]
ConfigDir = Annotated[Path | None, typer.Option(
    "--config-dir", help="A config tree of your own (e.g. pe/my_pe.yaml with a _target_) added "
    "to tlab's (tlab's own file wins where a name is in both); choose from it as usual "
    "(pe=my_pe).", show_default=False)]
FromHf = Annotated[Path | None, typer.Option(
    "--from-hf", help="A local Hugging Face model directory (save_pretrained): its architecture "
    "(a preset and knobs) and weights; never downloads.", show_default=False)]

FromRun = Annotated[Path | None, typer.Option(
    "--from-run", help="A tlab run's trained model (a run directory with one model, or one of "
    "its weights files, e.g. RUN/models/rope/seed0.safetensors): its architecture and weights.",
    show_default=False)]
TrustCode = Annotated[bool, typer.Option(
    "--trust-code", help="Load a run trained with your own components (_target_ outside tlab's) "
    "and import the modules it recorded; only for runs whose code you trust (docs/security.md).")]
RunPath = Annotated[Path, typer.Argument(
    help="A run directory (tlab train, tlab compare) or one of its weights files.",
    show_default=False)]
Variant = Annotated[str | None, typer.Option(
    "--variant", help="A compared run's model of this variant (default: the first).",
    show_default=False)]
ModelSeed = Annotated[int | None, typer.Option(
    "--model-seed", help="The run's model trained with this seed (default: the first).",
    show_default=False)]


def other_models(models: list) -> str:
    """``"; 3 other models in the run: --variant, --model-seed"`` when a run kept more models
    than the one used (``sample``, ``export``), else ``""``."""
    others = len(models) - 1
    return (f"; {others} other model{'s' if others > 1 else ''} in the run: --variant, "
            "--model-seed") if others else ""


def pass_hydra_flags(app: typer.Typer) -> None:
    """Let every command that takes overrides also take Hydra's own flags (``--cfg job``,
    ``--info``, ...): Click hands an option it does not know to the overrides argument, and
    ``app.arguments.check_arguments`` refuses one that is not Hydra's. Call after all commands
    are registered."""
    for info in app.registered_commands:
        if info.callback is not None and "overrides" in signature(info.callback).parameters:
            info.context_settings = {"ignore_unknown_options": True,
                                     **(info.context_settings or {})}


def hydra_list(text: str | None) -> str | None:
    """``"1x, 2x,4x"`` -> ``"[1x,2x,4x]"`` (a Hydra list override value); None stays None."""
    if text is None:
        return None
    return "[" + ",".join(item.strip() for item in text.split(",") if item.strip()) + "]"


def overrides_from(options: dict[str, object]) -> list[str]:
    """``{"pe": "rope", "block": None}`` -> ``["pe=rope"]`` (None values are left out)."""
    return [f"{key}={value}" for key, value in options.items() if value is not None]


def launch(experiment: str, options: dict[str, object], overrides: list[str] | None,
           multirun: bool = False, out: Path | None = None,
           resume: Path | None = None, config_dir: Path | None = None,
           trust_code: bool = False, nproc: int = 1) -> NoReturn:
    """Run ``experiment`` through the Hydra app and exit with its code.

    ``resume``: an earlier sweep directory to complete, or an interrupted run's directory to go
    on with from its checkpoint (``--resume``; the app tells which). ``trust_code``: a run read
    (``--from-run``, ``--resume``) may name the user components it recorded (``--trust-code``).
    ``nproc`` > 1: the app on that many processes (``training.distributed.launch``)."""
    args = [f"experiment={experiment}", *overrides_from(options), *(overrides or [])]
    if resume is not None:
        args += ["--resume", str(resume)]
    if out is not None:
        args.append(f"hydra.{'sweep' if multirun else 'run'}.dir={out}")
    if multirun:
        args.append("--multirun")
    if config_dir is not None:
        args += ["--config-dir", str(config_dir)]
    if nproc > 1:
        from transformer_lab.training.distributed import launch as launch_processes

        raise typer.Exit(launch_processes(nproc, args))
    from transformer_lab.app.hydra_app import main
    from transformer_lab.config.registry import trusting_code

    with trusting_code(trust_code):
        code = main(args)
    raise typer.Exit(code)
