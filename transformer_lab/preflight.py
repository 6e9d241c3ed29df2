"""Check Hydra arguments before anything is written: unknown choices or keys, malformed
overrides, invalid sizes, and an output directory that already holds a run all become one
``ConfigError`` line (exit code 2) instead of a Hydra traceback or a half-made run directory.
"""

from __future__ import annotations

from pathlib import Path

from transformer_lab.config import CONFIG_DIR, compose, group_choices, validate_config
from transformer_lab.errors import ConfigError
from transformer_lab.results import holds_run

# Hydra flags that take a value (the value is not an override).
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
                     "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_SKIP_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--help",
               "-h", "--hydra-help", "--shell-completion", "-sc", "--experimental-rerun"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
LAUNCHER_EXTRAS = {"joblib": "joblib", "submitit_local": "submitit", "submitit_slurm": "submitit",
                   "slurm": "submitit", "ray": "ray"}


def split_arguments(args: list[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra flags (with their values) from overrides."""
    flags, overrides, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            flags.append(arg)
            takes_value = arg in _FLAGS_WITH_VALUE or (
                arg in ("--info", "-i") and i + 1 < len(args) and args[i + 1] in _INFO_TOPICS
            )
            if takes_value and i + 1 < len(args):
                flags.append(args[i + 1])
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return flags, overrides


def _parse(overrides: list[str]) -> list:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as exc:
            detail = str(exc).strip().splitlines()[-1]
            raise ConfigError(f"malformed override '{text}': {detail}; expected key=value, "
                              "e.g. pe=rope or model.d_model=16") from None
    return parsed


def _values(override) -> list[str]:
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _check_group_choice(group: str, values: list[str]) -> None:
    if group.startswith("hydra/"):
        available = group_choices_hydra(group.split("/", 1)[1])
        for value in values:
            if value not in available:
                extra = LAUNCHER_EXTRAS.get(value)
                hint = f"; install it with: pip install 'transformer_lab[{extra}]'" if extra else ""
                raise ConfigError(f"{group}={value} is not available (installed: "
                                  f"{', '.join(available) or 'none'}){hint}")
        return
    choices = group_choices(group)
    if not choices:
        return
    for value in values:
        if value not in choices and value != "null":
            raise ConfigError(f"unknown {group} '{value}'; valid: {', '.join(choices)}")


def group_choices_hydra(kind: str) -> list[str]:
    """Choices of a Hydra group such as hydra/launcher (installed plugins included)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.plugins import Plugins  # noqa: F401  (registers plugin search paths)

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(CONFIG_DIR)))
    return sorted(loader.get_group_options(f"hydra/{kind}"))


def check_output_dir(path: Path, sweep: bool) -> None:
    if holds_run(path) or (sweep and (path / "sweep.csv").exists()):
        raise ConfigError(f"'{path}' already holds a run; choose another output directory "
                          "(runs are never overwritten)")
    if sweep and path.is_dir() and any(holds_run(p) for p in path.iterdir() if p.is_dir()):
        raise ConfigError(f"'{path}' already holds a sweep's runs; choose another directory")


def preflight(args: list[str]) -> None:
    """Raise ``ConfigError`` for arguments that cannot make a valid run."""
    flags, overrides = split_arguments(args)
    if any(flag in _SKIP_FLAGS for flag in flags):
        return  # a user config dir or help: let Hydra handle it
    parsed = _parse(overrides)
    first_values = []
    for override in parsed:
        key = override.key_or_group
        values = _values(override)
        if override.is_sweep_override() and not values:
            raise ConfigError(f"the sweep '{override.input_line}' has no values")
        if key in ("hydra.run.dir", "hydra.sweep.dir"):
            check_output_dir(Path(values[0]), sweep=key == "hydra.sweep.dir")
        if override.is_delete():
            first_values.append(override.input_line)
            continue
        if "." not in key and ("/" in key or key in group_choices_top()):
            _check_group_choice(key, values)
        if override.is_sweep_override():
            head = override.input_line.split("=", 1)[0]
            first_values.append(f"{head}={values[0]}")
        else:
            first_values.append(override.input_line)
    try:
        cfg = compose(first_values)
    except ConfigError:
        raise
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ConfigError(f"invalid override: {message}") from None
    validate_config(cfg)


def group_choices_top() -> set[str]:
    return {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()}
