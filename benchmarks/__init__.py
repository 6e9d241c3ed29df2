"""Performance harness: ``python -m benchmarks.run`` (see run.py)."""
