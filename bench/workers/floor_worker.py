"""Local floor: the memory work an out-of-place allreduce cannot avoid, with no communication.

    python floor_worker.py P SPEC.json OUT_PREFIX

Forks P processes, rank r pinned to the r-th allowed CPU (where hbmcoll's launcher puts its
ranks when there are no more ranks than cores; on larger machines it spreads them), that all at
once do `out = in + 1` on their own buffers: read the N-byte input, write the N-byte output with
ordinary stores. Same rotation, touch and timing loop as the library workers
(common.py), so a library's time over this one is what its communication costs on top of the
bytes every rank must read and write anyway. Only allreduce has a floor; other collectives are
reported as not supported. Buffers are ordinary NumPy arrays, so the floor is for the
out-of-place variants (mpi4py, hbmcoll-numpy); hbmcoll-empty runs in place and moves less.
"""
import multiprocessing as mp
import multiprocessing.connection  # noqa: F401  (mp.connection.wait)
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import common as C  # noqa: E402


def rank_main(rank, P, spec, out, barrier):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    one = C.DTYPE(1)

    def build(coll, size, nbuf):
        if coll != "allreduce":
            return None
        n = C.count(size)
        s = [C.filled(n, rank + k) for k in range(nbuf)]
        r = [C.output(n) for _ in range(nbuf)]
        return (lambda k: np.add(s[k], one, out=r[k])), s

    rows = C.run_all(spec, rank, P, barrier.wait, build)
    C.write_rank(out, rank, P, {"library": "floor", "op": "out = in + 1, no communication",
                                "pinned_cpu": cpus[rank % len(cpus)]}, rows)


def end_ranks(procs):
    """SIGTERM, then SIGKILL, whatever each rank is doing. (Not Barrier.abort(): it waits,
    without a timeout, for every rank at the barrier to wake, and a dead one never does.)"""
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: floor_worker.py P SPEC.json OUT_PREFIX")
    P = int(sys.argv[1])
    spec, out = C.load_spec(sys.argv[2:])
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(P, timeout=600)
    procs = [ctx.Process(target=rank_main, args=(r, P, spec, out, barrier)) for r in range(P)]
    for p in procs:
        p.start()
    left = {p.sentinel: p for p in procs}
    while left:  # a rank that fails ends the others: they would wait at the next barrier
        for s in mp.connection.wait(list(left)):
            p = left.pop(s)
            p.join()
            if p.exitcode != 0:
                end_ranks(list(left.values()))
                left.clear()
                break
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    for r, code in bad:
        print(f"[floor] rank {r} exited with {code}", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
