"""HRNet vs its baseline on GeoLife (HRNet Table 1 metrics), ablations, privacy sweep, and fit time.

Setting (HRNet §5.1): 10,000 GeoLife trajectories (sampled with a fixed public seed from
/work/shared/data/geolife_beijing.parquet after dropping points outside the box), stay points 200 m / 30 min,
32 x 32 grid over HRNet's box [39.8477, 116.1956, 40.1133, 116.4880], delta 1e-5. Each run fits on the 10,000
trajectories, samples 10,000 synthetic ones and compares them with the real stay-point trajectories through
``duckmob.evaluate`` (family 'hrnet', 32 x 32). One thread (torch.set_num_threads(1)); the machine is shared,
so times are indicative.

    python benchmarks/hrnet.py                      # every run (long: ~1 h on 2 cores), then the table
    python benchmarks/hrnet.py --runs hrnet-2 baseline-2 --seeds 11 12   # two fits each, averaged
    python benchmarks/hrnet.py --table-only         # print the table from the saved results
    python benchmarks/hrnet.py --fit-times 2000 5000 10000   # default fits (hrnet, baseline) against table size
    python benchmarks/hrnet.py --taxi 20000 --taxi-data /tmp/sf_taxi_20000.parquet   # issue 42 item 5's speed case

``--taxi N``: one default HRNet fit (eps 1, seed 1) on the first N simulated SF taxi trips of
``benchmarks/roads_sim.py`` (``City(seed=0).trips(20000, 101)``, read from ``--taxi-data`` or simulated there),
wall and CPU seconds with the parts, sampling N and the Table 1 metrics against the trips' stay points: one JSON
line, for before/after comparisons of the code (run each side from its own worktree). ``--taxi-steps K``: only
K DP-SGD steps (opacus and Adam included) at the default schedule of ``--taxi N`` trips, ms wall and CPU a step.

Results are appended to $HRNET_BENCH_OUT (default <tmp>/duckmob_bench/hrnet.jsonl), one JSON line per run, so a
long sweep survives interruption; the table is printed from that file.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

BOX = [39.8477, 116.1956, 40.1133, 116.4880]
DATA = "/work/shared/data/geolife_beijing.parquet"
OUT = Path(os.environ.get("HRNET_BENCH_OUT", Path(tempfile.gettempdir()) / "duckmob_bench" / "hrnet.jsonl"))
N_TRAIN = 10_000
DELTA = 1e-5

RUNS = {  # name: (method, eps, extra parameters); "from": re-sample that run's saved model (no new fit)
    "hrnet-2": ("hrnet", 2.0, {}),
    "hrnet-2-full": ("hrnet", 2.0, {"multitask_loss": "full"}),   # the paper's multi-task loss
    "hrnet-2-finest": ("hrnet", 2.0, {"from": "hrnet-2-full", "decode": "finest"}),  # ... and its decoding
    "hrnet-2-finestinput": ("hrnet", 2.0, {"input_levels": "finest"}),   # the paper's GRU input
    "hrnet-2-constlr": ("hrnet", 2.0, {"lr_final": 1.0}),   # a constant learning rate (the paper's)
    "baseline-2": ("baseline", 2.0, {}),
    "baseline-2-lrdecay": ("baseline", 2.0, {"lr_final": 0.1}),   # hrnet's learning-rate decay
    # before issue 16: lengths from the model's end token, one uniform point per cell
    "hrnet-2-endtoken": ("hrnet", 2.0, {"length_share": 0.0, "output": "cells"}),
    "baseline-2-endtoken": ("baseline", 2.0, {"length_share": 0.0, "output": "cells"}),
    "hrnet-nopretrain-2": ("hrnet", 2.0, {"pretrain": False}),
    "hrnet-nomultitask-2": ("hrnet", 2.0, {"multitask": False}),
    "hrnet-0.5": ("hrnet", 0.5, {}),
    "hrnet-1": ("hrnet", 1.0, {}),
    "hrnet-3": ("hrnet", 3.0, {}),
    # each method at the other's batch (defaults: hrnet 2 sqrt(N), baseline sqrt(N), the paper's)
    "hrnet-2-sqrtn": ("hrnet", 2.0, {"batch_factor": 1.0}),
    "baseline-2-b4": ("baseline", 2.0, {"batch_factor": 4.0}),
    "hrnet-2-finest4": ("hrnet", 2.0, {"finest_weight": 4.0}),   # probe: finest resolution = half the loss
    # capacity / pre-training budget probes (not run by default)
    "hrnet-2-loc64": ("hrnet", 2.0, {"loc_dim": 64}),
    "hrnet-2-c05": ("hrnet", 2.0, {"c": 0.05}),
    # DP-SGD probes: a larger batch, fewer epochs, averaged iterates (both methods)
    "hrnet-2-b4": ("hrnet", 2.0, {"batch_factor": 4.0}),
    "hrnet-2-b8": ("hrnet", 2.0, {"batch_factor": 8.0}),
    "hrnet-2-e20": ("hrnet", 2.0, {"epochs": 20}),
    "hrnet-2-ema": ("hrnet", 2.0, {"ema": 0.99}),
    "baseline-2-ema": ("baseline", 2.0, {"ema": 0.99}),
}
PROBES = ("hrnet-2-loc64", "hrnet-2-c05", "hrnet-2-finest4", "hrnet-2-b4", "hrnet-2-b8", "hrnet-2-e20",
          "hrnet-2-ema", "baseline-2-ema")  # opt-in: --runs NAME
DEFAULT_RUNS = [n for n in RUNS if n not in PROBES]
PAPER = {"hrnet_destination_jsd": 0.192, "hrnet_transition_jsd": 0.212, "hrnet_travel_distance_jsd": 0.00871,
         "hrnet_diameter_jsd": 0.0681, "hrnet_traj_density_are": 0.184, "hrnet_traj_pattern_are": 0.671}
PAPER_BASELINE = {"hrnet_destination_jsd": 0.397, "hrnet_transition_jsd": 0.397,
                  "hrnet_travel_distance_jsd": 0.0275, "hrnet_diameter_jsd": 0.0932,
                  "hrnet_traj_density_are": 0.382, "hrnet_traj_pattern_are": 0.771}
COLUMNS = ["hrnet_waypoint_jsd", "hrnet_destination_jsd", "hrnet_transition_jsd", "hrnet_travel_distance_jsd",
           "hrnet_diameter_jsd", "hrnet_density_t_jsd", "hrnet_traj_density_are", "hrnet_traj_pattern_are"]
SHORT = ["waypoint", "destin.", "transit.", "travel d.", "diameter", "dens. t", "traj dens", "traj patt"]


def load_training():
    from duckmob.staypoints import stay_trajectories
    from duckmob.trajectories import from_points

    traj, _ = from_points(pq.read_table(DATA), BOX, outside="drop")
    pick = np.sort(np.random.default_rng(2024).choice(traj.n_trajectories, N_TRAIN, replace=False))
    train = traj.take(pick)
    return train, stay_trajectories(train)


def run(name: str, train, real_stays, seed: int = 11) -> dict:
    from duckmob.metrics import evaluate
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.hrnet import Baseline, FittedModel, HRNet

    method, eps, extra = RUNS[name]
    t0 = time.perf_counter()
    if "from" in extra:   # the same fitted model, sampled another way
        model = FittedModel.from_bytes((OUT.parent / f"{extra['from']}-s{seed}.model").read_bytes())
        model.config = model.config.replace(**{k: v for k, v in extra.items() if k != "from"})
        fit_s = saved_fit_s(extra["from"], seed)
    else:
        synth = (HRNet if method == "hrnet" else Baseline)(BOX, progress=False, **extra)
        model = fit_unrecorded(synth, train, eps, DELTA, NoiseSource(seed))
        fit_s = time.perf_counter() - t0
        OUT.parent.mkdir(parents=True, exist_ok=True)
        (OUT.parent / f"{name}-s{seed}.model").write_bytes(model.to_bytes())   # for re-sampling without refitting
    t1 = time.perf_counter()
    out = model.sample(N_TRAIN, np.random.default_rng(seed + 1000))
    sample_s = time.perf_counter() - t1
    rows = evaluate(real_stays, out, BOX, families=["hrnet"], w=32)
    metrics = {r["metric"]: r["value"] for r in rows}
    metrics.update(length_shares(out, "synth"))
    return dict(name=name, seed=seed, method=method, eps=eps, extra=extra, fit_s=fit_s, sample_s=sample_s,
                timings=model.timings, info=model.info, metrics=metrics,
                synth_mean_len=float(out.lengths.mean()), real_mean_len=float(real_stays.lengths.mean()))


def length_shares(traj, side: str) -> dict:
    """Shares of cell sequences (32 x 32, consecutive duplicates collapsed) of one cell and of >= 4 cells (issue 16:
    each within 2 percentage points of the real ones at eps 2)."""
    from duckmob.staypoints import cell_sequences

    lengths = cell_sequences(traj, BOX, 32, stay_points=False).lengths
    return {f"one_cell_share_{side}": float(np.mean(lengths == 1)), f"four_plus_share_{side}": float(np.mean(lengths >= 4))}


def saved_fit_s(name: str, seed: int) -> float:
    return next((r["fit_s"] for r in saved_runs() if r["name"] == name and r["seed"] == seed), float("nan"))


def fmt(v) -> str:
    return "   -   " if v is None else f"{v:7.4f}"


def table(results: list[dict]) -> str:
    lines = ["HRNet Table 1 metrics on GeoLife (w = 32, delta = 1e-5; JSD in nats, lower is better)",
             f"{'run':22s} {'eps':>4s} " + " ".join(f"{s:>9s}" for s in SHORT) + "   fit s  s/epoch  len  fits"]
    for r in results:
        m = r["metrics"]
        ep = r["timings"].get("epoch_s") or [float("nan")]
        lines.append(f"{r['name']:22s} {r['eps']:4.1f} " + " ".join(f"{fmt(m.get(c)):>9s}" for c in COLUMNS)
                     + f" {r['fit_s']:7.0f} {np.mean(ep):7.2f} {r['synth_mean_len']:4.2f} {r['seeds']:5d}")
    for label, ref in (("paper HRNet", PAPER), ("paper baseline", PAPER_BASELINE)):
        lines.append(f"{label:22s}  2.0 " + " ".join(f"{fmt(ref.get(c)):>9s}" for c in COLUMNS))
    by = {r["name"]: r for r in results}
    for hr, bl in (("hrnet-2", "baseline-2"), ("hrnet-2", "baseline-2-lrdecay"), ("hrnet-2-constlr", "baseline-2"),
                   ("hrnet-2-finestinput", "baseline-2"), ("hrnet-2-full", "baseline-2"), ("hrnet-2", "baseline-2-b4"),
                   ("hrnet-2-sqrtn", "baseline-2")):
        if hr not in by or bl not in by:
            continue
        h, b = by[hr]["metrics"], by[bl]["metrics"]
        both = [c for c in COLUMNS if h.get(c) is not None and b.get(c) is not None]
        wins = [c for c in both if h[c] < b[c]]
        lines.append(f"{hr} beats {bl} on {len(wins)} of {len(both)} metrics; ratio: "
                     + ", ".join(f"{s} {h[c] / b[c]:.2f}" for c, s in zip(COLUMNS, SHORT) if c in both and b[c]))
    if results:
        lines.append(f"real stay-point trajectories: mean {results[0]['real_mean_len']:.2f} points (first fix, stays, "
                     "last fix; synthetic len: points = cells, consecutive cells distinct)")
        real = length_shares(load_training()[1], "real") if any("one_cell_share_synth" in r["metrics"] for r in results) \
            else {}
        if real:
            lines.append(f"cell-sequence lengths (32 x 32): real one cell {real['one_cell_share_real']:.3f}, "
                         f">= 4 cells {real['four_plus_share_real']:.3f}")
            for r in results:
                m = r["metrics"]
                if "one_cell_share_synth" in m:
                    lines.append(f"  {r['name']:22s} one cell {m['one_cell_share_synth']:.3f} "
                                 f"({100 * (m['one_cell_share_synth'] - real['one_cell_share_real']):+.1f} pp), "
                                 f">= 4 cells {m['four_plus_share_synth']:.3f} "
                                 f"({100 * (m['four_plus_share_synth'] - real['four_plus_share_real']):+.1f} pp)")
    for r in results:
        i = r["info"]
        lines.append(f"{r['name']:22s} eps_count {i['eps_count']:.3f}  eps_pretrain {i['eps_pretrain']:.3f}  "
                     f"sigma {i['noise_multiplier']:.3f}  q {i['sample_rate']:.4f}  steps {i['steps']}  "
                     f"accounted eps {i['epsilon_accounted']:.3f}  params {i['n_parameters']}  "
                     f"pretrain {r['timings'].get('pretrain_s', 0):.0f} s  DP-SGD {r['timings']['dp_sgd_s']:.0f} s")
    return "\n".join(lines)


def saved_runs() -> list[dict]:
    """The latest result of every (run, seed) in the results file."""
    if not OUT.exists():
        return []
    latest = {}
    for line in OUT.read_text().splitlines():
        r = json.loads(line)
        latest[r["name"], r.get("seed", 11)] = {"seed": 11, **r}
    return list(latest.values())


def saved() -> list[dict]:
    """One row per run: metrics, times and lengths averaged over its seeds (``seeds`` says how many)."""
    rows, every = [], saved_runs()
    for name in RUNS:
        runs = [r for r in every if r["name"] == name]
        if not runs:
            continue
        row = dict(runs[0], seeds=len(runs))
        row["metrics"] = {c: float(np.mean([r["metrics"][c] for r in runs])) for c in runs[0]["metrics"]
                          if all(r["metrics"].get(c) is not None for r in runs)}
        for key in ("fit_s", "synth_mean_len"):
            row[key] = float(np.mean([r[key] for r in runs]))
        row["timings"] = dict(runs[0]["timings"], epoch_s=[e for r in runs for e in r["timings"].get("epoch_s") or []])
        rows.append(row)
    return rows


def fit_times(sizes: list[int], eps: float = 1.0, seed: int = 11) -> None:
    """Wall-clock and CPU seconds (CPU time is steadier on a shared machine) of a default HRNet and baseline fit (the SQL defaults: 30 epochs, 3000 pre-training
    iterations, one torch thread) on the first ``sizes`` trajectories of a fixed public draw, with the parts."""
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.hrnet import Baseline, HRNet

    traj, _ = load_training()
    print(f"{'method':9s} {'n':>6s} {'fit s':>7s} {'CPU s':>7s} {'pretrain s':>10s} {'DP-SGD s':>9s} {'steps':>6s} "
          f"{'batch':>6s}")
    for n in sizes:
        data = traj.take(np.arange(min(n, traj.n_trajectories)))
        for cls in (HRNet, Baseline):
            t0, c0 = time.perf_counter(), time.process_time()
            model = fit_unrecorded(cls(BOX, progress=False), data, eps, DELTA, NoiseSource(seed))
            t = model.timings
            print(f"{cls.method:9s} {data.n_trajectories:6d} {time.perf_counter() - t0:7.1f} "
                  f"{time.process_time() - c0:7.1f} "
                  f"{t.get('pretrain_s', 0.0):10.1f} {t['dp_sgd_s']:9.1f} {model.info['steps']:6d} "
                  f"{model.info['expected_batch']:6.0f}", flush=True)


def taxi(n: int, data_path: str | None, seed: int = 1) -> dict:
    """:func:`fit_times` on simulated SF taxi trips (module docstring, ``--taxi``), with the sample's metrics."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from gpu_neural import BOX as TAXI_BOX, load_trips

    from duckmob.metrics import evaluate
    from duckmob.privacy.noise import NoiseSource
    from duckmob.staypoints import stay_trajectories
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.hrnet import HRNet

    data = load_trips(data_path, n)
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    model = fit_unrecorded(HRNet(TAXI_BOX, progress=False), data, 1.0, DELTA, NoiseSource(seed))
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    out = model.sample(n, np.random.default_rng(seed + 100))
    rows = evaluate(stay_trajectories(data, 200.0, 30.0), out, TAXI_BOX, families=["hrnet"], w=32, reference=False)
    t = model.timings
    return dict(n=n, seed=seed, fit_s=fit_s, fit_cpu_s=fit_cpu, load_start=load, load_end=os.getloadavg()[0],
                prepare_s=t["prepare_s"], pretrain_s=t.get("pretrain_s"), dp_sgd_s=t["dp_sgd_s"],
                steps=model.info["steps"], metrics={r["metric"]: r["value"] for r in rows if r["metric"] in COLUMNS})


