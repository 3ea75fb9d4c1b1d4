"""Downstream utility: tasks trained on the synthetic table and tested on real trajectories.

* ``next_location`` (HRNet §5.5.1; PateGail "Mobility Prediction"): a second-order Markov predictor with
  back-off (second order -> first order -> most visited cells) is fitted on the synthetic cell sequences and
  predicts each next cell of the real (held-out) sequences: Acc@1 and Acc@5. The same predictor fitted on one
  half of the real table and tested on the other half gives the reference a synthetic table should approach.
* ``mode`` (HRNet §5.5.2): transport-mode classification. Real trips are the runs of fixes covered by one
  label interval of GeoLife's labels (user_id, start, end, mode), joined by user and time. Synthetic
  trajectories must carry their label in a ``mode`` column: the design is to synthesize each mode's labelled
  real trips separately (what HRNet does with its label embedding) and stack the results with the mode as a
  column (:func:`labelled_trips` gives the real trips per mode for that). A multinomial logistic regression on
  geometric features (and speed features when both tables have time) is trained on the synthetic trajectories
  and tested on the real trips: accuracy and macro F1, with the real-trained (2-fold) reference.
* ``commute`` (HRNet §5.5.3): for each destination cell, the number of trajectories ending there and their
  mean commute distance (straight metres from first to last point); compared per cell.

NOT differentially private (reads the real table exactly); for the data owner.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from duckmob.errors import DuckmobError
from duckmob.metrics.common import Metric, Side, jsd, rng, unique_sorted
from duckmob.trajectories import Trajectories

TOP = 5


# ------------------------------------------------------------------------------------------- next location

def _top_next(context: np.ndarray, nxt: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """For each distinct context, its ``k`` most frequent next values (ties: smaller value), -1 padded."""
    if len(context) == 0:
        return np.zeros(0, np.int64), np.zeros((0, k), np.int64)
    span = np.int64(nxt.max()) + 1
    keys, counts = np.unique(context * span + nxt, return_counts=True)
    ctx, val = keys // span, keys % span
    order = np.lexsort((val, -counts, ctx))
    ctx, val = ctx[order], val[order]
    first = np.searchsorted(ctx, ctx, side="left")
    rank = np.arange(len(ctx)) - first
    uniq = unique_sorted(ctx)
    table = np.full((len(uniq), k), -1, dtype=np.int64)
    keep = rank < k
    table[np.searchsorted(uniq, ctx[keep]), rank[keep]] = val[keep]
    return uniq, table


class MarkovPredictor:
    """Next-cell predictor: second order, backing off to first order, then to the most visited cells."""

    def __init__(self, offsets: np.ndarray, cells: np.ndarray, n_cells: int):
        self.n_cells = n_cells
        owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        same1 = owner[1:] == owner[:-1]
        a, b = cells[:-1][same1], cells[1:][same1]
        self.ctx1, self.top1 = _top_next(a, b, TOP)
        same2 = same1[1:] & same1[:-1]
        a2, b2, c2 = cells[:-2][same2], cells[1:-1][same2], cells[2:][same2]
        self.ctx2, self.top2 = _top_next(a2 * n_cells + b2, c2, TOP)
        counts = np.bincount(cells, minlength=n_cells)
        self.popular = np.lexsort((np.arange(n_cells), -counts))[:TOP]

    @staticmethod
    def _rows(ctx_table, top, query):
        out = np.full((len(query), TOP), -1, dtype=np.int64)
        if len(ctx_table):
            pos = np.clip(np.searchsorted(ctx_table, query), 0, len(ctx_table) - 1)
            hit = ctx_table[pos] == query
            out[hit] = top[pos[hit]]
        return out

    def predict(self, prev2: np.ndarray, prev1: np.ndarray) -> np.ndarray:
        """(n x 5) ranked predictions; ``prev2`` is -1 where there is no second-previous cell."""
        q2 = np.where(prev2 >= 0, prev2 * self.n_cells + prev1, -1)
        cand = np.concatenate([self._rows(self.ctx2, self.top2, q2), self._rows(self.ctx1, self.top1, prev1),
                               np.broadcast_to(self.popular, (len(prev1), len(self.popular)))], axis=1)
        # Keep the first occurrence of each candidate, then the first five.
        earlier = (cand[:, :, None] == cand[:, None, :]) & np.tril(np.ones((cand.shape[1],) * 2, bool), -1)
        valid = (cand >= 0) & ~earlier.any(axis=2)
        order = np.argsort(~valid, axis=1, kind="stable")[:, :TOP]
        picked = np.take_along_axis(cand, order, axis=1)
        return np.where(np.take_along_axis(valid, order, axis=1), picked, -1)


def next_location_accuracy(train: Side, test: Side, w: int, test_rows=None) -> tuple[float, float, int]:
    """(Acc@1, Acc@5, number of predictions) of the Markov predictor fitted on ``train``, predicting every
    cell after the first of each ``test`` sequence (collapsed cell sequences on the w x w grid)."""
    tr, te = train.cells(w), test.cells(w)
    model = MarkovPredictor(tr.offsets, tr.cells, w * w)
    owner = te.owner
    pos = np.arange(len(te.cells))
    index_in = pos - te.offsets[:-1][owner]
    target = index_in >= 1
    if test_rows is not None:
        target &= np.isin(owner, test_rows)
    idx = np.flatnonzero(target)
    if len(idx) == 0:
        return float("nan"), float("nan"), 0
    prev1 = te.cells[idx - 1]
    prev2 = np.where(index_in[idx] >= 2, te.cells[np.maximum(idx - 2, 0)], -1)
    pred = model.predict(prev2, prev1)
    truth = te.cells[idx]
    return float((pred[:, 0] == truth).mean()), float((pred == truth[:, None]).any(axis=1).mean()), len(idx)


def _halves(side: Side, seed) -> tuple[Side, Side]:
    perm = rng(seed).permutation(side.n)
    half = side.n // 2
    return (Side(side.traj.take(np.sort(perm[:half])), side.bbox, "real half"),
            Side(side.traj.take(np.sort(perm[half:])), side.bbox, "real half"))


def next_location(real: Side, synth: Side, w: int = 32, seed=None) -> list[Metric]:
    src = "HRNet §5.5.1; PateGail Practical Demonstrations"
    a1, a5, n = next_location_accuracy(synth, real, w)
    out = [Metric("next_location_acc1", a1, False, src,
                  f"share of {n} next {w}x{w} cells of the real trajectories predicted first by a 2nd-order Markov "
                  "predictor (back-off) fitted on the synthetic table"),
           Metric("next_location_acc5", a5, False, src, "the same, true next cell among the top 5 predictions")]
    if real.n >= 4:
        x, y = _halves(real, seed)
        r1a, r5a, na = next_location_accuracy(x, y, w)
        r1b, r5b, nb = next_location_accuracy(y, x, w)
        out += [Metric("next_location_acc1_real_trained", (r1a * na + r1b * nb) / max(na + nb, 1), False, src,
                       "reference: the predictor fitted on half of the real table, tested on the other half (2 folds)"),
                Metric("next_location_acc5_real_trained", (r5a * na + r5b * nb) / max(na + nb, 1), False, src,
                       "reference Acc@5 with real training data (2 folds)")]
    return out


# ------------------------------------------------------------------------------------------------- commute

def commute_cells(side: Side, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Per destination cell (w*w): number of trajectories ending there, mean commute distance (m; NaN if none)."""
    end = side.cells(w).end
    n = np.bincount(end, minlength=w * w).astype(np.float64)
    total = np.bincount(end, weights=side.od_m, minlength=w * w)
    with np.errstate(invalid="ignore", divide="ignore"):
        return n, total / n


