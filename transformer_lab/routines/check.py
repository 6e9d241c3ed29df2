"""``tlab check``: correctness checks of the positional encodings (``checks.csv``), and step 3's
``rotary_relative`` row (docs/routines.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from rich import box
from rich.table import Table

from transformer_lab.config.instantiate import instantiate_component
from transformer_lab.config.knowledge import declared
from transformer_lab.config.schema import POSITIVE, POSITIVE_INT, Rule
from transformer_lab.config.tree import group_choices, user_config_dirs
from transformer_lab.errors import ConfigError
from transformer_lab.measures.properties import (
    Rotary,
    permutation_error,
    rope_relative_violation,
    shift_positions,
    sinusoidal_shift_residual,
    swap_attention_error,
)
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.check_rows import CheckRow, Stopwatch, check_counts, status
from transformer_lab.results.console import console, print_table
from transformer_lab.results.run_directory import RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.variants import with_choice
from transformer_lab.training.pretrained import load_pretrained, pretrained_option

# --------------------------------------------------------------------------------------------
# a row of checks.csv and the tolerances

CHECK_TABLE_COLUMNS = ["check", "component", "status", "value", "tolerance", "detail", "wall_s"]

# Tolerances. "exact" properties allow float32 rounding; "must break" properties need a
# difference far above it.
ROPE_TOLERANCE = 1e-4  # spread of q.k/(|q||k|) over shifts (fp32 angles up to ~100 rad)
MISMATCH_MINIMUM = 0.05  # a pairing mix-up must move the relative score at least this much
SHIFT_TOLERANCE = 1e-3  # relative residual of the fitted linear map on held-out positions
# ... or more for wide tables: float32 angle rounding grows with the largest position (measured
# 1.4e-7 per position at d 2048; this allows about 6x that).
SHIFT_ROUNDING_PER_POSITION = 2.0**-20
EQUIVARIANCE_TOLERANCE = 1e-5  # NoPE: relative output error, absolute attention error
BREAK_MINIMUM = 1e-4  # a PE must change outputs / attention more than this (10x the above)


@dataclass
class ComponentCheck:
    check: str
    component: str
    status: str  # PASS | FAIL
    value: float
    tolerance: str  # "<= x" (must be small) or "> x" (must be large)
    detail: str = ""
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def at_most(check: str, component: str, value: float, tolerance: float,
            detail: str = "") -> ComponentCheck:
    """A property that holds: PASS when ``value <= tolerance``."""
    return ComponentCheck(check, component, "PASS" if value <= tolerance else "FAIL", value,
                          f"<= {tolerance:g}", detail)


def more_than(check: str, component: str, value: float, minimum: float,
              detail: str = "") -> ComponentCheck:
    """A property that must break: PASS when ``value > minimum``."""
    return ComponentCheck(check, component, "PASS" if value > minimum else "FAIL", value,
                          f"> {minimum:g}", detail)


# --------------------------------------------------------------------------------------------
# the model and the tokens a check runs on


def check_tokens(cfg: DictConfig, seq_len: int) -> torch.Tensor:
    """Distinct tokens (1, T) so that a swap changes the input."""
    vocab = int(cfg.model.vocab_size)
    if vocab - 1 < seq_len:
        generator = torch.Generator().manual_seed(int(cfg.seed))
        return torch.randint(1, vocab, (1, seq_len), generator=generator)
    return torch.randperm(vocab - 1, generator=torch.Generator().manual_seed(int(cfg.seed)))[
        :seq_len][None] + 1


def pe_config(cfg: DictConfig, name: str) -> DictConfig:
    """``cfg`` with the ``pe`` group set to ``name`` (the run's own pe node, overrides included,
    when it is that one)."""
    return cfg if cfg.pe.get("name") == name else with_choice(cfg, "pe", name)


def build_for_check(cfg: DictConfig) -> TransformerModel:
    """The run's model in eval mode; with ``--from-hf DIR`` or ``--from-run RUN`` its weights."""
    model = build_model(cfg, seed=int(cfg.seed))
    load_pretrained(model, cfg)
    return model.eval()


# --------------------------------------------------------------------------------------------
# RoPE: q_m . k_n depends on n - m only


RotaryFactory = Callable[[float, str], Rotary]  # (base, style) -> a rotary PE module


def rotary_factory(cfg: DictConfig) -> RotaryFactory:
    def make(base: float, style: str) -> torch.nn.Module:
        spec = OmegaConf.to_container(cfg.pe, resolve=True)
        spec.update(base=float(base), style=style)
        return instantiate_component(spec, "pe")

    return make


