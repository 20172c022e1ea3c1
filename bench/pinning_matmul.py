"""Does pinning starve compute? A multi-threaded matmul timed before and after hbmcoll.init().

    python3 bench/pinning_matmul.py                 # 1 rank and 2 ranks (if the host has >= 2 CPUs)
    python3 bench/pinning_matmul.py --size 1024 --reps 30 --binds share,core,none

Each case starts N ranks with hbmcoll-run --bind B. Every rank times `--reps` torch matmuls of
size x size float32 (best of 5 batches) with torch's default threads, calls hbmcoll.init() (which
pins the rank and sets its threads to its share), and times them again. Prints, per case, the
slowest rank's before/after ratio (1.0: init() costs nothing; 3.0: compute 3x slower after init,
as `--bind core` was by default before the share binding). A benchmark: nothing here is asserted.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(os.path.dirname(HERE), "pymod")


def _time(size, reps):
    import torch
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _worker(size, reps):
    import torch
    before, threads_before = _time(size, reps), torch.get_num_threads()
    import hbmcoll
    comm = hbmcoll.init()
    after = _time(size, reps)
    line = json.dumps(dict(rank=comm.rank, before=before, after=after, threads=[
        threads_before, torch.get_num_threads()], cpus=len(os.sched_getaffinity(0))))
    os.write(1, (line + "\n").encode())
    comm.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--binds", default="share,core,none")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return _worker(a.size, a.reps)
    cpus = len(os.sched_getaffinity(0))
    env = dict(os.environ, PYTHONPATH=PYMOD + os.pathsep + os.environ.get("PYTHONPATH", ""),
               HBMCOLL_QUIET="1")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)
    print(f"host: {cpus} CPUs; matmul {a.size}x{a.size} float32; time after init / before")
    for n in sorted({1, min(2, cpus)}):
        for bind in a.binds.split(","):
            out = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", str(n), "--bind",
                                  bind, os.path.abspath(__file__), "--worker", "--size",
                                  str(a.size), "--reps", str(a.reps)], env=env,
                                 capture_output=True, text=True, timeout=600)
            rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
            if out.returncode or len(rows) != n:
                print(f"  {n} rank(s) --bind {bind}: failed: {out.stderr.strip()[-300:]}")
                continue
            worst = max(r["after"] / r["before"] for r in rows)
            detail = ", ".join(f"rank {r['rank']}: {r['before'] * 1e3:.2f} -> "
                               f"{r['after'] * 1e3:.2f} ms, threads {r['threads'][0]}->"
                               f"{r['threads'][1]} on {r['cpus']} CPU(s)" for r in rows)
            print(f"  {n} rank(s) --bind {bind:5s} {worst:5.2f}x  ({detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
