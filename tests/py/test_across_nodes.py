"""hbmcoll.init() across emulated nodes under real torchrun: namespaces on a bridge
(netnodes.py), `torchrun --nnodes 2 --node-rank R --master-addr 10.77.0.1` in each.

- 2 nodes x 2 ranks, 2 nodes x 1 rank and 2 + 1 ranks (one node with fewer): allreduce of
  float32, int32 and float64 for counts 1 to 256 Ki against NumPy, op sum/max/avg, the same
  bits on every rank for inexact float sums, bcast from every rank, barrier, allgather,
  gather/scatter/reduce to the first and last rank, reduce_scatter, alltoall, i-variants in
  flight together, torch tensors (bfloat16); split into groups that span the nodes (ordered by
  key), that stay on one node, that leave a rank out, and a split of a split;
- 10000 back-to-back 8-byte allreduces (2 x 1, 2 x 2), one rank late now and then: every result
  exact;
- ranks calling allreduce with different counts (the nodes differ, the ranks of a node differ,
  one rank differs): MismatchError on every rank, and the communicator works on;
- a rank of the second node killed: the first node's ranks get PeerLostError, no time limit;
- DDP over init_process_group("hbmcoll") across 2 x 2 ranks ends with gloo's weights (within
  float rounding: the sums are taken in another order) and the same bits on every rank; a
  new_group of one rank on each node works (its members meet through torch's store);
- a Horovod-style script (import hbmcoll.torch as hvd: broadcast_parameters, DistributedOptimizer,
  object collectives) across 2 x 2 ranks ends with the same weights on every rank;
- a Horovod-style Keras script (hbmcoll.tensorflow) across 2 x 1 ranks, the same;
- without HBMCOLL_JOB_KEY, torchrun's jobs draw a secret through its store, and hbmcoll-run's
  ranks stop at init with one clear error; so does every rank of
  both nodes when one node's bridge is on loopback, on an interface that does not exist, or
  asks for a provider that is missing.
"""
import os
import subprocess
import sys

import pytest

import netnodes

PYMOD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pymod")

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "across_job.py")


@pytest.fixture
def two_nodes(emulated_nodes):
    pytest.importorskip("torch")
    return emulated_nodes(2)


def _torchrun(nodes, per_node, port, env_extra, job=JOB, second_node_env=None):
    """torchrun on node i with per_node[i] ranks (an int: the same on both)."""
    counts = per_node if isinstance(per_node, tuple) else (per_node, per_node)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", **env_extra)
    procs = [nodes.popen(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                             "--nproc-per-node", str(counts[i]), "--master-addr", "10.77.0.1", "--master-port",
                             str(port), "--no-python", sys.executable, job],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(env, **(second_node_env or {})) if i else env)
             for i in range(2)]
    return netnodes.finish(procs, 240)


@pytest.mark.parametrize("per_node", [2, 1, (2, 1), (3, 2)], ids=["2x2", "2x1", "2+1", "3+2"])
def test_torchrun_two_nodes(two_nodes, per_node):
    counts = per_node if isinstance(per_node, tuple) else (per_node, per_node)
    res = _torchrun(two_nodes, per_node, 29720 + sum(counts), {"HBMCOLL_JOB_KEY": "k" + "7" * 31})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0, (i, out, err[-3000:])
        assert out.count(" ok") == counts[i], out
    shape = f"{counts[0]} rank{'s' * (counts[0] > 1)}" if counts[0] == counts[1] else f"{counts[0]}/{counts[1]} ranks"
    assert f"2 nodes x {shape}, {min(counts)} ring(s), bridge: provider tcp;ofi_rxm" in res[0][2], res[0][2][-2000:]


@pytest.mark.parametrize("per_node", [1, 2], ids=["2x1", "2x2"])
def test_back_to_back_small_calls_with_a_late_rank(two_nodes, per_node):
    # the meeting's eager path between nodes reuses its two areas call after call, with no credit
    res = _torchrun(two_nodes, per_node, 29760 + per_node, {"HBMCOLL_JOB_KEY": "k" * 32, "MODE": "backtoback"})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count(" ok") == per_node, (i, out, err[-3000:])


