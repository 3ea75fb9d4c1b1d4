"""What the release core's bookkeeping costs per release, with an empty ledger and after 500 releases.

Bookkeeping is everything a release does besides its mechanism: the lock, the ledger's integrity check, the
budget check, the reservation and finishing the ledger row. It is timed as ``release.run`` with a computation
that reads nothing; ``mob_noisy_count`` (the cheapest release from SQL, reading the GeoLife sample's 1,999
trajectories) shows it end to end, and ``ledger.verify`` the integrity check alone. Each process times
``--repeats`` + 1 rounds of the three, one after the other, on its own copy of one database file prepared by
this checkout (the sample as ``trips``, a budget at delta 0, and 0 or 500 earlier releases); the first round of
each process is left out of the medians (the first release is where a process hashes every ledger row: shown
apart). Figures are medians over ``--rounds`` processes, in wall time and in CPU time of the process (all
threads): on a machine shared with other work, CPU time is the figure that work disturbs least.

Rows: this checkout (incremental checks: one aggregate query, and only the rows added since hashed); this
checkout with its memory of the ledger dropped before each release and check, which redoes the work of the full
check each time (``ensure_tables`` and every row hashed); and with ``--baseline REV`` another commit (extracted
with ``git archive``, or a directory holding a checkout), e.g. the one before incremental checks. The processes
of all rows are interleaved in one run, so the ratios compare figures taken under the same load:

    python benchmarks/release.py --baseline ccdd3af

A budget with delta > 0 adds the accountant's own cost on top (composing every earlier release by PLD); one
such composition is timed last, for the same number of releases.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- in a child process ---------------------------------------------------------------------------------------

def _timed(f) -> tuple[float, float]:
    """(wall, CPU) seconds of ``f()``; CPU counts every thread of this process (DuckDB's too)."""
    wall, cpu = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - wall, time.process_time() - cpu


def _bookkeeping(db, i: int) -> None:
    from duckmob import release
    from duckmob.privacy import accounting

    request = release.Request(source="trips", mechanism="bench", privacy_unit="trajectory", params={"i": i},
                              seeded=False, price=lambda p: (accounting.laplace(0.01), None))
    release.run(db, request, lambda r: r.read(lambda: None))


def prepare(path: str, releases: int) -> None:
    """A database file holding the sample, a budget and ``releases`` earlier releases."""
    import duckmob
    from duckmob import release
    from duckmob.demo import load_sample

    con = duckmob.connect(path)
    load_sample(con)
    con.execute("FROM mob_set_budget('trips', eps := 1e6, delta := 0)").fetchall()
    db = release.database(con)
    for i in range(releases):
        _bookkeeping(db, i)
    con.execute("CHECKPOINT")
    con.close()


def measure(path: str, repeats: int, mode: str) -> dict:
    """(wall, CPU) seconds on ``path`` of ``repeats`` + 1 rounds of: one bookkeeping release, one
    mob_noisy_count, one integrity check alone. ``mode``: 'incremental' (this checkout), 'full' (this checkout,
    its memory of the ledger dropped before each of them) or 'as-is' (another checkout: its releases and its
    ``ledger.verify(con)``)."""
    import duckmob
    from duckmob import release
    from duckmob.privacy import ledger

    con = duckmob.connect(path)
    db = release.database(con)
    cur = db.cursor()

    def reset() -> None:
        if mode == "full":
            db.verified = ledger.Verified()

    def check() -> None:
        if mode == "incremental":
            ledger.verify(cur, db.verified)
        else:
            ledger.verify(cur)

    out = {"bookkeeping": [], "count": [], "check": []}
    for i in range(repeats + 1):
        reset()
        out["bookkeeping"].append(_timed(lambda: _bookkeeping(db, i)))
        reset()
        out["count"].append(_timed(lambda: con.execute(f"FROM mob_noisy_count('trips', eps := 0.01, seed := {i})"
                                                       ).fetchall()))
        out["check"].append(_timed(check))
    cur.close()
    con.close()
    return out


# -- in the parent --------------------------------------------------------------------------------------------

def _child(source: str, *args: str) -> dict | None:
    env = {**os.environ, "PYTHONPATH": source}
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, capture_output=True,
                          text=True, check=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _extract(rev: str, into: str) -> str:
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], capture_output=True, text=True,
                            check=True).stdout.strip()
    return commit


