"""The bare Hydra application. ``tlab run ARGS`` and ``python -m transformer_lab.run ARGS`` are
the same program; every other command builds Hydra overrides and comes through here, so
``-m``, ``--cfg job``, ``--info``, ``hydra/launcher=...`` work everywhere as in any Hydra app.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from transformer_lab.app.arguments import preflight, split_arguments
from transformer_lab.config.tree import CONFIG_DIR
from transformer_lab.errors import EXIT_INTERRUPTED, EXIT_USAGE, ConfigError

# Exit codes of the jobs that ran in this process (single runs and in-process sweeps).
JOB_EXIT_CODES: list[int] = []


@hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
def hydra_app(cfg: DictConfig) -> int:
    from hydra.types import RunMode

    from transformer_lab.app.job import execute
    from transformer_lab.config.tree import set_user_config_dirs

    hydra_cfg = HydraConfig.get()
    # --config-dir trees, so that routines find their choices too (e.g. --activations)
    set_user_config_dirs([Path(source.path) for source in hydra_cfg.runtime.config_sources
                          if source.provider == "command-line" and source.schema == "file"])
    if hydra_cfg.mode == RunMode.MULTIRUN:
        from transformer_lab.app.sweeps import run_sweep_job

        code = run_sweep_job(cfg, execute)  # --resume skips, sweep.csv row
    else:
        code = execute(cfg, Path(hydra_cfg.runtime.output_dir))
    JOB_EXIT_CODES.append(code)
    return code


def main(argv: list[str] | None = None) -> int:
    """Check the arguments, run the Hydra app with them, return the worst job exit code."""
    from transformer_lab.app import sweeps
    from transformer_lab.results.console import print_error

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        args, resume_dir = sweeps.pop_resume(args)
        if resume_dir is not None:
            args = sweeps.resume_arguments(resume_dir, args)
        args = renamed_group_aliases(args)
        preflight(args, resume=resume_dir is not None)
    except ConfigError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    if resume_dir is not None:
        sweeps.keep_multirun_yaml(resume_dir)
    flags, overrides = split_arguments(args)
    args = [*flags, *overrides]  # Hydra's parser wants its flags before the overrides
    if os.getcwd() not in sys.path:  # a user's own components: _target_=my_module.MyPE
        sys.path.insert(0, os.getcwd())
    JOB_EXIT_CODES.clear()
    sweeps.STARTED_SWEEPS.clear()
    saved_argv = sys.argv
    sys.argv = [saved_argv[0] if saved_argv else "tlab", *args]
    try:
        hydra_app()
    except KeyboardInterrupt:
        print_error("interrupted; rows logged so far are kept")
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # Hydra's own errors and --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved_argv
    # Jobs may have run in other processes (joblib, submitit): read their recorded statuses.
    codes = list(JOB_EXIT_CODES)
    for sweep_dir in sweeps.STARTED_SWEEPS:
        sweeps.print_sweep_summary(sweep_dir)
        codes.append(sweeps.sweep_exit_code(sweep_dir))
    return max(codes, default=0)


def renamed_group_aliases(args: list[str]) -> list[str]:
    """The arguments with old config-group names renamed (``activation=`` -> ``ffn=``,
    ``norm=`` -> ``block=``), saying so once per old name on stderr."""
    from transformer_lab.config.compose import GROUP_ALIASES, rename_group_aliases
    from transformer_lab.results.console import print_warning

    flags, overrides = split_arguments(args)
    overrides, used = rename_group_aliases(overrides)
    for old in dict.fromkeys(used):
        print_warning(f"'{old}=' is now '{GROUP_ALIASES[old]}=' (the old name works until tlab "
                      "0.3)")
    return [*flags, *overrides]


if __name__ == "__main__":
    sys.exit(main())