def rope_relative_rows(make_rotary: RotaryFactory, head_dim: int, bases: list[float],
                       component: str) -> list[ComponentCheck]:
    rows = []
    for style in ("half", "interleaved"):
        for base in bases:
            value = rope_relative_violation(make_rotary(base, style), head_dim).value
            rows.append(at_most("rope_relative", f"{component} {style} base={base:g}",
                                value, ROPE_TOLERANCE,
                                "max spread of q.k/(|q||k|) over shifts 0,5,17,64 of (m,n) = "
                                "(2,5) [the source article: = (7,10)], (0,3), (10,4), (1,30)"))
    return rows


def pairing_mismatch_row(make_rotary: RotaryFactory, head_dim: int, base: float,
                         component: str) -> ComponentCheck:
    half, interleaved = make_rotary(base, "half"), make_rotary(base, "interleaved")

    def mixed(q: torch.Tensor, k: torch.Tensor,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return half(q, k, positions)[0], interleaved(q, k, positions)[1]

    value = rope_relative_violation(mixed, head_dim).value
    detected = value > MISMATCH_MINIMUM
    detail = ("half on q, interleaved on k: q.k now depends on absolute position (mismatch "
              "detected)" if detected else "half on q, interleaved on k did NOT break the "
              "relative property: the detector cannot tell the pairings apart")
    return more_than("rope_pairing_mismatch", component, value, MISMATCH_MINIMUM, detail)


def rope_checks(cfg: DictConfig, model: TransformerModel, tokens: torch.Tensor,
                component: str) -> list[ComponentCheck]:
    make = rotary_factory(cfg)
    head_dim = int(cfg.pe.get("head_dim") or int(cfg.model.d_model) // int(cfg.model.n_heads))
    bases = sorted({float(cfg.pe.base), *map(float, cfg.routine.rope_bases)})
    return [*rope_relative_rows(make, head_dim, bases, component),
            pairing_mismatch_row(make, head_dim, float(cfg.pe.base), component)]


def rotary_relative_check(cfg: DictConfig, n_positions: int = 16) -> CheckRow | None:
    """Step 3's row: for a rotary PE, ``q_m . k_n`` must equal ``q_{m+1} . k_{n+1}`` at every
    position pair below ``n_positions - 1`` (None for other kinds of PE)."""
    clock = Stopwatch()
    pe = instantiate_component(cfg, "pe")
    if getattr(pe, "kind", None) != "rotary":
        return None
    head_dim = cfg.model.d_model // cfg.model.n_heads
    pairs = [(m, n) for m in range(n_positions - 1) for n in range(n_positions - 1)]
    violation = rope_relative_violation(pe, head_dim, pairs, shifts=(0, 1), n_vectors=1)
    ok = violation.value <= ROPE_TOLERANCE
    (m, n), (m_next, n_next) = violation.positions
    score, score_next = violation.scores
    if ok:
        detail = f"q.k depends on n-m only (largest drift {violation.value:.1e} of |q||k|)"
    else:
        detail = (f"q.k at positions (m={m}, n={n}) is {score:.4g} but at ({m_next}, {n_next}) "
                  f"it is {score_next:.4g}: a rotary PE must make scores depend on n-m only; "
                  "check that q and k get the same rotation (same pairing half/interleaved, "
                  "same angles per position)")
    return CheckRow(3, "rotary_relative", status(ok), "relative_drift", violation.value,
                    ROPE_TOLERANCE, clock.lap(), detail)


# --------------------------------------------------------------------------------------------
# the sinusoidal shift


def sinusoidal_shift_row(table: Callable[[torch.Tensor], torch.Tensor],
                         component: str) -> ComponentCheck:
    value = sinusoidal_shift_residual(table)
    positions = shift_positions(table(torch.arange(1)).shape[-1])
    tolerance = max(SHIFT_TOLERANCE, SHIFT_ROUNDING_PER_POSITION * positions)
    return at_most("sinusoidal_shift", component, value, tolerance,
                   "PE(pos+k) = M_k PE(pos): M_k fitted by least squares on half of the "
                   "positions 0..max(255, 4d-1), residual on the other half (k = 1, 3, 10)")


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


# --------------------------------------------------------------------------------------------
# permutation equivariance and the swap test


def equivariance_row(model: TransformerModel, tokens: torch.Tensor, component: str,
                     expect_equivariant: bool) -> ComponentCheck:
    # a fixed random permutation (not a reversal, which a symmetric ALiBi bias cannot see)
    permutation = torch.randperm(tokens.shape[1], generator=torch.Generator().manual_seed(1))
    value = permutation_error(model, tokens, permutation)
    text = f"max |f(Px) - P f(x)| / max |f(x)|, P = {permutation.tolist()}"
    if expect_equivariant:
        return at_most("permutation_equivariant", component, value, EQUIVARIANCE_TOLERANCE, text)
    return more_than("pe_breaks_permutation", component, value, BREAK_MINIMUM, text)


def swap_row(model: TransformerModel, tokens: torch.Tensor, component: str,
             expect_permuted: bool, i: int = 0, j: int = 2) -> ComponentCheck:
    differing = (tokens[0] != tokens[0, i]).nonzero().flatten().tolist()
    if tokens[0, i] == tokens[0, j] and differing:
        j = differing[0]  # swapping two equal tokens would change nothing
    attention, output = swap_attention_error(model, tokens, i, j)
    detail = (f"swap tokens {i} and {j}: max |A' - P A P| over layers and heads; outputs "
              f"differ from permuted outputs by {output:.3g}")
    if expect_permuted:
        return at_most("swap_attention", component, attention, EQUIVARIANCE_TOLERANCE,
                       detail + " (NoPE: rows and columns just permute)")
    return more_than("swap_attention", component, attention, BREAK_MINIMUM,
                     detail + " (a PE: attention is not just permuted)")


def equivariance_checks(cfg: DictConfig, model: TransformerModel, tokens: torch.Tensor,
                        component: str) -> list[ComponentCheck]:
    nope = model.pe_kind == "none"
    return [equivariance_row(model, tokens, component, expect_equivariant=nope),
            swap_row(model, tokens, component, expect_permuted=nope)]


# --------------------------------------------------------------------------------------------
# the registry: which checks a PE gets


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
    """The ``property_checks`` the class of the pe node ``pe`` declares (() without any);
    ConfigError for a name ``PROPERTY_CHECKS`` does not have."""
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
    if cfg.pe.get("name") != name and name not in group_choices("pe", user_config_dirs(cfg)):
        return ()
    return declared_checks(pe_config(cfg, name).pe)


def pes_with_checks(cfg: DictConfig) -> list[str]:
    """Every choice of the ``pe`` group whose class declares checks, in name order."""
    return [name for name in group_choices("pe", user_config_dirs(cfg)) if checks_of(cfg, name)]


def pes_to_check(cfg: DictConfig) -> list[str]:
    """``routine.pe``: ``all`` -> every PE with checks, else that one (ConfigError if none)."""
    choice = str(cfg.routine.pe)
    if option := pretrained_option(cfg):  # --from-hf, --from-run: the checkpoint's own PE only
        if choice not in ("all", cfg.pe.get("name")):
            raise ConfigError(f"--pe {choice}: {option} checks the checkpoint's own PE "
                              f"({cfg.pe.get('name')}); drop --pe")
        choice = str(cfg.pe.get("name"))
    if choice == "all":
        return pes_with_checks(cfg)
    if not checks_of(cfg, choice):
        raise ConfigError(f"--pe {choice} has no checks; pes with checks: "
                          f"{', '.join(pes_with_checks(cfg))}")
    return [choice]


# --------------------------------------------------------------------------------------------
# --trained: the swap test on a trained model


SOLVED = 0.99  # --trained: training stops at this held-out exact match


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


# --------------------------------------------------------------------------------------------
# the routine and its table


def component_check_table(rows: list[ComponentCheck], title: str) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    for column in ("check", "component", "status", "value", "tolerance"):
        table.add_column(column, no_wrap=column in ("check", "status"))
    colours = {"PASS": "green", "FAIL": "bold red"}
    for row in rows:
        table.add_row(row.check, row.component, f"[{colours[row.status]}]{row.status}[/]",
                      f"{row.value:.3g}", row.tolerance)
    return table


# The routine's own keys (``routines.check_settings``; ``routine.pe``'s choices: ``pes_to_check``).
SETTINGS = {"pe": Rule("str"), "seq_len": POSITIVE_INT, "rope_bases": Rule("list", item=POSITIVE),
            "trained": Rule("bool"), "train_steps": POSITIVE_INT}


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
    print_table(component_check_table(rows, f"tlab check - {run.path}"))
    failed = [f"{r.check} ({r.component})" for r in rows if not r.passed]
    return RoutineOutcome(passed=not failed, summary={"wall_s": time.perf_counter() - started},
                          message="" if not failed else "failed: " + ", ".join(failed),
                          result=check_counts([r.status for r in rows]))