def commute(real: Side, synth: Side, w: int = 32) -> list[Metric]:
    src = "HRNet §5.5.3"
    n_o, d_o = commute_cells(real, w)
    n_s, d_s = commute_cells(synth, w)
    both = (n_o > 0) & (n_s > 0)
    err = float(np.average(np.abs(d_o[both] - d_s[both]), weights=n_o[both])) if both.any() else float("nan")
    corr = float(np.corrcoef(d_o[both], d_s[both])[0, 1]) if both.sum() > 2 and np.std(d_s[both]) > 0 \
        and np.std(d_o[both]) > 0 else float("nan")
    return [
        Metric("commute_distance_error_m", err, True, src,
               f"mean over real trajectories of |mean commute distance (m, first to last point) to their {w}x{w} "
               f"destination cell, real vs synthetic|, over the {int(both.sum())} cells both tables reach"),
        Metric("commute_distance_correlation", corr, False, src,
               "Pearson correlation of the per-destination-cell mean commute distances, real vs synthetic"),
        Metric("commute_destination_jsd", jsd(n_o, n_s), True, src,
               f"JSD of the destination-cell distribution ({w}x{w}), nats"),
        Metric("commute_unreached_share", float(n_o[~both].sum() / max(n_o.sum(), 1)), True, src,
               "share of real trajectories ending in a cell where no synthetic trajectory ends"),
    ]


