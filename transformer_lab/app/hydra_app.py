"""The Hydra application every command runs through (``tlab run``): one parse, one compose, one
pre-flight per run; sweeps and printing flags go through Hydra's own command line
(``docs/cli.md``)."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log, env_override
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from transformer_lab.app import recovery, resume, search, sweeps
from transformer_lab.app.arguments import Arguments, check_arguments, compose_first_job
from transformer_lab.app.isolation import LAUNCHER_ENV, save_hydra_files
from transformer_lab.app.job import execute
from transformer_lab.config.tree import CONFIG_DIR, config_store_kept
from transformer_lab.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, ConfigError
from transformer_lab.results.console import console, print_error
from transformer_lab.results.run_directory import claim_directory, reclaim_directory
from transformer_lab.routines.objective import require_objective
from transformer_lab.training import distributed

FULL_ERROR = "HYDRA_FULL_ERROR"  # "1": Hydra raises an error instead of reporting it
# Flags of every command, read here: run even if the memory estimate refuses; no progress bars.
APP_FLAGS = {"--force": "force=true", "--quiet": "logger.progress=false",
             "-q": "logger.progress=false"}


def hydra_job(cfg: DictConfig) -> int:
    """A job started by Hydra's command line (a sweep's): pre-flight, run, ``sweep.csv`` row."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    with open_dict(cfg):  # --config-dir trees, so that routines find their choices too
        cfg.config_dirs = [source.path for source in hydra_cfg.runtime.config_sources
                           if source.provider == "command-line" and source.schema == "file"]
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return execute(cfg, run_dir)
    code = sweeps.run_sweep_job(cfg, execute)  # --resume skips, sweep.csv row
    if "optuna" in str(hydra_cfg.sweeper.get("_target_", "")).lower():  # a search's trial
        return search.trial_value(run_dir)
    return code


def main(argv: list[str] | None = None) -> int:
    """Check the arguments, run the job (or Hydra's sweep), return the worst job exit code."""
    from transformer_lab.app.preflight import check_unbuilt, preflight

    args = list(sys.argv[1:] if argv is None else argv)
    with working_directory_importable(), config_store_kept():  # _target_=my_module.MyPE
        try:
            with one_line_errors():
                args, resume_dir = resume.pop_resume(args)
                flag_overrides = dict.fromkeys(APP_FLAGS[a] for a in args if a in APP_FLAGS)
                args = [*(a for a in args if a not in APP_FLAGS), *flag_overrides]
                resumed_run = None  # a single run's directory, to go on from its checkpoint
                if resume_dir is not None and (resume_dir / "run.json").is_file() \
                        and not (resume_dir / "multirun.yaml").exists():
                    resumed_run = resume_dir
                    args = resume.run_arguments(resume_dir, args)
                elif resume_dir is not None:
                    args = resume.resume_arguments(resume_dir, args)
                arguments = check_arguments(args, resume=resume_dir is not None)
                if arguments.hydra_only:
                    return run_hydra([*arguments.flags, *arguments.overrides], hydra_job)
                cfg = compose_first_job(arguments)
                distributed.check_distributed(str(cfg.routine.name), arguments.single_run)
                if arguments.printing:  # --cfg, --info: nothing is built (no corpus downloaded)
                    check_unbuilt(cfg)
                elif not arguments.single_run:  # a sweep: its first job's pre-flight
                    preflight(cfg)
                    if search.uses_optuna(arguments.overrides):
                        require_objective(str(cfg.routine.name))  # a search needs one
                    sweep_dir = Path(str(OmegaConf.select(cfg, "hydra.sweep.dir"))).resolve()
                    if resume_dir is None:
                        claim_directory(sweep_dir)
            if resume_dir is not None and resumed_run is None:
                resume.keep_multirun_yaml(resume_dir)
            if arguments.single_run:
                return run_single(cfg, resumed_run)
            if arguments.printing:  # --cfg, --info: Hydra prints
                return run_hydra([*arguments.flags, *arguments.overrides], hydra_job)
            code = _run_sweep(arguments, sweep_dir, cfg)
        except ConfigError as exc:  # refused: one line
            print_error(str(exc))
            return EXIT_USAGE
        except KeyboardInterrupt as exc:  # ``Interrupted`` says where and how to go on
            print_error(str(exc) or "interrupted; rows logged so far are kept")
            return getattr(exc, "exit_code", EXIT_INTERRUPTED)
        # The jobs may have run in other processes (joblib, submitit): read their statuses.
        sweeps.print_sweep_summary(sweep_dir)
        return max(code, sweeps.sweep_exit_code(sweep_dir))


def run_single(cfg: DictConfig, resumed: Path | None = None) -> int:
    """A single run of the composed ``cfg``: pre-flight, claim ``hydra.run.dir``, run its job
    there as Hydra would; the exit code. ``resumed``: an interrupted run's directory to go on in
    (``--resume``). ``ConfigError`` (nothing written) when refused."""
    from transformer_lab.app.preflight import preflight

    with one_line_errors():
        inputs = preflight(cfg)
        HydraConfig.instance().set_config(cfg)  # for ${hydra:runtime.choices.experiment}
        # hydra.run.dir resolved once (${now:} changes on each read) and written back
        run_dir = Path(str(OmegaConf.select(cfg, "hydra.run.dir"))).absolute()
        with read_write(cfg.hydra.run), open_dict(cfg.hydra.run):
            cfg.hydra.run.dir = str(run_dir)
        if not distributed.world().leader:  # a rank > 0 of torchrun: a throwaway directory
            with read_write(cfg), open_dict(cfg):  # no progress bars or trackers
                cfg.logger = {"name": "csv", "progress": False}
            console.quiet = True  # its console prints only errors
            with distributed.follower_directory(resumed) as follower_dir, \
                    distributed.process_group(str(cfg.train.device)):
                return execute(cfg, follower_dir, inputs)
        if resumed is not None:
            resume.check_resumable(resumed, cfg)
            reclaim_directory(run_dir)
        else:
            claim_directory(run_dir)  # claimed before Hydra writes .hydra/ there
    with distributed.process_group(str(cfg.train.device)):
        return _run_job(cfg, run_dir, inputs)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Any exception in the block as a one-line ``ConfigError``, unless ``HYDRA_FULL_ERROR=1``."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        if os.environ.get(FULL_ERROR) == "1":
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"invalid configuration: {type(exc).__name__}: {first} (set "
                          "HYDRA_FULL_ERROR=1 for the traceback)") from exc


