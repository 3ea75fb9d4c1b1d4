"""The neural methods' fits on a GPU and on the CPU, side by side in one run (issue 42 item 5).

Data: simulated San Francisco taxi trips (``benchmarks/roads_sim.py``: ``City(seed=0).trips(n, 101)``, the
table ``benchmarks/roads.py`` calls "real A"), read from ``--data`` (a Parquet file the simulation wrote, so a
machine without DuckDB's road tools needs only the file) or simulated here when the file is missing. Each case
``method:device:n`` fits the method at its defaults (eps 1, delta 1e-5, seed 1; one torch CPU thread, the
methods' default) on the first ``n`` trips, samples ``n`` and prints one line: fit and sample wall seconds,
the fit's CPU seconds, the method's own timings (pre-training, DP-SGD, seconds per epoch; TI and TPG for
clean-slate), peak GPU memory, and the step-length JSD and points-per-trip ratio of the sample against the
trips it was fitted on (``mob_evaluate``'s ``fine`` family: a check that the device did not change what was
learnt, not a fidelity table).

Each case runs in its own process (a fresh CUDA context, its own peak memory), with a time limit: the run stops
at ``--deadline`` seconds in all, a case past its share is killed and reported as such, and the cases after it
still run if time is left. CUDA's start (the context, the first kernels) is timed apart from the fit.

    python benchmarks/roads_sim.py --trips 20000 --seed 101 --out /tmp/sf_taxi_20000.parquet
    python benchmarks/gpu_neural.py --data /tmp/sf_taxi_20000.parquet \\
        --cases cleanslate:cuda:20000 hrnet:cuda:20000 cleanslate:cpu:20000 hrnet:cpu:5000 --deadline 380
    python benchmarks/gpu_neural.py --cases hrnet:cpu:300 cleanslate:cpu:300   # a quick check on the CPU

NOT private: seeded fits, and the check reads the real table exactly (benchmark data).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

BOX = [37.76, -122.45, 37.80, -122.38]   # the downtown box of benchmarks/roads_sim.py
EPS, DELTA, SEED, TRIP_SEED = 1.0, 1e-5, 1, 101
METHODS = ("hrnet", "cleanslate", "pategail")


def load_trips(path: str | None, n: int):
    """The first ``n`` trips of the table at ``path`` (simulated and written there when missing) as private
    Trajectories inside BOX."""
    import pyarrow.parquet as pq

    from duckmob.trajectories import from_points

    if path and os.path.exists(path):
        table = pq.read_table(path)
    else:
        from roads_sim import City

        table = City(seed=0).trips(n, TRIP_SEED)
        if path:
            pq.write_table(table, path)
    traj, _ = from_points(table, bbox=BOX, outside="drop", private=True)
    import numpy as np

    return traj.take(np.arange(min(n, traj.n_trajectories)))


def synthesizer(method: str, device: str):
    if method == "hrnet":
        from duckmob.synth.hrnet import HRNet
        return HRNet(BOX, device=device)
    if method == "cleanslate":
        from duckmob.synth.cleanslate import CleanSlate
        return CleanSlate(BOX, device=device)
    from duckmob.synth.pategail import PateGail
    return PateGail(BOX, device=device)


def one_case(method: str, device: str, n: int, data_path: str | None) -> dict:
    """Fit ``method`` on ``device`` on ``n`` trips and sample ``n``: the figures as a dict."""
    import numpy as np
    import torch

    from duckmob.metrics import evaluate
    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded

    torch.set_num_threads(1)
    data = load_trips(data_path, n)
    out = dict(method=method, device=device, n=int(data.n_trajectories), fixes=int(data.n_points))
    if device.startswith("cuda"):
        t0 = time.perf_counter()
        torch.ones(256, 256, device=device).matmul(torch.ones(256, 256, device=device)).sum().item()
        out["cuda_start_s"] = time.perf_counter() - t0
        out["gpu"] = torch.cuda.get_device_name(device)
    synth = synthesizer(method, device)
    t0, c0 = time.perf_counter(), time.process_time()
    model = fit_unrecorded(synth, data, EPS, DELTA, NoiseSource(SEED))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    out.update(fit_s=time.perf_counter() - t0, fit_cpu_s=time.process_time() - c0)
    t0 = time.perf_counter()
    sample = model.sample(out["n"], np.random.default_rng(SEED + 100))
    out["sample_s"] = time.perf_counter() - t0
    if device.startswith("cuda"):
        out["gpu_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
    out["timings"] = {k: (float(np.mean(v)) if isinstance(v, list) and v else v)
                      for k, v in (model.timings or {}).items() if isinstance(v, (int, float, list))}
    try:   # the check only: a failure of the evaluation leaves the timings
        rows = {r["metric"]: r["value"] for r in evaluate(data, sample, BOX, families=["fine"], reference=False)}
        out["step_jsd"] = rows.get("fine_step_jsd")
        out["points_ratio"] = rows.get("fine_points_per_traj_ratio")
    except Exception as e:  # noqa: BLE001
        out["check_error"] = f"{type(e).__name__}: {e}"[:200]
    return out


def line(r: dict) -> str:
    if "error" in r:
        return f"{r['case']:22s} {r['error']}"
    t = r["timings"]
    parts = [f"{r['case']:22s} {r['n']:6,d} trips: fit {r['fit_s']:7.1f} s wall ({r['fit_cpu_s']:.1f} s CPU), "
             f"sample {r['sample_s']:5.1f} s"]
    for key in ("pretrain_s", "dp_sgd_s", "epoch_s", "ti_s", "tpg_s"):
        if key in t:
            parts.append(f"{key[:-2]} {t[key]:.2f} s")
    if "cuda_start_s" in r:
        parts.append(f"CUDA start {r['cuda_start_s']:.1f} s, peak {r['gpu_peak_mb']:.0f} MiB")
    if r.get("step_jsd") is not None:
        parts.append(f"step JSD {r['step_jsd']:.4f}, points x{r['points_ratio']:.2f}")
    else:
        parts.append(f"no check ({r.get('check_error')})")
    return "; ".join(parts)


def run_cases(cases: list[str], data: str | None, deadline: float, out_path: str | None,
              case_limit: float | None = None) -> list[dict]:
    """Each case in a child process, within what is left of ``deadline`` seconds (and ``case_limit`` each); lines
    printed and appended to ``out_path`` as they come. The children show progress (stderr lines per tenth of
    each phase), kept only to say how far a killed case went."""
    start = time.perf_counter()
    results = []
    for case in cases:
        left = deadline - (time.perf_counter() - start)
        if left < 20:
            r = dict(case=case, error="not run: the deadline was reached")
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", case] + (["--data", data] if data else [])
            limit = left if case_limit is None else min(left, case_limit)
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
                tail = proc.stdout.strip().splitlines()
                r = json.loads(tail[-1]) if proc.returncode == 0 and tail else \
                    dict(error=f"failed (rc {proc.returncode}): " + proc.stderr.strip()[-1500:])
            except subprocess.TimeoutExpired as e:
                err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
                seen = [x for x in err.splitlines() if x.startswith("duckmob:")][-3:]
                r = dict(error=f"killed after {limit:.0f} s; its last progress lines: {' | '.join(seen)}")
            r["case"] = case
        results.append(r)
        text = line(r) + f"   [load {os.getloadavg()[0]:.1f}, at {time.perf_counter() - start:.0f} s]"
        print(text, flush=True)
        if out_path:
            with open(out_path, "a") as f:
                f.write(text + "\n")
    return results


def parse_case(case: str) -> tuple[str, str, int]:
    method, device, n = case.split(":")
    if method not in METHODS:
        raise SystemExit(f"unknown method {method!r} in case {case!r}: use one of {', '.join(METHODS)}")
    return method, device, int(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", default=["cleanslate:cuda:20000", "hrnet:cuda:20000",
                                                       "cleanslate:cpu:20000", "hrnet:cpu:5000"],
                        help="method:device:n, run in this order")
    parser.add_argument("--data", default=None, help="Parquet of simulated trips (written here when missing)")
    parser.add_argument("--deadline", type=float, default=380.0, help="seconds for all the cases together")
    parser.add_argument("--case-limit", type=float, default=None, help="seconds at most for one case")
    parser.add_argument("--out", default=None, help="also append the lines here")
    parser.add_argument("--json", default=None, help="also write the results here as JSON")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)   # a child process: one case, JSON out
    args = parser.parse_args()
    os.environ.setdefault("DUCKMOB_PROGRESS", "1")
    if args.one:
        print(json.dumps(one_case(*parse_case(args.one), args.data)))
        return
    for case in args.cases:
        parse_case(case)
    import platform

    head = (f"# benchmarks/gpu_neural.py {' '.join(sys.argv[1:])}\n# {platform.node()}, {os.cpu_count()} CPU cores, "
            f"load {os.getloadavg()[0]:.1f}; eps {EPS}, delta {DELTA}, seed {SEED}, defaults, 1 torch CPU thread")
    print(head, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(head + "\n")
    results = run_cases(args.cases, args.data, args.deadline, args.out, args.case_limit)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
