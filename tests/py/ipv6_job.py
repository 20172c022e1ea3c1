"""A rank of test_ipv6_nodes.py's job (2 nodes x 2 ranks, IPv6 only): collectives across the nodes
through the bridge, send/recv between the nodes, and a memory server at the master's IPv6 address.
Each rank checks its own results and prints "ipv6 ok RANK"."""
import os

import numpy as np

import hbmcoll

c = hbmcoll.init()
r, n = c.rank, c.size
assert c.nodes == 2, c.nodes
for count in (1, 1000, 300001):  # small (rides with the check), medium, large (rings, chunked)
    x = np.arange(count, dtype=np.float64) + r
    c.allreduce(x)
    assert np.array_equal(x, n * np.arange(count, dtype=np.float64) + n * (n - 1) / 2), count
    for root in range(n):
        b = np.full(count, r, np.int32)
        c.bcast(b, root=root)
        assert (b == root).all(), (count, root)
    g = c.allgather(np.full(count, r, np.int64))
    assert np.array_equal(g, np.repeat(np.arange(n), count).reshape(n, count)), count
# send/recv between the nodes (ranks 0, 1 on node 0; 2, 3 on node 1), as libfabric tagged messages over IPv6
peer = (r + 2) % n
out, got = np.full(70001, r, np.float32), np.empty(70001, np.float32)
if r < 2:
    c.send(out, peer, tag=7)
    c.recv(got, peer, tag=8)
else:
    c.recv(got, peer, tag=7)
    c.send(out, peer, tag=8)
assert (got == peer).all(), got[:4]
# the memory server that hbmcoll-run started on node 0, at [master]:port
rb = hbmcoll.RemoteBuffer("v6", (1001,), "float64")
rb.accumulate(np.ones(1001))
c.barrier()
a = rb.read()
assert (a == n).all(), (a.min(), a.max())
os.write(1, f"ipv6 ok {r} {os.environ['HBMCOLL_MEMSERVERS']}\n".encode())
