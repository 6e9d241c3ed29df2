"""Training: the loop (``trainer``), several seeds at once (``multiseed``), the optimiser,
learning-rate schedules, lock-stepped threads and CPU thread counts."""