def _ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--earlier", type=int, default=500, help="earlier releases in the grown ledger")
    parser.add_argument("--repeats", type=int, default=10, help="releases timed per process")
    parser.add_argument("--rounds", type=int, default=6, help="processes per row and ledger size")
    parser.add_argument("--baseline", help="a git revision (or a directory holding a checkout) to compare with")
    parser.add_argument("--prepare", nargs=2, metavar=("PATH", "RELEASES"), help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=3, metavar=("PATH", "REPEATS", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare[0], int(args.prepare[1]))
        return
    if args.measure:
        print(json.dumps(measure(args.measure[0], int(args.measure[1]), args.measure[2])))
        return

    with tempfile.TemporaryDirectory() as tmp:
        rows = [("this checkout, incremental", ROOT, "incremental"),
                ("this checkout, full check each release", ROOT, "full")]
        if args.baseline and os.path.isdir(args.baseline):
            rows.append((f"baseline {args.baseline}", os.path.abspath(args.baseline), "as-is"))
        elif args.baseline:
            old = os.path.join(tmp, "baseline")
            os.mkdir(old)
            rows.append((f"baseline {_extract(args.baseline, old)}", old, "as-is"))
        sizes = (0, args.earlier)
        for n in sizes:
            _child(ROOT, "--prepare", os.path.join(tmp, f"ledger{n}.duckdb"), str(n))
        samples = {(label, n): [] for label, _, _ in rows for n in sizes}
        for r in range(args.rounds):
            for k in range(len(rows)):
                label, source, mode = rows[(k + r) % len(rows)]   # a different order each round
                for n in sizes:
                    copy = os.path.join(tmp, "copy.duckdb")
                    shutil.copy(os.path.join(tmp, f"ledger{n}.duckdb"), copy)
                    samples[label, n].append(_child(source, "--measure", copy, str(args.repeats), mode))
                    os.remove(copy)

    sys.path.insert(0, ROOT)   # the checkout this script is in, as its children use
    import duckmob
    from duckmob.privacy import accounting

    print(f"duckmob at {os.path.dirname(duckmob.__file__)}; median over {args.rounds} processes x {args.repeats} "
          "(the first of each process apart); wall ms, and in brackets CPU ms (all threads of the process: the "
          "figure other work on a shared machine disturbs least)")
    print(f"{'ledger rows before:':>66}{0:>16}{args.earlier:>16}")
    base = rows[0][0]
    for what, title in (("bookkeeping", "bookkeeping per release (release.run, nothing read)"),
                        ("count", "mob_noisy_count('trips') from SQL, per release"),
                        ("check", "the ledger's integrity check alone (ledger.verify)")):
        print(title)
        median = {(label, n, k): _ms([t[k] for s in samples[label, n] for t in s[what][1:]])
                  for label, _, _ in rows for n in sizes for k in (0, 1)}
        for label, _, _ in rows:
            print(f"  {label:<64}" + "".join(f"{median[label, n, 0]:>8.1f} ({median[label, n, 1]:>4.1f})"
                                             for n in sizes))
        for label, _, _ in rows[1:]:
            ratio = {(n, k): median[label, n, k] / median[base, n, k] for n in sizes for k in (0, 1)}
            print(f"  {'ratio to incremental: ' + label:<64}"
                  + "".join(f"{ratio[n, 0]:>7.2f}x ({ratio[n, 1]:.2f}x)" for n in sizes))
    first = _ms([s["bookkeeping"][0][0] for s in samples[base, args.earlier]])
    print(f"the first release of a process (this checkout, {args.earlier} rows before) hashes every row: "
          f"{first:.1f} ms")

    prior = [accounting.laplace(0.01)] * args.earlier
    start = time.perf_counter()
    accounting.epsilon(accounting.compose(prior + [accounting.laplace(0.0101)]), 1e-5)
    print(f"not included: at delta 1e-5 instead of 0, composing {args.earlier} Laplace releases (PLD) adds "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms to each budget check")


if __name__ == "__main__":
    main()
