"""Collectives beside other work: sub-communicators (split, nested splits), nonblocking
collectives, and threads: the GIL is released while a rank waits, and a communicator handed
between threads. Real processes, as in test_collectives.py."""

import threading
import time

import numpy as np
import pytest

from collective_data import (SLOT, Checker)


# ---- sub-communicators ------------------------------------------------------------------------

def split_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    half = comm.split(me % 2, key=me)
    peers = [r for r in range(P) if r % 2 == me % 2]
    chk.true(half.size == len(peers) and half.rank == peers.index(me),
             f"even/odd split: rank {half.rank} of {half.size}")
    rev = comm.split(0, key=-me)  # one group, reversed order
    chk.true(rev.size == P and rev.rank == P - 1 - me, f"reversed split: rank {rev.rank}")
    ties = comm.split(7, key=0)  # equal keys: old rank order
    chk.true(ties.rank == me, f"tied keys: rank {ties.rank}")
    none = comm.split(None if me == 0 else 1, key=me)
    if me == 0:
        chk.true(none is None, f"color None gave {none!r}")
    else:
        chk.true(none is not None and none.size == P - 1 and none.rank == me - 1,
                 f"color 1 without rank 0: {none!r}")

    order = rev.allgather(np.array([me], np.int64)).reshape(-1)
    chk.same(order, np.arange(P - 1, -1, -1, dtype=np.int64), None, "reversed split order")

    for it in range(4):  # collectives on the parent and the children, interleaved
        x = np.array([me + 1, it], np.int64)
        comm.allreduce(x)
        chk.same(x, np.array([P * (P + 1) // 2, P * it], np.int64), None, f"parent it={it}")
        y = np.full(1001, me + it, np.float64)
        half.allreduce(y)
        chk.true(bool(np.all(y == sum(r + it for r in peers))), f"half allreduce it={it}")
        b = np.array([me * 10 + it], np.int32)
        half.bcast(b, root=half.size - 1)
        chk.true(int(b[0]) == peers[-1] * 10 + it, f"half bcast it={it}: {b}")
        g = rev.gather(np.array([me], np.int32), root=0)
        if rev.rank == 0:
            chk.same(g.reshape(-1), np.arange(P - 1, -1, -1, dtype=np.int32), None, f"rev gather it={it}")
        if none is not None:
            z = none.allreduce(np.array([me], np.int64))
            chk.true(int(z[0]) == sum(range(1, P)), f"none allreduce it={it}")
        comm.barrier()

    # an arena array of one communicator used in another's collectives (ordinary memory there)
    a = half.empty(1001, "float32")
    a[:] = me
    comm.allreduce(a)
    chk.true(bool(np.all(a == sum(range(P)))), "child's arena array in a parent collective")
    b = comm.empty(1001, "float32")
    b[:] = me
    half.allreduce(b)
    chk.true(bool(np.all(b == sum(peers))), "parent's arena array in a child collective")

    # a split of a split, and a nonblocking collective on a child while the parent works
    quarter = half.split(half.rank % 2, key=0)
    q = quarter.allreduce(np.array([me], np.int64))
    qpeers = [r for i, r in enumerate(peers) if i % 2 == half.rank % 2]
    chk.true(int(q[0]) == sum(qpeers), f"nested split: {q} for {qpeers}")
    big = np.full(3 * SLOT // 4 + 1, float(me), np.float32)
    req = half.iallreduce(big)
    x = comm.allreduce(np.array([1], np.int32))
    req.wait()
    chk.true(int(x[0]) == P and bool(np.all(big == sum(peers))), "child iallreduce + parent")
    for c in (quarter, none, ties, rev, half):
        if c is not None:
            c.close()
    comm.barrier()  # the parent still works after its children are gone
    return chk.done()


@pytest.mark.parametrize("P", [2, 4, 5, 8])
def test_split(run_ranks, P):
    run_ranks(P, split_rank, timeout=120)


def deep_split_rank(comm, depth):
    from ranks import event

    c = comm
    for _ in range(depth):  # everyone stays together; only the key grows
        c = c.split(0, key=0)
    pair = c.split(c.rank // 2, key=0)  # {0, 1} and {2, 3}
    # Both pairs split again, so that pair {0, 1} is still meeting (rank 0 listening; rank 1 is
    # held by the test with SIGSTOP) when pair {2, 3} meets.
    if comm.rank == 0:
        time.sleep(1.0)
    elif comm.rank == 1:
        event("entering")
    else:
        time.sleep(2.0)
    again = pair.split(0, key=0)
    x = np.array([comm.rank], np.int64)
    again.allreduce(x)
    mates = [r for r in range(comm.size) if r // 2 == comm.rank // 2]
    assert again.size == len(mates) and int(x[0]) == sum(mates), (again.size, x)
    return again.size


def test_deeply_nested_split(start_ranks):
    """Bug: coll_comm_split (libcoll/src/comm.c) names a child "%.150s/s<n>.<color>" after its
    parent's key, cut to 150 characters. Past ~20 levels of nesting the part that told sibling
    groups apart is cut off, so two groups that split at the same time get the same key and
    meet on the same socket: one group's rank 0 cannot listen ('Address already in use'), or
    ranks of different groups end up in one communicator."""
    import signal

    job = start_ranks(4, deep_split_rank, 32, timeout=120, env={"HBMCOLL_TIMEOUT": "10"})
    job.wait_event(1, "entering")
    time.sleep(0.3)  # rank 1 is in pair {0, 1}'s split, waiting for rank 0
    job.signal(1, signal.SIGSTOP)
    time.sleep(3.0)  # rank 0 listens from ~1 s on; pair {2, 3} meets at ~2 s
    job.signal(1, signal.SIGCONT)
    job.join()
    assert job.check() == [2, 2, 2, 2]


# ---- nonblocking collectives ---------------------------------------------------------------------

def nonblocking_rank(comm):
    P, me = comm.size, comm.rank
    chk = Checker(comm)
    n = 3 * SLOT // 4 + 3
    # overlap with computation
    a = np.full(n, float(me), np.float32)
    req = comm.iallreduce(a)
    m = np.random.default_rng(me).standard_normal((200, 200))
    for _ in range(20):
        m = m @ m.T / 200
    res = req.wait()
    chk.true(res is a and req.done, "iallreduce: wait() returns buf and done is True")
    chk.true(bool(np.all(a == sum(range(P)))), "iallreduce overlapped with compute")

    # several outstanding requests of every kind; completed in the order issued
    bufs = [np.full(1000 + i, me + i, np.int64) for i in range(4)]
    bc = np.full(77, me, np.int32)
    ga = np.full(5, me, np.float64)
    sc_out = np.zeros(3, np.int32)
    sc_in = np.arange(P * 3, dtype=np.int32).reshape(P, 3) if me == 1 % P else None
    rs = np.ones((P, 9), np.float32) * (me + 1)
    a2a = np.arange(P * 2, dtype=np.int64).reshape(P, 2) + 100 * me
    rd = np.full(11, me, np.int64)
    reqs = [comm.iallreduce(bufs[0]), comm.ibcast(bc, root=P - 1), comm.iallreduce(bufs[1], op="max"),
            comm.iallgather(ga), comm.iscatter(sc_in, root=1 % P, out=sc_out),
            comm.ireduce_scatter(rs), comm.ialltoall(a2a), comm.ireduce(rd, root=0),
            comm.igather(np.array([me], np.int32), root=P - 1), comm.ibarrier(),
            comm.iallreduce(bufs[2], op="min"), comm.iallreduce(bufs[3], op="prod")]
    last = reqs[-1].wait()  # the last one first: all before it must be done by then
    chk.true(all(r.done for r in reqs), f"in-order completion: {[r.done for r in reqs]}")
    results = [r.wait() for r in reqs[:-1]] + [last]
    chk.true(bool(np.all(bufs[0] == sum(range(P)))), "iallreduce sum")
    chk.true(bool(np.all(bc == P - 1)), "ibcast")
    chk.true(bool(np.all(bufs[1] == P - 1 + 1)), "iallreduce max")
    chk.same(results[3], np.repeat(np.arange(P, dtype=np.float64), 5).reshape(P, 5), None, "iallgather")
    chk.same(sc_out, np.arange(3, dtype=np.int32) + 3 * me, None, "iscatter")
    chk.true(bool(np.all(results[5] == P * (P + 1) / 2)), "ireduce_scatter")
    want = np.stack([np.arange(2, dtype=np.int64) + 2 * me + 100 * q for q in range(P)])
    chk.same(results[6], want, None, "ialltoall")
    if me == 0:
        chk.true(bool(np.all(rd == sum(range(P)))), "ireduce root")
    else:
        chk.true(results[7] is None, "ireduce non-root")
    if me == P - 1:
        chk.same(results[8].reshape(-1), np.arange(P, dtype=np.int32), None, "igather")
    chk.true(results[9] is None, "ibarrier")
    chk.true(bool(np.all(bufs[2] == 2)), "iallreduce min")
    chk.true(bool(np.all(bufs[3] == np.prod([r + 3 for r in range(P)]))), "iallreduce prod")

    # wait(timeout) running out raises TimeoutError but leaves the request going
    import hbmcoll
    comm.barrier()
    if me == 0:
        time.sleep(0.3)
    w = np.full(5, me, np.int64)
    req = comm.iallreduce(w)
    if me != 0 and P > 1:
        try:
            req.wait(timeout=0)
            chk.true(False, "wait(timeout=0) returned while rank 0 was away")
        except hbmcoll.TimeoutError:
            pass
    req.wait(timeout=60)
    chk.true(bool(np.all(w == sum(range(P)))), "request after a wait that timed out")

    # a request dropped without wait(): it still completes (its owner waits for it on release)
    z = np.full(33, me, np.int32)
    comm.iallreduce(z)
    chk.true(bool(np.all(z == sum(range(P)))), "dropped request")

    # mixed with blocking calls: a blocking call issued after requests completes after them
    for it in range(5):
        x = np.full(SLOT // 4 + 1, me + it, np.float32)
        r1 = comm.iallreduce(x)
        y = comm.allreduce(np.array([me], np.int64))
        chk.true(r1.done, f"it={it}: blocking call returned before the earlier request")
        r2 = comm.iallreduce(np.array([it], np.int32))
        while not r2.test():
            pass
        chk.true(int(r2.wait()[0]) == P * it, f"it={it}: test() polling")
        r1.wait(timeout=30)
        chk.true(bool(np.all(x == sum(r + it for r in range(P)))) and int(y[0]) == sum(range(P)),
                 f"it={it}: mixed results")
    return chk.done()


@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_nonblocking(run_ranks, P):
    run_ranks(P, nonblocking_rank, timeout=120)


# ---- the GIL is released while waiting -----------------------------------------------------------

def thread_rank(comm, delay):
    me = comm.rank
    counts = {}
    stop = threading.Event()
    count = [0]

    def counter():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=counter, daemon=True)
    t.start()
    for kind in ("blocking", "request"):
        comm.barrier()
        if me == 1:
            time.sleep(delay)  # everyone else waits in the collective meanwhile
        before = count[0]
        x = np.array([me], np.int64)
        if kind == "blocking":
            comm.allreduce(x)
        else:
            comm.iallreduce(x).wait()
        counts[kind] = count[0] - before
        assert int(x[0]) == sum(range(comm.size))
    stop.set()
    t.join()
    # a collective run from a thread that is not the main one (the interrupt check takes the GIL
    # from there), handed the communicator with bind_thread()
    box = []
    worker = threading.Thread(target=lambda: (comm.bind_thread(), box.append(
        comm.allreduce(np.array([me + 1], np.int64)))))
    worker.start()
    worker.join(60)
    assert box and int(box[0][0]) == comm.size * (comm.size + 1) // 2, box
    if me != 1:  # waited about `delay` seconds: the other thread must have run meanwhile
        for kind, c in counts.items():
            assert c > 10000, f"{kind}: the counting thread advanced only {c} times during the wait"
    return counts


@pytest.mark.parametrize("P", [2, 3])
def test_thread_runs_during_wait(run_ranks, P):
    run_ranks(P, thread_rank, 1.0, timeout=60)


def contended_rank(comm, rounds):
    """Two threads of one rank share a communicator: the second waits (without the GIL) until
    the first's collective is over, then runs its own at once; the calls keep their order.
    Opted in with allow_any_thread(), as the torch backend does (by default a second thread is
    refused: test_trust.py)."""
    comm._c.allow_any_thread()
    me = comm.rank
    handoffs = []
    for _ in range(rounds):
        comm.barrier()  # both ranks start together
        if me == 0:
            ended = []

            def first():
                x = comm.allreduce(np.array([1], np.int64))
                ended.append(time.monotonic())
                assert int(x[0]) == comm.size

            t = threading.Thread(target=first)
            t.start()
            time.sleep(0.3)  # `first` now waits inside allreduce for rank 1
            t0 = time.monotonic()
            comm.barrier()  # must wait for `first` to finish, not run inside it
            done = time.monotonic()
            t.join(30)
            assert ended and done - t0 > 0.4, (ended, done - t0)
            handoffs.append(done - ended[0])
        else:
            time.sleep(1.0)
            x = comm.allreduce(np.array([1], np.int64))
            assert int(x[0]) == comm.size
            comm.barrier()
    if me == 0:  # woken when the flag is given back, not at the end of a 200 ms wait slice
        assert sorted(handoffs)[len(handoffs) // 2] < 0.05, handoffs
    return me


def test_threads_share_a_communicator(run_ranks):
    run_ranks(2, contended_rank, 3, timeout=60)