def taxi_steps(n: int, data_path: str | None, steps: int) -> str:
    """``steps`` DP-SGD steps of a default HRNet on ``n`` simulated taxi trips (rate 2 sqrt(n) / n, the noise
    multiplier of the default plan at n = 20,000), after 3 warm-up steps: milliseconds a step, wall and CPU."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from gpu_neural import BOX as TAXI_BOX, load_trips

    from duckmob.synth import dpsgd
    from duckmob.synth.hrnet import HRNet
    from duckmob.synth.hrnet.train import dp_sgd_train, training_arrays

    synth = HRNet(TAXI_BOX, device="cpu", progress=False)
    arrays = training_arrays(synth.cell_sequences(synth.stays(load_trips(data_path, n))), synth.config.w,
                             synth.config.n_time, synth.config.max_len)
    torch.manual_seed(0)
    model = synth.build()
    q = 2 * np.sqrt(n) / n
    schedule = dpsgd.Schedule(sample_rate=q, steps=steps, noise_multiplier=2.92, max_grad_norm=1.0,
                              expected_batch_size=q * n, lr=3e-3, lr_final=0.1)
    warm = dpsgd.Schedule(**{**schedule.__dict__, "steps": 3})   # the first Adam and opacus calls' one-time costs
    dp_sgd_train(model, arrays, warm, dpsgd.RunContext(np.random.default_rng(0), torch.device("cpu"), False))
    load = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    dp_sgd_train(model, arrays, schedule, dpsgd.RunContext(np.random.default_rng(1), torch.device("cpu"), False))
    wall, cpu = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
    return (f"{steps} DP-SGD steps at batch {q * n:.0f}: {wall * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU a step; "
            f"load {load:.1f}-{os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fit-times", nargs="*", type=int, default=None,
                        help="print default fit times for these table sizes and exit")
    parser.add_argument("--taxi", type=int, default=None, help="one default fit on this many simulated taxi trips")
    parser.add_argument("--taxi-data", default=None, help="Parquet of the simulated trips (written when missing)")
    parser.add_argument("--taxi-steps", type=int, default=None, help="with --taxi: time this many DP-SGD steps only")
    parser.add_argument("--runs", nargs="*", default=DEFAULT_RUNS)
    parser.add_argument("--seeds", nargs="*", type=int, default=[11],
                        help="one fit per seed; the table averages a run's metrics over its seeds")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("CI", "1")  # no progress bars in logs
    if args.fit_times:
        fit_times(args.fit_times)
        return
    if args.taxi and args.taxi_steps:
        print(taxi_steps(args.taxi, args.taxi_data, args.taxi_steps))
        return
    if args.taxi:
        print(json.dumps(taxi(args.taxi, args.taxi_data)))
        return
    if not args.table_only:
        train, real_stays = load_training()
        OUT.parent.mkdir(parents=True, exist_ok=True)
        for name, seed in ((n, s) for s in args.seeds for n in args.runs):
            r = run(name, train, real_stays, seed)
            with OUT.open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(f"{name} (seed {seed}): fit {r['fit_s']:.0f} s", {k: round(v, 4) for k, v in r["metrics"].items()
                                                      if k in COLUMNS and v is not None}, flush=True)
    print(table(saved()))


if __name__ == "__main__":
    main()
