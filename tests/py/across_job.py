"""The program every rank runs in the tests across emulated nodes (test_across_nodes.py,
test_launchers_across.py), whichever launcher starts it: every collective against NumPy.

MODE=mismatch: disagreeing calls, each MismatchError on every rank; MODE=backtoback: 10000 8-byte
allreduces, rank 1 sleeping now and then, every result checked; MODE=die: rank DIE (the last
by default) is killed (after DIE_AFTER s of allreduces of COUNT floats), the others loop until PeerLostError; MODE=loop: allreduce until PeerLostError; MODE=interrupt: node 0 waits in a collective that
node 1 joins late, until Ctrl-C. With an argument "mpi", the communicator comes from
mpi4py's COMM_WORLD. Each rank prints "rank R of P node N ok" when all went well.
"""
import os
import sys
import time
import zlib

import numpy as np

import hbmcoll


def say(*words):  # one write: the node's ranks share the pipe
    os.write(1, (" ".join(map(str, words)) + "\n").encode())


if sys.argv[1:] == ["mpi"]:
    from mpi4py import MPI
    c = hbmcoll.init(MPI.COMM_WORLD)
else:
    c = hbmcoll.init()
P = c.size
if os.environ.get("MODE") == "mismatch":
    # between nodes, inside one, one rank; and one node's call small enough to ride with the
    # descriptors while the other's is not
    for n in (10 + c.node, 10 + c.local_rank, 10 + (c.rank == P - 1), 10 + 990 * c.node):
        try:
            c.allreduce(np.ones(n, dtype=np.float32))
        except hbmcoll.MismatchError as e:
            say("mismatch:", e)
    x = np.ones(5, dtype=np.float32)
    c.allreduce(x)
    assert np.array_equal(x, np.full(5, P, dtype=np.float32)), x
    say("rank", c.rank, "of", c.size, "node", c.node, "ok")
    raise SystemExit(0)
