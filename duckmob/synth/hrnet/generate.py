"""Generation (HRNet §2.3.3): sample the chain rule of eq. 1 for all n trajectories at once.

Every output is learned: step 1 starts from the start token, so the first cell is drawn from the model; each
step draws the next cell (or the end token, which sets the length) from the finest-resolution distribution and
its time slot from the time head; nothing is copied from real trajectories. The previous cell is masked out at
each step, because the training sequences have consecutive duplicates collapsed (a property of the data
domain, not of the data); the end token is masked at step 1 so a trajectory has at least one cell, and
``max_len`` cells end a trajectory. Given target lengths (drawn from the released length distribution), the end
token is masked until a row reaches its target and the row stops there. Sampling is vectorised over trajectories
(in chunks of ``chunk`` rows to bound memory); the loop is over steps only.

Points: a cell becomes a point drawn uniformly inside it; a time slot of the day becomes a time drawn uniformly
inside the slot, on day ``base_day`` (a public date, µs since the epoch) plus as many days as the slot sequence
wraps around midnight, sorted within a trajectory.
"""

from __future__ import annotations

import numpy as np
import torch

from duckmob.synth.base import points_in_cells, trajectories_from_cells
from duckmob.synth.hrnet.encoding import unmorton
from duckmob.synth.hrnet.model import child_scores
from duckmob.synth.hrnet.train import torch_generator
from duckmob.trajectories import NO_TIME, Trajectories

DAY_US = 86_400_000_000
DECODES = ("coarse_to_fine", "finest")


def _gru_cell(model):
    return next(m for m in model.gru.modules() if type(m).__name__ == "DPGRUCell")


def _pick(logits: torch.Tensor, gen: torch.Generator, temperature: float = 1.0) -> torch.Tensor:
    """One categorical draw per row from ``softmax(logits / temperature)``; a row with every entry masked falls
    back to uniform (cannot happen unless the masks leave no option)."""
    dead = torch.isinf(logits).all(dim=1, keepdim=True)
    logits = torch.where(dead, torch.zeros_like(logits), logits / temperature)
    return torch.multinomial(torch.softmax(logits, dim=1), 1, generator=gen)[:, 0]


def coarse_to_fine(model, h: torch.Tensor, levels: list[torch.Tensor], prev: torch.Tensor, no_end,
                   counts: list[torch.Tensor], gen: torch.Generator, temperature: float = 1.0) -> torch.Tensor:
    """Next Z-order leaf (or ``model.end``) drawn resolution by resolution (HRNet's multi-resolution heads as a
    decoder): the end token or a level-1 cell from ``Pr(l^1 | prefix)``, then at each finer level r one of the 4
    children of the cell drawn so far, with probabilities ``Pr(l^r | prefix)`` renormalised over those children.
    Each decision uses the head trained for it (coarse tasks are the easier ones, §3.4). ``no_end`` (a bool,
    or (B,) bools) masks the end token for the rows that must go on. ``levels[r - 1]`` is
    M_r (4**r, dim); ``counts[r - 1]`` (4**r,) how many allowed leaves lie below each cell. A cell is masked
    when nothing allowed lies below it other than the previous leaf (consecutive cells differ)."""
    depth = len(levels)
    query = model.f_query(h)
    qk = model.f_key_t(query)                                           # (B, dim)

    def masked(r, cand, lg):
        anc = torch.where(prev >= 0, prev >> (2 * (depth - r)), torch.full_like(prev, -1))
        only_prev = (prev >= 0) & (counts[r - 1][anc.clamp(min=0)] == 1)
        dead = (counts[r - 1][cand] == 0) | ((cand == anc[:, None]) & only_prev[:, None])
        return lg.masked_fill(dead, -torch.inf)

    quad = torch.arange(4, device=h.device)
    logits = torch.cat([masked(1, quad[None, :].expand(len(h), -1), qk @ levels[0].T),
                        model.end_key(query)], dim=1)                    # (B, 4 + 1)
    no_end = torch.as_tensor(no_end, dtype=torch.bool, device=h.device).expand(len(h))
    logits[:, 4] = logits[:, 4].masked_fill(no_end, -torch.inf)
    top = _pick(logits, gen, temperature)
    ended = top == 4
    cell = top.clamp(max=3)
    for r in range(2, depth + 1):
        kids, lg = child_scores(qk, levels[r - 1], cell)                 # (B, 4) each
        lg = masked(r, kids, lg)
        cell = kids.gather(1, _pick(lg, gen, temperature)[:, None])[:, 0]
    return torch.where(ended, torch.full_like(cell, model.end), cell)


