"""Who is on which node, and the bridge's rings between the nodes, for hbmcoll.init() across nodes.

Every launcher tells a rank its local rank and how many ranks share its node; the node's ranks
already stand as a communicator over shared memory. What no launcher says in the same way is
which global ranks the other nodes hold (mpiexec may place ranks round-robin, torchrun may give
nodes different counts), so the nodes tell each other:

1. The node's ranks allgather their global ranks over shared memory.
2. Local rank 0 of every node opens a bridge endpoint and meets the others at the rendezvous
   (hbmcoll.nodes, authenticated by the job's secret), bringing its node's name and ranks with its
   card. The node holding rank 0 listens. It checks that the nodes' ranks cover 0..size-1 once
   each and that no two nodes share a name; otherwise every rank gets that one error. Nodes are
   numbered by their lowest rank, so node 0 holds rank 0.
3. Local rank 0 hands the layout to its node's other ranks.
4. There is one ring per local rank that every node has (the fewest ranks of any node): local rank
   l of every node joins ring l at the rendezvous port + l. Local ranks beyond that have no
   endpoint; their data goes with their node's ring carriers.

An endpoint's pool (what the other nodes write into, registered once) is taken from the node's
shared arena, so it is placed as the node's segments are: in HBM where the node has it.

A node's name is HBMCOLL_NODE, else its hostname. The rendezvous (meeting_point) is at
HBMCOLL_MASTER, else MASTER_ADDR (torchrun sets it; under mpiexec and srun set it as for torch's
env:// init), else under srun the first node of the step; port HBMCOLL_PORT, else MASTER_PORT + 1
(MASTER_PORT itself is torch's store), else 29600; the job's secret is HBMCOLL_JOB_KEY. The
bridge's interface is HBMCOLL_IFACE, else the one this node reaches the rendezvous through; its
address family is the master address' (IPv6 for an IPv6 address or a name with only those).
"""
import atexit
import functools
import json
import os
import re
import socket
import sys
from dataclasses import dataclass

import numpy as np

from .. import _core
from . import netaddr

from . import rendezvous as nodes
from ..launch import env as launch_env
from ..launch import launcher_secret
from ..errors import ArgumentError, BootstrapError, Error, TimeoutError

# How long the nodes wait for each other at init when HBMCOLL_TIMEOUT does not say (torchrun's
# own rendezvous waits 900 s too): a node that never comes is an error, not a hang.
RENDEZVOUS_S = 900
# What the nodes say to each other at the rendezvous and after (the rings, the watch): raised at
# every change of it, so nodes running code that cannot talk are told so at once.
PROTOCOL = 2
POOL_BYTES = 4 << 20  # each endpoint's registered pool: 4 slots of about 1 MiB
LEAVE_S = 10  # after a failed init, how long a rank waits at exit for its node's others (leave_together)


@dataclass(frozen=True)
class Layout:
    nodes: tuple   # per node, its global ranks by local rank; node 0 holds rank 0
    names: tuple   # per node, its name
    node: int      # this rank's node

    # asked on every call (bcast's root, _meet): worked out once
    @functools.cached_property
    def rings(self):
        """How many rings join the nodes: the fewest ranks any node has."""
        return min(len(r) for r in self.nodes)

    @functools.cached_property
    def _places(self):
        return {r: (i, lr) for i, ranks in enumerate(self.nodes) for lr, r in enumerate(ranks)}

    def place(self, rank):
        """(node, local rank) of a global rank."""
        try:
            return self._places[rank]
        except KeyError:
            raise ArgumentError(f"rank {rank} is on no node of this job") from None


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


