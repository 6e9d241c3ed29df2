"""Synthetic and text tasks; chosen with ``task=`` (reverse, copy, lm, text)."""

from transformer_lab.tasks.base import IGNORE_INDEX, Batch, Task
from transformer_lab.tasks.language import SyntheticLanguageTask, TextTask
from transformer_lab.tasks.sequence import CopyTask, ReverseTask

__all__ = ["IGNORE_INDEX", "Batch", "CopyTask", "ReverseTask", "SyntheticLanguageTask", "Task",
           "TextTask"]
