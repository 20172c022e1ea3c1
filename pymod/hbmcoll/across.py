"""A job on several nodes: the node's shared-memory communicator below, and the bridge's rings
between the nodes (hbmcoll.layout says who is where and builds them).

Two moves between nodes carry every collective, each split over the node's ring carriers (local
ranks 0..R-1, R the fewest ranks of any node), so every carrier and a NIC queue each work at once:
- reduce: the node's result (on every local rank) is cut in R slices; carrier l reduces slice l
  around ring l; a local allgather brings the slices back to every local rank. Each element is
  reduced in the same order on every rank, so every rank gets the same bits.
- gather: the node's block of bytes (the same on every local rank) is cut in R slices; carrier l
  gathers slice l of every node around ring l; a local allgather brings them to every local rank.

allreduce is a local allreduce then a reduce, or where every local rank carries a ring, a local
reduce-scatter, each slice around its ring, and a local allgather, in chunks that overlap
(pipeline.py); reduce takes its part of it. reduce_scatter, where every node has one rank per
ring, is a local reduce-scatter and a reduce-scatter around each ring (half an allreduce's
bytes); elsewhere, or up to SMALL bytes, its part of an allreduce.
bcast is a reduce of the bytes, zeros from every node but the root's (a byte sum with one term is
exact): a ring moves what a scatter and an allgather would. allgather is a local allgather then
a gather of the node blocks (padded to the largest node); gather keeps root's copy (the root's
link carries the same bytes either way); scatter is a bcast of root's blocks, each rank keeping
its own; alltoall is a local alltoall for the node's own ranks, and where every node has one
rank per ring, shifts between the nodes (the bridge's pairwise step: each block crosses once)
then a local alltoall; elsewhere a gather of the node blocks holding each node's blocks for the
other nodes. So scatter moves more than it needs to, and alltoall does on unequal nodes.

Every call starts with one exchange of blocks of a fixed size (_meet): each rank's descriptor
(collective, dtype, count, op, root) and up to SMALL bytes of data, gathered in the node and then
between the nodes by every ring's members (ceil(log2 nodes) steps: net_ring.c's small
allgather). Every rank sees all the nodes' blocks, so every rank reaches the same verdict
and a disagreement anywhere is MismatchError on every rank. Allreduce and bcast of up to SMALL
bytes finish in that exchange (folded in node order, the same bits everywhere). Any other failure
ends the job's communicator on every rank: this node's connections close without a goodbye (the
other nodes' waits end as PeerLostError) and the node's communicator is aborted.

Calls run one at a time in call order (in_order.py): i-variants on one thread of the communicator,
a blocking call in the caller's thread once those before it finished.
"""
import atexit
import struct
import threading
import time
import zlib

import numpy as np

from . import _core, alltoall_nodes, pipeline
from .comm import _empty_like, _is_numpy, _shape
from .errors import ArgumentError, Error, MismatchError, NotSupportedError, PeerLostError
from .in_order import InOrder
from . import timeline
from .objects import ObjectCollectives
from .p2p import Channels, PointToPoint
from .vcoll import VariableCollectives

_CODES = {"sum": _core.SUM, "prod": _core.PROD, "min": _core.MIN, "max": _core.MAX}
SMALL = 1024  # bytes of data that ride with every call's descriptors (_meet)
_HEAD = 48    # the descriptor's bytes in a block: node agrees, collective, dtype, count, op, root
_NP_FOLD = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _fold(rows, like, op):
    """rows (k, nbytes, uint8) as k buffers of like's dtype, folded with op in row order (so
    every rank that folds the same rows gets the same bits): a NumPy array of like's dtype."""
    rows = np.ascontiguousarray(rows)
    if _is_numpy(like):
        vals = rows.view(like.dtype)
        acc = vals[0].copy()
        for v in vals[1:]:
            _NP_FOLD[op](acc, v, out=acc)
        return acc
    import torch
    vals = torch.from_numpy(rows).view(like.dtype)
    fold = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}[op]
    acc = vals[0].clone()
    for v in vals[1:]:
        acc = fold(acc, v)
    return acc.view(torch.uint8).numpy()


def _raw(x):
    """A 1-D uint8 NumPy view of a contiguous NumPy array or CPU torch tensor."""
    if _is_numpy(x):
        return x.reshape(-1).view(np.uint8)
    import torch
    return x.detach().reshape(-1).view(torch.uint8).numpy()


