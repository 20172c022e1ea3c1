"""The node layer between emulated nodes: namespaces on a bridge (netnodes.py), one process per
node with its own hostname, the bridge over libfabric tcp;ofi_rxm.

- three nodes meet through hbmcoll.nodes.rendezvous.exchange (secret proved both ways) and allreduce NumPy
  arrays around the bridge's ring, against NumPy;
- a member with another secret is refused and sees no card; member 0 says who never came;
- a node killed after the rendezvous: every other member gets PeerLostError, with no time limit.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

import netnodes

PYMOD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pymod")

MEMBER = r"""
import os, sys, numpy as np
import hbmcoll
from hbmcoll import _core
from hbmcoll.nodes import rendezvous as nodes
me, n, secret, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
wait = 4 if mode == "refused" else 20
bridge = _core.Bridge("hbnet0")
try:
    cards, watch = nodes.exchange(me, ("10.77.0.1", port), secret, bridge.card(), nodes.members(n), timeout=wait)
except hbmcoll.Error as e:
    print("refused:", type(e).__name__, e, flush=True)
    sys.exit(3)
peers = {m: bridge.add_peer(cards[m]) for m in {(me - 1) % n, (me + 1) % n}}
bridge.ring(n, me, peers[(me - 1) % n], peers[(me + 1) % n])
bridge.watch(watch.fileno(), "the job's other nodes")
print("host", os.uname().nodename, bridge.describe(), flush=True)
if mode == "die" and me == n - 1:
    os.kill(os.getpid(), 9)
try:
    for count in (1, 1000, 1 << 20):
        x = (np.arange(count, dtype=np.float32) % 97) * (me + 1)
        bridge.allreduce(x, _core.SUM, 0 if mode == "die" else 30)
        want = (np.arange(count, dtype=np.float32) % 97) * (n * (n + 1) // 2)
        assert np.array_equal(x, want), (count, x[:4], want[:4])
    print("ok", flush=True)
except hbmcoll.Error as e:
    watch.abort()  # the others' watches fire too
    print("lost:", type(e).__name__, e, flush=True)
    sys.exit(4)
watch.close()
"""


@pytest.fixture
def three_nodes(emulated_nodes):
    return emulated_nodes(3)


def _start(nodes, n, secrets, mode, port):
    env = dict(os.environ, FI_PROVIDER="tcp", FI_TCP_IFACE="hbnet0", PYTHONPATH=PYMOD)
    return [nodes.popen(i, [sys.executable, "-c", MEMBER, str(i), str(n), secrets[i], str(port), mode],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for i in range(n)]


def test_three_nodes_allreduce_over_the_bridge(three_nodes):
    res = netnodes.finish(_start(three_nodes, 3, ["s3cret"] * 3, "run", 29611), 60)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and "ok" in out, (i, out, err[-2000:])
        assert f"host node{i} provider tcp;ofi_rxm" in out and "interface hbnet0" in out, out


def test_a_member_without_the_secret_is_refused(three_nodes):
    res = netnodes.finish(_start(three_nodes, 3, ["s3cret", "guess", "s3cret"], "refused", 29612), 60)
    rc1, out1, _ = res[1]
    assert rc1 == 3 and "does not hold the job's secret" in out1, out1
    rc0, out0, _ = res[0]
    assert rc0 == 3 and "members [0, 2] of 3 came; missing: members [1]" in out0, out0
    assert "refused connections from 10.77.0.2" in out0 and "another HBMCOLL_JOB_KEY" in out0, out0


def test_a_killed_node_is_peer_lost_everywhere(three_nodes):
    t0 = time.monotonic()
    res = netnodes.finish(_start(three_nodes, 3, ["s3cret"] * 3, "die", 29613), timeout=60)
    assert res[2][0] == -signal.SIGKILL or res[2][0] == 128 + 9, res[2]
    for i in (0, 1):
        rc, out, err = res[i]
        assert rc == 4 and "lost: PeerLostError" in out, (i, out, err[-2000:])
    assert time.monotonic() - t0 < 50
