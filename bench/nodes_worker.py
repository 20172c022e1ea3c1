"""One rank of bench/net_bridge.py: a collective (allreduce float32 sum by default; bcast from rank
0, allgather) timed through one library across the emulated nodes, the same way for each.

    nodes_worker.py LIB SIZES SECONDS [COLLECTIVES]    LIB: hbmcoll | gloo | mpich | openmpi

hbmcoll: hbmcoll.init() (the library's whole path across nodes, NumPy buffers), under torchrun;
gloo: torch.distributed's gloo, under torchrun; mpich and openmpi: mpi4py's Allreduce over MPICH
under hydra, or over Open MPI under its mpiexec (the mpi4py of build/ompi-venv). Per size: WARMUP calls to warm up, then as many calls as fit in SECONDS (rank 0's estimate,
broadcast), between barriers; rank 0 prints the slowest rank's mean per call.
"""
import sys
import time

import numpy as np


def library(name):
    """(rank, size, allreduce(a), bcast(a), allgather(a, out), barrier(), max_of(x), close()) of one
    library."""
    if name == "hbmcoll":
        import hbmcoll
        c = hbmcoll.init()

        def max_of(x):
            m = np.array([x])
            c.allreduce(m, op="max")
            return float(m[0])
        return c.rank, c.size, c.allreduce, c.bcast, lambda a, out: c.allgather(a, out=out), c.barrier, max_of, c.close
    if name == "gloo":
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")

        def allreduce(a):
            dist.all_reduce(torch.from_numpy(a))

        def bcast(a):
            dist.broadcast(torch.from_numpy(a), 0)

        def allgather(a, out):
            dist.all_gather(list(torch.from_numpy(out)), torch.from_numpy(a))

        def max_of(x):
            t = torch.tensor([x], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return float(t)
        return (dist.get_rank(), dist.get_world_size(), allreduce, bcast, allgather, dist.barrier, max_of,
                dist.destroy_process_group)
    if name in ("mpich", "openmpi"):
        from mpi4py import MPI
        w = MPI.COMM_WORLD
        return (w.Get_rank(), w.Get_size(), lambda a: w.Allreduce(MPI.IN_PLACE, a, MPI.SUM), lambda a: w.Bcast(a, 0),
                lambda a, out: w.Allgather(a, out), w.Barrier, lambda x: w.allreduce(x, MPI.MAX), lambda: None)
    raise SystemExit(f"unknown library {name!r}")


WARMUP = 16  # calls per size before the timing, every library alike: hbmcoll's first calls of a
             # size try its chunk counts (pipeline.Tuner), 4 candidates x 3


def main():
    name, sizes, seconds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], float(sys.argv[3])
    colls = sys.argv[4].split(",") if len(sys.argv) > 4 else ["allreduce"]
    rank, P, allreduce, bcast, allgather, barrier, max_of, close = library(name)
    for coll in colls:
        for size in sizes:
            a = np.ones(max(size // 4, 1), dtype=np.float32)
            out = np.empty((P, a.size), np.float32)
            call = {"allreduce": lambda: allreduce(a), "bcast": lambda: bcast(a),
                    "allgather": lambda: allgather(a, out)}[coll]
            for _ in range(WARMUP - 3):
                call()
            t0 = time.perf_counter()
            for _ in range(3):
                call()
            iters = np.array([max(5.0, min(100000.0, seconds / ((time.perf_counter() - t0) / 3 + 1e-6)))])
            bcast(iters)
            barrier()
            t0 = time.perf_counter()
            for _ in range(int(iters[0])):
                call()
            us = max_of((time.perf_counter() - t0) / int(iters[0]) * 1e6)
            if rank == 0:
                print("%s %d B: %.2f us" % (coll, size, us), flush=True)
    close()


if __name__ == "__main__":
    main()
