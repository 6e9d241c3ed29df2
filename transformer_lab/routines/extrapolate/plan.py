"""What ``tlab extrapolate`` trains and evaluates (``make_plan``), read and checked from
``cfg.routine``."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from transformer_lab.components.positional.rope_scaling import ROPE_SCALINGS
from transformer_lab.config.tree import user_config_dirs
from transformer_lab.errors import ConfigError
from transformer_lab.routines.study import study
from transformer_lab.routines.variants import as_list, load_choice

# Scalings whose factor defaults to the length ratio L'/L; ``dynamic`` computes it per length.
RATIO_SCALINGS = ("linear", "ntk", "yarn")
SCALING_CHOICES = (*ROPE_SCALINGS, "base")
_MULTIPLE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*$")


@dataclass(frozen=True)
class Scaling:
    """One entry of ``routine.scalings``: ``name`` or ``name:value``."""

    name: str  # none | linear | ntk | dynamic | yarn | base
    value: float | None = None  # fixed factor, or the base for ``base``

    @property
    def label(self) -> str:
        if self.value is None:
            return self.name
        return f"{self.name}:{self.value:g}"

    def pe_settings(self, ratio: float, original_max_len: int) -> dict[str, Any]:
        """Overrides of the RoPE config node at length ratio ``ratio = L'/L`` (``{}``: none)."""
        if self.name == "none":
            return {}
        if self.name == "base":
            return {"base": self.value}
        if self.value is not None:
            factor = self.value
        else:
            factor = max(1.0, ratio) if self.name in RATIO_SCALINGS else 1.0
        return {"scaling": self.name, "factor": factor, "original_max_len": original_max_len}


def parse_scaling(entry: Any) -> Scaling:
    """``"yarn"`` -> Scaling("yarn"); ``"linear:2"`` -> factor 2; ``"base:500000"`` -> base."""
    text = str(entry).strip()
    name, _, value_text = text.partition(":")
    valid = ", ".join([*ROPE_SCALINGS, "base:N"])
    if name not in SCALING_CHOICES:
        raise ConfigError(f"routine.scalings: '{text}' is not a RoPE scaling; valid: {valid} "
                          "(a factor may follow a colon, e.g. yarn:4)")
    if not value_text:
        if name == "base":
            raise ConfigError("routine.scalings: 'base' needs a value, e.g. base:500000")
        return Scaling(name)
    if name == "none":
        raise ConfigError(f"routine.scalings: '{text}' - 'none' takes no factor")
    try:
        value = float(value_text)
    except ValueError:
        raise ConfigError(f"routine.scalings: '{text}' - '{value_text}' is not a number") from None
    if name == "base" and not value > 1:
        raise ConfigError(f"routine.scalings: '{text}' - the RoPE base must be > 1")
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"routine.scalings: '{text}' - factor={value_text} is not valid; "
                          "the scaling factor must be > 0")
    return Scaling(name, value)


def parse_eval_length(entry: Any, train_len: int) -> int:
    """``"2x"`` -> ``round(2 * train_len)``; ``24`` or ``"24"`` -> 24. Raises ``ConfigError``."""
    text = str(entry).strip()
    match = _MULTIPLE.match(text)
    try:
        length = round(float(match.group(1)) * train_len) if match else int(text)
    except ValueError:
        raise ConfigError(f"routine.eval_lens: '{text}' is not a length; use a number of tokens "
                          f"(24) or a multiple of the training length {train_len} (2x)") from None
    if length < 1:
        raise ConfigError(f"routine.eval_lens: '{text}' gives an evaluation length of {length}; "
                          "it must be at least 1")
    return length


@dataclass
class Plan:
    pes: list[str]
    pe_nodes: dict[str, DictConfig]  # pe name -> its config node (unresolved interpolations)
    train_len: int
    eval_lens: list[int]  # sorted, unique
    scalings: list[Scaling]
    seeds: list[int]
    finetune_steps: int
    finetune_lr: float
    max_len: int | None  # learned table size; None = training model length

    def scalings_for(self, pe: str) -> list[Scaling]:
        """The scalings a PE is evaluated with: all of them for RoPE, ``none`` otherwise."""
        return self.scalings if supports_scaling(self.pe_nodes[pe]) else [Scaling("none")]


def supports_scaling(pe_node: DictConfig) -> bool:
    """A PE takes ``routine.scalings`` when its config has a ``scaling`` setting (RoPE)."""
    return "scaling" in pe_node


def pe_node(cfg: DictConfig, name: str) -> DictConfig:
    """The config node of PE ``name``: ``cfg.pe`` when it is that PE, else its choice file."""
    if cfg.pe.get("name") == name:
        return cfg.pe
    try:
        return load_choice("pe", name, user_config_dirs(cfg))
    except ConfigError as exc:
        raise ConfigError(f"routine.pes: {exc}") from None


def make_plan(cfg: DictConfig) -> Plan:
    """Read ``cfg.routine`` and check what ties its keys to each other and to the task."""
    r = cfg.routine
    if "seq_len" not in cfg.task:
        raise ConfigError(f"task={cfg.task.get('name')} has no seq_len; extrapolate needs a task "
                          "whose length can be set (reverse, copy, lm, text)")
    pes = as_list(r.get("pes")) or [str(cfg.pe.get("name"))]
    if len(set(pes)) != len(pes):
        raise ConfigError(f"routine.pes={pes} names a pe twice; list each once")
    nodes = {pe: pe_node(cfg, pe) for pe in pes}
    train_len = r.get("train_len") or cfg.task.seq_len
    entries = as_list(r.get("eval_lens")) or ["1x"]
    eval_lens = sorted({parse_eval_length(e, train_len) for e in entries})
    scalings = [parse_scaling(s) for s in as_list(r.get("scalings"))] or [Scaling("none")]
    if len({s.label for s in scalings}) != len(scalings):
        raise ConfigError(f"routine.scalings={[s.label for s in scalings]} lists one twice")
    scaled = [s.label for s in scalings if s.name != "none"]
    if scaled and not any(supports_scaling(node) for node in nodes.values()):
        raise ConfigError(f"routine.scalings={scaled} applies to RoPE only, and none of "
                          f"routine.pes={pes} is RoPE; add --pe rope or use --scaling none")
    seeds = list(study(cfg).seeds)
    finetune_steps = r.get("finetune_steps", 0) or 0
    finetune_lr = r.get("finetune_lr") or cfg.train.lr
    max_len = r.get("max_len")
    return Plan(pes, nodes, train_len, eval_lens, scalings, seeds, finetune_steps,
                float(finetune_lr), max_len)
