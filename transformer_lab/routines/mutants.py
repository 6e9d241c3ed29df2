"""``tlab mutants``: the validation routine as a bug detector, measured like a classifier over
broken and correct components (docs/routines.md)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.table import Table

from transformer_lab.config.schema import Rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.variants import as_list
from transformer_lab.errors import ConfigError
from transformer_lab.mutants import MUTANTS, Mutant, built_in_negatives, mutant_config
from transformer_lab.results.check_rows import CheckRow, Stopwatch
from transformer_lab.results.console import console
from transformer_lab.results.run_directory import RunDirectory, TaggedLog
from transformer_lab.routines import JobInputs, RoutineOutcome, validate

MUTANT_COLUMNS = ["name", "kind", "group", "arch", "expected", "caught", "outcome", "detail",
                  "wall_s"]
OUTCOMES = ("correct-passed", "correct-failed", "caught-expected", "caught-elsewhere", "missed")


@dataclass
class Candidate:
    """One component of the suite: how to compose its config and where it should be caught
    (``none``)."""

    name: str
    kind: str  # correct | broken
    group: str
    arch: str
    expected: str
    compose: Callable[[], Any]  # -> its composed config, read by ``preflight``


@dataclass
class Verdict:
    candidate: Candidate
    caught: str  # "" when every check passed
    detail: str
    wall_s: float

    @property
    def outcome(self) -> str:
        expected = self.candidate.expected
        if self.candidate.kind == "correct":
            return "correct-failed" if self.caught else "correct-passed"
        if not self.caught:
            return "missed"
        same = self.caught == expected or self.caught.split(":")[0] == expected
        return "caught-expected" if same else "caught-elsewhere"

    def as_row(self) -> dict[str, Any]:
        c = self.candidate
        return {"name": c.name, "kind": c.kind, "group": c.group, "arch": c.arch,
                "expected": c.expected, "caught": self.caught or "none", "outcome": self.outcome,
                "detail": self.detail[:300], "wall_s": round(self.wall_s, 3)}


def load_mutants(directory: Path) -> list[Mutant]:
    """The ``MUTANTS`` lists of every ``*.py`` file in ``directory`` (put on ``sys.path``)."""
    if not directory.is_dir():
        raise ConfigError(f"routine.dir={directory} is not a directory (--dir: a directory of "
                          "Python files defining MUTANTS)")
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))
    found: list[Mutant] = []
    for path in sorted(directory.glob("*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        found += list(getattr(module, "MUTANTS", []))
    if not found or not all(isinstance(m, Mutant) for m in found):
        raise ConfigError(f"routine.dir={directory}: no MUTANTS list of "
                          "transformer_lab.mutants.Mutant in its *.py files")
    return found


def suite(spec: RunSpec) -> list[Candidate]:
    """The mutants, then the built-in correct components; ``routine.only`` keeps those named."""
    directory = spec.routine.get("dir")
    mutants = load_mutants(Path(directory).expanduser().resolve()) if directory else MUTANTS
    extra = list(spec.routine.get("overrides") or [])
    candidates = [Candidate(m.name, "correct" if m.expected == "harmless" else "broken",
                            m.group, m.arch, "none" if m.expected == "harmless" else m.expected,
                            lambda m=m: mutant_config(m, extra, experiment="validate"))
                  for m in mutants]
    if spec.routine.get("negatives", True):
        from transformer_lab.config.compose import compose

        candidates += [Candidate(name, "correct", group, arch, "none",
                                 lambda o=overrides: compose(["experiment=validate", *o, *extra]))
                       for name, group, arch, overrides in built_in_negatives()]
    only = spec.routine.get("only")
    if only:
        names = set(as_list(only))
        unknown = names - {c.name for c in candidates}
        if unknown:
            raise ConfigError(f"routine.only: {', '.join(sorted(unknown))} not in the suite; "
                              f"valid: {', '.join(c.name for c in candidates)}")
        candidates = [c for c in candidates if c.name in names]
    return candidates


def first_failure(rows: list[CheckRow]) -> CheckRow | None:
    return next((row for row in rows if not row.passed), None)


def preflight(composed: Any) -> RunSpec:
    """The app's pre-flight of the components of a composed config: each run against its
    protocol (``ConfigError``); its spec, with the task's vocabulary."""
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.model import build_checked_model

    spec = RunSpec.of(composed)
    task = build_task(spec)
    spec = spec.with_vocab(task.vocab_size)
    build_checked_model(spec.model, task.model_seq_len, spec.seed)
    return spec


