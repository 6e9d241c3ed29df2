"""Configs: the Hydra tree, composing it, instantiating its nodes, the checks of a composed config
and the protocols of user components; Hydra through its public API only."""
