"""DP-SGD step time of HRNet with ``workers`` 1, 2, ... processes (duckmob.synth.distributed) on the shipped sample.

Setting: the shipped GeoLife sample (duckmob/data/geolife_sample.parquet) in HRNet's demo box, stay points and
HRNet's default model and plan at eps 1 (expected batch 2 sqrt(N~), its sampling rate, the calibrated noise
multiplier); ``--steps`` DP-SGD steps from the same initial weights and seed for every worker count, one torch
thread per worker. Prints, per worker count, the seconds per step inside the loop (rank 0's timer), the wall
time including starting the workers, and the ratios to one process; and the largest weight difference to the
one-process model (float rounding only: the batches and the noise are the same).

    python benchmarks/distributed.py [--steps 60] [--workers 1 2]

Speed-up needs free cores: on a machine whose cores other jobs keep busy, two workers compete with them (and with
each other) and can be slower than one.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import pyarrow.parquet as pq
import torch


def main() -> None:
    from duckmob.demo import HRNET_BBOX, sample_path
    from duckmob.privacy.noise import NoiseSource
    from duckmob.privacy.unit import PrivacyUnit
    from duckmob.synth.hrnet import HRNet
    from duckmob.synth.hrnet.train import RunContext, Schedule, dp_sgd_train, training_arrays
    from duckmob.trajectories import from_points

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--workers", nargs="*", type=int, default=[1, 2])
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("CI", "1")

    traj, _ = from_points(pq.read_table(sample_path()), HRNET_BBOX, outside="drop")
    synth = HRNet(HRNET_BBOX, progress=False)
    config = synth.config
    arrays = training_arrays(synth.cell_sequences(synth.stays(traj)), config.w, config.n_time, config.max_len)
    plan = synth.schedule(1.0, 1e-5, PrivacyUnit(), arrays.n, None)   # the fit's schedule for this many
    torch.manual_seed(0)
    start = synth.build()
    print(f"HRNet DP-SGD on the shipped sample: {arrays.n} trajectories, expected batch {plan.expected_batch:.0f}, "
          f"q {plan.sample_rate:.4f}, sigma {plan.noise_multiplier:.3f}, {args.steps} steps, "
          f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at start)")
    print(f"{'workers':>7s} {'s/step':>8s} {'wall s':>8s} {'step ratio':>10s} {'wall ratio':>10s} {'max |dw|':>9s}")
    first = None
    for workers in args.workers:
        model = copy.deepcopy(start)
        t0 = time.perf_counter()
        schedule = Schedule(sample_rate=plan.sample_rate, steps=args.steps, noise_multiplier=plan.noise_multiplier,
                            max_grad_norm=config.max_grad_norm, expected_batch_size=plan.expected_batch, lr=config.lr,
                            lr_final=config.lr_final)
        log = dp_sgd_train(model, arrays, schedule, RunContext(NoiseSource(11).generator(), torch.device("cpu"),
                                                               progress=False), workers=workers)
        wall = time.perf_counter() - t0
        per_step = log.seconds / log.steps
        if first is None:
            first = (per_step, wall, model.state_dict())
        diff = max(float((v - first[2][k]).abs().max()) for k, v in model.state_dict().items())
        print(f"{workers:7d} {per_step:8.3f} {wall:8.1f} {first[0] / per_step:10.2f} {first[1] / wall:10.2f} "
              f"{diff:9.2e}", flush=True)


if __name__ == "__main__":   # the workers are spawned: they import this file without running it
    main()
