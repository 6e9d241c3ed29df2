"""``tlab check``: correctness checks of the positional encodings (``checks.csv``), and step 3's
``rotary_relative`` row (docs/routines.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch

from transformer_lab.config.instantiate import instantiate_component
from transformer_lab.config.knowledge import declared
from transformer_lab.config.schema import POSITIVE, POSITIVE_INT, Rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.variants import choices, pe_spec
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
from transformer_lab.results.console import console, print_table, result_table
from transformer_lab.results.run_directory import RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.training.pretrained import load_pretrained, pretrained_option

# the tolerances and a row of checks.csv

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
SOLVED = 0.99  # --trained: training stops at this held-out exact match


@dataclass
class ComponentCheck:
    check: str
    component: str
    status: str  # PASS | FAIL
    value: float
    tolerance: str  # "<= x" (must be small) or "> x" (must be large)
    detail: str = ""
    wall_s: float = 0.0


CHECK_TABLE_COLUMNS = [f.name for f in fields(ComponentCheck)]

def judged(check: str, component: str, value: float, limit: float, detail: str = "",
           holds: bool = True) -> ComponentCheck:
    """PASS when ``value <= limit`` (a property that holds) or, ``holds=False``, when
    ``value > limit`` (a property that must break)."""
    ok = value <= limit if holds else value > limit
    return ComponentCheck(check, component, status(ok), value,
                          f"{'<=' if holds else '>'} {limit:g}", detail)


def check_tokens(spec: RunSpec, seq_len: int) -> torch.Tensor:
    """Distinct tokens (1, T) so that a swap changes the input."""
    vocab = int(spec.model.vocab_size)
    generator = torch.Generator().manual_seed(spec.seed)
    if vocab - 1 < seq_len:
        return torch.randint(1, vocab, (1, seq_len), generator=generator)
    return torch.randperm(vocab - 1, generator=generator)[:seq_len][None] + 1


def build_for_check(spec: RunSpec) -> TransformerModel:
    """The run's model in eval mode; with ``--from-hf DIR`` or ``--from-run RUN`` its weights."""
    model = build_model(spec.model, seed=spec.seed)
    load_pretrained(model, spec)
    return model.eval()


# RoPE: q_m . k_n depends on n - m only

RotaryFactory = Callable[[float, str], Rotary]  # (base, style) -> a rotary PE module


def rope_relative_rows(make_rotary: RotaryFactory, head_dim: int, bases: list[float],
                       component: str) -> list[ComponentCheck]:
    return [judged("rope_relative", f"{component} {style} base={base:g}",
                   rope_relative_violation(make_rotary(base, style), head_dim).value,
                   ROPE_TOLERANCE, "max spread of q.k/(|q||k|) over shifts 0,5,17,64 of (m,n) = "
                   "(2,5) [the source article: = (7,10)], (0,3), (10,4), (1,30)")
            for style in ("half", "interleaved") for base in bases]


