"""``tlab extrapolate``: ``plan`` (what to train and evaluate), ``lengths`` (configs, tasks and
models at each length), ``routine``, ``tables`` (curves, plot, table, verdicts)."""
