"""A job on several nodes (torchrun so far): the node's shared-memory communicator below, and
one ring of the bridge per local rank across the nodes.

Allreduce: the node's ranks allreduce over shared memory (every local rank holds the node's
sum); local rank l carries slice l of it around ring l, made of local rank l of every node, so
every core and a queue pair each of the NIC work at once; the slices come back to every local
rank by an allgather over shared memory. Each element is reduced in the same order on every
rank, so every rank gets the same bits. Bcast is the same path on the bytes, zeros from every
node but the root's (a byte sum with one term is exact). Barrier is an allreduce of one word.
The other collectives refuse, saying so: they are not built across nodes yet.

Before any data moves, every rank's ring agrees on what is called (collective, dtype, count, op,
root) by a small max-allreduce of the descriptor and its negation: every rank sees the same
verdict, so a disagreement between nodes is MismatchError on every rank. A failure of one node's
part (a local mismatch, a dead local rank) closes that node's connections without a goodbye, so
the other nodes' waits end as PeerLostError instead of hanging.

The rendezvous of each ring is hbmcoll.nodes.exchange at MASTER_ADDR, port HBMCOLL_PORT (default
MASTER_PORT + 1) plus the local rank, with the job's secret HBMCOLL_JOB_KEY, which every node must
be given (torchrun has none). The interface is HBMCOLL_IFACE, else the one this node reaches
MASTER_ADDR through.
"""
import atexit
import fcntl
import socket
import struct
import sys
import zlib

import numpy as np

from . import _core, nodes
from .errors import ArgumentError, MismatchError, NotSupportedError
from .launch_env import MultiNodeError

SIOCGIFADDR = 0x8915
_CODES = {"sum": _core.SUM, "prod": _core.PROD, "min": _core.MIN, "max": _core.MAX}