def _run_job(cfg: DictConfig, run_dir: Path, inputs: object) -> int:
    """The job of ``cfg`` in ``run_dir``, as ``hydra.core.utils.run_job`` runs one (``.hydra/``,
    ``run.log``, ``env_set``, ``chdir``), without composing ``cfg`` again."""
    with read_write(cfg.hydra.runtime), open_dict(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(cfg)
    job_cfg = copy.deepcopy(cfg)  # what a task gets: the config without its hydra node
    with read_write(job_cfg), open_dict(job_cfg):
        del job_cfg["hydra"]
    run_dir.mkdir(parents=True, exist_ok=True)
    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
    if cfg.hydra.output_subdir is not None:
        save_hydra_files(job_cfg, run_dir, str(cfg.hydra.output_subdir))
    with contextlib.chdir(run_dir) if cfg.hydra.job.chdir else contextlib.nullcontext(), \
            env_override(cfg.hydra.job.env_set):
        return execute(job_cfg, run_dir, inputs)  # type: ignore[arg-type]


def _run_sweep(arguments: Arguments, sweep_dir: Path, cfg: DictConfig) -> int:
    """The sweep through Hydra pinned to ``sweep_dir`` (an Optuna search given tlab's study
    settings; ``cfg``: the first job's config), relaunched while that makes progress when a
    launcher worker's death breaks its pool (``app.recovery``)."""
    finished = -1
    while True:
        overrides = list(arguments.overrides)
        if not any(o.startswith("hydra.sweep.dir=") for o in overrides):
            overrides.append(f"hydra.sweep.dir={sweeps.quote_value(str(sweep_dir))}")
        # jobs in other processes run isolated (app.isolation); they see the user's
        # HYDRA_FULL_ERROR, not the one run_hydra sets
        overrides += [f"+hydra.job.env_set.{LAUNCHER_ENV}={os.getpid()}",
                      f"+hydra.job.env_set.{FULL_ERROR}={os.environ.get(FULL_ERROR, '0')}"]
        if search.uses_optuna(overrides):
            overrides += search.sweeper_overrides(overrides, cfg, sweep_dir)
        try:
            return run_hydra([*arguments.flags, *overrides], hydra_job, recovery.BROKEN_POOL)
        except recovery.BROKEN_POOL as exc:
            lost, stopped, done = recovery.settle_jobs(sweep_dir, exc)
            again = done > finished and not search.uses_optuna(arguments.overrides)
            print_error(recovery.summary(exc, lost, stopped, again))
            if not again:
                return EXIT_FAILED
            finished, arguments = done, recovery.retry_arguments(arguments)


def run_hydra(argv: list[str], task_function: Callable[[DictConfig], object],
              reraise: tuple[type[BaseException], ...] = ()) -> int:
    """``hydra.main`` with ``sys.argv`` set to ``argv``; its exit code. An exception in
    ``reraise`` reaches the caller (Hydra runs with ``HYDRA_FULL_ERROR=1``; any other error is
    then reported here as Hydra would: its message, or a traceback if not Hydra's)."""
    user_full_error = os.environ.get(FULL_ERROR)
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "tlab", *argv]
    try:
        with env_override({FULL_ERROR: "1"} if reraise else {}):
            hydra.main(config_path=str(CONFIG_DIR), config_name="config",
                       version_base="1.3")(WithCommandLine(task_function, saved_argv))()
    except SystemExit as exc:  # Hydra's own errors and --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except reraise:
        raise
    except Exception as exc:
        if not reraise or user_full_error == "1":
            raise
        if not isinstance(exc, CompactHydraException):
            traceback.print_exception(exc)
        else:
            sys.stderr.write(f"{exc}{os.linesep}")
            if isinstance(exc.__cause__, OmegaConfBaseException):
                sys.stderr.write(f"{exc.__cause__}{os.linesep}")
        return EXIT_FAILED
    finally:
        sys.argv = saved_argv
    return 0


class WithCommandLine:
    """A picklable task function run with ``sys.argv`` the launching process's command line."""

    def __init__(self, task_function: Callable[[DictConfig], object], argv: list[str]) -> None:
        self.task_function, self.argv = task_function, list(argv)
        self.__module__ = task_function.__module__  # where Hydra looks for the app

    def __call__(self, cfg: DictConfig) -> object:
        hydra_argv, sys.argv = sys.argv, self.argv
        try:
            return self.task_function(cfg)
        finally:
            sys.argv = hydra_argv


@contextmanager
def working_directory_importable() -> Iterator[None]:
    """The working directory on ``sys.path`` meanwhile (``_target_: my_module.MyPE``)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


@contextmanager
def trusted(trust_code: bool) -> Iterator[None]:
    """With ``--trust-code`` (``trust_code=True``): a run's config may name its recorded user
    components, and the working directory is importable."""
    from transformer_lab.config.registry import trusting_code

    with trusting_code(trust_code), working_directory_importable() if trust_code \
            else contextlib.nullcontext():
        yield


if __name__ == "__main__":
    sys.exit(main())
