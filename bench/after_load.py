"""The suite quiet, then again right after a burst of load: does hbmcoll come back as the peers do?

    python3 bench/after_load.py [--burst 30] [--per-cpu 4] [--settle 0] [--threshold 1.5] [suite args]
    python3 bench/after_load.py --libs mpi4py,openmpi,hbmcoll --collectives allreduce,bcast --rounds 3

Issue 33 saw one suite run, taken minutes after the machine had been heavily loaded, where hbmcoll
was 2-5x slower at most sizes while the peers' times were normal. This runs bench/suite.py once on
the quiet machine, then loads every CPU for --burst seconds (--per-cpu processes each, half of them
spinning, half copying 64 MiB buffers, so caches and the scheduler's view of the tasks are both
disturbed), waits --settle seconds, and runs the same suite again. Every cell (library, ranks,
collective, size) is compared by its best round: an outlier is an hbmcoll cell whose time after the
burst is more than --threshold times its quiet time while no peer's cell of the same
collective and size moved that much. The table of both runs and the outliers go to
<out>/after_load.md; the exit status is 0 either way (a bench, not a test), and the last line
says how many outliers there were.
"""
import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _spin(until):
    while time.time() < until:
        pass


def _copy(until):
    a, b = bytearray(64 << 20), bytearray(64 << 20)
    while time.time() < until:
        b[:] = a


def burst(seconds, per_cpu):
    """per_cpu processes per CPU we may run on, for `seconds`, half spinning and half copying."""
    until = time.time() + seconds
    n = per_cpu * len(os.sched_getaffinity(0))
    procs = [multiprocessing.Process(target=_spin if i % 2 else _copy, args=(until,), daemon=True)
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(seconds + 30)
        if p.is_alive():
            p.kill()
    return n


def suite(out, passed):
    """bench/suite.py into `out`; its summary rows (the best round of each cell)."""
    cmd = [sys.executable, os.path.join(HERE, "suite.py"), "--out", out, "--no-plots"] + passed
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
    with open(os.path.join(out, "latest", "results.json")) as f:
        summary = json.load(f)["summary"]
    if rc:
        print(f"[after_load] suite.py exited {rc} (results kept in {out})", file=sys.stderr)
    return {(s["label"], s["P"], s["collective"], s["size"]): s["avg_us"] for s in summary}


def outliers(quiet, after, threshold):
    """hbmcoll cells slower by more than threshold after the burst while no peer's cell was."""
    moved = {k: after[k] / quiet[k] for k in quiet if k in after and quiet[k] > 0}
    found = []
    for (label, P, coll, size), r in sorted(moved.items()):
        if not label.startswith("hbmcoll") or r <= threshold:
            continue
        peers = [v for (l2, p2, c2, s2), v in moved.items()
                 if not l2.startswith("hbmcoll") and (p2, c2, s2) == (P, coll, size)]
        if peers and max(peers) <= threshold:
            found.append((label, P, coll, size, r, max(peers)))
    return moved, found


def table(quiet, after, moved, found, threshold):
    lines = ["| library | ranks | collective | bytes | quiet us | after us | after / quiet |",
             "|---|---|---|---|---|---|---|"]
    for k in sorted(moved, key=lambda k: (k[2], k[1], k[3], k[0])):
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {quiet[k]:.2f} | {after[k]:.2f} | {moved[k]:.2f}x |")
    lines.append("")
    lines.append(f"Outliers (hbmcoll after / quiet over {threshold}x while every peer stayed within it): "
                 f"{len(found)}")
    for label, P, coll, size, r, peer in found:
        lines.append(f"- {label} P={P} {coll} {size} B: {r:.2f}x (peers at most {peer:.2f}x)")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--burst", type=float, default=30, help="seconds of load between the runs")
    ap.add_argument("--per-cpu", type=int, default=4, help="load processes per CPU during the burst")
    ap.add_argument("--settle", type=float, default=0, help="seconds from the burst's end to the second run")
    ap.add_argument("--threshold", type=float, default=1.5)
    ap.add_argument("--out", default=None, help="results root (default bench/results/after_load-<time>)")
    a, passed = ap.parse_known_args(argv)
    if a.burst <= 0 or a.per_cpu <= 0 or a.settle < 0 or a.threshold <= 1:
        ap.error("--burst and --per-cpu must be positive, --settle not negative, --threshold above 1")
    out = a.out or os.path.join(HERE, "results", time.strftime("after_load-%Y%m%d-%H%M%S"))
    print("[after_load] the suite on the quiet machine", file=sys.stderr)
    quiet = suite(os.path.join(out, "quiet"), passed)
    n = burst(a.burst, a.per_cpu)
    print(f"[after_load] {n} processes loaded the machine for {a.burst:.0f} s; the suite again"
          f" {a.settle:.0f} s later", file=sys.stderr)
    time.sleep(a.settle)
    after = suite(os.path.join(out, "after"), passed)
    moved, found = outliers(quiet, after, a.threshold)
    md = table(quiet, after, moved, found, a.threshold)
    with open(os.path.join(out, "after_load.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"[after_load] {len(found)} outliers; tables in {out}/after_load.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
