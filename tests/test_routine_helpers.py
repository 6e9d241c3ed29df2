"""Helpers shared by several routines: ``config.variants.as_list``, ``train.mean_or_nan`` and the
result tables' ``console.cell``."""

import math

from omegaconf import OmegaConf

from transformer_lab.config.variants import as_list
from transformer_lab.results.console import cell
from transformer_lab.routines.train import mean_or_nan


def test_as_list_reads_a_comma_separated_string_and_a_hydra_list_alike():
    listed = OmegaConf.create({"pes": [" relu", "gelu ", 2, 1.5]}).pes
    assert as_list(listed) == ["relu", "gelu", "2", "1.5"]
    assert as_list(" relu, gelu ,, 2,1.5 ") == ["relu", "gelu", "2", "1.5"]
    assert as_list(None) == [] and as_list("") == [] and as_list(" , ") == []


def test_mean_or_nan_leaves_out_none_and_is_nan_without_values():
    assert mean_or_nan([1.0, None, 2.0, 4]) == 7 / 3
    assert math.isnan(mean_or_nan([None, None])) and math.isnan(mean_or_nan([]))
    assert math.isnan(mean_or_nan([1.0, math.nan]))  # a NaN is a value: it is not left out


def test_cell_prints_missing_values_as_a_dash_and_floats_to_their_digits():
    assert cell(None) == "-" and cell(math.nan) == "-" and cell(7) == "7" and cell("x") == "x"
    assert cell(0.0123456) == "0.0123" and cell(0.0123456, 4) == "0.01235"
    assert cell(999.6) == "1e+03" and cell(999.6, 4) == "999.6"  # below 1000: significant digits
    assert cell(1234567.8) == "1234568" and cell(1234567.8, 4, ",") == "1,234,568"  # whole
