"""Parse and check a command line once, before anything is written; compose the first job once.
Every problem is one ``ConfigError`` line (exit code 2)."""

from __future__ import annotations

import difflib
import re
import shutil
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict

from transformer_lab.app.sweeps import quote_value
from transformer_lab.config.compose import GROUP_ALIASES, compose, rename_group_aliases
from transformer_lab.config.tree import (
    CONFIG_DIR,
    config_dirs,
    group_choices,
    old_group_folder_notes,
    store_choices,
)
from transformer_lab.errors import ConfigError
from transformer_lab.results.console import print_warning
from transformer_lab.results.run_directory import claimed_by, holds_run, resume_hint
from transformer_lab.results.tracking import flatten

# Hydra flags that take a value (the value is not an override).
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name",
                     "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_SKIP_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--help", "-h", "--hydra-help",
               "--shell-completion", "-sc", "--experimental-rerun"}
_CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
# Every flag Hydra's command line knows (anything else starting with '-' is a typo).
HYDRA_FLAGS = _FLAGS_WITH_VALUE | _SKIP_FLAGS | {"--version", "--resolve", "--run", "-r",
                                                 "--multirun", "-m", "--info", "-i"}
_INFO_TOPICS = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
# Each extra installs hydra_plugins.hydra_<extra>_launcher (a preset in configs/hydra/launcher
# needs its plugin too).
LAUNCHER_EXTRAS = {"joblib": "joblib", "submitit_local": "submitit", "submitit_slurm": "submitit",
                   "slurm": "submitit", "ray": "ray", "ray_aws": "ray"}
SLURM_LAUNCHERS = ("submitit_slurm", "slurm")  # submit with srun: it must be on PATH


def nearest(name: str, candidates: list[str]) -> str | None:
    """The candidate ``name`` most likely meant (initials, ``difflib``, a prefix), or None."""
    def leaf(text: str) -> str:
        return text.lstrip("-+~").rsplit(".", 1)[-1].replace("_", "-")

    words = [w for w in re.split(r"[-_]", leaf(name)) if w]
    by_leaf: dict[str, str] = {}
    for candidate in candidates:
        by_leaf.setdefault(leaf(candidate), candidate)
    initials = "".join(w[0] for w in words)
    if len(words) > 1 and initials in by_leaf:
        return by_leaf[initials]
    close = difflib.get_close_matches(leaf(name), list(by_leaf), n=1, cutoff=0.6)
    if not close:  # a prefix (--batch for --batch-size)
        close = [c for c in by_leaf if len(leaf(name)) >= 3 and c.startswith(leaf(name))][:1]
    return by_leaf[close[0]] if close else None


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
    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.extend(parser.parse_overrides([text]))
        except OverrideParseException as exc:
            raise ConfigError(_parse_error(text, str(exc))) from None
    return parsed


def _parse_error(text: str, message: str) -> str:
    """One line for a Hydra grammar error (its own text has a URL and the token list)."""
    lines = [line for line in message.strip().splitlines()
             if not line.startswith(("See https://", "Error parsing override"))]
    detail = (lines[0] if lines else message).split(" expecting {")[0]
    if "empty choice" in detail:
        return f"the sweep '{text}' has no values"
    if text.rstrip().endswith(",") or ",," in text:
        detail = "a sweep value is missing next to ','"
    return (f"malformed override '{text}': {detail}; expected key=value or a sweep key=a,b, "
            "e.g. pe=rope or seed=0,1,2")


def _values(override) -> list[str]:
    if override.is_interval_sweep():  # an Optuna search's interval(a,b): check with a
        start = override.value().start
        return [str(int(start)) if float(start).is_integer() else str(start)]
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _check_group_choice(group: str, values: list[str], user_dirs: list[Path],
                        running: bool = True) -> None:
    if group.startswith("hydra/"):
        GlobalHydra.instance().clear()  # the group's choices, installed plugins included
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            available = sorted(GlobalHydra.instance().config_loader().get_group_options(group))
        launcher = group == "hydra/launcher"
        for value in values:
            extra = LAUNCHER_EXTRAS.get(value) if launcher else None
            if value not in available or \
                    (extra and not _importable(f"hydra_plugins.hydra_{extra}_launcher")):
                hint = (f"; install it with: pip install 'transformer_lab[{extra}]'" if extra
                        else "; Hydra plugins are pip packages (e.g. hydra-optuna-sweeper)")
                raise ConfigError(f"{group}={value} is not available (installed: "
                                  f"{', '.join(available) or 'none'}){hint}")
            if running and launcher and value in SLURM_LAUNCHERS and shutil.which("srun") is None:
                raise ConfigError(f"{group}={value} submits to SLURM but 'srun' is not on "
                                  "PATH: run it on the cluster's login node (to try the sweep "
                                  "here use hydra/launcher=submitit_local)")
        return
    choices = group_choices(group, user_dirs)
    for value in values:
        if choices and value not in choices and value != "null":
            raise ConfigError(f"unknown {group} '{value}'; valid: {', '.join(choices)}")


