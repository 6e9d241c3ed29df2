"""Output made for 80 columns: names and header words never split, paths whole, one final
line per run; `tlab list` shows each command's defaults."""

from __future__ import annotations

import os
import re
import subprocess

from helpers import TLAB, read_csv
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.cli.listing import command_defaults
from transformer_lab.config.compose import compose
from transformer_lab.results import console as console_module
from transformer_lab.results.check_rows import CheckRow, check_counts, check_table

LONG_DETAIL = ("every pair of positions below 256 at least 0.29 of a neighbour step apart, "
               "measured on the first layer's input with the model's own embeddings")


def rendered(renderable, width: int, monkeypatch) -> list[str]:
    """``renderable`` as ``print_table`` prints it on a console ``width`` columns wide."""
    wide = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    monkeypatch.setattr(console_module, "console", wide)
    console_module.print_table(renderable)
    return [line.rstrip() for line in wide.export_text().splitlines()]


def test_check_table_keeps_names_whole_at_80_and_160_columns(monkeypatch):
    rows = [CheckRow(1, "position_distinguishability", "PASS", value=0.2941, threshold=0.05,
                     detail=LONG_DETAIL),
            CheckRow(4, "activation_relu", "SKIP", threshold="< first loss", detail="short")]
    for width in (80, 160):
        monkeypatch.setattr(console_module.console, "_width", width, raising=False)
        lines = rendered(check_table(rows, "tlab smoke - run"), width, monkeypatch)
        assert all(len(line) <= width for line in lines), (width, lines)
        words = {word for line in lines for word in line.split()}
        assert {"position_distinguishability", "activation_relu", "<"} <= words
        assert LONG_DETAIL in " ".join(" ".join(lines).split())  # wrapped between words


def test_a_title_with_a_long_path_prints_whole(monkeypatch, tmp_path):
    path = tmp_path / ("a-long-folder-name-" * 4) / "2026-12-04_20-30-11-123456"
    table = Table(title=f"tlab train - {path}")
    headers = ("final_loss", "grad_norm_mean", "tokens_per_s", "p_improvement")
    for header in headers:
        table.add_column(header)
    table.add_row("1.0", "0.5", "1000", "0.5")
    lines = rendered(table, 40, monkeypatch)
    assert any(str(path) in line for line in lines), lines
    for header in headers:  # squeezed, still whole
        assert any(header in line for line in lines), (header, lines)


def test_check_counts_names_fails_and_skips():
    assert check_counts(["PASS", "SKIP", "FAIL", "PASS"]) == ["4 checks", "1 FAIL", "1 SKIP"]
    assert check_counts(["PASS"]) == ["1 check"]


def test_smoke_at_80_columns_fits_and_ends_with_one_line(tmp_path):
    out = tmp_path / "outputs-of-a-test-with-a-long-name" / "smoke" / "2026-12-04_20-30-11"
    result = subprocess.run([TLAB, "smoke", "--out", str(out)], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "80"}, timeout=240)
    assert result.returncode == 0, result.stderr
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert all(len(line) <= 80 or str(out) in line for line in lines), lines
    checks = read_csv(out / "smoke.csv")
    words = {word for line in lines for word in line.split()}
    assert {row["check"] for row in checks} <= words  # every name on one line, unsplit
    skips = sum(row["status"] == "SKIP" for row in checks)
    expected = f"smoke: PASS, {len(checks)} checks" + (f", {skips} SKIP" if skips else "")
    assert re.fullmatch(re.escape(expected) + r", \d+\.\d s", lines[-1]), lines[-1]


def test_list_shows_each_commands_defaults_as_hydra_composes_them():
    defaults = command_defaults()
    for command in ("train", "smoke", "validate", "budget"):
        cfg = compose([f"experiment={command}"], return_hydra_config=True)
        choices = cfg.hydra.runtime.choices
        for group in ("model", "pe", "block", "norm_layer", "ffn", "arch", "task", "optimizer"):
            assert defaults[command][group] == choices[group], (command, group)
        assert defaults[command]["d_model"] == str(cfg.model.d_model), command
    result = CliRunner().invoke(app, ["list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    train_row = next(line for line in result.output.splitlines() if line.startswith("train "))
    assert train_row.split() == ["train", "small", "rope", "decoder", "tinyshakespeare", "64"]
