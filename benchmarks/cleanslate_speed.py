"""Clean-slate's default fit on 20,000 trips, code against code, side by side in one run (issue 42 item 5: under 8 s
on this 2-core machine).

Data (benchmark data, not private), each a Parquet file written on the first run:

    sf    20,000 simulated San Francisco taxi trips, ``City(seed=0).trips(20000, 101)`` (``benchmarks/roads_sim.py``;
          217,913 fixes, about 20 grams a trip on the 32 x 32 grid), bbox [37.76, -122.45, 37.80, -122.38]
    taxi  20,000 taxi-like trips: GeoLife in HRNet's box, one fix a minute, cut into trips of 10 fixes
          (``benchmarks/cleanslate.py``'s ``taxi_like``; 196,095 fixes), bbox [39.8477, 116.1956, 40.1133, 116.4880]

Each fit runs in its own process with ``PYTHONPATH`` set to one checkout (``--code NAME=PATH``, e.g. two git
worktrees; default: this checkout), the checkouts alternating round after round, so a before/after pair meets the
same load. One line a fit: wall and CPU seconds of ``fit`` (the plan's noise calibrations, the releases, TI and TPG
by DP-SGD; imports not counted), TI's and TPG's wall seconds, a digest of the trained weights (equal digests: the
same model bit for bit), the load average. ``--sample`` also samples 20,000 and prints the step-length JSD and
points per trip against the data (``mob_evaluate``'s ``fine`` family; a check, not a fidelity table).

    git worktree add -f /tmp/before <commit> --detach
    python benchmarks/cleanslate_speed.py --code before=/tmp/before after=. --rounds 2 --out speed.txt

Defaults: eps 1, delta 1e-5, seed 1, one torch thread (the method's default). NOT private (seeded, benchmark data).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BOXES = {"sf": [37.76, -122.45, 37.80, -122.38], "taxi": [39.8477, 116.1956, 40.1133, 116.4880]}
N = 20_000


def write_data(which: str, path: str) -> None:
    """The benchmark table ``which`` (module docstring) written to ``path`` as Parquet."""
    import pyarrow.parquet as pq

    sys.path.insert(0, HERE)
    if which == "sf":
        from roads_sim import City

        pq.write_table(City(seed=0).trips(N, 101), path)
        return
    import duckmob
    from cleanslate import taxi_like

    from duckmob.metrics import table_points

    con = duckmob.connect()
    taxi_like(con, "timing", N)
    pq.write_table(table_points(con, "timing"), path)
    con.close()


def one_fit(which: str, path: str, seed: int, sample: bool) -> dict:
    """A default fit on the table at ``path`` with the duckmob that ``PYTHONPATH`` names: the figures as a dict."""
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from duckmob.privacy.noise import NoiseSource
    from duckmob.synth.base import fit_unrecorded
    from duckmob.synth.cleanslate import CleanSlate
    from duckmob.trajectories import from_points

    torch.set_num_threads(1)
    box = BOXES[which]
    data, _ = from_points(pq.read_table(path), bbox=box, outside="drop", private=True)
    t0, c0 = time.perf_counter(), time.process_time()
    model = fit_unrecorded(CleanSlate(box, progress=False), data, 1.0, 1e-5, NoiseSource(seed))
    out = dict(fit_s=time.perf_counter() - t0, fit_cpu_s=time.process_time() - c0, ti_s=model.timings["ti_s"],
               tpg_s=model.timings["tpg_s"], n=int(data.n_trajectories), code=os.environ.get("PYTHONPATH", ""))
    digest = hashlib.sha256()
    for net in ("ti", "tpg"):
        for _, value in sorted(model.state[net].items()):
            digest.update(value.numpy().tobytes())
    out["digest"] = digest.hexdigest()[:12]
    if sample:
        from duckmob.metrics import evaluate

        t0 = time.perf_counter()
        synth = model.sample(out["n"], np.random.default_rng(seed + 100))
        out["sample_s"] = time.perf_counter() - t0
        rows = {r["metric"]: r["value"] for r in evaluate(data, synth, box, families=["fine"], reference=False)}
        out["step_jsd"], out["points_ratio"] = rows["fine_step_jsd"], rows["fine_points_per_traj_ratio"]
    return out


def line(name: str, which: str, r: dict) -> str:
    if "error" in r:
        return f"{name:8s} {which:4s} {r['error']}"
    text = (f"{name:8s} {which:4s} {r['n']:,} trips: fit {r['fit_s']:5.1f} s wall, {r['fit_cpu_s']:5.1f} s CPU "
            f"(TI {r['ti_s']:4.1f} s, TPG {r['tpg_s']:4.1f} s wall); weights {r['digest']}")
    if "step_jsd" in r:
        text += f"; sample {r['sample_s']:.1f} s, step JSD {r['step_jsd']:.4f}, points x{r['points_ratio']:.2f}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", nargs="+", default=[f"here={os.path.dirname(HERE)}"],
                        help="NAME=PATH: checkouts to compare (each fit runs with PYTHONPATH=PATH)")
    parser.add_argument("--data", nargs="+", default=["sf", "taxi"], choices=sorted(BOXES))
    parser.add_argument("--data-dir", default="/tmp", help="where the Parquet tables are kept (written when missing)")
    parser.add_argument("--rounds", type=int, default=1, help="fits per checkout and table, alternating")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sample", action="store_true", help="also sample 20,000 and check the step lengths")
    parser.add_argument("--out", default=None, help="also append the lines here")
    parser.add_argument("--one", nargs=2, default=None, help=argparse.SUPPRESS)   # a child: WHICH PATH, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_fit(args.one[0], args.one[1], args.seed, args.sample)))
        return
    codes = [c.split("=", 1) for c in args.code]
    lines = [f"# benchmarks/cleanslate_speed.py {' '.join(sys.argv[1:])}",
             f"# {os.cpu_count()} CPU cores, load {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the start; "
             f"eps 1, delta 1e-5, seed {args.seed}, defaults, 1 torch thread; "
             + ", ".join(f"{name} = {os.path.abspath(path)}" for name, path in codes)]
    emit(lines, args.out)
    for which in args.data:
        path = os.path.join(args.data_dir, f"cleanslate_speed_{which}_{N}.parquet")
        if not os.path.exists(path):
            write_data(which, path)
        for _ in range(args.rounds):
            for name, code in codes:
                cmd = [sys.executable, os.path.abspath(__file__), "--one", which, path, "--seed", str(args.seed)]
                proc = subprocess.run(cmd + (["--sample"] if args.sample else []), capture_output=True, text=True,
                                      env={**os.environ, "PYTHONPATH": os.path.abspath(code),
                                           "DUCKMOB_PROGRESS": "0"})
                tail = proc.stdout.strip().splitlines()
                r = json.loads(tail[-1]) if proc.returncode == 0 and tail else \
                    dict(error=f"failed (rc {proc.returncode}): {proc.stderr.strip()[-600:]}")
                emit([line(name, which, r) + f"   [load {os.getloadavg()[0]:.1f}]"], args.out)


def emit(lines: list[str], out: str | None) -> None:
    for text in lines:
        print(text, flush=True)
    if out:
        with open(out, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
