"""``tlab check``: correctness checks of the positional encodings, written to ``checks.csv``.

Which checks apply to a PE is what its class declares (``property_checks``: names of the
registry ``PROPERTY_CHECKS`` below, e.g. ``SinusoidalPositionalEncoding.property_checks =
("sinusoidal_shift", "permutation")``); ``routine.pe=all`` runs them for every choice of the
``pe`` group whose class declares some, ``--pe NAME`` for one. The measurements are in
:mod:`transformer_lab.measures.properties`:

    rope_relative            RoPE scores depend only on m - n: several offsets, bases
                             (``routine.rope_bases`` plus the configured one) and both pairings
    rope_pairing_mismatch    half-pairing on q with interleaved on k: the relative property
                             must break, and the detector must see it break
    sinusoidal_shift         PE(pos + k) is one linear map of PE(pos) for every pos
    permutation_equivariant  the NoPE encoder: f(P x) = P f(x)
    pe_breaks_permutation    every PE: f(P x) != P f(x)
    swap_attention           the article's test: swap two tokens; NoPE attention rows and columns
                             permute exactly, a PE's do not. With ``--trained`` also on a model
                             just trained on reversal (``routine.train_steps`` steps).

Every check runs on an encoder built from the run's config (``model``, ``block``, ``norm_layer``,
``ffn`` groups), in eval mode. Exit 1 if any check fails.

Here: the registry, which checks a PE gets, the inputs, ``--trained`` and the routine; the rows
of each property, their tolerances and the terminal table are in ``check_properties.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import instantiate_component
from transformer_lab.config.knowledge import declared
from transformer_lab.config.tree import choice_file, group_choices, user_config_dirs
from transformer_lab.errors import ConfigError
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.console import console
from transformer_lab.results.run_directory import RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.check_properties import (
    CHECK_TABLE_COLUMNS,
    ComponentCheck,
    RotaryFactory,
    component_check_table,
    equivariance_row,
    pairing_mismatch_row,
    rope_relative_rows,
    sinusoidal_shift_row,
    swap_row,
)
from transformer_lab.routines.variants import with_choice

SOLVED = 0.99  # --trained: training stops at this held-out exact match


def check_tokens(cfg: DictConfig, seq_len: int) -> torch.Tensor:
    """Distinct tokens (1, T) so that a swap changes the input."""
    vocab = int(cfg.model.vocab_size)
    if vocab - 1 < seq_len:
        generator = torch.Generator().manual_seed(int(cfg.seed))
        return torch.randint(1, vocab, (1, seq_len), generator=generator)
    return torch.randperm(vocab - 1, generator=torch.Generator().manual_seed(int(cfg.seed)))[
        :seq_len][None] + 1


# --------------------------------------------------------------------------------------------
# the registry and the routine


def pe_config(cfg: DictConfig, name: str) -> DictConfig:
    """``cfg`` with the ``pe`` group set to ``name`` (the run's own pe node, overrides included,
    when it is that one)."""
    return cfg if cfg.pe.get("name") == name else with_choice(cfg, "pe", name)


def build_for_check(cfg: DictConfig) -> TransformerModel:
    """The run's model in eval mode; with ``from_hf`` (``--from-hf DIR``) its weights."""
    model = build_model(cfg, seed=int(cfg.seed))
    if cfg.get("from_hf"):
        from transformer_lab.interop.hf import load_hf_weights

        load_hf_weights(model, cfg, str(cfg.from_hf))
    return model.eval()


def rotary_factory(cfg: DictConfig) -> RotaryFactory:
    def make(base: float, style: str) -> torch.nn.Module:
        spec = OmegaConf.to_container(cfg.pe, resolve=True)
        spec.update(base=float(base), style=style)
        return instantiate_component(spec, "pe")

    return make