@torch.no_grad()
def sample_sequences(model, n: int, max_len: int, rng: np.random.Generator, device: torch.device,
                     chunk: int = 16384, allowed: np.ndarray | None = None, decode: str = "finest",
                     temperature: float = 1.0, target: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw ``n`` sequences: (lengths (n,), cells (sum lengths,) in the model's index order (Z-order for HRNet,
    grid ids for the baseline), time slots (sum lengths,)). Vectorised over trajectories. ``allowed`` (bool over
    cells, same order) masks cells that cannot occur (leaves without a POI). ``decode``: 'finest' draws from the
    finest-resolution distribution (the paper); 'coarse_to_fine' uses every resolution's head
    (:func:`coarse_to_fine`; HRNet with the multi-task loss only). ``target`` (n,) lengths in 1 .. max_len: each
    row runs to exactly its target (the end token masked before, the row stopped at it); None: the end token
    decides."""
    model.to(device).eval()
    gen = torch_generator(rng, device)
    cell_fn = _gru_cell(model)
    table = model.input_vectors()
    leaf = model.leaf_vectors() if hasattr(model, "next_logits") else None
    start = model.start_vector()
    banned = None
    if allowed is not None:
        banned = torch.as_tensor(~np.append(allowed, True), device=device)  # the end token stays allowed
    hierarchical = decode == "coarse_to_fine" and getattr(model, "multitask", False)
    if hierarchical:
        levels = model.encoding()[1:]
        ok = torch.ones(model.n_cells, device=device) if allowed is None else \
            torch.as_tensor(allowed, device=device).float()
        counts = [ok.reshape(4 ** r, -1).sum(1).long() for r in range(1, model.depth + 1)]
    out_len, out_cells, out_slots = [], [], []
    for lo in range(0, n, chunk):
        b = min(chunk, n - lo)
        h = torch.zeros(b, cell_fn.hidden_size, device=device)
        loc = start.expand(b, -1)
        slot_in = torch.full((b,), model.n_time, dtype=torch.long, device=device)
        prev = torch.full((b,), -1, dtype=torch.long, device=device)
        alive = torch.ones(b, dtype=torch.bool, device=device)
        goal = torch.full((b,), max_len, dtype=torch.long, device=device) if target is None else \
            torch.as_tensor(np.minimum(target[lo:lo + b], max_len), dtype=torch.long, device=device)
        length = torch.zeros(b, dtype=torch.long, device=device)
        cells = torch.zeros(b, max_len, dtype=torch.long, device=device)
        slots = torch.zeros(b, max_len, dtype=torch.long, device=device)
        for step in range(max_len):
            h = cell_fn(torch.cat([model.time_emb(slot_in), loc], dim=1), h)
            no_end = torch.full((b,), step == 0, dtype=torch.bool, device=device) if target is None else \
                step < goal
            if hierarchical:
                nxt = coarse_to_fine(model, h, levels, prev, no_end, counts, gen, temperature)
            else:
                logits = model.next_logits(h, leaf) if leaf is not None else model.loc_head(h)
                logits = logits.clone()
                if banned is not None:
                    logits[:, banned] = -torch.inf
                has_prev = prev >= 0
                logits[has_prev, prev[has_prev]] = -torch.inf
                logits[:, model.end] = logits[:, model.end].masked_fill(no_end, -torch.inf)
                nxt = _pick(logits, gen, temperature)
            slot = torch.multinomial(torch.softmax(model.time_head(h), dim=1), 1, generator=gen)[:, 0]
            alive &= (nxt != model.end) & (step < goal)
            if not alive.any():
                break
            cells[:, step] = torch.where(alive, nxt, 0)
            slots[:, step] = slot
            length += alive.long()
            prev = torch.where(alive, nxt, prev)
            loc = table[prev.clamp(min=0)]
            slot_in = slot
        keep = torch.arange(max_len, device=device)[None, :] < length[:, None]
        out_len.append(length.cpu().numpy())
        out_cells.append(cells[keep].cpu().numpy())
        out_slots.append(slots[keep].cpu().numpy())
    return np.concatenate(out_len), np.concatenate(out_cells), np.concatenate(out_slots)


def slot_times(lengths: np.ndarray, slots: np.ndarray, n_time: int, base_day_us: int,
               rng: np.random.Generator) -> np.ndarray:
    """Timestamps (µs) from time slots: uniform inside each slot, a new day whenever the slot goes back, sorted
    within each trajectory (only ties inside one slot are reordered). Vectorised."""
    n = len(lengths)
    owner = np.repeat(np.arange(n), lengths)
    first = np.zeros(len(slots), dtype=bool)
    first[np.concatenate([[0], np.cumsum(lengths)[:-1]])[lengths > 0]] = True
    back = np.zeros(len(slots), dtype=np.int64)
    back[1:] = (slots[1:] < slots[:-1]) & ~first[1:]
    csum = np.cumsum(back)
    day = csum - np.repeat(csum[first], lengths[lengths > 0])
    slot_us = DAY_US // n_time
    ts = base_day_us + day * DAY_US + slots * slot_us + (rng.random(len(slots)) * slot_us).astype(np.int64)
    order = np.lexsort((ts, owner))
    return ts[order]


def one_cell_twice(lengths: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """A one-cell sequence is a trajectory that stayed in one cell: its first and last fix (the stay-point form
    HRNet models). ``(lengths, *arrays)`` with the single entry of each such sequence given twice in every array
    (lengths are >= 1: the generator never ends at its first step)."""
    at = (np.cumsum(lengths) - lengths)[lengths == 1]
    return (np.maximum(lengths, 2),) + tuple(np.insert(a, at + 1, a[at]) for a in arrays)


def to_trajectories(lengths: np.ndarray, cells: np.ndarray, slots: np.ndarray | None, bbox, w: int, n_time: int,
                    base_day_us: int, rng: np.random.Generator) -> Trajectories:
    """Synthetic Trajectories from sampled grid cells (points uniform in cells) and slots (NO_TIME if None)."""
    lat, lon = points_in_cells(cells, bbox, w, rng)
    if slots is None:
        ts = np.full(len(cells), NO_TIME, dtype=np.int64)
    else:
        ts = slot_times(lengths, slots, n_time, base_day_us, rng)
    return trajectories_from_cells(lengths, lat, lon, ts)


def zorder_to_grid(cells: np.ndarray, w: int) -> np.ndarray:
    return unmorton(cells.astype(np.int64), w)