def _importable(module: str) -> bool:
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_output_dir(path: Path, sweep: bool) -> None:
    """Refuse an output directory that holds a run, a sweep, a user's files, or a claim."""
    if holds_run(path) or (sweep and (path / "sweep.csv").exists()):
        raise ConfigError(f"'{path}' already holds a run; choose another output directory "
                          f"(runs are never overwritten){resume_hint(path)}")
    if not sweep and ((path / "sweep.csv").exists() or (path / "multirun.yaml").exists()):
        raise ConfigError(f"'{path}' is a sweep's folder; a single run needs a directory of its "
                          "own (tlab report reads the sweep there)")
    if (owner := claimed_by(path)) is not None:
        raise ConfigError(f"'{path}' is already taken by another run: {owner}; choose another "
                          "output directory")
    if sweep and path.is_dir() and any(holds_run(p) for p in path.iterdir() if p.is_dir()):
        raise ConfigError(f"'{path}' already holds a sweep's runs; choose another directory")
    if path.is_dir() and (found := sorted(p.name for p in path.iterdir())):
        raise ConfigError(f"'{path}' holds files but no run ({', '.join(found[:3])}"
                          f"{', ...' if len(found) > 3 else ''}); tlab never writes among your "
                          "files: choose a new or empty output directory")


@dataclass
class Arguments:
    """A command line, parsed once and checked: what ``hydra_app.main`` runs."""

    flags: list[str]                # Hydra's flags (-m, --cfg job, --config-dir DIR, ...)
    overrides: list[str]            # the overrides, as Hydra gets them
    first_job: list[str] = field(default_factory=list)  # a sweep's first values (its 1st job)
    config_dirs: list[Path] = field(default_factory=list)  # --config-dir trees
    multirun: bool = False
    printing: bool = False          # --cfg / --info: Hydra prints, nothing runs
    hydra_only: bool = False        # --help, another primary config: Hydra handles it all

    @property
    def single_run(self) -> bool:
        return not (self.multirun or self.printing or self.hydra_only)


def check_arguments(args: list[str], resume: bool = False) -> Arguments:
    """Parse the command line once; ``ConfigError`` for arguments that cannot make a valid run.
    ``resume``: the output directory is being resumed, so it may hold runs. Old group names are
    renamed (``activation=`` -> ``ffn=``, ``norm=`` -> ``block=``) with a warning, as are
    old-named folders."""
    flags, overrides = split_arguments(args)
    overrides, used = rename_group_aliases(overrides)
    for old in dict.fromkeys(used):
        print_warning(f"'{old}=' is now '{GROUP_ALIASES[old]}=' (the old name works until tlab "
                      "0.3)")
    overrides = expand_pretrained(overrides)
    if any(flag.split("=", 1)[0] in _SKIP_FLAGS for flag in flags):
        return Arguments(flags, overrides, hydra_only=True)  # help, another primary config
    dirs = user_config_dirs_of(flags)
    unknown = [f for f in flags if f.split("=", 1)[0] not in HYDRA_FLAGS and f.startswith("-")]
    if unknown:
        guess = nearest(unknown[0].split("=", 1)[0], sorted(HYDRA_FLAGS))
        raise ConfigError(f"unknown option '{unknown[0]}'"
                          f"{f'; did you mean {guess}?' if guess else ''}; Hydra's flags are "
                          "--multirun/-m, --cfg job|hydra|all, --info [topic], --resolve, "
                          "--package; a command's own options are listed by --help")
    printing = [f for f in flags if f in ("--cfg", "-c", "--info", "-i")]
    multirun = any(f in ("-m", "--multirun") for f in flags)
    if printing and multirun:
        raise ConfigError(f"Hydra does not combine {printing[0]} with -m/--multirun; drop -m to "
                          "see the first job's config (sweep values are then single values)")
    first_values = []
    top = {p.name for d in config_dirs(dirs) if d.is_dir() for p in d.iterdir() if p.is_dir()}
    for override in _parse(overrides):
        key = override.key_or_group
        values = _values(override)
        if override.is_sweep_override() and not values:
            raise ConfigError(f"the sweep '{override.input_line}' has no values")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and not resume:
            check_output_dir(Path(values[0]), sweep=key == "hydra.sweep.dir")
        if override.is_delete():
            first_values.append(override.input_line)
            continue
        if "." not in key and ("/" in key or key in top):
            _check_group_choice(key, values, dirs, running=not printing)
        if override.is_sweep_override():
            head = override.input_line.split("=", 1)[0]
            first_values.append(f"{head}={values[0]}")
        else:
            first_values.append(override.input_line)
    for note in old_group_folder_notes(dirs):
        print_warning(note)
    return Arguments(flags, overrides, first_values, dirs, multirun, bool(printing))


