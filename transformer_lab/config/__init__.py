"""Configs: the Hydra tree (``tree``), composing it (``compose``), turning a config group into
an object (``instantiate``), the plug-in protocols of user components (``protocols``), and the
one module that uses Hydra's private API (``hydra_adapter``)."""
