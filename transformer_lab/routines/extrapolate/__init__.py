"""``tlab extrapolate``: what to train and evaluate (``plan``), the configs, tasks and models at
each length (``lengths``), the routine (``routine``), its tables and plot (``tables``)."""

from transformer_lab.routines.extrapolate.routine import check_config, run_extrapolate

__all__ = ["check_config", "run_extrapolate"]
