"""What the rendezvous of nodes says when it fails, on every rank of every node (emulated nodes):

- nodes that disagree on the job: what differs and on which node (the job's size, from --nnodes or
  ranks per node);
- a node that never comes: member 0 names the nodes that came and the ranks missing, in a line
  after 10 s and in its error; the node's other ranks say the same, not a timeout of their own;
- a node with another secret: it is told the listener does not hold its secret, and node 0 names
  the address it refused and why.
Before, node 0's ranks said only "rank 1 timed out after 8 s waiting for rank 0"."""
import os
import re
import subprocess
import sys

import pytest

import netnodes

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(HERE, "..", "..", "pymod")


def test_nodes_launched_with_different_nnodes_fail_at_once_on_both(emulated_nodes):
    nodes = emulated_nodes(2)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="n" * 32,
               HBMCOLL_TIMEOUT="60")
    prog = [sys.executable, "-c", "import hbmcoll; hbmcoll.init(); print('formed')"]
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "1", "--nnodes", str(2 + i), "--node-rank",
                             str(i), "--master", "10.77.0.1:29890"] + prog,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    for rc, out, err in netnodes.finish(procs, 50):  # within the 60 s a timeout would take
        assert rc != 0 and "formed" not in out, (out, err[-2000:])
        assert "the nodes disagree on the job's size (ranks in all)" in err, err[-2000:]


def _job(nodes, node_env, timeout):
    """hbmcoll-run -n 2 on each node given an environment (None: not started); their results.
    Output is tagged: two ranks failing at once would otherwise interleave their tracebacks."""
    procs = []
    for i, extra in enumerate(node_env):
        if extra is None:
            continue
        env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="s" * 32,
                   HBMCOLL_TIMEOUT=str(timeout))
        env.update(extra)
        procs.append(nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--tag-output", "--nnodes", "2",
                                     "--node-rank", str(i), "--master", "10.77.0.1:29900", sys.executable, "-c",
                                     "import hbmcoll; hbmcoll.init()"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return netnodes.finish(procs, timeout + 40)


def _errors(err):
    """The BootstrapError line of each rank (tagged '[rank] ')."""
    return [line for line in err.splitlines() if re.match(r"\[\d+\] hbmcoll\.BootstrapError", line)]


def test_a_missing_node_is_named_after_10_s_and_in_every_ranks_error(emulated_nodes):
    (rc, _, err), = _job(emulated_nodes(2), [{}, None], 14)
    assert rc != 0
    assert "the rendezvous at 10.77.0.1:29901 has waited 10 s: nodes " in err, err[-3000:]
    errors = _errors(err)
    assert len(errors) == 2 and all("missing: the nodes of ranks 2-3" in e for e in errors), err[-3000:]
    assert "timed out" not in err, err[-3000:]


def test_a_node_with_another_secret_is_named_on_both_nodes(emulated_nodes):
    (rc0, _, err0), (rc1, _, err1) = _job(emulated_nodes(2), [{}, {"HBMCOLL_JOB_KEY": "t" * 32}], 8)
    assert rc0 != 0 and rc1 != 0
    errors0 = _errors(err0)
    assert len(errors0) == 2, err0[-3000:]
    assert all("refused connections from 10.77.0.2" in e and "another HBMCOLL_JOB_KEY" in e for e in errors0), errors0
    assert err1.count("the listener at 10.77.0.1:29901 does not hold the job's secret") >= 2, err1[-3000:]
