"""Training: the loop (``trainer``: one model, its optimiser, schedule and metrics rows),
learning-rate schedules and CPU thread counts."""