def examine(candidate: Candidate, run: RunDirectory, reversal: bool) -> Verdict:
    """The pre-flight, steps 1-2 and step 3 on one candidate; the first failure names where
    it was caught."""
    from transformer_lab.routines import check, validate

    clock = Stopwatch()
    try:
        spec = preflight(candidate.compose())
    except ConfigError as exc:
        return Verdict(candidate, "preflight", str(exc).splitlines()[0], clock.lap())
    configs = validate.step_configs(spec)
    # what validate's steps write to: metrics tagged with the candidate, no table of their own
    target = SimpleNamespace(metrics=TaggedLog(run.metrics, component=candidate.name),
                             path=run.path, write_table=lambda *args, **kwargs: None)
    try:
        rows = validate.smoke_steps(configs["smoke"], target)
        if first_failure(rows) is None:
            rotary = check.rotary_relative_check(configs["reverse_task"])
            rows += [rotary] if rotary is not None else []
        if first_failure(rows) is None and reversal:
            rows += validate.reversal_step(configs["reverse_task"], target)[0]
    except Exception as exc:  # tlab validate would stop with exit 1
        return Verdict(candidate, f"crash:{type(exc).__name__}", str(exc)[:200], clock.lap())
    failed = first_failure(rows)
    if failed is None:
        return Verdict(candidate, "", "every check passed", clock.lap())
    return Verdict(candidate, f"step{failed.step}:{failed.check}", failed.detail, clock.lap())


def confusion(verdicts: list[Verdict]) -> dict[str, int]:
    return {outcome: sum(v.outcome == outcome for v in verdicts) for outcome in OUTCOMES}


def mutation_score(counts: dict[str, int]) -> float | None:
    """Fraction of the broken components caught at any step (None without any)."""
    caught = counts["caught-expected"] + counts["caught-elsewhere"]
    return caught / (caught + counts["missed"]) if caught + counts["missed"] else None


def confusion_table(counts: dict[str, int], score: float | None) -> Table:
    table = Table(title="tlab mutants: the routine as a classifier")
    for column in ("", "passed", "caught at the expected step", "caught elsewhere", "missed"):
        table.add_column(column)
    table.add_row("correct", str(counts["correct-passed"]), "", str(counts["correct-failed"])
                  + " (false alarms)", "")
    table.add_row("broken", "", str(counts["caught-expected"]), str(counts["caught-elsewhere"]),
                  str(counts["missed"]))
    table.caption = ("mutation score: " + ("n/a" if score is None else f"{score:.1%}"))
    return table


def mutation_table(verdicts: list[Verdict]) -> Table:
    table = Table(title="components")
    for column in ("name", "kind", "expected", "caught", "outcome"):
        table.add_column(column, overflow="fold")
    colours = {"correct-passed": "green", "caught-expected": "green", "missed": "bold red",
               "correct-failed": "bold red", "caught-elsewhere": "yellow"}
    for v in verdicts:
        table.add_row(v.candidate.name, v.candidate.kind, v.candidate.expected,
                      v.caught or "none", f"[{colours[v.outcome]}]{v.outcome}[/]")
    return table


def run_mutants(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    clock = Stopwatch()
    candidates = suite(spec)
    log = run.log("mutants", MUTANT_COLUMNS)
    verdicts = []
    for index, candidate in enumerate(candidates, 1):
        with console.status(f"[{index}/{len(candidates)}] {candidate.name}"):
            verdict = examine(candidate, run, bool(spec.routine.get("reversal", False)))
        log.write(verdict.as_row())
        verdicts.append(verdict)
    counts = confusion(verdicts)
    score = mutation_score(counts)
    console.print(mutation_table(verdicts))
    console.print(confusion_table(counts, score))
    wrong = [v for v in verdicts if v.outcome not in ("correct-passed", "caught-expected")]
    message = "; ".join(f"{v.candidate.name}: {v.outcome} ({v.caught or 'nothing'})"
                        for v in wrong)
    return RoutineOutcome(passed=not wrong, message=message,
                          summary={"components": len(verdicts), **counts,
                                   "mutation_score": score, "wall_s": clock.lap()})


# The routine's own keys (``routines.check_settings``; what ``dir`` and ``only`` name:
# ``check_config``). ``only``: comma-separated names, or a list.
SETTINGS = {"dir": Rule("str", nullable=True), "negatives": Rule("bool"),
            "reversal": Rule("bool"), "overrides": Rule("list"),
            "only": Rule("any", nullable=True),
            **validate.SETTINGS}  # the steps' settings, composed from experiment=validate


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """``routine.dir`` must hold mutants and ``routine.only`` name components of the suite."""
    suite(spec)
