"""experiments/moe.md: its FFN config files build the sizes the study reports, and its analysis
script (experiments/scripts/moe_stats.py) measures expert utilisation as documented."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

import transformer_lab.config.compose  # noqa: F401  (registers ${tlab.div:...})
from experiments.scripts.moe_stats import contrasts, spread, utilisation
from transformer_lab.components.feedforward import FeedForward
from transformer_lab.components.moe import MoEFeedForward

CONFIGS = Path(__file__).resolve().parents[1] / "experiments" / "moe_configs" / "ffn"
SMALL = {"d_model": 64, "d_ff": 256, "ffn_bias": True, "init_std": 0.02,
         "dropout": {"ffn": 0.0}, "gated_match_params": False}


def build(name: str, **model) -> MoEFeedForward:
    """The FFN of ``experiments/moe_configs/ffn/<name>.yaml`` at ``model=small`` (+ ``model``)."""
    cfg = OmegaConf.create({"model": {**SMALL, **model},
                            "ffn": OmegaConf.load(CONFIGS / f"{name}.yaml")})
    arguments = OmegaConf.to_container(cfg.ffn, resolve=True)
    assert arguments.pop("name") == name
    assert arguments.pop("_target_") == "transformer_lab.components.moe.MoEFeedForward"
    return MoEFeedForward(**arguments)


@pytest.mark.parametrize(("name", "top_k", "d_ff", "total", "coef"), [
    ("moe_active_lb", 2, 128, 133_120, 0.01), ("moe_active_nolb", 2, 128, 133_120, 0.0),
    ("moe_total_lb", 2, 32, 34_048, 0.01), ("moe_total_nolb", 2, 32, 34_048, 0.0),
    ("moe_soft", 8, 32, 34_048, 0.0)])
def test_study_configs_build_the_reported_sizes(name, top_k, d_ff, total, coef):
    ffn = build(name)
    assert (ffn.n_experts, ffn.top_k, ffn.load_balance_coef) == (8, top_k, coef)
    assert ffn.experts[0].up_proj.out_features == d_ff  # model.d_ff / 2 or / 8
    assert sum(p.numel() for p in ffn.parameters()) == total
    dense = sum(p.numel() for p in FeedForward(64, 256, "gelu", True, 0.0, 0.02).parameters())
    if name.startswith("moe_active"):  # two active experts hold the dense FFN's weights
        active = MoEFeedForward.active_parameters(64, d_ff, 8, top_k, "gelu")
        assert active - 64 * 8 - 64 == dense  # less the router and one extra output bias
    else:  # all eight experts together hold them
        assert total - 64 * 8 - 7 * 64 == dense


def test_study_configs_follow_model_d_ff():
    assert build("moe_active_lb", d_ff=64).experts[0].up_proj.out_features == 32  # depth check
    assert build("moe_total_lb", d_ff=64).experts[0].up_proj.out_features == 8


def test_spread_of_uniform_and_skewed_shares():
    uniform = spread(np.full(8, 0.125))
    assert uniform["cv"] == pytest.approx(0.0) and uniform["eff_experts"] == pytest.approx(8.0)
    assert uniform["max_min_ratio"] == pytest.approx(1.0)
    skewed = spread(np.array([0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]))
    assert skewed["max_min_ratio"] == pytest.approx(3.0) and skewed["eff_experts"] < 8


def metrics_rows(variant: str, seed: int, early: list[float], late: list[float]) -> list[dict]:
    """20 logged steps: the first 18 with shares ``early``, the last 2 with ``late``."""
    rows = []
    for step in range(1, 21):
        shares = early if step <= 18 else late
        rows.append({"step": step, "split": "train", "variant": variant, "seed": seed,
                     **{f"moe_expert{i}_fraction": s for i, s in enumerate(shares)}})
    return rows


def test_utilisation_averages_the_last_tenth_of_training():
    skew = [0.3] + [0.1] * 7
    metrics = pd.DataFrame(metrics_rows("moe_x", 0, skew, [0.125] * 8)
                           + metrics_rows("moe_x", 1, [0.125] * 8, skew))
    table = utilisation(metrics).set_index("seed")
    assert (table["steps_averaged"] == 2).all()  # steps 19-20 of 20
    assert table.loc[0, "cv"] == pytest.approx(0.0)  # balanced at the end, whatever came before
    assert table.loc[1, "max_min_ratio"] == pytest.approx(3.0)


def test_load_balance_contrast_pairs_by_seed():
    seeds = range(8)
    runs = pd.DataFrame([{"activation": a, "seed": s, "final_loss": 2.0 + 0.01 * s + shift}
                         for a, shift in (("moe_active_lb", -0.01), ("moe_active_nolb", 0.0))
                         for s in seeds])
    per_seed = pd.DataFrame([{"variant": v, "seed": s, "cv": cv + 0.001 * s}
                             for v, cv in (("moe_active_lb", 0.1), ("moe_active_nolb", 0.5))
                             for s in seeds])
    table = contrasts(runs, per_seed).set_index("metric")
    assert table.loc["final_loss", "diff"] == pytest.approx(-0.01)
    assert table.loc["cv", "diff"] == pytest.approx(-0.4)
    assert (table["verdict"] == "better").all()  # 8/8 seeds: p = 2/2^8, Holm over 2 = 0.016
