"""``--resume DIR``: the arguments that run again, into ``DIR``, the sweep or the single run it
recorded (``docs/cli.md``, "Resume")."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from transformer_lab.app.arguments import split_arguments
from transformer_lab.app.isolation import LAUNCHER_ENV
from transformer_lab.app.search import STUDY_CALLBACK
from transformer_lab.app.sweeps import RESUME_ENV, quote_value
from transformer_lab.config.registry import TRUST_HINT, code_trusted
from transformer_lab.errors import ConfigError
from transformer_lab.results.run_directory import CHECKPOINT_FILE, read_json
from transformer_lab.results.tracking import flatten

# Overrides a resumed run may add to the recorded ones: they change no number (--quiet, --force).
HARMLESS_ON_RESUME = ("logger.progress", "force")
# Statuses of a run that may go on (running: killed without a chance to say so).
RESUMABLE_STATUSES = ("running", "interrupted", "error")
FINISHED_STATUS = "passed"  # a finished run goes on only to more steps (train.steps=N)


def pop_resume(args: list[str]) -> tuple[list[str], Path | None]:
    """Take ``--resume DIR`` / ``--resume=DIR`` out of the arguments."""
    rest, resume, given = [], None, iter(args)
    for arg in given:
        if arg == "--resume":
            if (value := next(given, None)) is None:
                raise ConfigError("--resume needs a sweep directory or a run directory, e.g. "
                                  "--resume outputs/multirun/smoke/2026-01-01_12-00-00-000000")
            resume = Path(value)
        elif arg.startswith("--resume="):
            resume = Path(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return rest, resume


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _is_hydra_override(override: str) -> bool:
    key = _key(override)
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


_DROPPED_ON_RESUME = ("hydra.sweep.dir", "hydra.run.dir", "hydra.mode", "hydra.output_subdir",
                      f"hydra.job.env_set.{RESUME_ENV}", f"hydra.job.env_set.{LAUNCHER_ENV}",
                      "hydra.job.env_set.HYDRA_FULL_ERROR", STUDY_CALLBACK)


# A recorded override is data from a directory made elsewhere: without --trust-code it may not
# name a callable (instantiate keys), interpolate, or set Hydra's settings beyond the launcher's
# and sweeper's plain values (env_set, callbacks, logging can run code).
_CODE_IN_OVERRIDE = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_", "${")
_RECORDED_HYDRA = {"hydra.launcher.": re.compile(r"[\w.\-]*"),
                   "hydra.sweeper.": re.compile(r"[\w.\-+,:()\[\]/' ]*")}


def check_recorded(overrides: list[str], source: Path) -> None:
    """``ConfigError`` for a recorded override that could run code, unless ``--trust-code``."""
    if code_trusted():
        return
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        code = next((word for word in _CODE_IN_OVERRIDE if word in override), None)
        if code is not None:
            raise ConfigError(f"--resume: {source} records '{override}', which names code "
                              f"({code}); {TRUST_HINT}")
        if _is_hydra_override(override) and key not in ("hydra/launcher", "hydra/sweeper") \
                and not any(
                    key.startswith(prefix) and pattern.fullmatch(value)
                    for prefix, pattern in _RECORDED_HYDRA.items()):
            raise ConfigError(f"--resume: {source} records the Hydra setting '{override}'; "
                              "give it yourself on the command line, or trust the directory "
                              "with --trust-code")


def read_overrides(path: Path, error: str, part: str = "") -> list[str]:
    """The overrides recorded in ``path`` (``multirun.yaml``: its ``hydra.overrides.<part>``),
    tlab's own left out, checked to name no code; ``ConfigError(error)`` if unreadable."""
    try:
        recorded: Any = OmegaConf.to_container(OmegaConf.load(path))
        if part:
            recorded = recorded["hydra"]["overrides"][part]
        overrides = [str(o) for o in recorded if _key(str(o)) not in _DROPPED_ON_RESUME]
    except Exception as exc:
        raise ConfigError(f"{error} ({type(exc).__name__})") from None
    check_recorded(overrides, path)
    return overrides


def _refuse_others(directory: Path, kind: str, overrides: list[str], recorded: list[str],
                   allowed: list[str], hint: str = "") -> None:
    """``ConfigError`` for an override that names the directory, or is neither ``recorded``
    nor ``allowed``."""
    if named := [o for o in overrides if _key(o) in ("hydra.sweep.dir", "hydra.run.dir")]:
        raise ConfigError(f"--resume {directory} already names the {kind} directory; drop "
                          f"'{named[0]}' (or --out)")
    if foreign := [o for o in overrides if o not in recorded + allowed]:
        raise ConfigError(f"--resume {directory}: {' '.join(foreign)} is not part of the {kind} "
                          f"recorded there ({' '.join(recorded)}); give the same overrides or "
                          f"none{hint}")