def rope_checks(cfg: DictConfig, model: TransformerModel, tokens: torch.Tensor,
                component: str) -> list[ComponentCheck]:
    make = rotary_factory(cfg)
    head_dim = int(cfg.pe.get("head_dim") or int(cfg.model.d_model) // int(cfg.model.n_heads))
    bases = sorted({float(cfg.pe.base), *map(float, cfg.routine.rope_bases)})
    return [*rope_relative_rows(make, head_dim, bases, component),
            pairing_mismatch_row(make, head_dim, float(cfg.pe.base), component)]


def sinusoidal_checks(cfg: DictConfig, model: TransformerModel, tokens: torch.Tensor,
                      component: str) -> list[ComponentCheck]:
    pe = instantiate_component(pe_with_length(cfg, 4 * int(cfg.model.d_model) + 512), "pe")
    # a learned table (sinusoidal_learned) is checked as initialised, before any training
    suffix = " (at init)" if any(True for _ in pe.parameters()) else ""
    with torch.no_grad():
        return [sinusoidal_shift_row(pe, component + suffix)]


def pe_with_length(cfg: DictConfig, length: int) -> dict[str, Any]:
    """The pe node (a dict) with a table of at least ``length`` positions (learned tables)."""
    spec = OmegaConf.to_container(cfg.pe, resolve=True)
    if "max_len" in spec:
        spec["max_len"] = max(int(spec["max_len"]), length)
    return spec


def equivariance_checks(cfg: DictConfig, model: TransformerModel, tokens: torch.Tensor,
                        component: str) -> list[ComponentCheck]:
    nope = model.pe_kind == "none"
    return [equivariance_row(model, tokens, component, expect_equivariant=nope),
            swap_row(model, tokens, component, expect_permuted=nope)]


Check = Callable[[DictConfig, TransformerModel, torch.Tensor, str], list[ComponentCheck]]
# The property checks by name. A PE class lists the names that apply to it in its
# ``property_checks`` (a tuple, or a classmethod of its config arguments returning one).
PROPERTY_CHECKS: dict[str, Check] = {
    "rope_relative": rope_checks,  # rows rope_relative and rope_pairing_mismatch
    "sinusoidal_shift": sinusoidal_checks,
    "permutation": equivariance_checks,  # rows permutation_equivariant / pe_breaks_permutation
                                         # and swap_attention
}


def declared_checks(pe: DictConfig) -> tuple[str, ...]:
    """The check names the class of the pe node ``pe`` declares (``property_checks``); () when
    it declares none. ConfigError for a name ``PROPERTY_CHECKS`` does not have."""
    names = declared(pe, "property_checks")
    if isinstance(names, str):
        names = (names,)
    if not isinstance(names, tuple | list):
        return ()
    unknown = [name for name in names if name not in PROPERTY_CHECKS]
    if unknown:
        raise ConfigError(f"pe={pe.get('name')} declares property_checks {unknown} that tlab "
                          f"does not have; checks: {', '.join(PROPERTY_CHECKS)}")
    return tuple(names)


def checks_of(cfg: DictConfig, name: str) -> tuple[str, ...]:
    """The checks of ``pe=name`` (() for a choice that does not exist)."""
    if cfg.pe.get("name") != name and choice_file("pe", name, user_config_dirs(cfg)) is None:
        return ()
    return declared_checks(pe_config(cfg, name).pe)


def pes_with_checks(cfg: DictConfig) -> list[str]:
    """Every choice of the ``pe`` group whose class declares checks, in name order."""
    return [name for name in group_choices("pe", user_config_dirs(cfg)) if checks_of(cfg, name)]


def pes_to_check(cfg: DictConfig) -> list[str]:
    """``routine.pe``: ``all`` -> every PE with checks, else that one (ConfigError if none)."""
    choice = str(cfg.routine.pe)
    if cfg.get("from_hf"):  # --from-hf: the checkpoint's own PE only
        if choice not in ("all", cfg.pe.get("name")):
            raise ConfigError(f"--pe {choice}: --from-hf checks the checkpoint's own PE "
                              f"({cfg.pe.get('name')}); drop --pe")
        choice = str(cfg.pe.get("name"))
    if choice == "all":
        return pes_with_checks(cfg)
    if not checks_of(cfg, choice):
        raise ConfigError(f"--pe {choice} has no checks; pes with checks: "
                          f"{', '.join(pes_with_checks(cfg))}")
    return [choice]


def trained_swap_row(cfg: DictConfig, tokens: torch.Tensor, component: str) -> ComponentCheck:
    """Train on the run's task (reversal) for ``routine.train_steps`` steps, then swap-test."""
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.routines.variants import train_settings
    from transformer_lab.training.trainer import Trainer

    task = build_task(cfg)
    model = build_for_check(cfg).train()
    trainer = Trainer(model, task, train_settings(cfg), int(cfg.seed))
    result = trainer.fit(int(cfg.routine.train_steps), target_exact_match=SOLVED)
    row = swap_row(model, tokens, f"{component} (trained)", expect_permuted=model.pe_kind == "none")
    match = result.best_exact_match
    row.detail += (f"; trained {result.steps} steps on {cfg.task.get('name')}: final loss "
                   f"{result.final_loss:.3f}, held-out exact match "
                   f"{'n/a' if match is None else f'{match:.3f}'}")
    return row


def trained_swap_check(cfg: DictConfig, model: TransformerModel, tokens: torch.Tensor,
                       component: str) -> list[ComponentCheck]:
    with console.status(f"{component}: training on {cfg.task.get('name')}"):
        return [trained_swap_row(cfg, tokens, component)]


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight (``routines.check_routine``): an encoder, and a PE that has checks."""
    if cfg.arch.causal:
        raise ConfigError("tlab check needs arch=encoder: a causal mask breaks permutation "
                          "equivariance by design")
    pes_to_check(cfg)


def run_check(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    started = time.perf_counter()
    rows: list[ComponentCheck] = []
    table = run.log("checks", CHECK_TABLE_COLUMNS)
    for name in pes_to_check(cfg):
        pe_cfg = pe_config(cfg, name)
        model = build_for_check(pe_cfg)
        tokens = check_tokens(pe_cfg, int(cfg.routine.seq_len))
        component = f"pe={name}"
        checks: list[Check] = [PROPERTY_CHECKS[check] for check in declared_checks(pe_cfg.pe)]
        if cfg.routine.trained:
            checks.append(trained_swap_check)
        for check in checks:
            clock = time.perf_counter()
            new = check(pe_cfg, model, tokens, component)
            for row in new:
                row.wall_s = (time.perf_counter() - clock) / len(new)
                table.write(row.as_row())
            rows += new
    console.print(component_check_table(rows, f"tlab check - {run.path}"))
    failed = [f"{r.check} ({r.component})" for r in rows if not r.passed]
    return RoutineOutcome(passed=not failed, summary={"wall_s": time.perf_counter() - started},
                          message="" if not failed else "failed: " + ", ".join(failed))
