"""hbmcoll.init() across emulated nodes under real torchrun: namespaces on a bridge
(netnodes.py), `torchrun --nnodes 2 --node-rank R --master-addr 10.77.0.1` in each.

- 2 nodes x 2 ranks and 2 nodes x 1 rank: allreduce of float32, int32 and float64 for counts
  1 to 256 Ki against NumPy, op sum/max/avg, the same bits on every rank for inexact float
  sums, bcast from a rank of the second node, barrier; a collective not built across nodes
  yet refuses with NotSupportedError;
- ranks of different nodes calling allreduce with different counts: MismatchError on every rank,
  and the communicator works on;
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
    try:
        c.allreduce(np.ones(10 + c.node, dtype=np.float32))
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
b = np.arange(1000, dtype=np.float32) * (c.rank + 1)
c.bcast(b, root=P - 1)
assert np.array_equal(b, np.arange(1000, dtype=np.float32) * P)
c.barrier()
try:
    c.gather(np.zeros(1))
except hbmcoll.errors.NotSupportedError as e:
    assert "across nodes" in str(e)
else:
    raise AssertionError("gather across nodes did not refuse")
say("rank", c.rank, "of", c.size, "node", c.node, "ok")
c.close()
"""


@pytest.fixture
def two_nodes(emulated_nodes):
    pytest.importorskip("torch")
    return emulated_nodes(2)


def _torchrun(nodes, per_node, port, env_extra):
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", **env_extra)
    procs = [nodes.popen(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                             "--nproc-per-node", str(per_node), "--master-addr", "10.77.0.1", "--master-port",
                             str(port), "--no-python", sys.executable, "-c", RANK],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    return netnodes.finish(procs, 240)


@pytest.mark.parametrize("per_node", [2, 1])
def test_torchrun_two_nodes(two_nodes, per_node):
    res = _torchrun(two_nodes, per_node, 29720 + per_node, {"HBMCOLL_JOB_KEY": "k" + "7" * 31})
    for i, (rc, out, err) in enumerate(res):
        if rc != 0:
            open(f"/tmp/across-{i}.err", "w").write(err)
        assert rc == 0, (i, out, err[-3000:])
        assert out.count(" ok") == per_node, out
    assert f"2 nodes x {per_node} ranks, bridge: provider tcp;ofi_rxm" in res[0][2], res[0][2][-2000:]


def test_disagreeing_nodes_are_mismatch_everywhere(two_nodes):
    res = _torchrun(two_nodes, 2, 29735, {"HBMCOLL_JOB_KEY": "k" * 32, "MODE": "mismatch"})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("mismatch: ranks on different nodes disagree") == 2, (i, out, err[-2000:])
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
