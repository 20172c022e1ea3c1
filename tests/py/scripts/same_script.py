"""One user script for every launcher: allreduce, bcast, gather, then print a
line the test parses. `--mpi` bootstraps over mpi4py's COMM_WORLD instead."""
import os
import sys

import numpy as np

import hbmcoll

if "--mpi" in sys.argv:
    from mpi4py import MPI

    comm = hbmcoll.init(comm=MPI.COMM_WORLD)
else:
    comm = hbmcoll.init()
r, p = comm.rank, comm.size
x = np.full(1000, r + 1, np.float64)
comm.allreduce(x)
assert (x == p * (p + 1) / 2).all(), x[:3]
y = np.arange(10, dtype=np.int32) if r == 0 else np.zeros(10, np.int32)
comm.bcast(y, root=0)
assert (y == np.arange(10)).all()
g = comm.gather(np.array([r], np.int64), root=0)
if r == 0:
    assert g.ravel().tolist() == list(range(p)), g
# one write(2): lines from several ranks on one pipe must not interleave
os.write(1, f"OK rank={r} size={p} launcher={comm.launcher}\n".encode())
