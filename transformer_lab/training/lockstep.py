"""Two training runs on two threads, the second never ahead of the first.

The reversal step trains the chosen PE until it solves the task and a NoPE control for as many
steps as the chosen PE took, a number known only when the chosen PE stops. Run one after the
other, the control waits for the chosen PE; run on a second thread (a second core; PyTorch
releases the GIL inside its kernels), the control follows the chosen PE step by step and stops
where it stopped. The control's numbers are those of a separate run with that step budget: it
has its own model, data generator and schedule, and takes exactly the same steps.

    lockstep = Lockstep()
    leader.fit(max_steps, lead=lockstep)        # calls took(step) after each step, then stopped()
    follower.fit(max_steps, follow=lockstep)    # on another thread: asks may_take(step) first
"""

from __future__ import annotations

import threading


class Lockstep:
    """The leader's progress, shared with one follower on another thread."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._taken = 0  # steps the leader has taken so far
        self._stopped_at: int | None = None  # the leader's final step count, once it stops

    def took(self, step: int) -> None:
        with self._changed:
            self._taken = step
            self._changed.notify_all()

    def stopped(self, steps: int) -> None:
        """The leader will take no more steps (solved, out of steps, or an error)."""
        with self._changed:
            self._stopped_at = steps
            self._changed.notify_all()

    def may_take(self, step: int) -> bool:
        """May the follower take step ``step`` (1-based)? Blocks until the leader has taken it
        (True) or has stopped before it (False)."""
        with self._changed:
            self._changed.wait_for(lambda: self._taken >= step or self._stopped_at is not None)
            return self._taken >= step
