"""mpi4py worker: run as `mpiexec -n P python mpi4py_worker.py SPEC.json OUT_PREFIX`.

Uses the buffer (upper-case) API the way OMB-Py does: out-of-place NumPy buffers, MPI.SUM,
float32. Each rank writes OUT_PREFIX.r<rank>.json.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import common as C  # noqa: E402


def main():
    spec, out = C.load_spec()
    comm = MPI.COMM_WORLD
    rank, P = comm.Get_rank(), comm.Get_size()
    SUM = MPI.SUM

    def build(coll, size, nbuf):
        n = C.count(size)
        if coll == "barrier":
            return (lambda k: comm.Barrier()), [np.zeros(1, C.DTYPE)]
        if coll == "alltoall":
            s = [C.filled((P, n), rank + k) for k in range(nbuf)]
            r = [C.output((P, n)) for _ in range(nbuf)]
            return (lambda k: comm.Alltoall(s[k], r[k])), [x.reshape(-1) for x in s]
        s = [C.filled(n, rank + k) for k in range(nbuf)]
        touch = s
        if coll == "allreduce":
            r = [C.output(n) for _ in range(nbuf)]
            op = lambda k: comm.Allreduce(s[k], r[k], SUM)  # noqa: E731
        elif coll == "bcast":
            op = lambda k: comm.Bcast(s[k], 0)  # noqa: E731
        elif coll == "reduce":
            r = [C.output(n) for _ in range(nbuf)]
            op = lambda k: comm.Reduce(s[k], r[k], SUM, 0)  # noqa: E731
        elif coll == "gather":
            r = [C.output((P, n)) if rank == 0 else None for _ in range(nbuf)]
            op = lambda k: comm.Gather(s[k], r[k], 0)  # noqa: E731
        elif coll == "allgather":
            r = [C.output((P, n)) for _ in range(nbuf)]
            op = lambda k: comm.Allgather(s[k], r[k])  # noqa: E731
        elif coll == "reduce_scatter":
            r = [C.output(n // P) for _ in range(nbuf)]
            s = [x[: (n // P) * P] for x in s]
            op = lambda k: comm.Reduce_scatter_block(s[k], r[k], SUM)  # noqa: E731
        else:
            return None
        return op, touch

    def progress(done, total):
        print(f"[mpi4py] {done}/{total} collectives", file=sys.stderr, flush=True)

    rows = C.run_all(spec, rank, P, comm.Barrier, build, progress if spec.get("verbose") else None)
    import mpi4py
    meta = {"library": "mpi4py", "mpi4py_version": mpi4py.__version__,
            "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
            "mpi_device": next((ln.split(":", 1)[1].strip() for ln in
                                MPI.Get_library_version().splitlines() if "Device" in ln), ""),
            "local_rank": os.environ.get("MPI_LOCALRANKID")}
    C.write_rank(out, rank, P, meta, rows)


if __name__ == "__main__":
    main()
