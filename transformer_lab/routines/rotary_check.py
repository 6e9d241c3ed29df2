from transformer_lab.routines.check import rotary_relative_check  # noqa: F401
