"""From a command line to finished runs (``docs/architecture.md``, ``docs/cli.md``)."""
