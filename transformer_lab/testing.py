"""Assertions for your own pytest suite: tlab's checks on your component, failing with the rows that
failed and what to look at (docs/python_api.md)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import transformer_lab.api as api
from transformer_lab.api import Component, Result


def _label(component: Component) -> str:
    return component if isinstance(component, str) else \
        getattr(component, "__name__", type(component).__name__)


def _run_checked(command: Any, what: str, out: str | Path | None, **kwargs: Any) -> Result:
    """Run ``command`` into ``out`` (default: a temporary directory, removed if it passes);
    ``AssertionError`` listing the FAIL rows (``step check: detail``) and their steps' hints
    otherwise."""
    from transformer_lab.routines.validate import STEP_HINTS

    temp = None if out is not None else Path(tempfile.mkdtemp(prefix="tlab-test-"))
    result = command(out=out if out is not None else temp / "run", **kwargs)
    if result.passed:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
        return result
    lines = [f"{what} failed (exit code {result.exit_code}):"]
    table = result.table
    if table.empty or "status" not in table:
        lines.append(f"{result.table_name}.csv was not written; see {result.run_dir / 'run.log'}")
    else:
        failed = table[table.status == "FAIL"]
        lines += [f"  step {row.step} {row.check}: {row.detail}" for row in failed.itertuples()]
        lines += [f"  -> step {step}: {STEP_HINTS[int(step)]}"
                  for step in dict.fromkeys(failed.step) if int(step) in STEP_HINTS]
        if failed.empty:  # no FAIL row: the run ended otherwise (diverged, error)
            summary = result.summary
            has_error = not summary.empty and "error" in summary
            lines.append(f"  {summary.error[0] if has_error else 'unknown'}")
    raise AssertionError("\n".join([*lines, f"run directory: {result.run_dir}"]))


def assert_positional_encoding(pe: Component, arch: str = "encoder", *,
                               overrides: Sequence[str] = (),
                               out: str | Path | None = None) -> Result:
    """``tlab validate`` with this PE: the model runs, the loss falls, reversal beats the NoPE
    control (and, for a rotary PE, scores depend on n - m only), activations train."""
    return _run_checked(api.validate, f"pe={_label(pe)} (arch={arch}): tlab validate", out,
                        pe=pe, arch=arch, overrides=overrides)


def assert_trains(pe: Component = None, *, ffn: Component = None,
                  norm_layer: Component = None, arch: str = "encoder",
                  overrides: Sequence[str] = (), out: str | Path | None = None) -> Result:
    """``tlab smoke`` with these components: a tiny model runs forward and backward and its loss
    falls within 10 steps."""
    chosen = [f"{group}={_label(c)}" for group, c in
              (("pe", pe), ("ffn", ffn), ("norm_layer", norm_layer)) if c is not None]
    what = f"{', '.join(chosen) or 'the default model'} (arch={arch}): tlab smoke"
    return _run_checked(api.smoke, what, out, pe=pe, ffn=ffn,
                        norm_layer=norm_layer, arch=arch, overrides=overrides)


def assert_rope_relative(pe: Component, *, d_model: int = 64, n_heads: int = 4,
                         n_positions: int = 16) -> None:
    """A rotary PE makes ``q_m . k_n`` depend on ``n - m`` only: validate's step-3 check,
    in-process; class arguments follow ``d_model`` and ``n_heads``."""
    from omegaconf import OmegaConf

    from transformer_lab.config.compose import compose  # noqa: F401  (registers ${tlab.div:...})
    from transformer_lab.config.spec import RunSpec
    from transformer_lab.config.variants import load_choice
    from transformer_lab.errors import ConfigError
    from transformer_lab.routines.check import rotary_relative_check

    label = _label(pe)
    components = api.OfferedComponents()
    choice = components.choice("pe", pe)  # a name as it is; a class or an instance offered
    node = (OmegaConf.to_container(load_choice("pe", pe)) if isinstance(pe, str)
            else components.nodes["pe"][choice])
    model = {"d_model": d_model, "n_heads": n_heads, "d_ff": 4 * d_model, "max_len": 512,
             "n_layers": 1}
    try:
        with components.offered():
            spec = RunSpec.of(OmegaConf.create({"model": model, "pe": node}))
            row = rotary_relative_check(spec, n_positions)
    except ConfigError as exc:
        raise AssertionError(f"pe={label}: could not be built: {exc}") from None
    if row is None:
        kind = getattr(pe if not isinstance(pe, str) else None, "kind", None)
        raise AssertionError(f"pe={label} is not a rotary PE (kind={kind!r}); "
                             "assert_rope_relative checks PEs with kind = 'rotary'")
    if row.status != "PASS":
        raise AssertionError(f"pe={label}: rotary_relative {row.status}: {row.detail}")