def iface_to(addr):
    """The name of the interface whose address this host uses to reach addr."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        mine = s.getsockname()[0]
        for _, name in socket.if_nameindex():
            try:
                got = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(got[20:24]) == mine:
                return name
    raise ArgumentError(f"no interface of this host has the address {mine} it reaches {addr} from; "
                        "set HBMCOLL_IFACE")


def where(env):
    """(node, master address, base port) of a torchrun job spanning nodes."""
    missing = [v for v in ("GROUP_RANK", "MASTER_ADDR", "MASTER_PORT") if v not in env]
    if missing:
        raise MultiNodeError("the job's ranks span several nodes, and across nodes hbmcoll follows torchrun "
                             f"so far (GROUP_RANK, MASTER_ADDR, MASTER_PORT); this launch lacks "
                             f"{', '.join(missing)}: run all ranks on one node, or start them with torchrun")
    if not env.get("HBMCOLL_JOB_KEY"):
        raise ArgumentError("a job across nodes needs a secret its nodes share: set HBMCOLL_JOB_KEY to "
                            "the same random string on every node (e.g. `openssl rand -hex 16`)")
    base = int(env.get("HBMCOLL_PORT") or int(env["MASTER_PORT"]) + 1)
    return int(env["GROUP_RANK"]), env["MASTER_ADDR"], base


def _flat(x):
    """A 1-D view of a contiguous NumPy array or torch tensor."""
    return x.reshape(-1) if isinstance(x, np.ndarray) else x.view(-1)


def _zeros_like(flat, n):
    return np.zeros(n, dtype=flat.dtype) if isinstance(flat, np.ndarray) else flat.new_zeros(n)


def _bytes(flat):
    if isinstance(flat, np.ndarray):
        return flat.view(np.uint8)
    import torch
    return flat.view(torch.uint8)


def _is_float(flat):
    return flat.dtype.kind == "f" if isinstance(flat, np.ndarray) else flat.is_floating_point()


class NodesCommunicator:
    """Communicator of a job across nodes: what hbmcoll.init() returns there."""

    def __init__(self, local, bridge, watch, rank, size, node, nnodes, timeout):
        self._local, self._bridge, self._watch = local, bridge, watch
        self.rank, self.size, self.node, self.nodes = rank, size, node, nnodes
        self.local_rank, self.local_size = local.rank, local.size
        self._timeout = timeout or 0
        self._closed = False
        # the goodbye is collective: a process that exits without close() would look lost
        atexit.register(self.close)

    def __repr__(self):
        return (f"<hbmcoll NodesCommunicator rank {self.rank} of {self.size}, node {self.node} of "
                f"{self.nodes}, {self._bridge.describe()}>")

    def _guard(self, fn):
        """Run fn; any failure ends the other nodes' waits too (close() then says no goodbye)."""
        try:
            return fn()
        except BaseException:
            self._watch.abort()
            raise

    def _agree(self, name, flat, op, root):
        """MismatchError on every rank unless all called name with the same dtype, count, op, root."""
        dt = str(flat.dtype)
        mine = np.array([zlib.crc32(name.encode()), zlib.crc32(dt.encode()), len(flat),
                         zlib.crc32(str(op).encode()), root], dtype=np.int64)
        both = np.concatenate([mine, -mine])
        self._guard(lambda: self._bridge.allreduce(both, _core.MAX, self._timeout))
        if not np.array_equal(both[:5], -both[5:]):
            raise MismatchError(f"ranks on different nodes disagree on the arguments of {name} (this rank: "
                                f"{dt} x {len(flat)}, op {op}, root {root}): every rank must call the same "
                                "collectives in the same order with the same arguments")

    def _across(self, flat, code):
        """flat (1-D, the node's result on every local rank) reduced across the nodes, in place."""
        n, L, me = len(flat), self.local_size, self.local_rank
        S = -(-n // L)
        lo, hi = min(me * S, n), min((me + 1) * S, n)
        self._guard(lambda: self._bridge.allreduce(flat[lo:hi], code, self._timeout))
        if L > 1:
            tmp = _zeros_like(flat, L * S)
            tmp[me * S:me * S + (hi - lo)] = flat[lo:hi]
            self._guard(lambda: self._local.allgather(tmp[me * S:(me + 1) * S], out=tmp))
            flat[:] = tmp[:n]

    def allreduce(self, buf, op="sum", out=None):
        """Reduce buf over all ranks of all nodes; the result goes to out (default: buf)."""
        out = buf if out is None else out
        avg = op == "avg"
        if not avg and op not in _CODES:
            raise ArgumentError(f"op={op!r}: across nodes sum, prod, min, max or avg")
        if avg and not _is_float(_flat(buf)):
            raise ArgumentError("op='avg' across nodes takes floating-point buffers")
        self._agree("allreduce", _flat(buf), op, -1)
        self._guard(lambda: self._local.allreduce(buf, op="sum" if avg else op, out=out))
        flat = _flat(out)
        self._across(flat, _CODES["sum" if avg else op])
        if avg:
            flat /= self.size
        return out

    def bcast(self, buf, root=0):
        """buf of rank root to every rank, in place."""
        if not 0 <= root < self.size:
            raise ArgumentError(f"root={root} is outside 0..{self.size - 1}")
        L = self.local_size
        flat = _flat(buf)
        raw = _bytes(flat)
        self._agree("bcast", flat, "-", root)
        if root // L == self.node:
            self._guard(lambda: self._local.bcast(buf, root=root % L))
        else:
            raw[:] = 0
        self._across(raw, _core.SUM)
        return buf

    def barrier(self):
        self.allreduce(np.zeros(1, dtype=np.int32))

    def close(self):
        """Collective across nodes (as the endpoints must outlive the peers' last writes)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._watch.close()
        self._bridge.close()
        self._local.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotSupportedError(f"{name}: across nodes hbmcoll has allreduce, bcast and barrier so far; "
                                "run this collective on one node, or through gloo or MPI")


def init(local, info, env, timeout, node, master, base):
    """The job's NodesCommunicator, once the node's communicator `local` stands; node, master
    and base as where(env) gave them."""
    if info.size % info.local_size:
        raise NotSupportedError(f"{info.size} ranks do not split evenly into nodes of {info.local_size}: "
                                "across nodes hbmcoll needs the same ranks on every node so far")
    nnodes = info.size // info.local_size
    iface = env.get("HBMCOLL_IFACE") or iface_to(master)
    bridge = _core.Bridge(iface)
    try:
        cards, watch = nodes.exchange(node, nnodes, master, base + info.local_rank,
                                      env["HBMCOLL_JOB_KEY"], bridge.card(), timeout)
    except BaseException:
        bridge.close()
        raise
    left, right = (node - 1) % nnodes, (node + 1) % nnodes
    peers = {m: bridge.add_peer(cards[m]) for m in {left, right} if m != node}
    if nnodes > 1:
        bridge.ring(nnodes, node, peers[left], peers[right])
    else:
        bridge.ring(1, 0, -1, -1)
    bridge.watch(watch.fileno(), "the job's other nodes")
    if info.rank == 0 and not env.get("HBMCOLL_QUIET"):
        print(f"hbmcoll: {nnodes} nodes x {info.local_size} ranks, bridge: {bridge.describe()}",
              file=sys.stderr, flush=True)
    return NodesCommunicator(local, bridge, watch, info.rank, info.size, node, nnodes, timeout)