def resume_arguments(sweep_dir: Path, args: list[str]) -> list[str]:
    """The Hydra arguments that run the sweep recorded in ``sweep_dir`` again, into it; ``args``
    may repeat recorded overrides and change Hydra settings, nothing else."""
    recorded_file = sweep_dir / "multirun.yaml"
    if not sweep_dir.is_dir():
        raise ConfigError(f"--resume {sweep_dir}: no such directory")
    if not recorded_file.exists():
        raise ConfigError(f"--resume {sweep_dir}: no multirun.yaml there, so it is not a sweep "
                          "directory (resume the folder that holds sweep.csv and the job "
                          "folders), and no run.json: not a run directory either")
    unreadable = f"--resume {sweep_dir}: multirun.yaml is unreadable"
    recorded_task = read_overrides(recorded_file, unreadable, "task")
    recorded_hydra = read_overrides(recorded_file, unreadable, "hydra")  # tlab's: added anew
    flags, overrides = split_arguments(args)
    user_hydra = [o for o in overrides if _is_hydra_override(o)]
    _refuse_others(sweep_dir, "sweep", overrides, recorded_task, user_hydra)
    # a launcher (sweeper) chosen now replaces the recorded one and the settings made for it
    replaced = tuple(f"hydra.{_key(o).split('/', 1)[1]}." for o in user_hydra
                     if _key(o) in ("hydra/launcher", "hydra/sweeper"))
    hydra_overrides = {_key(o): o for o in recorded_hydra if not _key(o).startswith(replaced)}
    hydra_overrides.update({_key(o): o for o in user_hydra})
    flags = [f for f in flags if f not in ("-m", "--multirun")]
    return ["--multirun", *flags, *recorded_task, *hydra_overrides.values(),
            f"hydra.sweep.dir={quote_value(str(sweep_dir))}", "hydra.output_subdir=null",
            f"+hydra.job.env_set.{RESUME_ENV}=1"]


def keep_multirun_yaml(sweep_dir: Path) -> None:
    """Keep ``multirun.yaml`` as ``multirun-<n>.yaml`` (Hydra rewrites it on every launch)."""
    source = sweep_dir / "multirun.yaml"
    if not source.exists():
        return
    n = 1
    while (target := sweep_dir / f"multirun-{n}.yaml").exists():
        n += 1
    shutil.copy2(source, target)


def run_arguments(run_dir: Path, args: list[str]) -> list[str]:
    """The Hydra arguments that go on with the run recorded in ``run_dir`` from its checkpoint;
    ``args`` may add only ``HARMLESS_ON_RESUME`` overrides and ``train.steps=N``."""
    info = read_json(run_dir / "run.json")
    status = info.get("status")
    if not (run_dir / CHECKPOINT_FILE).is_file():
        finished = f" (it finished: status {status})" if status not in RESUMABLE_STATUSES \
            else ""
        raise ConfigError(f"--resume {run_dir}: the run there has no checkpoint to go on "
                          f"from{finished}; tlab train keeps one at its end, on Ctrl-C or "
                          "SIGTERM, and every N steps with train.checkpoint_every=N")
    flags, overrides = split_arguments(args)
    steps = [o for o in overrides if _key(o) == "train.steps"]
    if status not in (*RESUMABLE_STATUSES, FINISHED_STATUS):
        raise ConfigError(f"--resume {run_dir}: the run there ended with status {status} "
                          f"({info.get('error') or 'no error'}); resuming would end the same way")
    if status == FINISHED_STATUS and not steps:
        done = _kept_steps(_checkpoint(run_dir))
        raise ConfigError(f"--resume {run_dir}: the run there finished its {done} steps (status "
                          f"{status}); to train it further give more steps: tlab train --resume "
                          f"{run_dir} train.steps={2 * done}")
    if steps:  # N above the steps taken, the finished seeds' final states kept
        state = _checkpoint(run_dir)  # once: it holds every seed's weights
        done, value = _kept_steps(state), steps[-1].partition("=")[2]
        if not value.strip().isdigit() or int(value) <= done:
            raise ConfigError(f"--resume {run_dir} {steps[-1]}: the run there has taken {done} "
                              f"steps; give train.steps=N with N > {done}, e.g. "
                              f"train.steps={2 * max(done, 1)}")
        if any(seed.get("trainer") is None for seed in state["done"]):
            raise ConfigError(f"--resume {run_dir} {steps[-1]}: its checkpoint keeps no final "
                              "state of its finished seeds (an older tlab made it); it cannot be "
                              "extended")
    recorded = read_overrides(run_dir / ".hydra" / "overrides.yaml", f"--resume {run_dir}: its "
                              ".hydra/overrides.yaml is missing or unreadable")
    if any(flag in ("-m", "--multirun") for flag in flags):
        raise ConfigError(f"--resume {run_dir} goes on with one run; drop -m/--multirun")
    harmless = [o for o in overrides if _key(o) in HARMLESS_ON_RESUME] + steps[-1:]
    _refuse_others(run_dir, "run", overrides, recorded, harmless + steps,
                   " (and train.steps=N to train it to N steps)")
    if steps:  # the new length replaces the recorded one
        recorded = [o for o in recorded if _key(o) != "train.steps"]
    return [*flags, *recorded, *harmless, f"hydra.run.dir={quote_value(str(run_dir))}"]


def _checkpoint(run_dir: Path) -> dict[str, Any]:
    from transformer_lab.training.checkpoint import load_state

    return load_state(run_dir / CHECKPOINT_FILE)


def _kept_steps(state: dict[str, Any]) -> int:
    """The most steps a seed has taken, by the run's checkpoint ``state``."""
    steps = [int(seed["result"]["steps"]) for seed in state["done"]]
    if state.get("current") is not None:
        steps.append(int(state["current"]["trainer"]["step"]))
    return max(steps, default=0)


def check_resumable(run_dir: Path, cfg: DictConfig) -> None:
    """``ConfigError`` naming the first key of ``cfg`` that differs from the config of
    ``run_dir``'s checkpoint."""
    from transformer_lab.config.spec import RunSpec

    then = flatten(OmegaConf.to_container(OmegaConf.create(_checkpoint(run_dir)["config"])))
    now = flatten(RunSpec.of(cfg).resolved())
    for key in sorted(set(then) | set(now)):
        if key.startswith(HARMLESS_ON_RESUME) or then.get(key) == now.get(key) or \
                key == "train.steps":  # a new length: run_arguments checked it
            continue
        raise ConfigError(f"--resume {run_dir}: {key} is {now.get(key, 'absent')} now but was "
                          f"{then.get(key, 'absent')} when the run was checkpointed (config files "
                          "changed since?); it cannot go on with the same numbers")
