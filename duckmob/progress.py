"""Progress of long work, one switch for all of it: fits (DP-SGD steps, pre-training iterations) and outputs
(trajectories and rows drawn).

:func:`enabled` decides whether anything is shown: ``DUCKMOB_PROGRESS=1`` / ``0`` forces it on or off; otherwise
it is on (a shell, a notebook, a log) and off in CI and under pytest. A caller's explicit ``progress`` parameter
(a method's ``progress := true/false``) wins over both. Where it is on, a terminal gets a tqdm bar and anything
else (a log, a notebook's stream) plain stderr lines.

Only counts that follow from public parameters or from synthetic output are shown (steps, trajectories, rows of
the synthetic table): nothing computed from the sensitive table.
"""

from __future__ import annotations

import os
import sys
import time


def enabled() -> bool:
    """Whether progress is shown when the caller did not say: ``DUCKMOB_PROGRESS`` decides when set; otherwise on,
    except in CI and under pytest."""
    asked = os.environ.get("DUCKMOB_PROGRESS")
    if asked is not None:
        return asked.strip().lower() not in ("", "0", "false", "no", "off")
    return not (os.environ.get("CI") or os.environ.get("PYTEST_CURRENT_TEST"))


class Steps:
    """Progress of ``steps`` steps as one stderr line per tenth (``duckmob: HRNet DP-SGD: 40% (400/1,000 steps)``),
    where no terminal shows a bar: a long fit says it is alive. tqdm's ``update``/``close`` interface."""

    def __init__(self, desc: str, steps: int):
        self.desc, self.steps, self.done, self.next = desc, max(int(steps), 1), 0, 1

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done * 10 >= self.next * self.steps:
            self.next = self.done * 10 // self.steps + 1
            sys.stderr.write(f"duckmob: {self.desc}: {self.done * 100 // self.steps}% ({self.done:,}/{self.steps:,} "
                             "steps)\n")
            sys.stderr.flush()

    def close(self) -> None:
        pass


def steps(desc: str, total: int, progress: bool | None = None):
    """A progress counter of ``total`` steps with ``update(n)`` and ``close()``: a tqdm bar in a terminal,
    :class:`Steps` lines elsewhere, nothing when off (``progress``, else :func:`enabled`)."""
    from tqdm import tqdm

    if not (enabled() if progress is None else progress):
        return tqdm(total=total, disable=True)
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit="step", leave=False)
    return Steps(desc, total)


class Rows:
    """Progress of a long output as stderr lines (``duckmob: mob_sample: 40% (819,200/2,048,000 trajectories,
    95,840,211 rows)``): the first after ``QUIET`` seconds (a short output prints nothing), then at most one every
    ``EVERY`` seconds, and one at the end. Counts of synthetic rows only (post-processing)."""

    QUIET = 5.0
    EVERY = 10.0

    def __init__(self, desc: str, n: int, progress: bool | None = None):
        self.desc, self.n = desc, max(int(n), 1)
        self.enabled = enabled() if progress is None else progress
        self.done = self.rows = 0
        self.start = time.monotonic()
        self.last: float | None = None

    def update(self, trajectories: int, rows: int) -> None:
        """Count one drawn block (``trajectories`` and their ``rows``)."""
        self.done += int(trajectories)
        self.rows += int(rows)
        if not self.enabled:
            return
        now = time.monotonic()
        finished = self.done >= self.n
        due = now - self.start >= self.QUIET and (self.last is None or now - self.last >= self.EVERY)
        if due or (finished and self.last is not None):
            self.last = now
            sys.stderr.write(f"duckmob: {self.desc}: {self.done * 100 // self.n}% ({self.done:,}/{self.n:,} "
                             f"trajectories, {self.rows:,} rows)\n")
            sys.stderr.flush()
