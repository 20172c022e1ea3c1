"""Jobs across emulated nodes that have IPv6 addresses only (netnodes.NetNodes(ipv6=True): ULA
fd00:77::1 and ::2 on hbnet0, no IPv4 on the link):

- hbmcoll-run -n 2 on 2 nodes with `--master [fd00:77::1]:PORT`: allreduce, bcast from every rank,
  allgather through the bridge (libfabric's tcp;ofi_rxm on the IPv6 address; rank 0's line names
  the fabric fd00:77::/64), send/recv between the nodes, a memory server at the master's address;
- the same job given the bare address (`--master fd00:77::1`, MASTER_ADDR without brackets);
- torchrun with `--master-addr fd00:77::1` and no HBMCOLL_JOB_KEY (the secret through torch's store);
- a master address that is no node's: node 0 says it cannot listen at [A]:P, node 1 that it found
  no member 0 listening at [A]:P, each within the rendezvous time;
- the address forms (netaddr): `[v6]:port`, bare v6, v4 and names, written back as `[A]:P`.
The C example across IPv6 nodes runs in `make example-c` (examples/c/run_nodes.sh, IPV6=1)."""
import os
import socket
import subprocess
import sys

import pytest

import netnodes
from hbmcoll.nodes import netaddr

HERE = os.path.dirname(os.path.abspath(__file__))
PYMOD = os.path.join(HERE, "..", "..", "pymod")
JOB = os.path.join(HERE, "ipv6_job.py")


def _run(nodes, master, prog, extra=(), timeout=120, env_extra=None):
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="6" * 32, **(env_extra or {}))
    env = {k: v for k, v in env.items() if k not in ("HBMCOLL_TOKEN", "MASTER_ADDR", "HBMCOLL_MASTER")}
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--nnodes", "2", "--node-rank", str(i),
                             "--master", master, *extra, *prog], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env) for i in range(2)]
    return netnodes.finish(procs, timeout)


@pytest.mark.parametrize("master", ["[fd00:77::1]:29950", "fd00:77::1"], ids=["bracketed", "bare"])
def test_a_job_across_ipv6_only_nodes(emulated_nodes, master):
    nodes = emulated_nodes(2, ipv6=True)
    port = 29950 if "]:" in master else 29500  # --master's default port
    res = _run(nodes, master, [sys.executable, JOB], ["--memservers", "1", "--memserver-capacity", "8M"])
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count("ipv6 ok") == 2, (i, out, err[-3000:])
        assert f"[fd00:77::1]:{port + 64}" in out, out  # the memory server's address as the ranks got it
    assert "bridge: provider tcp;ofi_rxm, fabric fd00:77::/64, interface hbnet0" in res[0][2], res[0][2][-2000:]


def test_torchrun_across_ipv6_only_nodes(emulated_nodes):
    """torchrun's --master-addr fd00:77::1 (MASTER_ADDR bare), and no HBMCOLL_JOB_KEY: the job's
    secret goes through torch's store over IPv6; across_job.py's collectives, splits and torch
    tensors."""
    pytest.importorskip("torch")
    nodes = emulated_nodes(2, ipv6=True)
    env = dict(os.environ, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_JOB_KEY="")
    procs = [nodes.popen(i, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(i),
                             "--nproc-per-node", "2", "--master-addr", "fd00:77::1", "--master-port", "29970",
                             "--no-python", sys.executable, os.path.join(HERE, "across_job.py")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    res = netnodes.finish(procs, 240)
    for i, (rc, out, err) in enumerate(res):
        assert rc == 0 and out.count(" ok") == 2, (i, out, err[-3000:])
    assert "fabric fd00:77::/64, interface hbnet0" in res[0][2], res[0][2][-2000:]


def test_a_wrong_ipv6_master_is_named_with_brackets(emulated_nodes):
    nodes = emulated_nodes(2, ipv6=True)
    prog = [sys.executable, "-c", "import hbmcoll; hbmcoll.init(); print('formed')"]
    (rc0, out0, err0), (rc1, out1, err1) = _run(nodes, "[fd00:77::9]:29960", prog, timeout=60,
                                                env_extra={"HBMCOLL_TIMEOUT": "8"})
    assert rc0 != 0 and "formed" not in out0 and "hung" not in err0, err0[-2000:]
    assert "member 0 cannot listen at [fd00:77::9]:29961 (Cannot assign requested address)" in err0, err0[-2000:]
    assert rc1 != 0 and "formed" not in out1 and "hung" not in err1, err1[-2000:]
    assert "found no member 0 listening at [fd00:77::9]:29961 in time" in err1, err1[-2000:]


@pytest.mark.parametrize("text, default, want", [
    ("[fd00:9::1]:29500", None, ("fd00:9::1", 29500)), ("[fd00:9::1]", 7, ("fd00:9::1", 7)),
    ("fd00:9::1", 7, ("fd00:9::1", 7)), ("10.0.0.1:8", 7, ("10.0.0.1", 8)), ("node0", 7, ("node0", 7))])
def test_address_forms(text, default, want):
    assert netaddr.split(text, default) == want
    host, port = want
    assert netaddr.join(host, port) == (f"[{host}]:{port}" if ":" in host else f"{host}:{port}")


@pytest.mark.parametrize("text", ["[fd00:9::1]x", "10.0.0.1:p", "node0"])
def test_address_forms_refused(text):
    with pytest.raises(ValueError):
        netaddr.split(text)


def test_families():
    assert netaddr.family("fd00:9::1") == netaddr.family("[fd00:9::1]") == socket.AF_INET6
    assert netaddr.family("10.0.0.1") == netaddr.family("localhost") == socket.AF_INET  # IPv4 where there is one


def test_a_bridge_without_a_usable_ipv6_address_refuses_in_one_sentence(emulated_nodes):
    """An IPv4 node's interface has a link-local IPv6 address only: a job whose addresses are IPv6
    cannot put its bridge there, and says so at once rather than handing out a card nobody reaches."""
    nodes = emulated_nodes(1)
    code = ("import socket\nfrom hbmcoll import _core\ntry:\n    _core.Bridge('hbnet0', 1 << 20, None, socket.AF_INET6)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\nelse:\n    print('opened')")
    env = dict(os.environ, PYTHONPATH=PYMOD, FI_PROVIDER="tcp")
    (rc, out, err), = netnodes.finish([nodes.popen(0, [sys.executable, "-c", code], stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True, env=env)], 60)
    assert rc == 0 and "the job's addresses are IPv6, and no libfabric provider of FI_PROVIDER=tcp offers RDM " \
        "endpoints with RMA over IPv6 on interface hbnet0" in out, (out, err[-2000:])