def _flat(x):
    return x.reshape(-1) if _is_numpy(x) else x.view(-1)


def _is_float(x):
    return x.dtype.kind == "f" if _is_numpy(x) else x.is_floating_point()


class NodesCommunicator(ObjectCollectives, VariableCollectives, PointToPoint):
    """Communicator of a job across nodes: what hbmcoll.init() returns there."""

    def __init__(self, local, layout, bridge, watch, rank, size, timeout, launcher, iface, pool_bytes,
                 parent=None):
        self._local, self._layout, self._bridge, self._watch = local, layout, bridge, watch
        self._iface, self._pool_bytes = iface, pool_bytes  # for the endpoints of split()
        self._parent, self._children, self._retired = parent, [], []
        self.rank, self.size, self.launcher = rank, size, launcher
        self.node, self.nodes = layout.node, len(layout.nodes)
        self.local_rank, self.local_size = local.rank, local.size
        self._placement = local._placement
        self._timeout = timeout or 0
        widest = max(len(r) for r in layout.nodes)
        # where rank r's block sits among the node blocks (padded to the widest node)
        self._order = np.array([layout.place(r)[0] * widest + layout.place(r)[1] for r in range(size)])
        self._widest = widest
        # every local rank of every node carries a ring: the sliced allreduce (pipeline.py). All
        # nodes or none, as the rings' calls must match: a node with more ranks than rings
        # would cut the message otherwise.
        self._even = all(len(r) == layout.rings for r in layout.nodes)
        self._sliced = layout.rings > 1 and self._even
        self._tuner = pipeline.Tuner(proposer=layout.node == 0 and local.rank == 0)
        self._closed = self._failed = False
        self._p2p = None                        # send/recv, made last (close() may come first)
        self._crcs = {}                         # (collective, dtype, op) -> their CRCs, for _meet
        self._block = np.zeros(_HEAD + SMALL, np.uint8)
        self._rows = np.zeros((self.local_size, _HEAD + SMALL), np.uint8)
        self._blocks = np.zeros((self.nodes, _HEAD + SMALL), np.uint8)
        self._lock = threading.Lock()           # held while a collective runs
        self._calls = InOrder(self._run)
        self._rings = None                      # the thread the rings run on beside the node stages
        local._c.allow_any_thread()             # this class orders the calls itself
        if parent is None:
            atexit.register(self.close)         # the goodbye is collective: see close()
        else:
            parent._children.append(self)
        from .layout import iface_address
        self._p2p = Channels(self, tcp_address=iface_address(iface), timeout=timeout)  # send/recv over TCP

    def _transports(self):
        where = self._bridge.describe() if self._bridge is not None else "through this node's ring ranks"
        return f"shared memory in the node; between nodes the bridge, {where}; send/recv over TCP"

    def __repr__(self):
        where = self._bridge.describe() if self._bridge is not None else "no bridge endpoint (beyond the rings)"
        return (f"<hbmcoll NodesCommunicator rank {self.rank} of {self.size}, node {self.node} of "
                f"{self.nodes}, {where}>")

    @property
    def closed(self):
        return self._closed

    @property
    def cross_rank(self):
        """Among the nodes that have this local rank (Horovod's cross rank), this node's number."""
        return sum(len(r) > self.local_rank for r in self._layout.nodes[:self.node])

    @property
    def cross_size(self):
        """How many nodes have this local rank (Horovod's cross size)."""
        return sum(len(r) > self.local_rank for r in self._layout.nodes)

    # -- running calls in order --------------------------------------------------------------
    def _run(self, fn):
        """Run fn in order with the other calls; any failure but a mismatch ends the job's communicator."""
        if self._closed:
            raise ArgumentError("the communicator is closed")
        if self._failed:
            raise Error("an earlier collective across nodes failed; this communicator is finished")
        with self._lock:
            try:
                watch = self._watch if self._parent is None else None  # a group's calls are not all ranks'
                if watch is not None and watch.began() is not None:
                    raise PeerLostError(watch.why())  # a node closed before this call: it never comes
                try:
                    return fn()
                except Error as e:  # a write to a node that left may fail otherwise first
                    why = watch.why() if watch is not None and not isinstance(e, MismatchError) else None
                    if why is None:
                        raise
                    raise PeerLostError(why) from None
            except MismatchError:
                raise
            except BaseException as e:
                self._failed = True
                if self._watch is not None:
                    self._watch.abort()
                # the node's other ranks learn why: a lost node is theirs too
                self._local.abort(PeerLostError if isinstance(e, PeerLostError) else None)
                raise

    def _call(self, fn):
        return self._calls.call(fn)

    def _start(self, fn, result):
        return self._calls.start(fn, result)

    def _ring_thread(self):
        if self._rings is None:
            self._rings = pipeline.ring_thread()
        return self._rings

    def _allow_any_thread(self):
        """Calls come in the same order on every rank, from any thread (torch's contract)."""

    # -- the two moves between nodes ------------------------------------------------------------
    def _reduce_across(self, flat, code):
        """flat (1-D, the node's result on every local rank) reduced across the nodes, in place."""
        n, L, R, me = len(flat), self.local_size, self._layout.rings, self.local_rank
        S = -(-n // R)
        lo, hi = min(me * S, n), min((me + 1) * S, n)
        if me < R and self.nodes > 1:
            self._bridge.allreduce(flat[lo:hi], code, self._timeout)
        if L > 1:
            tmp = _empty_like(flat, (L * S,))
            if me < R:
                tmp[me * S:me * S + (hi - lo)] = flat[lo:hi]
            self._local.allgather(tmp[me * S:(me + 1) * S], out=tmp)
            flat[:] = tmp[:n]

    def _gather_across(self, raw):
        """Every node's block (raw: uint8, the same length on every node and the same bytes on
        every local rank) on every rank: an (nodes, len) uint8 array."""
        B, L, R, N, me = len(raw), self.local_size, self._layout.rings, self.nodes, self.local_rank
        S = -(-B // R) if B else 0
        piece = np.zeros(N * S, np.uint8)
        if me < R:
            part = raw[me * S:min((me + 1) * S, B)]
            piece[self.node * S:self.node * S + len(part)] = part
            if N > 1 and S:
                self._bridge.allgather(piece, self._timeout)
        every = piece.reshape(1, N * S)
        if L > 1:
            every = np.empty((L, N * S), np.uint8)
            self._local.allgather(piece, out=every)
        return every[:R].reshape(R, N, S).transpose(1, 0, 2).reshape(N, R * S)[:, :B]

    def _meet(self, name, buf, op, root, data=None, node_part=None, hint=0):
        """The exchange every call starts with: each rank's descriptor (collective, dtype, count,
        op, root) and up to SMALL bytes of data, in blocks of one fixed size whatever the call,
        so ranks that disagree still exchange alike. Each of a node's ranks checks its node's
        descriptors and makes the node's block (node_part(rows): the node's data from its ranks'
        rows), and every ring gathers the node blocks.
        MismatchError on every rank unless all descriptors agree; else the nodes' data parts,
        an (nodes, SMALL) uint8 array, the same on every rank. hint (0-255) of node 0's local
        rank 0 is the call's on every rank: self._hint."""
        dt = str(buf.dtype) if buf is not None else "-"
        count = (buf.numel() if hasattr(buf, "numel") else buf.size) if buf is not None else -1
        crcs = self._crcs.get((name, dt, op))
        if crcs is None:
            crcs = self._crcs[name, dt, op] = tuple(zlib.crc32(str(w).encode()) for w in (name, dt, op))
        block, nodes = self._block, self._blocks  # (this rank's, every node's): reused, calls run one at a time
        block[:_HEAD] = np.frombuffer(struct.pack("<6q", 1 | hint << 8, crcs[0], crcs[1], count, crcs[2], root),
                                      np.uint8)
        if data is not None:
            block[_HEAD:_HEAD + len(data)] = data
        if self.local_size > 1:
            rows = self._rows
            self._local.allgather(block, out=rows)
        else:
            rows = block.reshape(1, -1)
        mine = nodes[self.node]  # the same bytes on each of the node's ranks
        mine[:_HEAD] = rows[0, :_HEAD]
        if self.local_size > 1 and not (rows[:, 8:_HEAD] == rows[0, 8:_HEAD]).all():
            mine[0] = 0  # this node's ranks disagree (byte 0 is the head's "agrees")
        elif node_part is not None:
            part = node_part(rows[:, _HEAD:])
            if part is not None:
                mine[_HEAD:_HEAD + len(part)] = part
        # every ring gathers the node blocks (a waiting carrier yields its core, a local wait
        # would spin); ranks beyond the rings get them from local rank 0
        rings = self._layout.rings
        if self.local_rank < rings and self.nodes > 1:
            self._bridge.allgather(nodes.reshape(-1), self._timeout)
        if rings < self.local_size:
            self._local.bcast(nodes, root=0)
        if not nodes[:, 0].all() or not (nodes[:, 8:_HEAD] == nodes[0, 8:_HEAD]).all():
            raise MismatchError(f"ranks disagree on the arguments of {name} (this rank, on node {self.node}: "
                                f"{dt} x {count}, op {op}, root {root}): every rank must call the same "
                                "collectives in the same order with the same arguments")
        self._hint = int(nodes[0, 1])
        return nodes[:, _HEAD:]

    def _agree(self, name, buf, op, root):
        self._meet(name, buf, op, root)

    def _root(self, root):
        if root.__class__ is not int or not 0 <= root < self.size:
            raise ArgumentError(f"root {root!r} is not a rank of this communicator (size {self.size})")
        return root

    @staticmethod
    def _op(op, buf):
        if op == "avg":
            if not _is_float(buf):
                raise ArgumentError("op='avg' takes floating-point buffers")
            return "sum"
        if op not in _CODES:
            raise ArgumentError(f"op={op!r}: across nodes sum, prod, min, max or avg")
        return op

    # -- the collectives: each checks its arguments, then runs as one call in order ------------------
    def _allreduce(self, buf, op, out):
        base = self._op(op, buf)
        raw = _raw(buf)
        if len(raw) <= SMALL:  # the data rides with the descriptors: one exchange in all
            def node_part(rows):
                return _fold(rows[:, :len(raw)], buf, base).reshape(-1).view(np.uint8)
            parts = self._meet("allreduce", buf, op, -1, raw, node_part)
            _raw(out)[:] = _fold(parts[:, :len(raw)], buf, base).reshape(-1).view(np.uint8)
        elif self._sliced:  # timed from the start, as the exchange is what the choice waits in
            t0, piece = time.perf_counter(), -(-len(raw) // self.local_size)
            self._meet("allreduce", buf, op, -1, hint=self._tuner.pick(piece))
            pipeline.allreduce_sliced(self, _flat(buf), base, _CODES[base], _flat(out), self._hint)
            self._tuner.took(piece, self._hint, time.perf_counter() - t0)
        else:
            self._agree("allreduce", buf, op, -1)
            if self.local_size > 1:
                self._local.allreduce(buf, op=base, out=out)
            elif out is not buf:  # alone on its node: nothing to reduce there
                _raw(out)[:] = _raw(buf)
            self._reduce_across(_flat(out), _CODES[base])
        if op == "avg":
            _flat(out)[:] /= self.size
        return out

    def _bcast(self, buf, root):
        node, local_root = self._layout.place(root)
        raw = _raw(buf)
        if len(raw) <= SMALL:  # root's bytes ride with the descriptors
            parts = self._meet("bcast", buf, "-", root, raw if self.rank == root else None,
                               lambda rows: rows[local_root, :len(raw)] if node == self.node else None)
            raw[:] = parts[node, :len(raw)]
            return buf
        self._agree("bcast", buf, "-", root)
        if node == self.node:
            self._local.bcast(buf, root=local_root)
        else:
            raw[:] = 0
        self._reduce_across(raw, _core.SUM)
        return buf

    def _allgather(self, buf, out, name="allgather", root=-1):
        self._agree(name, buf, "-", root)
        mine = self._local.allgather(buf)
        b = len(_raw(buf))
        block = np.zeros(self._widest * b, np.uint8)
        block[:self.local_size * b] = _raw(mine)
        every = self._gather_across(block).reshape(self.nodes * self._widest, b)
        _raw(out).reshape(self.size, b)[:] = every[self._order]
        return out

    def allreduce(self, buf, op="sum", out=None):
        """Reduce buf over all ranks of all nodes; the result goes to out (default: buf)."""
        out = buf if out is None else out
        self._op(op, buf)  # a bad op is this rank's ArgumentError, before anything moves
        return self._call(lambda: self._allreduce(buf, op, out))

    def iallreduce(self, buf, op="sum", out=None):
        """allreduce in the background: a Request whose wait() gives its result."""
        out = buf if out is None else out
        self._op(op, buf)
        return self._start(lambda: self._allreduce(buf, op, out), out)

    def reduce(self, buf, op="sum", root=0, out=None):
        """Reduce buf over all ranks into root's out (default: buf); others get None."""
        return self._call(self._reduce_fn(buf, op, root, out)[0])

    def ireduce(self, buf, op="sum", root=0, out=None):
        """reduce in the background: a Request whose wait() gives its result."""
        return self._start(*self._reduce_fn(buf, op, root, out))

    def _reduce_fn(self, buf, op, root, out):
        root = self._root(root)
        self._op(op, buf)
        res = (buf if out is None else out) if self.rank == root else None

        def fn():
            tmp = _empty_like(buf, _shape(buf))
            self._allreduce(buf, op, tmp)
            if res is not None:
                _flat(res)[:] = _flat(tmp)
            return res
        return fn, res

    def bcast(self, buf, root=0):
        """buf of rank root to every rank, in place."""
        root = self._root(root)
        return self._call(lambda: self._bcast(buf, root))

    def ibcast(self, buf, root=0):
        """bcast in the background: a Request whose wait() gives its result."""
        root = self._root(root)
        return self._start(lambda: self._bcast(buf, root), buf)

    def barrier(self):
        """Returns once every rank of every node has called it."""
        self.allreduce(np.zeros(1, dtype=np.int32))

    def ibarrier(self):
        """barrier in the background: a Request whose wait() gives its result."""
        return self.iallreduce(np.zeros(1, dtype=np.int32))

    def allgather(self, buf, out=None):
        """Every rank gets out of shape (size, *buf.shape)."""
        out = _empty_like(buf, (self.size,) + _shape(buf)) if out is None else out
        return self._call(lambda: self._allgather(buf, out))

    def iallgather(self, buf, out=None):
        """allgather in the background: a Request whose wait() gives its result."""
        out = _empty_like(buf, (self.size,) + _shape(buf)) if out is None else out
        return self._start(lambda: self._allgather(buf, out), out)

    def gather(self, buf, root=0, out=None):
        """Root gets out of shape (size, *buf.shape); others get None."""
        return self._call(self._gather_fn(buf, root, out)[0])

    def igather(self, buf, root=0, out=None):
        """gather in the background: a Request whose wait() gives its result."""
        return self._start(*self._gather_fn(buf, root, out))

    def _gather_fn(self, buf, root, out):
        root = self._root(root)
        res = None
        if self.rank == root:
            res = _empty_like(buf, (self.size,) + _shape(buf)) if out is None else out

        def fn():
            every = self._allgather(buf, _empty_like(buf, (self.size,) + _shape(buf)), "gather", root)
            if res is not None:
                _raw(res)[:] = _raw(every)
            return res
        return fn, res

    def scatter(self, buf, root=0, out=None):
        """Root's buf of shape (size, *s) is split; rank i gets block i in out (shape s)."""
        return self._call(self._scatter_fn(buf, root, out)[0])

    def iscatter(self, buf, root=0, out=None):
        """scatter in the background: a Request whose wait() gives its result."""
        return self._start(*self._scatter_fn(buf, root, out))

    def _scatter_fn(self, buf, root, out):
        root = self._root(root)
        if out is None:
            shp = _shape(buf) if buf is not None else ()
            if not shp or shp[0] != self.size:
                raise ArgumentError(f"scatter: buf's first dimension must be size ({self.size}), or pass out=")
            out = _empty_like(buf, shp[1:])

        def fn():
            whole = _empty_like(out, (self.size,) + _shape(out))
            if self.rank == root:
                _raw(whole)[:] = _raw(buf)
            self._bcast(whole, root)
            _raw(out)[:] = _raw(whole[self.rank])
            return out
        return fn, out

    def reduce_scatter(self, buf, op="sum", out=None, counts=None):
        """buf of shape (size, *s) reduced over ranks; rank i gets block i (shape s). With
        counts (one per rank), buf is read flat and rank i gets counts[i] elements."""
        if counts is not None:
            return self._reduce_scatter_counts(buf, op, counts, out)
        return self._call(self._reduce_scatter_fn(buf, op, out)[0])

    def ireduce_scatter(self, buf, op="sum", out=None):
        """reduce_scatter in the background: a Request whose wait() gives its result."""
        return self._start(*self._reduce_scatter_fn(buf, op, out))

    def _reduce_scatter_fn(self, buf, op, out):
        self._op(op, buf)
        shp = _shape(buf)
        if out is None:
            if not shp or shp[0] != self.size:
                raise ArgumentError(f"reduce_scatter: buf's first dimension must be size ({self.size}), "
                                    "or pass out=")
            out = _empty_like(buf, shp[1:])

        def fn():
            if self._even and self.nodes > 1 and len(_raw(buf)) > SMALL:
                self._reduce_scatter_rings(buf, op, out)
                return out
            tmp = _empty_like(buf, shp)
            self._allreduce(buf, op, tmp)
            n = len(_flat(out))
            _flat(out)[:] = _flat(tmp)[self.rank * n:(self.rank + 1) * n]
            return out
        return fn, out

    def _reduce_scatter_rings(self, buf, op, out):
        """Where every node has one rank per ring: local rank l of node k gets, from its node's
        reduce-scatter, the blocks of local rank l of every node (node by node), reduced over the
        node; ring l reduce-scatters those, and member k keeps segment k, its own block. Half
        the ring's bytes of an allreduce, and no allgather in the node."""
        self._agree("reduce_scatter", buf, op, -1)
        base, lay, L, N = self._op(op, buf), self._layout, self.local_size, self.nodes
        blocks = _flat(buf).reshape(self.size, -1)
        b = blocks.shape[1]
        mine = blocks[[lay.nodes[k][l] for l in range(L) for k in range(N)]].reshape(-1)  # a copy
        piece = mine
        if L > 1:
            piece = _empty_like(mine, (N * b,))
            self._local.reduce_scatter(mine, op=base, out=piece)
        self._bridge.reduce_scatter(piece, _CODES[base], self._timeout)
        _flat(out)[:] = piece[self.node * b:(self.node + 1) * b]
        if op == "avg":
            _flat(out)[:] /= self.size

    def alltoall(self, buf, out=None):
        """Block j of rank i's buf (first dimension size) lands in block i of rank j's out."""
        return self._call(self._alltoall_fn(buf, out)[0])

    def ialltoall(self, buf, out=None):
        """alltoall in the background: a Request whose wait() gives its result."""
        return self._start(*self._alltoall_fn(buf, out))

    def _alltoall_fn(self, buf, out):
        out = _empty_like(buf, _shape(buf)) if out is None else out

        def fn():
            self._agree("alltoall", buf, "-", -1)
            alltoall_nodes.alltoall(self, _raw(buf), _raw(out))
            return out
        return fn, out

    def empty(self, shape, dtype="float32"):
        """An array in this node\'s shared arena (hbmcoll.empty with the node\'s communicator)."""
        return self._local.empty(shape, dtype)

    # -- ending --------------------------------------------------------------------------------
    def split(self, color, key=0):
        """Ranks with equal color form a new communicator ordered by (key, rank), across nodes
        as well; color=None (or negative) joins none and gets None. Every rank calls it."""
        from .subnodes import split
        sub = self._call(lambda: split(self, color, key))
        return None if sub is None else timeline.made(sub)

    def close(self):
        """Collective across nodes (as the endpoints must outlive the peers' last writes): the
        sub-communicators first, then the goodbye on the parent's connections, then the
        endpoints, a sub-communicator's among them."""
        if self._closed:
            return
        for child in list(self._children):
            child.close()
        self._closed = True
        if self._p2p is not None:
            self._p2p.close()
        self._calls.stop()
        if self._rings is not None:
            self._rings.shutdown()
        if self._parent is not None:  # its endpoint closes with the parent's, after the goodbye
            self._parent._children.remove(self)
            if self._bridge is not None:
                self._parent._retired.append(self._bridge)
            self._local.close()
            return
        atexit.unregister(self.close)
        if self._watch is not None:
            if self._failed:
                self._watch.abort()
            else:
                self._watch.close()
        for bridge in [self._bridge] + self._retired:
            if bridge is not None:
                bridge.close()
        self._local.close()

    def abort(self):
        """Fail the communicator on every rank of every node."""
        self._failed = True
        if self._watch is not None:
            self._watch.abort()
        self._local.abort()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotSupportedError(f"{name}: not built across nodes yet (the collectives, their i-variants, "
                                "split() and empty() are); run it on one node, or through gloo or MPI")
