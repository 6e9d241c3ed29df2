"""The bare Hydra application. ``tlab run ARGS`` and ``python -m transformer_lab.run ARGS`` are
the same program; every other command builds Hydra overrides and comes through here, so
``-m``, ``--cfg job``, ``--info``, ``hydra/launcher=...`` work everywhere as in any Hydra app.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from transformer_lab.config import CONFIG_DIR
from transformer_lab.errors import EXIT_INTERRUPTED, EXIT_USAGE, ConfigError
from transformer_lab.preflight import preflight

# Exit codes of the jobs that ran in this process (single runs and in-process sweeps).
JOB_EXIT_CODES: list[int] = []


@hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
def hydra_app(cfg: DictConfig) -> int:
    from transformer_lab.runner import execute

    code = execute(cfg, Path(HydraConfig.get().runtime.output_dir))
    JOB_EXIT_CODES.append(code)
    return code


def main(argv: list[str] | None = None) -> int:
    """Check the arguments, run the Hydra app with them, return the worst job exit code."""
    from transformer_lab.console import print_error

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        preflight(args)
    except ConfigError as exc:
        print_error(str(exc))
        return EXIT_USAGE
    JOB_EXIT_CODES.clear()
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
    return max(JOB_EXIT_CODES, default=0)


if __name__ == "__main__":
    sys.exit(main())
