"""The physical limit, measured in the same run: STREAM-like copy bandwidth with numpy.copyto.

Bandwidth counts 2N bytes per N-byte copy (read + write, STREAM's convention, as in the 2PN
bound of research/shm-collectives.md section 4). Arrays (256 MiB) are far larger than the LLC.
"all cores" runs one process per core at once (processes, as the collectives' ranks are):
per repetition all bytes over the span from the first start to the last end; best repetition.
STREAM "add" (np.add(a, b, out=c), 3N counted) is measured too as a cross-check: on some
machines one core pulls more bandwidth from two read streams than from one copy stream, so a
reduction can beat the copy-based bound; results.json then shows fractions above 100%.

Also the minimum bytes each collective must move, for "fraction of limit" = (bytes/B)/T.
"""
import multiprocessing as mp
import os
import time

import numpy as np

KERNELS = {"copy": 2, "add": 3}               # arrays counted per element, STREAM convention


def _reps(kind, nbytes, reps, barrier=None):
    """Per repetition (start, end) of one kernel pass over nbytes arrays."""
    n = nbytes // 8
    a = np.arange(n, dtype=np.float64)
    b = np.ones_like(a)
    c = np.empty_like(a)
    run = (lambda: np.copyto(c, a)) if kind == "copy" else (lambda: np.add(a, b, out=c))
    run()                                     # first touch outside the timing
    spans = []
    for _ in range(reps):
        if barrier is not None:
            barrier.wait()
        t = time.perf_counter()               # CLOCK_MONOTONIC: comparable across processes
        run()
        spans.append((t, time.perf_counter()))
    return spans


def _child(kind, nbytes, reps, barrier, q):
    q.put(_reps(kind, nbytes, reps, barrier))


def bandwidth(kind, nprocs, nbytes=256 << 20, reps=20):
    """(best, median) bytes/s of nprocs processes running the kernel at once."""
    if nprocs == 1:
        res = [_reps(kind, nbytes, reps)]
    else:
        ctx = mp.get_context("fork")
        barrier, q = ctx.Barrier(nprocs), ctx.Queue()
        ps = [ctx.Process(target=_child, args=(kind, nbytes, reps, barrier, q))
              for _ in range(nprocs)]
        for p in ps:
            p.start()
        res = [q.get(timeout=600) for _ in ps]
        for p in ps:
            p.join()
    moved = KERNELS[kind] * (nbytes // 8) * 8 * nprocs
    rates = sorted(moved / (max(r[i][1] for r in res) - min(r[i][0] for r in res))
                   for i in range(reps))
    return rates[-1], rates[len(rates) // 2]


def measure(world_sizes, nbytes=256 << 20, reps=20):
    """Copy (and add) bandwidth for 1 process, each world size that fits the cores, all cores."""
    ncores = len(os.sched_getaffinity(0))
    counts = sorted({1, ncores} | {min(p, ncores) for p in world_sizes})
    out = {"method": "numpy.copyto float64, 2N bytes counted per copy (STREAM copy); "
                     "add: np.add(a, b, out=c), 3N counted",
           "array_bytes": nbytes, "reps": reps, "cores": ncores, "by_procs": {}}
    for n in counts:
        best, median = bandwidth("copy", n, nbytes, reps)
        add_best, _ = bandwidth("add", n, nbytes, reps // 2)
        out["by_procs"][str(n)] = {"best_GBps": best / 1e9, "median_GBps": median / 1e9,
                                   "add_best_GBps": add_best / 1e9}
    _summary(out)
    spans = _reps("copy", 1 << 20, 200)
    out["in_cache_1MiB_GBps"] = 2 * (1 << 20) / min(b - a for a, b in spans) / 1e9
    return out


def _summary(out):
    out["single_core_GBps"] = out["by_procs"]["1"]["best_GBps"]
    out["all_cores_GBps"] = out["by_procs"][str(out["cores"])]["best_GBps"]
    out["all_cores_add_GBps"] = out["by_procs"][str(out["cores"])]["add_best_GBps"]


def merge(a, b):
    """Two measurements of the same run (e.g. the start and the end of a round): keep the
    better per process count, since interference from other work only ever lowers a rate.
    Merging into a merged result appends to its samples."""
    if not a or not b:
        return a or b
    out = dict(a, by_procs={}, samples=a.get("samples", [a]) + [b])
    for k, va in a["by_procs"].items():
        vb = b["by_procs"].get(k, va)
        out["by_procs"][k] = {f: max(va[f], vb[f]) for f in va}
    _summary(out)
    out["in_cache_1MiB_GBps"] = max(a["in_cache_1MiB_GBps"], b["in_cache_1MiB_GBps"])
    return out


def bandwidth_for(limits, P):
    """B to hold a P-rank collective against: the best rate min(P, cores) concurrent processes
    reached with STREAM copy or add (whichever this machine runs faster: a limit that one of
    two plain kernels beats would not be the machine's)."""
    k = str(min(P, limits["cores"]))
    got = limits["by_procs"].get(k, {"best_GBps": limits["all_cores_GBps"]})
    return max(got["best_GBps"], got.get("add_best_GBps", 0)) * 1e9


def min_bytes(coll, P, size):
    """Least memory traffic (bytes) for one call, OSU size semantics (see workers/common.py).
    From research/shm-collectives.md section 4, with N the full vector."""
    if coll == "allreduce":
        return 2 * P * size                   # every input read once, every output written once
    if coll == "bcast":
        return P * size                       # root read once, P-1 copies written
    if coll == "reduce":
        return (P + 1) * size
    if coll == "reduce_scatter":
        return (P + 1) * size                 # PN read, N written in total
    if coll == "allgather":
        return (P + 1) * P * size             # full vector N = P*size
    if coll == "gather":
        return 2 * P * size                   # N = P*size read once, written once at root
    if coll == "alltoall":
        return 2 * P * P * size
    return 0


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(measure([int(a) for a in sys.argv[1:]] or [2]), indent=1))