def test_ddp_across_nodes_ends_with_gloos_weights(two_nodes):
    ddp = os.path.join(os.path.dirname(JOB), "ddp_job.py")
    res = _torchrun(two_nodes, 2, 29740, {"HBMCOLL_JOB_KEY": "k" * 32, "GLOO_SOCKET_IFNAME": "hbnet0"}, ddp)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("ddp ok") == 2, (i, out, err[-3000:])


def test_horovod_style_script_across_nodes(two_nodes):
    job = os.path.join(os.path.dirname(JOB), "horovod_job.py")
    res = _torchrun(two_nodes, 2, 29745, {"HBMCOLL_JOB_KEY": "k" * 32}, job)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("horovod ok") == 2, (i, out, err[-3000:])


def test_keras_script_across_nodes(two_nodes):
    pytest.importorskip("tensorflow")
    job = os.path.join(os.path.dirname(JOB), "keras_job.py")
    res = _torchrun(two_nodes, 1, 29748, {"HBMCOLL_JOB_KEY": "k" * 32, "TF_CPP_MIN_LOG_LEVEL": "2"}, job)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("keras ok") == 1, (i, out, err[-3000:])


def test_disagreeing_nodes_are_mismatch_everywhere(two_nodes):
    res = _torchrun(two_nodes, 2, 29735, {"HBMCOLL_JOB_KEY": "k" * 32, "MODE": "mismatch"})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("mismatch: ranks disagree on the arguments of allreduce") == 8, (i, out, err[-2000:])
        assert out.count(" ok") == 2, out


@pytest.mark.parametrize("during", ["start", "pipeline"])
def test_a_lost_node_is_peer_lost_on_the_others(two_nodes, during):
    # "pipeline": killed 1 s into allreduces of 16 MiB in 4 chunks (hier_allreduce.c's sliced
    # allreduce), so most likely while a chunk is on the ring
    big = {"COUNT": str(1 << 22), "DIE_AFTER": "1", "HBMCOLL_PIPELINE_CHUNKS": "4"} if during == "pipeline" else {}
    res = _torchrun(two_nodes, 2, 29736 + (during == "pipeline"), {"HBMCOLL_JOB_KEY": "k" * 32, "MODE": "die", **big})
    rc, out, err = res[0]  # (torchrun stops a node's other ranks once one has failed)
    assert rc != 0 and "lost: the connection to the job's other nodes closed" in out, (out, err[-2000:])
    assert "hung" not in err
    # no other error: a broken connection and the node's abort are PeerLostError too
    assert "hbmcoll.SystemCallError" not in err and "hbmcoll.Error:" not in err, err[-3000:]


def test_torchrun_needs_no_secret_of_ours(two_nodes):
    """No HBMCOLL_JOB_KEY: the job draws its secret and passes it through torchrun's store."""
    res = _torchrun(two_nodes, (2, 1), 29730, {"HBMCOLL_JOB_KEY": ""})
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count(" ok") == (2, 1)[i], (i, out, err[-3000:])


def test_no_secret_is_one_clear_error(two_nodes):
    """hbmcoll-run has no store to carry a secret: without HBMCOLL_JOB_KEY it says on each node what to set."""
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="")
    procs = [two_nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", "2", "--node-rank", str(i),
                                 "--master", "10.77.0.1:29733", JOB], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
             for i in range(2)]
    for rc, out, err in netnodes.finish(procs, 60):
        assert rc != 0 and "every node needs the same secret: set HBMCOLL_JOB_KEY" in err, err[-2000:]


@pytest.mark.parametrize("bad,says", [
    ({"HBMCOLL_IFACE": "lo"}, "node node1's bridge is on a loopback interface (127.0.0.1)"),
    ({"HBMCOLL_IFACE": "nosuch0"}, "node node1 could not open its bridge endpoint"),
    ({"FI_PROVIDER": "verbs"}, "node node1 could not open its bridge endpoint"),
], ids=["loopback", "no-such-interface", "missing-provider"])
def test_a_bad_node_is_one_clear_error_everywhere(two_nodes, bad, says):
    res = _torchrun(two_nodes, 2, 29750, {"HBMCOLL_JOB_KEY": "k" * 32}, second_node_env=bad)
    for i, (rc, out, err) in enumerate(res):
        assert rc != 0 and err.count(says) == 2, (i, err[-3000:])
        assert "hung" not in err
