"""hbmcoll.init() across emulated nodes under real torchrun: namespaces on a bridge
(netnodes.py), `torchrun --nnodes 2 --node-rank R --master-addr 10.77.0.1` in each.

- 2 nodes x 2 ranks, 2 nodes x 1 rank and 2 + 1 ranks (one node with fewer): allreduce of
  float32, int32 and float64 for counts 1 to 256 Ki against NumPy, op sum/max/avg, the same
  bits on every rank for inexact float sums, bcast from every rank, barrier, allgather,
  gather/scatter/reduce to the first and last rank, reduce_scatter, alltoall, i-variants in
  flight together, torch tensors (bfloat16); split refuses with NotSupportedError;
- ranks calling allreduce with different counts (the nodes differ, the ranks of a node differ,
  one rank differs): MismatchError on every rank, and the communicator works on;
- a rank of the second node killed: the first node's ranks get PeerLostError, no time limit;
- without HBMCOLL_JOB_KEY every rank stops at init with one clear error.
"""
import os
import subprocess
import sys

import pytest

import netnodes

PYMOD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pymod")

RANK = r"""
import os, zlib, numpy as np, hbmcoll
def say(*words):  # one write: the node's ranks share the pipe
    os.write(1, (" ".join(map(str, words)) + "\n").encode())
c = hbmcoll.init()
P = c.size
if os.environ.get("MODE") == "mismatch":
    for n in (10 + c.node, 10 + c.local_rank, 10 + (c.rank == P - 1)):  # between nodes, inside one, one rank
        try:
            c.allreduce(np.ones(n, dtype=np.float32))
        except hbmcoll.MismatchError as e:
            say("mismatch:", e)
    x = np.ones(5, dtype=np.float32)
    c.allreduce(x)
    assert np.array_equal(x, np.full(5, P, dtype=np.float32)), x
    say("rank", c.rank, "of", c.size, "node", c.node, "ok")
    raise SystemExit(0)
if os.environ.get("MODE") == "die":
    if c.rank == P - 1:
        os.kill(os.getpid(), 9)
    try:
        while True:
            c.allreduce(np.ones(1000, dtype=np.float32))
    except hbmcoll.PeerLostError as e:
        say("lost:", e)
        raise SystemExit(5)
for dtype in (np.float32, np.int32, np.float64):
    for count in (1, 7, 1000, 1 << 18):
        x = (np.arange(count) % 13 + c.rank).astype(dtype)
        c.allreduce(x)
        want = sum((np.arange(count) % 13 + r).astype(dtype) for r in range(P))
        assert np.array_equal(x, want), (dtype, count, x[:4], want[:4])
m = np.array([c.rank, -c.rank], dtype=np.int32)
c.allreduce(m, op="max")
assert list(m) == [P - 1, 0], m
y = np.random.default_rng(c.rank).random(100001).astype(np.float32)  # inexact sums
c.allreduce(y, op="avg")
h = np.array([zlib.crc32(y.tobytes())], dtype=np.int64)
h0 = h.copy()
c.bcast(h0, root=0)
assert h0[0] == h[0], "ranks disagree on the bits of a float sum"
for root in range(P):
    b = np.arange(1000, dtype=np.float32) * (c.rank + 1)
    c.bcast(b, root=root)
    assert np.array_equal(b, np.arange(1000, dtype=np.float32) * (root + 1)), root
c.barrier()
mine = lambda r, n=5: (np.arange(n) + 100 * r).astype(np.int64)
g = c.allgather(mine(c.rank))
assert np.array_equal(g, np.stack([mine(r) for r in range(P)])), g
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
a2a = c.alltoall(np.array([[c.rank * 10 + j, j] for j in range(P)], dtype=np.int32))
assert np.array_equal(a2a, np.array([[i * 10 + c.rank, c.rank] for i in range(P)])), a2a
reqs = [c.iallreduce(np.full(3, c.rank + k, np.float64)) for k in range(4)]
reqs.append(c.iallgather(np.array([c.rank], np.int32)))
for k, q in enumerate(reqs[:4]):
    assert np.array_equal(q.wait(), np.full(3, sum(range(P)) + P * k, np.float64))
assert list(reqs[4].wait().reshape(-1)) == list(range(P))
import torch
t = torch.arange(10, dtype=torch.bfloat16) + c.rank
c.allreduce(t)
assert torch.equal(t, sum(torch.arange(10, dtype=torch.bfloat16) + r for r in range(P)))
tg = c.allgather(torch.tensor([c.rank, c.node], dtype=torch.int32))
nodes_of = [int(v) for v in tg[:, 1]]
assert [int(v) for v in tg[:, 0]] == list(range(P)) and nodes_of == sorted(nodes_of)
try:
    c.split(0)
except hbmcoll.errors.NotSupportedError as e:
    assert "across nodes" in str(e)
else:
    raise AssertionError("split across nodes did not refuse")
say("rank", c.rank, "of", c.size, "node", c.node, "ok")
c.close()
"""


@pytest.fixture
def two_nodes(emulated_nodes):
    pytest.importorskip("torch")
    return emulated_nodes(2)


def _torchrun(nodes, per_node, port, env_extra):
    """torchrun on node i with per_node[i] ranks (an int: the same on both)."""
    counts = per_node if isinstance(per_node, tuple) else (per_node, per_node)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", **env_extra)
    procs = [nodes.popen(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                             "--nproc-per-node", str(counts[i]), "--master-addr", "10.77.0.1", "--master-port",
                             str(port), "--no-python", sys.executable, "-c", RANK],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    return netnodes.finish(procs, 240)


@pytest.mark.parametrize("per_node", [2, 1, (2, 1)], ids=["2x2", "2x1", "2+1"])
def test_torchrun_two_nodes(two_nodes, per_node):
    counts = per_node if isinstance(per_node, tuple) else (per_node, per_node)
    res = _torchrun(two_nodes, per_node, 29720 + sum(counts), {"HBMCOLL_JOB_KEY": "k" + "7" * 31})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0, (i, out, err[-3000:])
        assert out.count(" ok") == counts[i], out
    shape = f"{counts[0]} ranks" if counts[0] == counts[1] else f"{counts[0]}/{counts[1]} ranks"
    assert f"2 nodes x {shape}, {min(counts)} ring(s), bridge: provider tcp;ofi_rxm" in res[0][2], res[0][2][-2000:]


def test_disagreeing_nodes_are_mismatch_everywhere(two_nodes):
    res = _torchrun(two_nodes, 2, 29735, {"HBMCOLL_JOB_KEY": "k" * 32, "MODE": "mismatch"})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("mismatch: ranks disagree on the arguments of allreduce") == 6, (i, out, err[-2000:])
        assert out.count(" ok") == 2, out


def test_a_lost_node_is_peer_lost_on_the_others(two_nodes):
    res = _torchrun(two_nodes, 2, 29736, {"HBMCOLL_JOB_KEY": "k" * 32, "MODE": "die"})
    rc, out, err = res[0]  # (torchrun stops a node's other ranks once one has failed)
    assert rc != 0 and "lost: the connection to the job's other nodes closed" in out, (out, err[-2000:])
    assert "hung" not in err


def test_no_secret_is_one_clear_error(two_nodes):
    res = _torchrun(two_nodes, 1, 29730, {"HBMCOLL_JOB_KEY": ""})
    for rc, out, err in res:
        assert rc != 0 and "set HBMCOLL_JOB_KEY to the same random string on every node" in err, err[-2000:]
