"""The clean-slate router kept across sampling calls (issue 42 item 5): each (destination, slot) group is searched
once, what is kept changes no path, and the byte cap drops tables without changing any."""

import numpy as np

from duckmob.synth.cleanslate.paths import Router, most_probable_paths
from duckmob.synth.cleanslate.trips import valid_moves


def _log_probs(w, r, seed, calls):
    rng = np.random.default_rng(seed)
    valid = valid_moves(w, r)
    table = rng.normal(size=(w * w * 3, w * w, (2 * r + 1) ** 2)) * 2   # logits per (dest, slot)

    def log_probs(dest, slot):
        calls.append(len(dest))
        x = table[dest * 3 + slot] + np.where(valid, 0.0, -1e9)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))
    return log_probs


def test_router_searches_each_group_once_across_calls_and_keeps_paths():
    w, r = 6, 1
    rng = np.random.default_rng(1)
    calls = []
    router = Router(_log_probs(w, r, 0, calls), w, r, groups_per_search=8, hop_cost=1.0)
    assert router.hops.dtype == np.int16
    seen = set()
    for block in range(4):
        s, d, t = rng.integers(0, w * w, 50), rng.integers(0, w * w, 50), rng.integers(0, 3, 50)
        got = router.paths(s, d, t, 3 * w)
        fresh = Router(_log_probs(w, r, 0, []), w, r, groups_per_search=8, hop_cost=1.0).paths(s, d, t, 3 * w)
        assert all((a == b).all() for a, b in zip(got, fresh))      # the same paths as a router made for this call
        seen |= set((d * Router.KEY + t).tolist())
        assert sum(calls) == len(seen)                              # only the groups not searched before
    assert len(router.keys) == len(seen)


def test_router_over_its_byte_cap_keeps_only_the_call_s_groups_and_the_same_paths():
    w, r = 6, 1
    rng = np.random.default_rng(2)
    calls = []
    table_bytes = w * w * np.dtype(np.int16).itemsize
    router = Router(_log_probs(w, r, 0, calls), w, r, max_bytes=40 * table_bytes)
    for block in range(5):
        s, d, t = rng.integers(0, w * w, 30), rng.integers(0, w * w, 30), rng.integers(0, 3, 30)
        got = router.paths(s, d, t, 3 * w)
        fresh = most_probable_paths(_log_probs(w, r, 0, []), s, d, t, w, r, 3 * w)  # hop_cost 0
        assert all((a == b).all() for a, b in zip(got, fresh))
        assert len(router.keys) <= max(40, len(np.unique(d * Router.KEY + t)))
    assert sum(calls) > len(np.unique(router.keys))                 # some groups were dropped and searched again