# -------------------------------------------------------------------------------------- transport mode

def _column(tbl, name):
    col = tbl.field(name) if isinstance(tbl, pa.StructArray) else tbl.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _us(col) -> np.ndarray:
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("us")).cast(pa.int64())
    return col.to_numpy(zero_copy_only=False).astype(np.int64)


def labelled_trips(side: Side, modes: pa.Table, min_points: int = 2) -> tuple[Trajectories, np.ndarray]:
    """Real trips with a transport mode: runs of consecutive fixes of one trajectory inside one label interval
    (``modes``: user_id, start, end, mode; a fix is labelled when start <= ts <= end for its user).

    Returns the trips (new traj_id 0..k-1, same user_id) and their modes (strings). Fixes outside every
    interval are left out. Needs user_id and timestamps on ``side``."""
    t = side.traj
    if not t.has_time or (t.user_id < 0).all():
        raise DuckmobError("transport-mode labels join by user and time: the real table needs user_id and ts")
    for name in ("user_id", "start", "end", "mode"):
        if name not in (modes.column_names if isinstance(modes, pa.Table) else modes.type.names):
            raise DuckmobError(f"the mode labels need columns user_id, start, end, mode; {name} is missing")
    lu = _column(modes, "user_id").to_numpy(zero_copy_only=False).astype(np.int64)
    ls, le = _us(_column(modes, "start")), _us(_column(modes, "end"))
    lm = np.asarray(_column(modes, "mode").to_pylist(), dtype=object)
    shift = np.int64(1) << 52  # µs since 1970 stay below 2**52 until 2112
    key = lu * shift + ls
    order = np.argsort(key, kind="stable")
    key, le_s, lu_s = key[order], le[order], lu[order]
    user = t.user_id[side.owner]
    fix = user * shift + t.ts
    pos = np.searchsorted(key, fix, side="right") - 1
    ok = (pos >= 0) & (lu_s[np.maximum(pos, 0)] == user) & (t.ts <= le_s[np.maximum(pos, 0)]) & (user >= 0)
    label = np.where(ok, pos, -1)
    # A trip starts at a labelled fix whose predecessor is in another trajectory or another interval.
    start = ok.copy()
    start[1:] &= ~((side.owner[1:] == side.owner[:-1]) & (label[1:] == label[:-1]))
    trip = np.cumsum(start) - 1
    idx = np.flatnonzero(ok)
    counts = np.bincount(trip[idx], minlength=int(start.sum()))
    keep_trip = counts >= min_points
    idx = idx[keep_trip[trip[idx]]]
    new_id = np.cumsum(keep_trip) - 1
    tid = new_id[trip[idx]]
    lengths = np.bincount(tid, minlength=int(keep_trip.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    firsts = idx[offsets[:-1]]
    trips = Trajectories(offsets, np.arange(len(lengths), dtype=np.int64), user[firsts], t.ts[idx], t.lat[idx],
                         t.lon[idx])
    return trips, lm[order][label[firsts]].astype(str)


def mode_features(side: Side, with_speed: bool) -> np.ndarray:
    """Per trajectory: log length, log diameter, log radius of gyration, straightness (od / length), log mean
    and log max step (metres); with speed: log mean speed and log largest step speed (m/s)."""
    eps = 1.0
    length = side.length_m
    steps_mean = length / np.maximum(side.traj.lengths - 1, 1)
    steps_max = np.zeros(side.n)
    if len(side.step_m):
        np.maximum.at(steps_max, side.step_owner, side.step_m)
    cols = [np.log(length + eps), np.log(side.diameter_m + eps), np.log(side.gyration_m + eps),
            side.od_m / np.maximum(length, eps), np.log(steps_mean + eps), np.log(steps_max + eps)]
    if with_speed:
        t = side.traj
        dur = (t.ts[t.offsets[1:] - 1] - t.ts[t.offsets[:-1]]) / 1e6
        dt = np.diff(t.ts)[side.owner[1:] == side.owner[:-1]] / 1e6
        speed = side.step_m / np.maximum(dt, 1.0)
        vmax = np.zeros(side.n)
        if len(speed):
            np.maximum.at(vmax, side.step_owner, speed)
        cols += [np.log(length / np.maximum(dur, 1.0) + 0.1), np.log(vmax + 0.1)]
    return np.stack(cols, axis=1)


def fit_softmax(x: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1e-3, steps: int = 500):
    """Multinomial logistic regression by full-batch gradient descent on standardised features; returns a
    function mapping features to predicted class indices."""
    mu, sd = x.mean(axis=0), x.std(axis=0) + 1e-9
    z = np.hstack([(x - mu) / sd, np.ones((len(x), 1))])
    onehot = np.eye(n_classes)[y]
    weight = np.zeros((z.shape[1], n_classes))
    prior = np.bincount(y, minlength=n_classes) / len(y)
    balance = (1.0 / np.maximum(prior, 1e-9))[y] / n_classes  # classes weigh alike
    for _ in range(steps):  # iterations of a convex solver, not a loop over data
        logits = z @ weight
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        grad = z.T @ ((p - onehot) * balance[:, None]) / len(z) + l2 * weight
        weight -= 1.0 * grad

    def predict(xq):
        zq = np.hstack([(xq - mu) / sd, np.ones((len(xq), 1))])
        return np.argmax(zq @ weight, axis=1)

    return predict


def macro_f1(truth: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    tp = np.bincount(truth[truth == pred], minlength=n_classes).astype(float)
    fp = np.bincount(pred, minlength=n_classes) - tp
    fn = np.bincount(truth, minlength=n_classes) - tp
    present = (tp + fn) > 0
    f1 = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
    return float(f1[present].mean()) if present.any() else float("nan")


def mode(real: Side, synth: Side, synth_modes: np.ndarray, modes: pa.Table, seed=None) -> list[Metric]:
    """Mode classification rows; ``synth_modes`` holds the mode of each synthetic trajectory (by index)."""
    src = "HRNet §5.5.2"
    trips, labels = labelled_trips(real, modes)
    if trips.n_trajectories == 0:
        raise DuckmobError("no real fix falls inside a mode label interval: check user_id and ts against the labels")
    classes = np.array(sorted(set(synth_modes.tolist())))
    if len(classes) < 2:
        raise DuckmobError("the synthetic table needs trajectories of at least two modes in its mode column")
    test = np.isin(labels, classes)
    real_trips = Side(trips.take(np.flatnonzero(test)), real.bbox, "real trips")
    y_test = np.searchsorted(classes, labels[test])
    y_train = np.searchsorted(classes, synth_modes)
    speed = real.has_time and synth.has_time
    x_train, x_test = mode_features(synth, speed), mode_features(real_trips, speed)
    pred = fit_softmax(x_train, y_train, len(classes))(x_test)
    out = [Metric("mode_accuracy", float((pred == y_test).mean()), False, src,
                  f"accuracy on {len(y_test)} labelled real trips ({', '.join(classes)}) of a logistic regression "
                  f"trained on the labelled synthetic trajectories ({'geometry and speed' if speed else 'geometry'} "
                  f"features); {int((~test).sum())} real trips of other modes left out"),
           Metric("mode_macro_f1", macro_f1(y_test, pred, len(classes)), False, src,
                  "macro-averaged F1 of the same classifier over the modes")]
    # Reference: the same classifier trained on half of the real trips, tested on the other half (2 folds).
    perm = rng(seed).permutation(len(y_test))
    halves = np.array_split(perm, 2)
    if min(len(h) for h in halves) > 0:
        x_real = mode_features(real_trips, speed)
        hits = 0
        for a, b in ((0, 1), (1, 0)):  # two folds
            tr, te = halves[a], halves[b]
            if len(np.unique(y_test[tr])) < 2:
                hits = np.nan
                break
            hits += int((fit_softmax(x_real[tr], y_test[tr], len(classes))(x_real[te]) == y_test[te]).sum())
        out.append(Metric("mode_accuracy_real_trained", hits / len(y_test), False, src,
                          "reference: the classifier trained on half of the real trips, tested on the other half"))
    return out


TASKS = ("next_location", "mode", "commute")


def downstream(real: Side, synth: Side, task: str, w: int = 32, seed=None, synth_modes=None,
               modes: pa.Table | None = None) -> list[Metric]:
    """Rows of one downstream task (see the module docstring)."""
    if task == "next_location":
        return next_location(real, synth, w, seed)
    if task == "commute":
        return commute(real, synth, w)
    if task == "mode":
        if synth_modes is None:
            raise DuckmobError("task 'mode' needs a mode column in the synthetic table (one mode per trajectory)")
        if modes is None:
            raise DuckmobError("task 'mode' needs the labels: pass modes := 'path/to/geolife_modes.parquet' "
                               "(user_id, start, end, mode)")
        return mode(real, synth, synth_modes, modes, seed)
    raise DuckmobError(f"unknown task {task!r}: choose one of {list(TASKS)}")
