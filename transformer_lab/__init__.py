"""tlab: a command-line experiment runner for Transformer components."""

__version__ = "0.1.0"
