"""``--resume DIR``: the arguments that run the sweep recorded in ``DIR`` again, into it.

``DIR/multirun.yaml`` holds the sweep's overrides; they run again with ``hydra.sweep.dir=DIR``
and ``TLAB_RESUME=1`` in each job, which then skips a passed job or moves a failed attempt
aside (``sweeps.run_sweep_job``). Hydra rewrites ``multirun.yaml`` on every launch, so the
earlier one is kept first (:func:`keep_multirun_yaml`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from transformer_lab.app.isolation import LAUNCHER_ENV
from transformer_lab.app.sweeps import RESUME_ENV, quote_value
from transformer_lab.errors import ConfigError


def pop_resume(args: list[str]) -> tuple[list[str], Path | None]:
    """Take ``--resume DIR`` / ``--resume=DIR`` out of the arguments."""
    rest, resume, i = [], None, 0
    while i < len(args):
        arg = args[i]
        if arg == "--resume":
            if i + 1 >= len(args):
                raise ConfigError("--resume needs a sweep directory, e.g. --resume "
                                  "outputs/multirun/smoke/2026-01-01_12-00-00-000000")
            resume, i = Path(args[i + 1]), i + 2
            continue
        if arg.startswith("--resume="):
            resume = Path(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return rest, resume


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _is_hydra_override(override: str) -> bool:
    key = _key(override)
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


_DROPPED_ON_RESUME = ("hydra.sweep.dir", "hydra.run.dir", "hydra.mode", "hydra.output_subdir",
                      f"hydra.job.env_set.{RESUME_ENV}", f"hydra.job.env_set.{LAUNCHER_ENV}")


def resume_arguments(sweep_dir: Path, args: list[str]) -> list[str]:
    """The Hydra arguments that run the sweep recorded in ``sweep_dir`` again, into it.

    ``args`` may repeat the recorded overrides (or a subset, e.g. the ``experiment=`` a command
    adds) and may change Hydra settings such as the launcher; a task override that is not part
    of the recorded sweep is refused."""
    from transformer_lab.app.arguments import split_arguments

    recorded_file = sweep_dir / "multirun.yaml"
    if not sweep_dir.is_dir():
        raise ConfigError(f"--resume {sweep_dir}: no such directory")
    if not recorded_file.exists():
        raise ConfigError(f"--resume {sweep_dir}: no multirun.yaml there, so it is not a sweep "
                          "directory (resume the folder that holds sweep.csv and the job folders)")
    try:
        recorded = OmegaConf.load(recorded_file).hydra.overrides
        recorded_task = [str(o) for o in recorded.task]
        recorded_hydra = [str(o) for o in recorded.hydra]
    except Exception as exc:
        raise ConfigError(f"--resume {sweep_dir}: multirun.yaml is unreadable "
                          f"({type(exc).__name__})") from None
    flags, overrides = split_arguments(args)
    user_task = [o for o in overrides if not _is_hydra_override(o)]
    user_hydra = [o for o in overrides if _is_hydra_override(o)]
    foreign = [o for o in user_task if o not in recorded_task]
    if foreign:
        raise ConfigError(f"--resume {sweep_dir}: {' '.join(foreign)} is not part of the sweep "
                          f"recorded there ({' '.join(recorded_task)}); give the same overrides "
                          "or none")
    for override in user_hydra:
        if _key(override) in ("hydra.sweep.dir", "hydra.run.dir"):
            raise ConfigError(f"--resume {sweep_dir} already names the sweep directory; drop "
                              f"'{override}' (or --out)")
    # a launcher (sweeper) chosen now replaces the recorded one and the settings made for it
    replaced = tuple(f"hydra.{_key(o).split('/', 1)[1]}." for o in user_hydra
                     if _key(o) in ("hydra/launcher", "hydra/sweeper"))
    hydra_overrides = {_key(o): o for o in recorded_hydra
                       if _key(o) not in _DROPPED_ON_RESUME and not _key(o).startswith(replaced)}
    hydra_overrides.update({_key(o): o for o in user_hydra})
    flags = [f for f in flags if f not in ("-m", "--multirun")]
    return ["--multirun", *flags, *recorded_task, *hydra_overrides.values(),
            f"hydra.sweep.dir={quote_value(str(sweep_dir))}", "hydra.output_subdir=null",
            f"+hydra.job.env_set.{RESUME_ENV}=1"]


def keep_multirun_yaml(sweep_dir: Path) -> None:
    """Hydra rewrites ``multirun.yaml`` on every launch: keep the earlier one as
    ``multirun-<n>.yaml`` before a resume."""
    source = sweep_dir / "multirun.yaml"
    if not source.exists():
        return
    n = 1
    while (target := sweep_dir / f"multirun-{n}.yaml").exists():
        n += 1
    shutil.copy2(source, target)