def _check(size):
    """The complete() of the rendezvous of local ranks 0: all nodes came, each rank once, each
    node with a bridge endpoint the others can reach."""
    from .._version import __version__
    mine = {"size": size, "version": __version__, "protocol": PROTOCOL}

    def complete(blobs):
        heads = {k: json.loads(b.split(b"\0", 1)[0]) for k, b in blobs.items()}
        for key, what in (("protocol", "the protocol between nodes"), ("version", "hbmcoll's version"),
                          ("size", "the job's size (ranks in all)")):
            differ = {h["name"]: h.get(key) for h in heads.values() if h.get(key) != mine[key]}
            if differ:
                first = next(h["name"] for h in heads.values() if h.get(key) == mine[key])
                said = ", ".join(f"{n} {v}" for n, v in differ.items())
                raise BootstrapError(f"the nodes disagree on {what}: node {first} has {mine[key]}, {said}; "
                                     "launch every node of the job alike (the same --nnodes and ranks per "
                                     "node, the same hbmcoll)")
        seen = sorted(r for h in heads.values() for r in h["ranks"])
        if len(seen) < size and len(set(seen)) == len(seen):
            return False
        if seen != list(range(size)):  # (complete.who, below, names the missing while they may come)
            raise BootstrapError(f"the nodes' ranks do not make one job of {size}: the nodes that came "
                                 f"hold {seen}; is every node's launch for the same job and size?")
        names = [h["name"] for h in heads.values()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise BootstrapError(f"several nodes call themselves {', '.join(twice)}; give each node its own "
                                 "name with HBMCOLL_NODE (by default the hostname)")
        for h in heads.values():
            if h.get("error"):
                raise BootstrapError(f"node {h['name']} could not open its bridge endpoint: {h['error']}")
            if len(heads) > 1 and netaddr.loopback(h.get("addr") or ""):
                raise BootstrapError(f"node {h['name']}'s bridge is on a loopback interface ({h['addr']}), which "
                                     "the other nodes cannot reach: set HBMCOLL_IFACE to its interface toward them")
        return True

    def who(blobs):
        heads = [json.loads(b.split(b"\0", 1)[0]) for b in blobs.values()]
        seen = {r for h in heads for r in h["ranks"]}
        return (f"nodes {', '.join(h['name'] for h in heads)} came with ranks {sorted(seen)} of {size}; missing: "
                f"the nodes of ranks {_spans(sorted(set(range(size)) - seen))}")
    complete.who = who
    return complete


def _spans(ranks):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, k = [], 0
    while k < len(ranks):
        j = k
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[k]) if j == k else f"{ranks[k]}-{ranks[j]}")
        k = j + 1
    return ", ".join(out)


def open_bridge(iface, pool_bytes, local, family=0):
    """A bridge endpoint whose pool is in local's shared arena, placed as the node's segments
    are (in HBM where the node has it); where the arena has no room, a pool of its own. family:
    that of the job's addresses (AF_INET6: the interface's IPv6 address; 0 or AF_INET: IPv4 first)."""
    confine_ports(os.environ)
    try:
        pool = local.empty(pool_bytes, "uint8")
    except (Error, MemoryError, ValueError):
        pool = None
    return _core.Bridge(iface, pool_bytes, pool, family)


def confine_ports(env):
    """With HBMCOLL_PORTS, libfabric's tcp endpoints listen within the range's bridge part (read
    by libfabric when it first loads: before any endpoint opens). A user's own FI_TCP_PORT_*
    stands."""
    ports = launch_env.port_range(env)
    if ports and "FI_TCP_PORT_LOW_RANGE" not in env and "FI_TCP_PORT_HIGH_RANGE" not in env:
        env["FI_TCP_PORT_LOW_RANGE"] = str(ports[0] + launch_env.PORTS_BRIDGE)
        env["FI_TCP_PORT_HIGH_RANGE"] = str(ports[1])


def _open(iface, pool_bytes, head, local, family):
    """This rank's bridge endpoint, its address in head; on failure None, the failure in head
    (the other nodes learn it at the rendezvous instead of waiting for this node)."""
    try:
        bridge = open_bridge(iface, pool_bytes, local, family)
    except (Error, ValueError, OSError) as exc:
        head["error"] = str(exc)
        return None
    try:
        head["addr"] = iface_address(iface, family)
    except ArgumentError:  # a libfabric domain that is no netdev (mlx5_0): nothing to check
        pass
    return bridge


def _share(local, blob):
    """Local rank 0's blob on every local rank (bytes)."""
    n = np.array([len(blob) if local.rank == 0 else 0], dtype=np.int64)
    local.bcast(n)
    buf = np.frombuffer(blob, dtype=np.uint8).copy() if local.rank == 0 else np.empty(int(n[0]), np.uint8)
    local.bcast(buf)
    return buf.tobytes()


