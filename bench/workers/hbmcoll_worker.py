"""hbmcoll worker: run as `python -m hbmcoll.run -n P hbmcoll_worker.py SPEC.json OUT_PREFIX`.

Variants (spec["buffers"]): "numpy" = ordinary NumPy arrays (what a user already has; allreduce
out-of-place like the MPI worker, other collectives as the API defines them), "empty" = arrays
from hbmcoll.empty (inside the shared segment: zero copy; allreduce in place). Placement and
binding come from the environment the driver sets (HBMCOLL_MEMORY, HBMCOLL_BIND); the
topology hbmcoll reports is written with every result.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

import hbmcoll  # noqa: E402

import common as C  # noqa: E402


def main():
    spec, out = C.load_spec()
    comm = hbmcoll.init()
    rank, P = comm.rank, comm.size
    kind = spec.get("buffers", "numpy")
    inplace = spec.get("inplace", kind == "empty")

    def alloc(shape, dtype):
        if kind == "empty":
            return hbmcoll.empty(shape, dtype, comm=comm)
        return np.empty(shape, dtype)

    def fill(shape, k):
        return C.filled(shape, rank + k, alloc)

    def build(coll, size, nbuf):
        n = C.count(size)
        if coll == "barrier":
            return (lambda k: comm.barrier()), [np.zeros(1, C.DTYPE)]
        if coll == "alltoall":
            s = [fill((P, n), k) for k in range(nbuf)]
            r = [C.output((P, n), alloc) for _ in range(nbuf)]
            return (lambda k: comm.alltoall(s[k], out=r[k])), [x.reshape(-1) for x in s]
        s = [fill(n, k) for k in range(nbuf)]
        touch = s
        if coll == "allreduce":
            if inplace:
                op = lambda k: comm.allreduce(s[k], op="sum")  # noqa: E731
            else:
                r = [C.output(n, alloc) for _ in range(nbuf)]
                op = lambda k: comm.allreduce(s[k], op="sum", out=r[k])  # noqa: E731
        elif coll == "bcast":
            op = lambda k: comm.bcast(s[k], root=0)  # noqa: E731
        elif coll == "reduce":
            r = [C.output(n, alloc) for _ in range(nbuf)]
            op = lambda k: comm.reduce(s[k], op="sum", root=0, out=r[k])  # noqa: E731
        elif coll == "gather":
            r = [C.output((P, n), alloc) if rank == 0 else None for _ in range(nbuf)]
            op = lambda k: comm.gather(s[k], root=0, out=r[k])  # noqa: E731
        elif coll == "allgather":
            r = [C.output((P, n), alloc) for _ in range(nbuf)]
            op = lambda k: comm.allgather(s[k], out=r[k])  # noqa: E731
        elif coll == "reduce_scatter":
            r = [C.output(n // P, alloc) for _ in range(nbuf)]
            s = [x[: (n // P) * P] for x in s]
            op = lambda k: comm.reduce_scatter(s[k], op="sum", out=r[k])  # noqa: E731
        else:
            return None
        return op, touch

    def progress(done, total):
        print(f"[hbmcoll] {done}/{total} collectives", file=sys.stderr, flush=True)

    rows = C.run_all(spec, rank, P, comm.barrier, build, progress if spec.get("verbose") else None)
    try:
        topo = hbmcoll.topology()
    except Exception as e:  # the benchmark must still record its timings
        topo = {"error": repr(e)}
    meta = {"library": "hbmcoll", "hbmcoll_version": getattr(hbmcoll, "__version__", "?"),
            "buffers": kind, "allreduce_inplace": inplace,
            "HBMCOLL_MEMORY": os.environ.get("HBMCOLL_MEMORY"),
            "HBMCOLL_BIND": os.environ.get("HBMCOLL_BIND"),
            "local_rank": getattr(comm, "local_rank", None),
            "topology": topo if rank == 0 else None}
    C.write_rank(out, rank, P, meta, rows)


if __name__ == "__main__":
    main()
