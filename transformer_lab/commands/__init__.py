"""Typer commands of the ``tlab`` CLI, one module each; ``transformer_lab.cli`` registers them.

Commands only translate options into Hydra overrides and hand them to ``transformer_lab.run``;
they import nothing heavy (torch, hydra) until they run.
"""
