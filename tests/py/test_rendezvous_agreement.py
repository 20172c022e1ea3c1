"""Nodes that disagree on the job are told so at the rendezvous, on every node, with what differs
and on which node: the job's size (--nnodes or ranks per node), hbmcoll's version, the protocol
between nodes (layout._check, the rendezvous' completion rule; and a real job across emulated
nodes launched with different --nnodes, which hung node 0 until its timeout before)."""
import json
import os
import subprocess
import sys

import pytest

import netnodes
from hbmcoll import __version__, layout
from hbmcoll.errors import BootstrapError

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(HERE, "..", "..", "pymod")


def _blob(name, ranks, **head):
    h = dict(name=name, ranks=ranks, size=4, version=__version__, protocol=layout.PROTOCOL)
    h.update(head)
    return json.dumps(h).encode() + b"\0card"


@pytest.mark.parametrize("key, value, words", [("size", 6, "the job's size (ranks in all): node a has 4, b 6"),
                                               ("version", "0.0.9", "hbmcoll's version: node a has"),
                                               ("protocol", 1, "the protocol between nodes: node a has")])
def test_a_node_that_differs_is_named_with_what_differs(key, value, words):
    complete = layout._check(4)
    with pytest.raises(BootstrapError, match="disagree") as got:
        complete({0: _blob("a", [0, 1]), 1: _blob("b", [2, 3], **{key: value})})
    assert words in str(got.value)


def test_nodes_that_agree_complete():
    complete = layout._check(4)
    assert complete({0: _blob("a", [0, 1])}) is False  # still waiting for b
    assert complete({0: _blob("a", [0, 1]), 1: _blob("b", [2, 3])}) is True


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
