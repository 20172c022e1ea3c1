"""One rank of a job whose ranks run in different containers (tests/docker/run.sh).

Rank, size and job key come from HBMCOLL_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE and HBMCOLL_JOB_KEY.
Checks allreduce and bcast on a NumPy buffer larger than a container's 64 MB /dev/shm (segments
are memfd), an allreduce on an hbmcoll.empty buffer (single copy through the shared arena), and
prints one line per rank. Rank 0 sleeps TWO_RANKS_SKEW seconds (1) first, so the others wait
long enough to check whether their peers are alive.
"""
import os
import socket
import time

import numpy as np

import hbmcoll

MB = 1 << 20


def main():
    comm = hbmcoll.init()
    # rank 0 "computes" a while first: the others wait in the slow path, which watches peers' pids
    if comm.rank == 0:
        time.sleep(float(os.environ.get("TWO_RANKS_SKEW", "1")))
    n = int(os.environ.get("TWO_RANKS_MB", "96")) * MB // 4
    buf = np.full(n, comm.rank + 1, np.float32)
    comm.allreduce(buf)
    ok = bool((buf == comm.size * (comm.size + 1) / 2).all())
    root = np.arange(1024, dtype=np.int64) if comm.rank == 0 else np.zeros(1024, np.int64)
    comm.bcast(root, root=0)
    ok &= bool((root == np.arange(1024)).all())
    arena = hbmcoll.empty(1 << 16, "float64", comm=comm)
    arena[:] = comm.rank
    comm.allreduce(arena, op="max")
    ok &= bool((arena == comm.size - 1).all())
    comm.barrier()
    print(f"rank {comm.rank} of {comm.size} (host {socket.gethostname()}, pid {os.getpid()}): "
          f"allreduce of {n * 4 // MB} MiB, bcast, arena allreduce: {'ok' if ok else 'WRONG'}",
          flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
