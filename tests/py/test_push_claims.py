"""A push's slices go to whichever rank claims them first (libcoll/src/algo_allreduce.c): a rank
that arrived and then lost its CPU (to a busy process, here to SIGSTOP) holds up nobody. Rank 0
calls allreduce on hbmcoll.empty buffers first and is stopped inside the call; the other ranks
must get the right result while it stays stopped (HBMCOLL_TIMEOUT turns a wait for it into an
error), and rank 0 must find its result complete when it runs again. Then a bcast from rank 1
(which gives and goes) and a few more calls with everyone running, against the descriptors rank 0
compares late. (Every call tried here waits for rank 0 before a rank's descriptor could come
round to the push's place again, so collective.c's guard for that is not reached.)"""
import os
import signal
import time

import numpy as np
import pytest


def stopped_first_rank(comm, steps):
    import hbmcoll
    pids = comm.allgather(np.array([os.getpid()], np.int64))
    n = 1 << 16  # 256 KiB of float32: past the one-round copy
    buf = hbmcoll.empty(n, "float32", comm=comm)
    want = comm.size * np.arange(n, dtype=np.float32) + sum(range(comm.size))
    buf[:] = np.arange(n, dtype=np.float32) + comm.rank
    one = np.zeros(1, np.int64)
    if comm.rank == 0:
        comm.allreduce(buf)  # stopped in here by rank 1, after arriving
        comm.bcast(one, root=1)
    else:
        time.sleep(0.5 * comm.rank)  # rank 1 stops rank 0 first, then the others come
        if comm.rank == 1:
            os.kill(int(pids[0][0]), signal.SIGSTOP)
        try:
            comm.allreduce(buf)
            assert comm._c.algorithm == "push"
            if comm.rank == 1:
                one[0] = 7
            # rank 1 gives and goes while rank 0 is still stopped
            comm.bcast(one, root=1)
            if comm.rank == 1:
                time.sleep(0.3)
        finally:
            if comm.rank == 1:
                os.kill(int(pids[0][0]), signal.SIGCONT)
    assert one[0] == 7
    np.testing.assert_array_equal(buf, want)
    for step in range(steps):  # everyone running: calls of several kinds, then push again
        buf[:] = np.arange(n, dtype=np.float32) + comm.rank + step
        comm.allreduce(buf)
        np.testing.assert_array_equal(buf, want + comm.size * step)
        assert comm.bcast(np.array([step + 1], np.int64), root=step % comm.size)[0] == step + 1
    return "ok"


@pytest.mark.parametrize("P", [2, 3])
def test_a_stopped_rank_holds_up_nobody(run_ranks, P):
    env = {"HBMCOLL_TIMEOUT": "20"}
    assert run_ranks(P, stopped_first_rank, 3, timeout=120, env=env) == ["ok"] * P
