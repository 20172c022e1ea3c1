"""A job on several nodes: the node's shared-memory communicator below, and the bridge's rings
between the nodes (hbmcoll.layout says who is where and builds them).

Every collective runs in C from its arguments to its result (libcoll/src/hier.h, _core.Hier):
the meeting that checks every rank's arguments (a disagreement anywhere is MismatchError on
every rank) and carries small messages, the node's stages over shared memory, the rings between
the nodes, overlapped in chunks. This class keeps the rendezvous' results, the order of the
calls and what a failure ends: any failure but a mismatch ends the job's communicator on every
rank: this node's connections close without a goodbye (the other nodes' waits end as
PeerLostError) and the node's communicator is aborted.

Calls run one at a time in call order, by libcoll's request engine: i-variants on its thread,
a blocking call in the caller's thread once those before it finished.
"""
import atexit

from .. import _core
from ..comm import Communicator, CPointToPoint, Request, _op_code
from ..errors import ArgumentError, Error, MismatchError, NotSupportedError, PeerLostError
from .. import timeline
from ..objects import ObjectCollectives
from ..vcoll import VariableCollectives


class NodesCommunicator(ObjectCollectives, VariableCollectives, CPointToPoint):
    """Communicator of a job across nodes: what hbmcoll.init() returns there."""

    def __init__(self, local, layout, bridge, watch, rank, size, timeout, launcher, iface, pool_bytes,
                 parent=None, family=0):
        self._local, self._layout, self._bridge, self._watch = local, layout, bridge, watch
        self._iface, self._pool_bytes, self._family = iface, pool_bytes, family  # for the endpoints of split()
        self._parent, self._children, self._retired = parent, [], []
        self.rank, self.size, self.launcher = rank, size, launcher
        self.node, self.nodes = layout.node, len(layout.nodes)
        self.local_rank, self.local_size = local.rank, local.size
        self._placement = local._placement
        self._timeout = timeout or 0
        self._closed = self._failed = False
        self._pc = None                         # send/recv's communicator, made last (close() may come first)
        ring = bridge if bridge is not None and self.nodes > 1 else None
        self._hier = _core.Hier(local._c, ring, self.node, self.nodes, layout.rings,
                                [layout.place(r)[0] for r in range(size)],
                                [layout.place(r)[1] for r in range(size)], self._timeout,
                                watch.fileno() if watch is not None else -1)
        local._c.allow_any_thread()             # the layer across nodes orders the calls itself
        if parent is None:
            atexit.register(self.close)         # the goodbye is collective: see close()
        else:
            parent._children.append(self)
        # send/recv in C: the layer's face, whose every rank opens a tagged endpoint (libcoll/src/nodes_p2p.c)
        self._pc = self._run(lambda: self._hier.p2p(iface, family))

    def _transports(self):
        where = self._bridge.describe() if self._bridge is not None else "through this node's ring ranks"
        return f"shared memory in the node; between nodes the bridge, {where}; send/recv over libfabric tagged messages"

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

    # -- running calls (in call order: the C layer's request engine orders them) -----------------
    def _run(self, fn):
        """Run fn; any failure but a mismatch ends the job's communicator (the C layer has ended it
        for the nodes' ranks already; here the Python side learns it)."""
        if self._closed:
            raise ArgumentError("the communicator is closed")
        if self._failed:
            raise Error("an earlier collective across nodes failed; this communicator is finished")
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
        except (MismatchError, ArgumentError, TypeError, BufferError):
            raise  # a disagreement, or this rank's arguments (found before anything moved)
        except BaseException as e:
            self._failed = True
            if self._watch is not None:
                self._watch.abort()
            # the node's other ranks learn why: a lost node is theirs too
            self._local.abort(PeerLostError if isinstance(e, PeerLostError) else None)
            raise

    def _allow_any_thread(self):
        """Calls come in the same order on every rank, from any thread (torch's contract)."""

    # -- the collectives: the arguments as on one node (Communicator's), run in C in call order ----
    _root = Communicator._root
    _reduce_args, _gather_args = Communicator._reduce_args, Communicator._gather_args
    _allgather_args, _scatter_args = Communicator._allgather_args, Communicator._scatter_args
    _reduce_scatter_args, _alltoall_args = Communicator._reduce_scatter_args, Communicator._alltoall_args

    def _run_args(self, args, result):
        self._run(lambda: self._hier.run(*args))
        return result

    def _start_args(self, args, result):
        if self._closed:
            raise ArgumentError("the communicator is closed")
        return Request(self._hier.start(*args), result)

    def barrier(self):
        """Returns once every rank of every node has called it."""
        self._run_args((_core.BARRIER,), None)

    def ibarrier(self):
        """barrier in the background: a Request."""
        return self._start_args((_core.BARRIER,), None)

    def bcast(self, buf, root=0):
        """buf of rank root to every rank, in place; returns buf."""
        return self._run_args((_core.BCAST, None, buf, 0, self._root(root)), buf)

    def ibcast(self, buf, root=0):
        """bcast in the background: a Request whose wait() gives its result."""
        return self._start_args((_core.BCAST, None, buf, 0, self._root(root)), buf)

    def allreduce(self, buf, op="sum", out=None):
        """Reduce buf over all ranks of all nodes; the result goes to out (default: buf)."""
        out = buf if out is None else out
        return self._run_args((_core.ALLREDUCE, buf, out, _op_code(op), 0), out)

    def iallreduce(self, buf, op="sum", out=None):
        """allreduce in the background: a Request whose wait() gives its result."""
        out = buf if out is None else out
        return self._start_args((_core.ALLREDUCE, buf, out, _op_code(op), 0), out)

    def reduce(self, buf, op="sum", root=0, out=None):
        """Reduce buf over all ranks into root's out (default: buf); others get None."""
        return self._run_args(*self._reduce_args(buf, op, root, out))

    def ireduce(self, buf, op="sum", root=0, out=None):
        """reduce in the background: a Request whose wait() gives its result."""
        return self._start_args(*self._reduce_args(buf, op, root, out))

    def allgather(self, buf, out=None):
        """Every rank gets out of shape (size, *buf.shape)."""
        return self._run_args(*self._allgather_args(buf, out))

    def iallgather(self, buf, out=None):
        """allgather in the background: a Request whose wait() gives its result."""
        return self._start_args(*self._allgather_args(buf, out))

    def gather(self, buf, root=0, out=None):
        """Root gets out of shape (size, *buf.shape); others get None."""
        return self._run_args(*self._gather_args(buf, root, out))

    def igather(self, buf, root=0, out=None):
        """gather in the background: a Request whose wait() gives its result."""
        return self._start_args(*self._gather_args(buf, root, out))

    def scatter(self, buf, root=0, out=None):
        """Root's buf of shape (size, *s) is split; rank i gets block i in out (shape s)."""
        return self._run_args(*self._scatter_args(buf, root, out))

    def iscatter(self, buf, root=0, out=None):
        """scatter in the background: a Request whose wait() gives its result."""
        return self._start_args(*self._scatter_args(buf, root, out))

    def reduce_scatter(self, buf, op="sum", out=None, counts=None):
        """buf of shape (size, *s) reduced over ranks; rank i gets block i (shape s). With
        counts (one per rank), buf is read flat and rank i gets counts[i] elements."""
        if counts is not None:
            return self._reduce_scatter_counts(buf, op, counts, out)
        return self._run_args(*self._reduce_scatter_args(buf, op, out))

    def ireduce_scatter(self, buf, op="sum", out=None):
        """reduce_scatter in the background: a Request whose wait() gives its result."""
        return self._start_args(*self._reduce_scatter_args(buf, op, out))

    def alltoall(self, buf, out=None):
        """Block j of rank i's buf (first dimension size) lands in block i of rank j's out."""
        return self._run_args(*self._alltoall_args(buf, out))

    def ialltoall(self, buf, out=None):
        """alltoall in the background: a Request whose wait() gives its result."""
        return self._start_args(*self._alltoall_args(buf, out))

    def empty(self, shape, dtype="float32"):
        """An array in this node\'s shared arena (hbmcoll.empty with the node\'s communicator)."""
        return self._local.empty(shape, dtype)

    # -- ending --------------------------------------------------------------------------------
    def split(self, color, key=0):
        """Ranks with equal color form a new communicator ordered by (key, rank), across nodes
        as well; color=None (or negative) joins none and gets None. Every rank calls it."""
        from .split import split
        self._hier.quiet()  # the node's communicator splits in this thread: nothing may run on it
        sub = self._run(lambda: split(self, color, key))
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
        pc = self._pc
        try:
            if pc is not None:
                pc.close()  # before the layer it borrows (Ctrl-C here still closes the rest)
        finally:
            self._close_parts()

    def _close_parts(self):
        self._hier.close()  # after the calls started (queued ones end), before the endpoint of its ring
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
        self._hier.fail()
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
