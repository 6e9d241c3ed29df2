"""The one place where tlab uses Hydra's private API (``hydra._internal``, the layout of the
ConfigStore's ``repo``, and the Optuna sweeper plugin's ``_impl``).

Checked on hydra-core 1.3.2 and 1.3.8 (``pyproject.toml`` allows ``>=1.3,<1.4``) and
hydra-optuna-sweeper 1.3.0. Everything else in tlab uses Hydra's public API only; if a Hydra
release moves these names, this file is the one to fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_PROVIDER = "tlab"  # the ConfigStore entries that store_choices makes (and replaces)


def locate(path: str) -> Any:
    """The object named by a dotted ``_target_`` path (what ``hydra.utils.instantiate`` does)."""
    from hydra._internal.utils import _locate

    return _locate(path)


def group_options(config_dir: Path, group: str) -> list[str]:
    """The choices of config group ``group`` (e.g. ``hydra/launcher``) as Hydra's loader sees
    them from ``config_dir``, installed Hydra plugins included."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.plugins import Plugins  # noqa: F401  (registers plugin search paths)

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(config_dir)))
    return sorted(loader.get_group_options(group))


def _search_path(config_dir: Path, user_dirs: list[Path]) -> Any:
    """tlab's tree plus the ``--config-dir`` trees after it, as ``hydra.main`` builds the search
    path (``--config-dir`` goes before the structured-config schemas, after the app's tree: a
    name in both trees is tlab's)."""
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_automatic_config_search_path(None, None, str(config_dir))
    for user_dir in user_dirs:
        search_path.prepend(provider="command-line", path=f"file://{Path(user_dir).resolve()}",
                            anchor=SearchPathQuery(provider="schema"))
    return search_path


def store_choices(choices: Mapping[str, Mapping[str, Path | Mapping[str, Any]]]) -> None:
    """Offer ``choices`` (group -> choice -> its YAML file or config node) in Hydra's
    ConfigStore, in place of those this function offered before. Hydra searches the store
    after every config folder, and a launcher carries it to its worker processes."""
    from hydra.core.config_store import ConfigNode, ConfigStore
    from omegaconf import OmegaConf

    store = ConfigStore.instance()
    for options in store.repo.values():
        if isinstance(options, dict):
            for name in [n for n, node in options.items()
                         if isinstance(node, ConfigNode) and node.provider == _PROVIDER]:
                del options[name]
    for group, options in choices.items():
        for choice, node in options.items():
            store.store(name=choice, group=group, provider=_PROVIDER,
                        node=OmegaConf.load(node) if isinstance(node, Path) else node)


def compose_app_config(config_dir: Path, user_dirs: list[Path], overrides: list[str]) -> Any:
    """The config of one run exactly as ``hydra.main`` composes it (the ``hydra`` node and its
    runtime fields included), plus the handle :func:`run_job` needs to run it."""
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name="run",
                                     config_search_path=_search_path(config_dir, user_dirs))
    try:
        cfg = hydra.compose_config("config", overrides, run_mode=RunMode.RUN,
                                   with_log_configuration=True)
    finally:
        GlobalHydra.instance().clear()  # as after hydra.main; the handle still runs the job
    return hydra, cfg


def run_job(hydra: Any, cfg: Any, task_function: Callable[[Any], Any]) -> Any:
    """Run ``task_function`` on the composed ``cfg`` as ``hydra.main`` runs a single job: run
    directory, ``.hydra/`` files, logging, callbacks; returns what the task function returned."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext

    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name="config")
    result = hydra_run_job(hydra_context=HydraContext(config_loader=hydra.config_loader,
                                                      callbacks=callbacks),
                           task_function=task_function, config=cfg,
                           job_dir_key="hydra.run.dir", job_subdir_key=None)
    callbacks.on_run_end(config=cfg, config_name="config", job_return=result)
    return result.return_value


class _Reraised(BaseException):
    """Carries an exception past Hydra's ``run_and_report`` (which catches ``Exception``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def run_hydra(argv: list[str], task_function: Callable[[Any], Any], config_dir: Path,
              reraise: tuple[type[BaseException], ...] = ()) -> None:
    """Hydra's own command line on ``argv`` (sweeps, ``--cfg``, ``--info``, ``--help``), as
    ``hydra.main`` runs it, without reading or changing ``sys.argv``. An exception of a type in
    ``reraise`` reaches the caller instead of Hydra's report (a traceback and exit 1)."""
    import hydra._internal.utils as hydra_utils

    parser = hydra_utils.get_args_parser()
    args = parser.parse_args(argv)
    original = hydra_utils.run_and_report

    def run_and_report(func: Callable[[], Any]) -> Any:
        def guarded() -> Any:
            try:
                return func()
            except reraise as exc:
                raise _Reraised(exc) from None
        return original(guarded)

    hydra_utils.run_and_report = run_and_report
    try:
        hydra_utils._run_hydra(args=args, args_parser=parser, task_function=task_function,
                               config_path=str(config_dir), config_name="config")
    except _Reraised as wrapped:
        raise wrapped.error from None
    finally:
        hydra_utils.run_and_report = original


@contextmanager
def after_optuna_sweeper_setup(extend: Callable[[Any], None]) -> Iterator[None]:
    """Within the block, Optuna's Hydra sweeper calls ``extend(sweeper)`` after its own
    ``setup`` (the plugin's private ``OptunaSweeperImpl``)."""
    from hydra_plugins.hydra_optuna_sweeper._impl import OptunaSweeperImpl

    original = OptunaSweeperImpl.setup

    def setup(self: Any, **kwargs: Any) -> None:
        original(self, **kwargs)
        extend(self)

    OptunaSweeperImpl.setup = setup
    try:
        yield
    finally:
        OptunaSweeperImpl.setup = original


def in_multirun() -> bool:
    """True inside a job of a Hydra multirun (a sweep), False in a single run or outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
