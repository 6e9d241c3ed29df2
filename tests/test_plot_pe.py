"""`tlab plot-pe`: the PNGs per PE kind, the numbers behind them, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from helpers import assert_refused
from matplotlib import image

from transformer_lab.components.positional import alibi_slopes, sinusoidal_table

SEED_DIMS = [0, 1, 3, 7, 15, 31]


def assert_png(path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = image.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_seed_figure_for_sinusoidal(tlab, tmp_path):
    out = tmp_path / "sin"
    code, stdout, _ = tlab("experiment=plot_pe", f"hydra.run.dir={out}")
    assert code == 0, stdout
    for name in ("pe_curves.png", "pe_heatmap.png"):
        assert_png(out / name)
    values = pd.read_csv(out / "pe_values.csv")
    assert list(values.columns) == ["position"] + [f"dim {d}" for d in SEED_DIMS]
    assert len(values) == 100
    table = sinusoidal_table(100, 128).numpy()  # the seed: 100 positions, d_model 128
    for d in SEED_DIMS:
        np.testing.assert_allclose(values[f"dim {d}"], table[:, d], atol=1e-5)
    # low dims oscillate fast, high dims slowly: count sign changes
    changes = [int((np.diff(np.sign(table[:, d])) != 0).sum()) for d in (0, 31)]
    assert changes[0] > 5 * max(changes[1], 1)


def test_rope_score_vs_distance(tlab, tmp_path):
    out = tmp_path / "rope"
    code, stdout, _ = tlab("experiment=plot_pe", "pe=rope", "routine.max_len=64",
                           f"hydra.run.dir={out}")
    assert code == 0, stdout
    for name in ("pe_curves.png", "pe_heatmap.png", "rope_score_vs_distance.png"):
        assert_png(out / name)
    values = pd.read_csv(out / "pe_values.csv")
    configured = values["score base 10000 (configured)"]
    assert configured.iloc[0] == pytest.approx(1.0)  # distance 0: q.k = |q||k|
    assert configured.iloc[1:].max() < 1.0
    assert values["score base 500000"].iloc[1:20].mean() > configured.iloc[1:20].mean()


def test_alibi_bias_per_head(tlab, tmp_path):
    out = tmp_path / "alibi"
    code, stdout, _ = tlab("experiment=plot_pe", "pe=alibi", "model.n_heads=4",
                           "pe.symmetric=abs",  # the paper's slopes over 4 heads
                           "routine.max_len=32", f"hydra.run.dir={out}")
    assert code == 0, stdout
    assert_png(out / "pe_bias_vs_distance.png")
    assert_png(out / "pe_bias_heads.png")
    values = pd.read_csv(out / "pe_values.csv")
    slopes = alibi_slopes(4).numpy()
    for h in range(4):
        column = next(c for c in values.columns if c.startswith(f"head {h} "))
        np.testing.assert_allclose(values[column], -slopes[h] * values.position, rtol=1e-5)


def test_cli_options(tmp_path):
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    out = tmp_path / "learned"
    result = CliRunner().invoke(app, ["plot-pe", "--pe", "learned", "--max-len", "40",
                                      "--d-model", "32", "--dims", "0,5", "--out", str(out)])
    assert result.exit_code == 0, result.output
    values = pd.read_csv(out / "pe_values.csv")
    assert list(values.columns) == ["position", "dim 0", "dim 5"] and len(values) == 40


@pytest.mark.parametrize("overrides, message", [
    (["pe=none"], "pe=none (kind 'none') has nothing to plot"),
    (["routine.dims=[0,200]"], "routine.dims=[200] not valid for d_model 128"),
    (["routine.max_len=0"], "max_len=0 is not valid"),
])
def test_bad_input_exits_2(tlab, tmp_path, overrides, message):
    assert_refused(tlab("experiment=plot_pe", *overrides, f"hydra.run.dir={tmp_path / 'x'}"),
                   tmp_path / "x", message)
