"""tlab: a command-line experiment runner for Transformer components. The Python API
(docs/python_api.md) loads on first use, so ``import transformer_lab`` stays cheap."""

from typing import Any

__version__ = "0.2.0"

_API = ("train", "compare", "sample", "export", "validate", "smoke", "reverse_task",
        "compare_activations", "check", "Result")
__all__ = [*_API, "testing"]


def __getattr__(name: str) -> Any:
    """``tl.validate`` etc. from ``transformer_lab.api``, ``tl.testing``, imported lazily."""
    from importlib import import_module

    if name in _API:
        return getattr(import_module("transformer_lab.api"), name)
    if name == "testing":
        return import_module("transformer_lab.testing")
    raise AttributeError(f"module 'transformer_lab' has no attribute '{name}'")
