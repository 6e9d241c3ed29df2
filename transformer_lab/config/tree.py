"""Where the Hydra config tree is and what it offers (no heavy imports: ``tlab list``): tlab's
``configs/``, the user's ``--config-dir`` trees (old-named group folders too, until tlab 0.3) and
the Python API's choices of this process (the last two: in Hydra's ConfigStore)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # transformer_lab/
CONFIG_DIR = next(
    (p for p in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs") if p.is_dir()),
    _PACKAGE_DIR.parent / "configs",
)
# Groups whose choices are components or settings a user picks (shown by `tlab list`).
GROUPS = ("experiment", "preset", "model", "pe", "block", "norm_layer", "ffn", "arch", "task",
          "train", "optimizer", "logger")
# Config groups renamed in 0.2, the old names accepted until 0.3: old -> new.
GROUP_ALIASES = {"activation": "ffn", "norm": "block"}
_IN_PROCESS_CHOICES: dict[str, dict[str, dict[str, Any]]] = {}  # group -> choice -> config node
_SAVED_STORES: list[Any] = []  # per open config_store_kept block: the ConfigStore before it


@contextmanager
def offered_in_process(choices: Mapping[str, Mapping[str, dict[str, Any]]]) -> Iterator[None]:
    """Within the block, ``choices`` (group -> choice -> plain config node) are choices of their
    groups, after every file of the same name."""
    for group, nodes in choices.items():
        _IN_PROCESS_CHOICES.setdefault(group, {}).update(nodes)
    try:
        yield
    finally:
        for group, nodes in choices.items():
            for choice in nodes:
                _IN_PROCESS_CHOICES[group].pop(choice, None)


def config_dirs(user_dirs: Iterable[Path | str] = ()) -> list[Path]:
    """``CONFIG_DIR`` then the user's own config trees (``--config-dir``), in Hydra's order."""
    return [CONFIG_DIR, *(Path(d) for d in user_dirs)]


def user_config_dirs(cfg: Any) -> list[Path]:
    """The ``--config-dir`` trees a composed config was made with (its ``config_dirs`` key)."""
    return [Path(d) for d in (cfg.get("config_dirs") or ())]


def group_folders(group: str) -> list[str]:
    """The folder names that hold choices of ``group``: its own, then its old names."""
    return [group, *(old for old, new in GROUP_ALIASES.items() if new == group)]


def group_choices(group: str, user_dirs: Iterable[Path | str] = ()) -> list[str]:
    """The choices of a config group: its YAML files in every searched tree (old-named folders
    too) and those offered in this process; sorted."""
    dirs = config_dirs(user_dirs)
    return sorted({p.stem for folder in group_folders(group) for d in dirs
                   for p in (d / folder).glob("*.yaml")} | set(_IN_PROCESS_CHOICES.get(group, {})))


def choice_file(group: str, choice: str, user_dirs: Iterable[Path | str] = ()) -> Path | None:
    """The YAML of ``group=choice`` that Hydra would load: the first tree with it in the
    group's folder, else the first with it in an old-named folder."""
    dirs = config_dirs(user_dirs)
    return next((d / folder / f"{choice}.yaml" for folder in group_folders(group) for d in dirs
                 if (d / folder / f"{choice}.yaml").is_file()), None)


def choice_node(group: str, choice: str, user_dirs: Iterable[Path | str] = ()) -> Any:
    """The config node of ``group=choice``, interpolations unresolved: its file, else the node
    offered in this process; None if neither has it."""
    from omegaconf import OmegaConf

    path = choice_file(group, choice, user_dirs)
    if path is not None:
        return OmegaConf.load(path)
    node = _IN_PROCESS_CHOICES.get(group, {}).get(choice)
    return None if node is None else OmegaConf.create(node)


def old_group_folders(user_dirs: Iterable[Path | str]) -> list[Path]:
    """The folders of the user's trees named as a group was before 0.2 (``DIR/activation``)."""
    return [Path(d) / old for d in user_dirs for old in GROUP_ALIASES
            if (Path(d) / old).is_dir()]


def old_group_folder_notes(user_dirs: Iterable[Path | str]) -> list[str]:
    """One deprecation line per old-named folder of the user's trees, naming its new name."""
    return [f"config folder '{folder}' is now '{GROUP_ALIASES[folder.name]}': rename it (the "
            "old name works until tlab 0.3)" for folder in old_group_folders(user_dirs)]


@contextmanager
def config_store_kept() -> Iterator[None]:
    """Within the block (a command), ``store_choices`` may fill Hydra's ConfigStore; afterwards
    it is restored (Hydra's singleton state), so that a later command does not merge a stored
    node into a file of the same name."""
    _SAVED_STORES.append(None)
    try:
        yield
    finally:
        saved = _SAVED_STORES.pop()
        if saved is not None:
            from hydra.core.config_store import ConfigStore
            from hydra.core.singleton import Singleton

            state = Singleton.get_state()
            state["instances"][ConfigStore] = saved
            Singleton.set_state(state)


def store_choices(user_dirs: Iterable[Path | str]) -> None:
    """Offer in Hydra's ConfigStore (searched after every folder, carried by launchers) the
    choices of old-named folders (the first tree's) and those offered in this process, unless
    a folder of the group's name holds that choice (the file wins, as in ``choice_file``)."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.singleton import Singleton
    from omegaconf import OmegaConf

    dirs = config_dirs(user_dirs)
    choices: dict[tuple[str, str], Path | dict[str, Any]] = {}  # (group, choice) -> file or node
    for folder in old_group_folders(user_dirs):
        for path in sorted(folder.glob("*.yaml")):
            choices.setdefault((GROUP_ALIASES[folder.name], path.stem), path)
    for group, nodes in _IN_PROCESS_CHOICES.items():
        for choice, node in nodes.items():
            choices.setdefault((group, choice), node)
    stored = [(group, choice, found) for (group, choice), found in choices.items()
              if not any((d / group / f"{choice}.yaml").is_file() for d in dirs)]
    if stored and _SAVED_STORES and _SAVED_STORES[-1] is None:
        _SAVED_STORES[-1] = Singleton.get_state()["instances"].get(ConfigStore)
    for group, choice, found in stored:
        node = OmegaConf.load(found) if isinstance(found, Path) else found
        ConfigStore.instance().store(name=choice, group=group, provider="tlab", node=node)
