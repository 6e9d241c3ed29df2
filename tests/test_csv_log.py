"""CsvLog never drops a column: a later row with new keys widens the header (nothing lost)."""

from __future__ import annotations

import csv
from pathlib import Path

from transformer_lab.results.run_directory import CsvLog


def rows_of(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_a_later_row_with_new_keys_widens_the_header(tmp_path: Path) -> None:
    log = CsvLog(tmp_path / "m.csv", ["step", "loss"])
    log.write({"step": 1, "loss": 2.5})
    log.write({"step": 2, "loss": 2.0, "moe_expert0_fraction": 0.25})
    log.write({"step": 3, "loss": 1.5})
    log.close()
    header, rows = rows_of(tmp_path / "m.csv")
    assert header == ["step", "loss", "moe_expert0_fraction"]
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert [r["moe_expert0_fraction"] for r in rows] == ["", "0.25", ""]
    assert not list(tmp_path.glob("*.widening"))


def test_dense_then_moe_keeps_the_expert_columns(tlab, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, _ = tlab("experiment=compare_activations", "routine.activations=[gelu,moe]",
                           "routine.seeds=1", "routine.steps=12", "model=tiny",
                           "model.d_model=16", "task.seq_len=8", "task.eval_size=32",
                           "train.batch_size=8", f"hydra.run.dir={out}")
    assert code == 0, stdout
    header, rows = rows_of(out / "metrics.csv")
    assert "moe_expert0_fraction" in header
    moe = [r for r in rows if r.get("variant") == "moe" and r["moe_expert0_fraction"]]
    assert moe, "the MoE rows lost their expert fractions"