if os.environ.get("MODE") == "backtoback":  # the eager path's slots reused: rank 1 late at random
    import random
    import time
    rng = random.Random(c.rank)
    x = np.empty(2, dtype=np.int32)  # 8 bytes
    for i in range(10000):
        x[:] = (c.rank * 7 + i, i % 5)
        if c.rank == 1 and rng.random() < 1 / 16:
            time.sleep(rng.random() * 3e-4)
        c.allreduce(x)
        want = (7 * P * (P - 1) // 2 + P * i, P * (i % 5))
        assert tuple(x) == want, (i, tuple(x), want)
    say("rank", c.rank, "of", c.size, "node", c.node, "ok")
    raise SystemExit(0)
if os.environ.get("MODE") == "interrupt":  # node 0 waits for node 1, which comes late
    # 80 KB: past what rides in the meeting (64 KiB with two nodes of one rank), so node 1's call needs
    # node 0 after the meeting; a call that rode would find node 0's data already there, and succeed
    big = 20000
    if c.node == 0:
        say("waiting")
        try:
            c.allreduce(np.ones(big, dtype=np.float32))
        except KeyboardInterrupt:
            say("interrupted")
            raise SystemExit(3)
    else:
        import time
        time.sleep(8)
        try:
            c.allreduce(np.ones(big, dtype=np.float32))
        except hbmcoll.PeerLostError as e:
            say("lost:", e)
            raise SystemExit(5)
    raise SystemExit(0)
if os.environ.get("MODE") in ("loop", "die"):  # until the job breaks (loop: a node's link goes down)
    if os.environ["MODE"] == "loop":
        say("looping")
    elif c.rank == int(os.environ.get("DIE", P - 1)):  # die: rank DIE (default the last) is killed,
        import threading                                  # after DIE_AFTER seconds of the loop
        threading.Timer(float(os.environ.get("DIE_AFTER", 0)), os.kill, (os.getpid(), 9)).start()
    try:
        while True:
            c.allreduce(np.ones(int(os.environ.get("COUNT", 1000)), dtype=np.float32))
    except hbmcoll.PeerLostError as e:
        say("lost:", e)
        raise SystemExit(5)
for dtype in (np.float32, np.int32, np.float64):
    for count in (1, 7, 1000, 4099, 1 << 18):
        x = (np.arange(count) % 13 + c.rank).astype(dtype)
        c.allreduce(x)
        want = sum((np.arange(count) % 13 + r).astype(dtype) for r in range(P))
        assert np.array_equal(x, want), (dtype, count, x[:4], want[:4])
iv = np.array([1, 2, -7, 2**31 - 1], dtype=np.int32) + c.rank  # avg of integers, as on one node: the
c.allreduce(iv, op="avg")                                       # wrapped sum, C's truncating division
wrapped = sum(np.array([1, 2, -7, 2**31 - 1], dtype=np.int64) + r for r in range(P)).astype(np.int32)
assert list(iv) == [int(v / P) for v in wrapped.astype(np.int64)], iv
try:  # a bad op is an ArgumentError on each rank, and the communicator goes on
    c.allreduce(np.ones(3, dtype=np.int32), op="median")
except hbmcoll.ArgumentError as e:
    assert "unknown op" in str(e), e
else:
    raise AssertionError("op='median' was taken")
m = np.array([c.rank, -c.rank], dtype=np.int32)
c.allreduce(m, op="max")
assert list(m) == [P - 1, 0], m
# inexact sums, the same bits everywhere; a size repeated, so that the chunk counts of the
# pipelined allreduce are each tried (hier_allreduce.c), and one past the choice
for _ in range(2 + 4 * 3):
    y = np.random.default_rng(c.rank).random((1 << 18) + 1).astype(np.float32)
    c.allreduce(y, op="avg")
    h = np.array([zlib.crc32(y.tobytes())], dtype=np.int64)
    h0 = h.copy()
    c.bcast(h0, root=0)
    assert h0[0] == h[0], "ranks disagree on the bits of a float sum"
    assert np.allclose(y, sum(np.random.default_rng(r).random((1 << 18) + 1) for r in range(P)) / P, rtol=1e-5)
for root in range(P):
    b = np.arange(1000, dtype=np.float32) * (c.rank + 1)
    c.bcast(b, root=root)
    assert np.array_equal(b, np.arange(1000, dtype=np.float32) * (root + 1)), root
big = np.full((3 << 20) + 5, c.rank, np.uint8)  # chunks of several ring slots, along the chain
big[::4096] = np.arange(big[::4096].size) % 251 if c.rank == P - 1 else 0
c.bcast(big, root=P - 1)
assert big[1] == P - 1 and (big[::4096] == np.arange(big[::4096].size) % 251).all() and (big[1:4096] == P - 1).all()
c.barrier()
mine = lambda r, n=5: (np.arange(n) + 100 * r).astype(np.int64)
g = c.allgather(mine(c.rank))
assert np.array_equal(g, np.stack([mine(r) for r in range(P)])), g
g = c.allgather(mine(c.rank, (3 << 17) + 3))  # 3 MiB a rank: several ring slots each
assert all(np.array_equal(g[r], mine(r, (3 << 17) + 3)) for r in range(P))
for root in (0, P - 1):
    got = c.gather(mine(c.rank, 3001), root=root)
    assert (got is None) == (c.rank != root)
    assert got is None or np.array_equal(got, np.stack([mine(r, 3001) for r in range(P)]))
    blocks = np.stack([mine(r, 7) for r in range(P)]) * (root + 1)
    got = c.scatter(blocks if c.rank == root else None, root=root, out=np.empty(7, np.int64))
    assert np.array_equal(got, mine(c.rank, 7) * (root + 1)), got
    r = c.reduce(mine(c.rank, 9).astype(np.float64), op="sum", root=root)
    assert (r is None) == (c.rank != root)
    assert r is None or np.array_equal(r, sum(mine(q, 9) for q in range(P)).astype(np.float64))
rs = c.reduce_scatter(np.stack([mine(c.rank, 4) + j for j in range(P)]).astype(np.int32))
assert np.array_equal(rs, sum(mine(q, 4) + c.rank for q in range(P)).astype(np.int32)), rs
import torch  # noqa: E402  (not before: the failure modes above do without)
for comm in (c, c.split(c.rank % 2)):  # beyond SMALL: around the rings where the layout allows
    R, Q = comm.rank, comm.size
    blocks = np.stack([np.arange(1000) * (R + 1) + j for j in range(Q)]).astype(np.float64)
    got = comm.reduce_scatter(blocks)
    assert np.array_equal(got, sum(np.arange(1000) * (q + 1) + R for q in range(Q))), (R, got[:3])
    got = comm.ireduce_scatter(torch.from_numpy(blocks).to(torch.float32), op="max").wait()
    assert torch.equal(got, torch.arange(1000, dtype=torch.float32) * Q + R), (R, got[:3])
a2a = c.alltoall(np.array([[c.rank * 10 + j, j] for j in range(P)], dtype=np.int32))
assert np.array_equal(a2a, np.array([[i * 10 + c.rank, c.rank] for i in range(P)])), a2a
big = np.arange(P * 700, dtype=np.float64).reshape(P, 700) + 1e6 * c.rank  # blocks of 5600 bytes
got = c.ialltoall(big).wait()
want = np.stack([np.arange(c.rank * 700, (c.rank + 1) * 700, dtype=np.float64) + 1e6 * i for i in range(P)])
assert np.array_equal(got, want), (got[:, :2], want[:, :2])
reqs = [c.iallreduce(np.full(3, c.rank + k, np.float64)) for k in range(4)]
reqs.append(c.iallgather(np.array([c.rank], np.int32)))
for k, q in enumerate(reqs[:4]):
    assert np.array_equal(q.wait(), np.full(3, sum(range(P)) + P * k, np.float64))
assert list(reqs[4].wait().reshape(-1)) == list(range(P))
t = torch.arange(10, dtype=torch.bfloat16) + c.rank
c.allreduce(t)
assert torch.equal(t, sum(torch.arange(10, dtype=torch.bfloat16) + r for r in range(P)))
tg = c.allgather(torch.tensor([c.rank, c.node], dtype=torch.int32))
assert [int(v) for v in tg[:, 0]] == list(range(P)) and int(tg[c.rank, 1]) == c.node
# sub-communicators: one per parity, ordered backwards (across the nodes whenever a parity
# has ranks on both), one per node, one without rank 0, and a split of a split
members = [r for r in range(P) if r % 2 == c.rank % 2][::-1]
sub = c.split(c.rank % 2, key=-c.rank)
assert (sub.rank, sub.size) == (members.index(c.rank), len(members)), (sub.rank, sub.size)
assert list(sub.allgather(np.array([c.rank], np.int64)).reshape(-1)) == members
x = np.full(3, float(c.rank))
sub.allreduce(x)
assert np.all(x == sum(members)), x
b = np.array([c.rank * 10], np.int64)
sub.bcast(b, root=sub.size - 1)
assert b[0] == members[-1] * 10, b
half = sub.split(0 if sub.rank < 2 else None)
if half is not None:
    assert half.allgather(np.array([c.rank], np.int64)).reshape(-1).tolist() == members[:2]
    half.close()
bynode = c.split(c.node)
assert bynode.size == c.local_size
rest = c.split(None if c.rank == 0 else 1)
assert (rest is None) == (c.rank == 0)
if rest is not None:
    y = np.ones(2)
    rest.allreduce(y)
    assert y[0] == P - 1, y
    rest.close()
bynode.close()
sub.close()
# point-to-point in C between every pair, across nodes and inside one, tags out of order
ahead, behind = (c.rank + 1) % P, (c.rank - 1) % P
big = np.arange(300000, dtype=np.float32) + c.rank
reqs = [c.isend(big, ahead, tag=2), c.isend(np.array([c.rank], np.int64), ahead, tag=1)]
one, got_big, st = np.empty(1, np.int64), np.empty(300000, np.float32), hbmcoll.Status()
c.recv(one, behind, tag=1, status=st)
c.recv(got_big, tag=2)
for q in reqs:
    q.wait()
assert one[0] == behind and st.source == behind and (got_big == np.arange(300000) + behind).all()
swap = np.empty(3)
c.sendrecv(np.full(3, c.rank * 1.0), P - 1 - c.rank, swap, P - 1 - c.rank)
assert (swap == P - 1 - c.rank).all(), swap
# a count per rank (v-collectives), 0 on rank 1
counts = [0 if r == 1 else r + 2 for r in range(P)]
blocks = [np.arange(counts[r], dtype=np.float64) + 10 * r for r in range(P)]
assert np.array_equal(c.allgatherv(blocks[c.rank], counts=counts), np.concatenate(blocks))
assert np.array_equal(c.alltoallv(np.full(P, c.rank, np.int32), [1] * P), np.arange(P, dtype=np.int32))
assert np.array_equal(c.reduce_scatter(np.ones(sum(counts)), counts=counts), np.full(counts[c.rank], float(P)))
mine = c.scatterv(np.concatenate(blocks) if c.rank == P - 1 else None, counts, root=P - 1, out=np.empty(counts[c.rank]))
assert np.array_equal(mine, blocks[c.rank])
got = c.gatherv(blocks[c.rank], root=0)  # the counts gathered from the blocks
assert (got is None) == (c.rank != 0) and (c.rank != 0 or np.array_equal(got, np.concatenate(blocks)))
try:  # counts that differ on one rank: refused on every rank of every node, and the job goes on
    c.allgatherv(blocks[c.rank], counts=counts[::-1] if c.rank == 0 else counts)
    raise AssertionError("allgatherv took counts that differ")
except hbmcoll.MismatchError as exc:
    assert "different counts" in str(exc), exc

# objects of a different size on every rank (mpi4py's lowercase calls)
mine = {"rank": c.rank, "pad": "x" * (c.rank * 3000)}
assert c.allgather_object(mine) == [{"rank": r, "pad": "x" * (r * 3000)} for r in range(P)]
got = c.gather_object(mine, root=P - 1)
assert (got == [{"rank": r, "pad": "x" * (r * 3000)} for r in range(P)]) if c.rank == P - 1 else got is None
assert c.bcast_object(("from", c.rank) if c.rank == 1 else None, root=1) == ("from", 1)
c.barrier()
# closing with an hbmcoll.empty array alive (on rank 0) and a split left open: the split closes
# first, and rank 0 still says goodbye (the others would wait 60 s for it)
kept = c.empty(1024, "float64") if c.rank == 0 else np.empty(1024)
kept[:] = c.rank
c.allreduce(kept)
assert (kept == sum(range(P))).all(), kept[:2]
left_open = c.split(c.rank % 2)
t0 = time.monotonic()
c.close()
assert (left_open.closed or left_open.nodes == 1) and time.monotonic() - t0 < 30, time.monotonic() - t0
assert (kept == sum(range(P))).all()  # still mapped
say("rank", c.rank, "of", c.size, "node", c.node, "ok")
