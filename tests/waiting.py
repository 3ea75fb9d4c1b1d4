"""How tests wait: for a condition they can observe, polled until it holds or a deadline passes (never a bare
sleep standing in for "long enough")."""

import os
import pathlib
import time


def wait_until(predicate, timeout: float, interval: float = 0.02) -> bool:
    """Call ``predicate`` until it returns true (then True) or ``timeout`` seconds have passed (then whatever one
    last call returns, as a bool). A test asserts the result when the condition is what it proves."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= end:
            return bool(predicate())
        time.sleep(interval)
    return True


def cpu_seconds(pid: int) -> float:
    """The CPU seconds (user + system, all threads) process ``pid`` has used so far, from Linux's /proc: a
    process that is computing uses them, one that waits at a prompt does not."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

