"""Which component made a step-1 property fail? Swap each for its group's default and measure
again (docs/routines.md)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import yaml

from transformer_lab.config.spec import RunSpec
from transformer_lab.config.tree import CONFIG_DIR
from transformer_lab.config.variants import with_choice
from transformer_lab.measures.property_result import PropertyResult, component
from transformer_lab.model import TransformerModel, build_model

# The swapped groups, as a failing row names them.
GROUP_LABELS = {"pe": "the positional encoding", "ffn": "the FFN", "norm_layer": "the norm layer",
                "block": "the block"}
Measure = Callable[[TransformerModel], list[PropertyResult]]


def default_choices() -> dict[str, str]:
    """The default choice of each swapped group, from the primary config's defaults list."""
    defaults = yaml.safe_load((CONFIG_DIR / "config.yaml").read_text(encoding="utf-8"))["defaults"]
    found = {group: str(choice) for entry in defaults if isinstance(entry, dict)
             for group, choice in entry.items()}
    return {group: found[group] for group in GROUP_LABELS if group in found}


def swaps(spec: RunSpec) -> list[tuple[str, str, RunSpec]]:
    """``(group, default choice, spec)`` for each group whose node is not the default's."""
    variants = [(group, choice, with_choice(spec, group, choice))
                for group, choice in default_choices().items()]
    return [(group, choice, variant) for group, choice, variant in variants
            if dict(variant.model.component(group)) != dict(spec.model.component(group))]


def culprits(spec: RunSpec, model: TransformerModel, failing: set[str],
             measure: Measure) -> dict[str, str]:
    """Failing property name -> what the swaps found, for its row's detail (``""`` when no
    group was swapped); ``measure``: the properties of a model."""
    tried, found = [], {name: [] for name in failing}
    block = model.blocks[0] if len(model.blocks) else None  # the run's module of each group:
    modules = {"pe": model.positional, "ffn": getattr(block, "feedforward", None),
               "norm_layer": getattr(block, "norm1", None), "block": block}  # of block 0
    for group, choice, variant in swaps(spec):
        try:
            with torch.random.fork_rng(devices=[]):  # build_model seeds torch's generator
                results = measure(build_model(variant.model, seed=spec.seed))
        except Exception:  # noqa: BLE001 - the default does not fit this config: no verdict
            continue
        tried.append(f"{group}={choice}")
        holds = {r.name for r in results if r.passed is not False}
        label = f"{GROUP_LABELS[group]} ({component(modules[group])})"
        for name in failing & holds:
            found[name].append(f"{label}: with {choice} the property holds")
    return {name: ("culprit: " + "; ".join(names) if names else
                   f"no single swap to a default ({', '.join(tried)}) makes it hold")
            if tried else "" for name, names in found.items()}
