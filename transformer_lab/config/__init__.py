"""Configs: the Hydra tree (``tree``), composing it (``compose``), turning a config group into
an object (``instantiate``), the plug-in protocols of user components (``protocols``). Hydra is
used through its public API only."""