PRETRAINED_KEYS = ("from_hf", "from_run")  # --from-hf DIR, --from-run RUN


def expand_pretrained(overrides: list[str]) -> list[str]:
    """``from_hf=DIR`` / ``from_run=RUN`` -> the source's architecture overrides, then
    ``+from_hf=DIR`` / ``+from_run=FILE``, in its place (later overrides still win)."""
    given = {o.lstrip("+").split("=", 1)[0] for o in overrides} & set(PRETRAINED_KEYS)
    if len(given) > 1:
        raise ConfigError("--from-hf and --from-run both give the weights to start from; "
                          "give one of them")
    out: list[str] = []
    for text in overrides:
        key, _, value = text.partition("=")
        key = key.lstrip("+")
        if key not in PRETRAINED_KEYS or not value:
            out.append(text)
            continue
        path = Path(value.strip("'\"")).expanduser().resolve()
        if key == "from_hf":
            from transformer_lab.interop.hf import hf_overrides

            built = hf_overrides(str(path))
        else:
            from transformer_lab.training.pretrained import (
                ARCHITECTURE_GROUPS,
                run_overrides,
                run_weights_file,
            )

            path = run_weights_file(path)
            built = run_overrides(path)
            for other in overrides:  # a component choice (pe=alibi) the weights would not fit
                group = other.split("=", 1)[0]
                if group in ARCHITECTURE_GROUPS and other not in built:
                    own = next(o for o in built if o.startswith(group + "=")).split("=", 1)[1]
                    raise ConfigError(f"{other}: --from-run builds the checkpoint's own {group} "
                                      f"({own}); drop {other}")
        out += [o for o in built if o not in out]
        out.append(f"+{key}='{path}'")
    return out


def compose_first_job(arguments: Arguments) -> DictConfig:
    """Compose the (first) job's config once, as Hydra's app will, with ``config_dirs`` filled
    in; an error is one ``ConfigError`` line (an unknown key lists its parent's keys)."""
    store_choices(arguments.config_dirs)  # old-named folders' choices, the Python API's
    search_path = [quote_value(f"file://{d}") for d in arguments.config_dirs]  # as --config-dir
    overrides = [*arguments.first_job,
                 *([f"hydra.searchpath=[{','.join(search_path)}]"] if search_path else [])]
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), job_name="run",
                                   version_base="1.3"):
            cfg = hydra_compose("config", overrides, return_hydra_config=True)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ConfigError(_unknown_key_message(message, arguments.first_job)
                          or f"invalid override: {message}") from None
    with open_dict(cfg):
        cfg.config_dirs = [str(d) for d in arguments.config_dirs]
    return cfg


def user_config_dirs_of(flags: list[str]) -> list[Path]:
    """The ``--config-dir DIR`` trees of ``flags`` (each checked to be a directory)."""
    dirs = []
    for i, flag in enumerate(flags):
        name, _, value = flag.partition("=")
        if name in _CONFIG_DIR_FLAGS:
            value = value or (flags[i + 1] if i + 1 < len(flags) else "")
            if not Path(value).is_dir():
                raise ConfigError(f"--config-dir '{value}' is not a directory; give a folder "
                                  "holding config groups, e.g. DIR/pe/my_pe.yaml")
            dirs.append(Path(value).resolve())
    return dirs


def _unknown_key_message(message: str, overrides: list[str]) -> str | None:
    """"Could not override 'model.foo'" -> the keys that ``model`` does have."""
    match = re.match(r"Could not override '([^']+)'", message)
    if not match:
        return None
    key = match.group(1)
    parent, _, leaf = key.rpartition(".")
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    try:
        cfg = compose(rest, return_hydra_config=key.startswith("hydra"))
        node = OmegaConf.select(cfg, parent) if parent else cfg
    except Exception:
        return None
    if not isinstance(node, DictConfig):
        return None
    keys = ", ".join(str(k) for k in node)
    where = parent or "the top level"
    guess = nearest(key, [f"{parent}.{k}" if parent else str(k) for k in node]) or \
        nearest(key, list(flatten(OmegaConf.to_container(cfg, resolve=False))))
    hint = f"; did you mean {guess}?" if guess else ""
    return (f"unknown key '{key}'{hint} ('{leaf}' is not in {where}; its keys: {keys}); "
            f"to add a new key write +{key}=...")

