"""HBMCOLL_PORTS=LO-HI: a job across nodes listens on no port outside one range, so a firewall that
opens only that range lets it through (emulated nodes whose input is dropped by nft but for the
range): the rendezvous from LO, memory servers from LO+64, point-to-point from LO+128, the bridge's
endpoints from LO+256.
With only the rendezvous' port open, the bridge cannot connect: one clear error at init."""
import os
import subprocess
import sys

import pytest

import netnodes
from hbmcoll.launch import env as launch_env

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(HERE, "..", "..", "pymod")
JOB = os.path.join(HERE, "across_job.py")
RANGE = (30000, 30999)
SERVER = """
import numpy as np, hbmcoll
rb = hbmcoll.RemoteBuffer("w", (1000,), "float32")
rb.accumulate(np.ones(1000, np.float32))
print("server ok", flush=True)
"""


def _firewall(nodes):
    """Each node takes only what answers its own connections, and new ones to the range."""
    for name in nodes.names:
        rules = ("add table inet hbfw; add chain inet hbfw input { type filter hook input priority 0; policy drop; }; "
                 "add rule inet hbfw input iif lo accept; add rule inet hbfw input ct state established,related accept; "
                 f"add rule inet hbfw input tcp dport {RANGE[0]}-{RANGE[1]} accept")
        subprocess.run(["ip", "netns", "exec", name, "nft", rules], check=True)


def _run(nodes, env_extra, prog, memservers=0, timeout=60):
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="p" * 32,
               HBMCOLL_TIMEOUT=str(timeout))
    env.update(env_extra)
    extra = ["--memservers", str(memservers)] if memservers else []
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--nnodes", "2", "--node-rank", str(i),
                             "--master", "10.77.0.1:29990"] + extra + prog,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    return netnodes.finish(procs, timeout + 60)


def test_a_job_within_the_range_passes_the_firewall(emulated_nodes):
    nodes = emulated_nodes(2)
    _firewall(nodes)
    for i, (rc, out, err) in enumerate(_run(nodes, {"HBMCOLL_PORTS": "%d-%d" % RANGE}, [JOB])):
        assert rc == 0 and out.count(" ok") == 2, (i, out, err[-3000:])


def test_memory_servers_within_the_range_pass_the_firewall(emulated_nodes):
    nodes = emulated_nodes(2)
    _firewall(nodes)
    res = _run(nodes, {"HBMCOLL_PORTS": "%d-%d" % RANGE}, [sys.executable, "-c", SERVER], memservers=1)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("server ok") == 2, (i, out, err[-3000:])


def test_only_the_rendezvous_port_open_is_one_clear_error(emulated_nodes):
    nodes = emulated_nodes(2)
    _firewall(nodes)  # the rendezvous (HBMCOLL_PORT) in the range, the bridge's ports anywhere
    for rc, out, err in _run(nodes, {"HBMCOLL_PORT": str(RANGE[0])}, [JOB], timeout=20):
        assert rc != 0 and "BootstrapError" in err, err[-3000:]


@pytest.mark.parametrize("text", ["30000", "30000-30300", "100-2000", "30000-70000", "b-a"])
def test_a_bad_range_names_the_variable(text):
    with pytest.raises(ValueError, match="HBMCOLL_PORTS="):
        launch_env.port_range({"HBMCOLL_PORTS": text})
    assert launch_env.port_range({"HBMCOLL_PORTS": "30000-30511"}) == (30000, 30511)
