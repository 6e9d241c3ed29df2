"""Where the Hydra config tree is and what it offers (no heavy imports: used by ``tlab list``).

The tree lives in ``configs/`` at the repository root and is copied into the wheel as
``transformer_lab/configs``; ``CONFIG_DIR`` finds whichever is present. A user's own trees
(``--config-dir``) are searched after it; in them a folder with a group's old name
(``GROUP_ALIASES``: ``activation/``, ``norm/``) still holds choices of the new group until tlab
0.3. The Python API's components are choices offered in this process, with no file
(``offered_in_process``). Hydra finds both kinds in its ConfigStore (``store_choices``),
as no folder of the group's name has them.
"""

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
    """Within the block, ``choices`` (group -> choice -> config node of plain values) are
    choices of their groups, after every file of the same name."""
    for group, nodes in choices.items():
        _IN_PROCESS_CHOICES.setdefault(group, {}).update(nodes)
    try:
        yield
    finally:
        for group, nodes in choices.items():
            left = {c: n for c, n in _IN_PROCESS_CHOICES.pop(group, {}).items() if c not in nodes}
            if left:
                _IN_PROCESS_CHOICES[group] = left


def config_dirs(user_dirs: Iterable[Path | str] = ()) -> list[Path]:
    """``CONFIG_DIR`` then the user's own config trees (``--config-dir``), in Hydra's order."""
    return [CONFIG_DIR, *(Path(d) for d in user_dirs)]


def user_config_dirs(cfg: Any) -> list[Path]:
    """The ``--config-dir`` trees a composed config was made with (its ``config_dirs`` key,
    filled in by the app), so routines find the user's choices too."""
    return [Path(d) for d in (cfg.get("config_dirs") or ())]


def group_folders(group: str) -> list[str]:
    """The folder names that hold choices of ``group``: its own, then its old names."""
    return [group, *(old for old, new in GROUP_ALIASES.items() if new == group)]


def group_choices(group: str, user_dirs: Iterable[Path | str] = ()) -> list[str]:
    """The YAML files of a config group in every searched tree (in its old-named folders too),
    without extension, and the choices offered in this process; sorted."""
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
    """The config node of ``group=choice`` as Hydra would compose it (interpolations left
    unresolved): its file (``choice_file``), else the node offered in this process; None if
    neither has it."""
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
    """Within the block (a command), ``store_choices`` may offer choices in Hydra's
    ConfigStore; afterwards the ConfigStore is as it was before (through Hydra's singleton
    state, ``hydra.core.singleton``, as launchers carry it), so that a later command in this
    process finds none of them (Hydra would merge a stored node into a file of the same
    name)."""
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
    """Offer in Hydra's ConfigStore the choices that no folder of the group's name holds:
    those of old-named folders (the first tree's where several have one) and those offered in
    this process. A choice that a folder of the group's name holds too is left out: that file
    wins, as in ``choice_file``. Hydra searches the store after every config folder, and a
    launcher carries it to its worker processes. Inside ``config_store_kept`` the store is
    restored when the block ends."""
    from hydra.core.config_store import ConfigStore
    from hydra.core.singleton import Singleton
    from omegaconf import OmegaConf

    dirs = config_dirs(user_dirs)
    choices: dict[str, dict[str, Path | dict[str, Any]]] = {}
    for folder in old_group_folders(user_dirs):
        group = GROUP_ALIASES[folder.name]
        for path in sorted(folder.glob("*.yaml")):
            choices.setdefault(group, {}).setdefault(path.stem, path)
    for group, nodes in _IN_PROCESS_CHOICES.items():
        for choice, node in nodes.items():
            choices.setdefault(group, {}).setdefault(choice, node)
    stored = [(group, choice, found) for group, options in choices.items()
              for choice, found in options.items()
              if not any((d / group / f"{choice}.yaml").is_file() for d in dirs)]
    if stored and _SAVED_STORES and _SAVED_STORES[-1] is None:
        _SAVED_STORES[-1] = Singleton.get_state()["instances"].get(ConfigStore)
    for group, choice, found in stored:
        ConfigStore.instance().store(name=choice, group=group, provider="tlab", node=OmegaConf.load(
            found) if isinstance(found, Path) else found)
