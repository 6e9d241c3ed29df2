"""The application layer: from a command line to finished runs.

``arguments`` checks the command line before anything is written, ``hydra_app`` runs Hydra
with it (single runs and sweeps), ``preflight`` checks a composed config once before its run,
``job`` runs one job in its run directory, ``sweeps`` keeps ``sweep.csv``, ``resume`` runs a
recorded sweep again (``--resume``). See ``docs/architecture.md`` for the life of one run.
"""
