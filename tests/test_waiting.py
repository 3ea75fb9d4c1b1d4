"""The waiting helpers of tests/waiting.py."""

import os
import time

from waiting import cpu_seconds, wait_until


def test_wait_until_returns_when_the_condition_holds_or_at_the_deadline():
    calls = []
    assert wait_until(lambda: calls.append(None) or len(calls) >= 3, timeout=10)
    assert len(calls) == 3
    start = time.monotonic()
    assert not wait_until(lambda: False, timeout=0.1)
    assert 0.1 <= time.monotonic() - start < 5


def test_cpu_seconds_grow_while_this_process_computes():
    before = cpu_seconds(os.getpid())
    assert wait_until(lambda: sum(range(100_000)) and cpu_seconds(os.getpid()) > before + 0.05, timeout=30)
