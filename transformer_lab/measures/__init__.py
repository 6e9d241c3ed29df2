"""Measurements of a model or a config: parameter formulas (``parameters``), activation memory
(``memory``), component properties (``properties``)."""