def find(local, rank, size, name, secret, where_of, iface, timeout, pool_bytes=None, family=0):
    """(layout, bridge or None, watch or None) of this rank; where_of(l) is the rendezvous of
    ring l ((addr, port), or for the member that listens, possibly a listening socket); family
    that of the job's addresses (open_bridge)."""
    ranks = [int(r) for r in local.allgather(np.array([rank], dtype=np.int64)).reshape(-1)]
    pool_bytes = pool_bytes or POOL_BYTES
    bridge = watch = None
    shared = True  # until the layout is shared, every local rank fails alike
    timeout = timeout or RENDEZVOUS_S
    try:
        said = b""
        if local.rank == 0:
            try:
                from .._version import __version__
                head = {"name": name, "ranks": ranks, "size": size, "version": __version__, "protocol": PROTOCOL}
                bridge = _open(iface, pool_bytes, head, local, family)
                card = bridge.card() if bridge is not None else b""
                # the node's other ranks wait for this one in a collective bounded by the same time:
                # its rendezvous ends a little sooner, so they hear why instead of timing out
                first = timeout if timeout == RENDEZVOUS_S else timeout - min(2.0, timeout / 4)
                blobs, watch = nodes.exchange(min(ranks), where_of(0), secret,
                                              json.dumps(head).encode() + b"\0" + card, _check(size), first)
                parts = [blobs[k].split(b"\0", 1) for k in sorted(blobs)]
                heads = [json.loads(h) for h, _ in parts]
                said = json.dumps({"nodes": [h["ranks"] for h in heads], "names": [h["name"] for h in heads]})
                cards = [c for _, c in parts]
            except Exception as exc:  # the node's other ranks wait for the layout: they get the same error
                said = json.dumps({"error": type(exc).__name__, "why": str(exc)})
                _share(local, said.encode())
                raise
        said = json.loads(_share(local, said.encode() if said else b""))
        if "error" in said:
            raise BootstrapError(f"local rank 0 of this node failed to meet the other nodes: {said['why']}")
        layout = Layout(tuple(tuple(r) for r in said["nodes"]), tuple(said["names"]),
                        [i for i, r in enumerate(said["nodes"]) if rank in r][0])
        shared = False
        if 0 < local.rank < layout.rings:
            bridge = open_bridge(iface, pool_bytes, local, family)
            got, watch = nodes.exchange(layout.node, where_of(local.rank), secret, bridge.card(),
                                        nodes.members(len(layout.nodes)), timeout)
            cards = [got[i] for i in range(len(layout.nodes))]
        shared = False  # from here on a failure is this rank's alone
        if bridge is not None:
            ring(bridge, layout, cards)
            bridge.watch(watch.fileno(), "the job's other nodes")
            probe(bridge, layout, min(timeout, 60))
        return layout, bridge, watch
    except BaseException as exc:
        if not shared:
            local.abort()  # the node's other ranks may wait in a collective with this one
        elif isinstance(exc, Exception):
            exc.node_wide = True  # every local rank raises it (leave_together)
        if watch is not None:
            watch.abort()
        if bridge is not None:
            bridge.close()
        raise


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


def probe(bridge, layout, timeout):
    """One word around the ring, so that an endpoint the others cannot reach is an error here
    rather than a hang in the first collective."""
    try:
        bridge.allreduce(np.zeros(1, np.int32), _core.SUM, timeout)
    except TimeoutError:
        raise BootstrapError(f"the bridge's ring could not pass one word around the nodes in {timeout:.0f} s: "
                             "a node's endpoint is unreachable from its neighbour (check HBMCOLL_IFACE on "
                             f"every node, and that {', '.join(layout.names)} reach each other)") from None


def ring(bridge, layout, cards):
    """Join bridge to its ring: cards[i] is the card of this ring's member on node i."""
    n, me = len(layout.nodes), layout.node
    if n == 1:
        bridge.ring(1, 0, -1, -1)
        return
    left, right = (me - 1) % n, (me + 1) % n
    peers = {m: bridge.add_peer(cards[m]) for m in {left, right}}
    bridge.ring(n, me, peers[left], peers[right])
    for m in range(n):  # every member: the small allgather writes to members 2^k away
        if m != me:
            bridge.reach(m, peers[m] if m in peers else bridge.add_peer(cards[m]))


def say(layout, bridge, env):
    """The one line rank 0 prints about the job's nodes."""
    if env.get("HBMCOLL_QUIET"):
        return
    counts = sorted({len(r) for r in layout.nodes})
    per = f"{counts[0]} rank{'s' * (counts[0] > 1)}" if len(counts) == 1 else \
        f"{'/'.join(str(len(r)) for r in layout.nodes)} ranks"
    print(f"hbmcoll: {len(layout.nodes)} nodes x {per}, {layout.rings} ring(s), bridge: {bridge.describe()}",
          file=sys.stderr, flush=True)
