"""Where the nodes of a job meet, and through which interface, for hbmcoll.init() across nodes
(the meeting itself, the layout and the rings are libcoll's: libcoll/src/nodes_join.c).

A node's name is HBMCOLL_NODE, else its hostname. The rendezvous (meeting_point) is at
HBMCOLL_MASTER, else MASTER_ADDR (torchrun sets it; under mpiexec and srun set it as for torch's
env:// init), else under srun the first node of the step; port HBMCOLL_PORT, else MASTER_PORT + 1
(MASTER_PORT itself is torch's store), else 29600; ring l of local ranks l meets at that port + l.
The job's secret is HBMCOLL_JOB_KEY, else one drawn through torchrun's store. The bridge's
interface is HBMCOLL_IFACE, else the one this node reaches the rendezvous through; its address
family is the master address' (IPv6 for an IPv6 address or a name with only those).
"""
import atexit
import os
import re
import socket
import sys

from . import netaddr
from ..launch import env as launch_env
from ..launch import launcher_secret
from ..errors import ArgumentError

# How long the nodes wait for each other at init when HBMCOLL_TIMEOUT does not say (torchrun's
# own rendezvous waits 900 s too): a node that never comes is an error, not a hang.
RENDEZVOUS_S = 900
LEAVE_S = 10  # after a failed init, how long a rank waits at exit for its node's others (leave_together)


def _first_host(nodelist):
    """The first host of a Slurm node list: 'kn[03-05,9],gpu1' -> 'kn03'."""
    m = re.match(r"([^,\[]+)(?:\[([^-,\]]+))?", nodelist)
    return m.group(1) + (m.group(2) or "") if m else None


def meeting_point(env, launcher, timeout=RENDEZVOUS_S):
    """(address, base port, secret) where the job's nodes meet; one clear error if not given. The
    secret: HBMCOLL_JOB_KEY, else one the job draws through torchrun's store (launcher_secret)."""
    addr = netaddr.strip(env.get("HBMCOLL_MASTER") or env.get("MASTER_ADDR") or "")
    if not addr and launcher == "srun":
        addr = _first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    if not addr:
        raise ArgumentError(f"the job's ranks span several nodes ({launcher}); say where the nodes meet: set "
                            "MASTER_ADDR (or HBMCOLL_MASTER) to the address of rank 0's node on every node")
    secret = env.get("HBMCOLL_JOB_KEY") or launcher_secret.from_store(env, timeout)
    if not secret:
        raise ArgumentError("a job across nodes needs a secret its nodes share: set HBMCOLL_JOB_KEY to "
                            "the same random string on every node (e.g. `openssl rand -hex 16`); under "
                            "torchrun the job draws one itself")
    text = env.get("HBMCOLL_PORT") or ""
    try:
        ports = launch_env.port_range(env)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    if ports and text:
        raise ArgumentError("HBMCOLL_PORTS and HBMCOLL_PORT are both set: the range's first port is the "
                            "rendezvous' (HBMCOLL_PORTS alone, or HBMCOLL_PORT alone)")
    try:
        base = ports[0] + launch_env.PORTS_RINGS if ports else int(text) if text else \
            int(env["MASTER_PORT"]) + 1 if env.get("MASTER_PORT") else 29600
    except ValueError:
        raise ArgumentError(f"HBMCOLL_PORT={text!r} / MASTER_PORT={env.get('MASTER_PORT')!r}: "
                            "give a TCP port number") from None
    if not 0 < base < 65536 - 256:
        raise ArgumentError(f"the nodes' base port {base} (HBMCOLL_PORT, MASTER_PORT + 1) is out of range")
    return addr, base, secret


def iface_to(addr):
    """The name of the interface whose address this host uses to reach addr."""
    try:
        mine = netaddr.toward(addr)
    except OSError as exc:
        raise ArgumentError(f"no route from this node to the rendezvous at {addr} ({exc}); check MASTER_ADDR "
                            "/ HBMCOLL_MASTER, or set HBMCOLL_IFACE") from None
    fam = netaddr.family(addr)
    for _, name in socket.if_nameindex():
        if mine in netaddr.iface_addresses(name, fam):
            return name
    raise ArgumentError(f"no interface of this host has the address {mine} it reaches {addr} from; "
                        "set HBMCOLL_IFACE")


def iface_address(name, family=0):
    """The address of interface `name` of family (AF_INET, AF_INET6; 0: IPv4 where it has one)."""
    for fam in [family] if family else [socket.AF_INET, socket.AF_INET6]:
        got = netaddr.iface_addresses(name, fam)
        if got:
            return got[0]
    what = {socket.AF_INET: "IPv4 ", socket.AF_INET6: "global IPv6 "}.get(family, "IPv4 or global IPv6 ")
    raise ArgumentError(f"HBMCOLL_IFACE={name!r}: no {what}address on it")


def listen_address(env):
    """Where this node can be reached by the others, for a rendezvous it serves itself (mpi4py,
    torch groups): HBMCOLL_IFACE's address, else the one toward HBMCOLL_MASTER / MASTER_ADDR,
    else the hostname's (of the master address' family)."""
    master = env.get("HBMCOLL_MASTER") or env.get("MASTER_ADDR")
    if env.get("HBMCOLL_IFACE"):
        return iface_address(env["HBMCOLL_IFACE"], netaddr.family(master) if master else 0)
    if master:
        addr = netaddr.toward(master)
    else:
        host = socket.gethostname()
        addr = netaddr.resolve(host, netaddr.family(host))
    if netaddr.loopback(addr):
        raise ArgumentError(f"this node's address for the other nodes resolves to {addr}, which they cannot "
                            "reach: set HBMCOLL_IFACE to the interface toward them")
    return addr


def node_name(env):
    return env.get("HBMCOLL_NODE") or socket.gethostname()


def confine_ports(env):
    """With HBMCOLL_PORTS, libfabric's tcp endpoints listen within the range's bridge part (read
    by libfabric when it first loads: before any endpoint opens). A user's own FI_TCP_PORT_*
    stands."""
    ports = launch_env.port_range(env)
    if ports and "FI_TCP_PORT_LOW_RANGE" not in env and "FI_TCP_PORT_HIGH_RANGE" not in env:
        env["FI_TCP_PORT_LOW_RANGE"] = str(ports[0] + launch_env.PORTS_BRIDGE)
        env["FI_TCP_PORT_HIGH_RANGE"] = str(ports[1])


def leave_together(local):
    """After init failed on this node's ranks: each reports its error (an uncaught one is printed
    before atexit runs), then waits at exit, at most LEAVE_S, for the node's others to be there
    too. Launchers such as torchrun stop a node's ranks once one has exited, so a rank a loaded
    machine kept from its report a moment longer would otherwise say nothing."""
    def leave():
        try:
            local.ibarrier().wait(timeout=LEAVE_S)
        except BaseException:  # a rank that went on (or died): no more waiting
            local.abort()
        try:
            local.close()
        except BaseException:
            pass
    atexit.register(leave)


def say(comm, env):
    """The one line rank 0 prints about the job's nodes (comm: the job's Communicator)."""
    if env.get("HBMCOLL_QUIET"):
        return
    _, nodes, rings, node_of, _, bridge = comm._c.span()
    counts = [node_of.count(i) for i in range(nodes)]
    per = f"{counts[0]} rank{'s' * (counts[0] > 1)}" if len(set(counts)) == 1 else \
        f"{'/'.join(map(str, counts))} ranks"
    print(f"hbmcoll: {nodes} nodes x {per}, {rings} ring(s), bridge: {bridge}", file=sys.stderr, flush=True)