def pairing_mismatch_row(make_rotary: RotaryFactory, head_dim: int, base: float,
                         component: str) -> ComponentCheck:
    half, interleaved = make_rotary(base, "half"), make_rotary(base, "interleaved")

    def mixed(q: torch.Tensor, k: torch.Tensor,
              positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return half(q, k, positions)[0], interleaved(q, k, positions)[1]

    value = rope_relative_violation(mixed, head_dim).value
    detail = ("half on q, interleaved on k: q.k now depends on absolute position (mismatch "
              "detected)" if value > MISMATCH_MINIMUM else "half on q, interleaved on k did "
              "NOT break the relative property: the detector cannot tell the pairings apart")
    return judged("rope_pairing_mismatch", component, value, MISMATCH_MINIMUM, detail,
                  holds=False)


def rope_checks(spec: RunSpec, model: TransformerModel, tokens: torch.Tensor,
                component: str) -> list[ComponentCheck]:
    pe = spec.model.pe

    def make(base: float, style: str) -> torch.nn.Module:
        return instantiate_component({**pe, "base": float(base), "style": style}, "pe")

    head_dim = int(pe.get("head_dim") or spec.model.d_model // spec.model.n_heads)
    bases = sorted({float(pe["base"]), *map(float, spec.routine.rope_bases)})
    return [*rope_relative_rows(make, head_dim, bases, component),
            pairing_mismatch_row(make, head_dim, float(pe["base"]), component)]


def rotary_relative_check(spec: RunSpec, n_positions: int = 16) -> CheckRow | None:
    """Step 3's row: for a rotary PE, ``q_m . k_n`` must equal ``q_{m+1} . k_{n+1}`` at every
    position pair below ``n_positions - 1`` (None for other kinds of PE)."""
    clock = Stopwatch()
    pe = spec.model.pe.build()
    if getattr(pe, "kind", None) != "rotary":
        return None
    head_dim = spec.model.d_model // spec.model.n_heads
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


# the sinusoidal shift


def sinusoidal_shift_row(table: Callable[[torch.Tensor], torch.Tensor],
                         component: str) -> ComponentCheck:
    value = sinusoidal_shift_residual(table)
    positions = shift_positions(table(torch.arange(1)).shape[-1])
    tolerance = max(SHIFT_TOLERANCE, SHIFT_ROUNDING_PER_POSITION * positions)
    return judged("sinusoidal_shift", component, value, tolerance,
                  "PE(pos+k) = M_k PE(pos): M_k fitted by least squares on half of the "
                  "positions 0..max(255, 4d-1), residual on the other half (k = 1, 3, 10)")


def sinusoidal_checks(spec: RunSpec, model: TransformerModel, tokens: torch.Tensor,
                      component: str) -> list[ComponentCheck]:
    node = dict(spec.model.pe)
    if "max_len" in node:  # a learned table of enough positions
        node["max_len"] = max(int(node["max_len"]), 4 * spec.model.d_model + 512)
    pe = instantiate_component(node, "pe")
    # a learned table (sinusoidal_learned) is checked as initialised, before any training
    suffix = " (at init)" if any(True for _ in pe.parameters()) else ""
    with torch.no_grad():
        return [sinusoidal_shift_row(pe, component + suffix)]


# permutation equivariance and the swap test


def equivariance_row(model: TransformerModel, tokens: torch.Tensor, component: str,
                     expect_equivariant: bool) -> ComponentCheck:
    # a fixed random permutation (not a reversal, which a symmetric ALiBi bias cannot see)
    permutation = torch.randperm(tokens.shape[1], generator=torch.Generator().manual_seed(1))
    value = permutation_error(model, tokens, permutation)
    text = f"max |f(Px) - P f(x)| / max |f(x)|, P = {permutation.tolist()}"
    if expect_equivariant:
        return judged("permutation_equivariant", component, value, EQUIVARIANCE_TOLERANCE, text)
    return judged("pe_breaks_permutation", component, value, BREAK_MINIMUM, text, holds=False)


def swap_row(model: TransformerModel, tokens: torch.Tensor, component: str,
             expect_permuted: bool, i: int = 0, j: int = 2) -> ComponentCheck:
    differing = (tokens[0] != tokens[0, i]).nonzero().flatten().tolist()
    if tokens[0, i] == tokens[0, j] and differing:
        j = differing[0]  # swapping two equal tokens would change nothing
    attention, output = swap_attention_error(model, tokens, i, j)
    detail = (f"swap tokens {i} and {j}: max |A' - P A P| over layers and heads; outputs "
              f"differ from permuted outputs by {output:.3g}")
    if expect_permuted:
        return judged("swap_attention", component, attention, EQUIVARIANCE_TOLERANCE,
                      detail + " (NoPE: rows and columns just permute)")
    return judged("swap_attention", component, attention, BREAK_MINIMUM,
                  detail + " (a PE: attention is not just permuted)", holds=False)


def equivariance_checks(spec: RunSpec, model: TransformerModel, tokens: torch.Tensor,
                        component: str) -> list[ComponentCheck]:
    nope = model.pe_kind == "none"
    return [equivariance_row(model, tokens, component, expect_equivariant=nope),
            swap_row(model, tokens, component, expect_permuted=nope)]


def trained_swap_row(spec: RunSpec, tokens: torch.Tensor, component: str) -> ComponentCheck:
    """``--trained``: train on the run's task (reversal) for ``routine.train_steps`` steps, then
    the swap test."""
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.training.trainer import Trainer

    model = build_for_check(spec).train()
    trainer = Trainer(model, build_task(spec), spec.train, spec.seed)
    with console.status(f"{component}: training on {spec.task.name}"):
        result = trainer.fit(int(spec.routine.train_steps), target_exact_match=SOLVED)
    row = swap_row(model, tokens, f"{component} (trained)", expect_permuted=model.pe_kind == "none")
    match = result.best_exact_match
    row.detail += (f"; trained {result.steps} steps on {spec.task.name}: final loss "
                   f"{result.final_loss:.3f}, held-out exact match "
                   f"{'n/a' if match is None else f'{match:.3f}'}")
    return row


# which checks a PE gets

Check = Callable[[RunSpec, TransformerModel, torch.Tensor, str], list[ComponentCheck]]
# The property checks by name. A PE class lists the names that apply to it in its
# ``property_checks`` (a tuple, or a classmethod of its config arguments returning one).
PROPERTY_CHECKS: dict[str, Check] = {
    "rope_relative": rope_checks,  # rows rope_relative and rope_pairing_mismatch
    "sinusoidal_shift": sinusoidal_checks,
    "permutation": equivariance_checks,  # rows permutation_equivariant / pe_breaks_permutation
                                         # and swap_attention
}



def checks_of(spec: RunSpec, name: str) -> tuple[str, ...]:
    """The ``property_checks`` the class of ``pe=name`` declares (() for none, or for a choice
    that does not exist); ConfigError for a name ``PROPERTY_CHECKS`` does not have."""
    if spec.model.pe.name != name and name not in choices(spec, "pe"):
        return ()
    names = declared(pe_spec(spec, name).model.pe, "property_checks")
    names = (names,) if isinstance(names, str) else names
    if not isinstance(names, tuple | list):
        return ()
    unknown = [check for check in names if check not in PROPERTY_CHECKS]
    if unknown:
        raise ConfigError(f"pe={name} declares property_checks {unknown} that tlab does not "
                          f"have; checks: {', '.join(PROPERTY_CHECKS)}")
    return tuple(names)


def pes_with_checks(spec: RunSpec) -> list[str]:
    """Every choice of the ``pe`` group whose class declares checks, in name order."""
    return [name for name in choices(spec, "pe") if checks_of(spec, name)]


def pes_to_check(spec: RunSpec) -> list[str]:
    """``routine.pe``: ``all`` -> every PE with checks, else that one (ConfigError if none)."""
    choice, own = str(spec.routine.pe), spec.model.pe.name
    # --from-hf, --from-run: the checkpoint's own PE only
    if option := pretrained_option(spec):
        if choice not in ("all", own):
            raise ConfigError(f"--pe {choice}: {option} checks the checkpoint's own PE "
                              f"({own}); drop --pe")
        choice = str(own)
    if choice == "all":
        return pes_with_checks(spec)
    if not checks_of(spec, choice):
        raise ConfigError(f"--pe {choice} has no checks; pes with checks: "
                          f"{', '.join(pes_with_checks(spec))}")
    return [choice]


# the routine and its table

# The routine's own keys (``routines.check_settings``; ``routine.pe``'s choices: ``pes_to_check``).
SETTINGS = {"pe": Rule("str"), "seq_len": POSITIVE_INT, "rope_bases": Rule("list", item=POSITIVE),
            "trained": Rule("bool"), "train_steps": POSITIVE_INT}
STEPS = "routine.train_steps (with --trained)"  # (``routines.check_unread``)


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight (``routines.check_routine``): an encoder, and a PE that has checks."""
    if spec.model.causal:
        raise ConfigError("tlab check needs arch=encoder: a causal mask breaks permutation "
                          "equivariance by design")
    pes_to_check(spec)


def run_check(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    started = time.perf_counter()
    rows: list[ComponentCheck] = []
    log = run.log("checks", CHECK_TABLE_COLUMNS)
    for name in pes_to_check(spec):
        with_pe = pe_spec(spec, name)
        model = build_for_check(with_pe)
        tokens = check_tokens(with_pe, int(spec.routine.seq_len))
        checks = [PROPERTY_CHECKS[check] for check in checks_of(with_pe, name)]
        if spec.routine.trained:
            checks.append(lambda s, m, t, component: [trained_swap_row(s, t, component)])
        for check in checks:
            clock = time.perf_counter()
            new = check(with_pe, model, tokens, f"pe={name}")
            for row in new:
                row.wall_s = (time.perf_counter() - clock) / len(new)
                log.write(asdict(row))
            rows += new
    table = result_table(f"tlab check - {run.path}")
    for column in ("check", "component", "status", "value", "tolerance"):
        table.add_column(column, no_wrap=column in ("check", "status"))
    for row in rows:
        colour = "green" if row.status == "PASS" else "bold red"
        table.add_row(row.check, row.component, f"[{colour}]{row.status}[/]", f"{row.value:.3g}",
                      row.tolerance)
    print_table(table)
    failed = [f"{r.check} ({r.component})" for r in rows if r.status != "PASS"]
    return RoutineOutcome(passed=not failed, summary={"wall_s": time.perf_counter() - started},
                          message="" if not failed else "failed: " + ", ".join(failed),
                          result=check_counts([r.status for r in rows]))
