"""Helpers shared by several routines: ``variants.as_list`` and ``train.mean_or_nan``."""

import math

from omegaconf import OmegaConf

from transformer_lab.routines.train import mean_or_nan
from transformer_lab.routines.variants import as_list


def test_as_list_reads_a_comma_separated_string_and_a_hydra_list_alike():
    listed = OmegaConf.create({"pes": [" relu", "gelu ", 2, 1.5]}).pes
    assert as_list(listed) == ["relu", "gelu", "2", "1.5"]
    assert as_list(" relu, gelu ,, 2,1.5 ") == ["relu", "gelu", "2", "1.5"]
    assert as_list(None) == [] and as_list("") == [] and as_list(" , ") == []


def test_mean_or_nan_leaves_out_none_and_is_nan_without_values():
    assert mean_or_nan([1.0, None, 2.0, 4]) == 7 / 3
    assert math.isnan(mean_or_nan([None, None])) and math.isnan(mean_or_nan([]))
    assert math.isnan(mean_or_nan([1.0, math.nan]))  # a NaN is a value: it is not left out
