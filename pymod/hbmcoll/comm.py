"""The Communicator: the Python face of a libcoll communicator.

Arguments are checked here and in _core before any communication; the
collective itself runs in C with the GIL released. Result buffers that the
caller did not pass (out=None) are made here, of the caller's kind (NumPy
array, torch tensor, bytearray).
"""
import atexit
import hashlib
import weakref

from . import _core, timeline
from .errors import ArgumentError
from .objects import ObjectCollectives
from .p2p import ANY_SOURCE, ANY_TAG, Status, secret_of
from .vcoll import VariableCollectives

_OPS = {"sum": _core.SUM, "prod": _core.PROD, "min": _core.MIN, "max": _core.MAX,
        "avg": _core.AVG, "mean": _core.AVG, "average": _core.AVG}
_KINDS = {"barrier": _core.BARRIER, "bcast": _core.BCAST, "gather": _core.GATHER,
          "scatter": _core.SCATTER, "allgather": _core.ALLGATHER, "reduce": _core.REDUCE,
          "allreduce": _core.ALLREDUCE, "reduce_scatter": _core.REDUCE_SCATTER,
          "alltoall": _core.ALLTOALL}
_BCAST, _ALLREDUCE, _REDUCE, _GATHER = _core.BCAST, _core.ALLREDUCE, _core.REDUCE, _core.GATHER
_ALLGATHER, _SCATTER, _REDUCE_SCATTER = _core.ALLGATHER, _core.SCATTER, _core.REDUCE_SCATTER
_ALLTOALL = _core.ALLTOALL


def _op_code(op):
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op < len(set(_OPS.values())):
        return op
    code = _OPS.get(op.lower()) if isinstance(op, str) else None
    if code is None:
        raise ArgumentError(f"unknown op {op!r}: use one of sum, prod, min, max, avg")
    return code


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _is_numpy(x):
    return type(x).__module__ == "numpy"


def _empty_like(buf, shape):
    """A new uninitialised buffer like `buf` (same kind and dtype) of `shape`."""
    if _is_numpy(buf):
        import numpy as np
        return np.empty(shape, dtype=buf.dtype)
    if _is_torch(buf):
        import torch
        return torch.empty(shape, dtype=buf.dtype)
    n = 1
    for s in shape:
        n *= s
    mv = memoryview(buf)
    out = bytearray(n * mv.itemsize)
    return out if mv.format == "B" else memoryview(out).cast(mv.format)


def _shape(buf):
    if _is_numpy(buf) or _is_torch(buf):
        return tuple(buf.shape)
    mv = memoryview(buf)
    return tuple(mv.shape)


class Request:
    """A collective in flight (from an i-variant). wait() returns its result."""

    __slots__ = ("_req", "_result")

    def __init__(self, req, result):
        self._req = req
        self._result = result

    def wait(self, timeout=None):
        """The collective's result once it is done; after timeout seconds (default: no limit)
        hbmcoll.TimeoutError, and the collective stays in flight (wait again)."""
        self._req.wait(timeout)
        return self._result

    def test(self):
        """True when the collective is done (wait() then returns at once)."""
        return self._req.test()

    @property
    def done(self):
        return self._req.done


class CPointToPoint:
    """send/recv and friends in C (p2p.py says what the calls mean), on the communicator self._pc: the
    node's own (through its shared segment) or, across nodes, the layer's face (libfabric tagged
    messages, libcoll/src/nodes_p2p.c); self._timeout bounds a request's wait by default."""

    def send(self, buf, dest, tag=0):
        """buf to rank dest; returns once buf may be reused (up to 4032 bytes at once; a longer
        message once the receiver has taken it, or taken it aside while waiting itself)."""
        self._pc.send(buf, dest, tag)

    def isend(self, buf, dest, tag=0):
        """send in the background: a Request; buf must stay unchanged until it is done."""
        return _SendRequest(self._pc.isend(buf, dest, tag), self._timeout or None)

    def recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """The first message from source (any: ANY_SOURCE) with tag (any: ANY_TAG) into buf;
        returns buf. status (a Status) gets the source, tag and byte count."""
        got = self._pc.recv(buf, source, tag)
        if status is not None:
            status.source, status.tag, status.nbytes = got
        return buf

    def irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """recv in the background: a Request whose wait() gives buf and whose .status says what came."""
        return _RecvRequest(self._pc.irecv(buf, source, tag), buf, status, self._timeout or None)

    def sendrecv(self, sendbuf, dest, recvbuf, source=ANY_SOURCE, sendtag=0, recvtag=ANY_TAG, status=None):
        """sendbuf to dest and a message from source into recvbuf at once (no deadlock when two
        ranks swap); returns recvbuf."""
        got = _RecvRequest(self._pc.irecv(recvbuf, source, recvtag), recvbuf, status, self._timeout or None)
        try:
            self._pc.send(sendbuf, dest, sendtag)
        except BaseException:
            got._req.cancel()  # no later message lands in recvbuf
            raise
        return got.wait()


class Communicator(ObjectCollectives, VariableCollectives, CPointToPoint):
    """Processes that run collectives together, on one node or across nodes.

    Every rank must call the same collectives in the same order with matching
    counts, dtypes, ops and roots; if they do not, all get MismatchError.
    After any other failure (PeerLostError, TimeoutError, Ctrl-C) the
    communicator is closed for good; across nodes on every rank of every node.

    Across nodes (libcoll/src/nodes_comm.c) each call runs in C from its arguments
    to its result: the meeting of every rank's arguments, the node's stages over
    shared memory and the bridge's rings between the nodes, overlapped in chunks;
    send/recv go over libfabric tagged messages. node and nodes say where this
    rank is; close() there is collective (the endpoints outlive the peers' last
    writes), and runs at exit when the script does not call it.
    """

    def __init__(self, core, local_rank=None, local_size=None, launcher="single", placement=None, timeout=None,
                 key=None, secret=None, listener=None):
        self._c = core
        self.rank = core.rank
        self.size = core.size
        self.node, self.nodes, self._per_node = 0, 1, (self.size,)
        span = core.span()
        if span is not None:  # across nodes
            self.node, self.nodes, _, node_of, local_of, _ = span
            self._per_node = tuple(node_of.count(i) for i in range(self.nodes))
            local_rank, local_size = local_of[self.rank], self._per_node[self.node]
            atexit.register(self.close)  # the goodbye is collective: see close()
        self.local_rank = self.rank if local_rank is None else local_rank
        self.local_size = self.size if local_size is None else local_size
        self.launcher = launcher
        self._placement = placement
        self._timeout = timeout if timeout is not None else _core.env_check()
        # send/recv run in C through the shared segment (libcoll/src/p2p*.c); the secret names
        # split communicators; a socket bound for the old path (listener) is not needed
        self._secret = secret if secret is not None else secret_of(key or "")
        self._splits = 0
        self._spanning = []  # weak references to its splits across nodes: close() ends them first
        if listener is not None:
            listener.close()

    @property
    def _pc(self):  # send/recv's communicator (CPointToPoint): this one
        return self._c

    @property
    def pu(self):
        """The PU (OS index) this rank is pinned to, or None."""
        return self._placement.pu if self._placement is not None else None

    @property
    def single_copy(self):
        """The collectives ("bcast", "gather") whose large messages copy straight between the
        ranks' own buffers, empty when none: asked for with HBMCOLL_CMA (1, gather, bcast; "auto",
        the default, gather unless staging measured faster at creation; python -m hbmcoll.tune
        measures which pays on the host), and process_vm_readv/writev
        works between every pair (not across PID namespaces, nor where seccomp or Yama refuse
        it). Otherwise they stage through the shared segment."""
        kinds = self._c.single_copy
        return tuple(name for name, k in (("bcast", _BCAST), ("gather", _GATHER)) if kinds >> k & 1)

    @property
    def single_copy_probe(self):
        """What the communicator measured when it was made, with HBMCOLL_CMA=auto (the default):
        {"bytes": what each rank gathered, "us": rank 0's (staged, single copy) best batches, which
        decided for all}, or None
        without a probe (single copy does not work here, another HBMCOLL_CMA word, or fewer
        CPUs than ranks, where single copy stays). `single_copy` says what was kept."""
        nbytes, staged, single = self._c.single_copy_probe
        return {"bytes": nbytes, "us": (staged * 1e6, single * 1e6)} if nbytes else None

    @property
    def staging(self):
        """How this rank writes the chunks it stages for its peers: {"streaming_from": bytes
        from which it uses streaming stores (None: never), "probe_us": the best batch of the
        probe the communicator ran when it was made, (ordinary, streaming) in microseconds, or
        None without a probe}. HBMCOLL_STAGE_STREAM_MIN sets it; "auto" (the default) measures."""
        start, ordinary, streaming = self._c.staging
        return {"streaming_from": start or None,
                "probe_us": (ordinary * 1e6, streaming * 1e6) if ordinary else None}

    def __repr__(self):
        where = f", node {self.node} of {self.nodes}" if self.nodes > 1 else ""
        return f"<hbmcoll.Communicator rank {self.rank} of {self.size}{where}>"

    # -- helpers ---------------------------------------------------------------
    def _root(self, root):
        if not isinstance(root, int) or isinstance(root, bool):
            raise TypeError("root must be an int")
        if not 0 <= root < self.size:
            raise ArgumentError(f"root {root} is not a rank of this communicator (size {self.size})")
        return root

    # -- collectives -----------------------------------------------------------
    def barrier(self):
        """Returns once every rank has called it."""
        self._c.run(_core.BARRIER)

    def ibarrier(self):
        """barrier in the background: a Request."""
        return Request(self._c.start(_core.BARRIER), None)

    def bcast(self, buf, root=0):
        """Broadcast root's buf into every rank's buf, in place; returns buf."""
        self._c.run(_BCAST, None, buf, 0, root if root.__class__ is int else self._root(root))
        return buf

    def allreduce(self, buf, op="sum", out=None):
        """Reduce buf over all ranks; the result goes to out (default: buf, in place)."""
        if out is None:
            out = buf
        self._c.run(_ALLREDUCE, buf, out, _OPS.get(op) if op in _OPS else _op_code(op), 0)
        return out

    def _reduce_args(self, buf, op, root, out):
        root = self._root(root)
        if self.rank == root:
            return (_REDUCE, buf, buf if out is None else out, _op_code(op), root), \
                buf if out is None else out
        return (_REDUCE, buf, None, _op_code(op), root), None

    def reduce(self, buf, op="sum", root=0, out=None):
        """Reduce buf over all ranks into root's out (default: buf); others get None."""
        if root.__class__ is int and 0 <= root < self.size and op in _OPS:  # the hot path
            if self.rank != root:
                self._c.run(_REDUCE, buf, None, _OPS[op], root)
                return None
            if out is None:
                out = buf
            self._c.run(_REDUCE, buf, out, _OPS[op], root)
            return out
        args, res = self._reduce_args(buf, op, root, out)
        self._c.run(*args)
        return res

    def _gather_args(self, buf, root, out):
        root = self._root(root)
        if self.rank != root:
            return (_GATHER, buf, None, 0, root), None
        if out is None:
            out = _empty_like(buf, (self.size,) + _shape(buf))
        return (_GATHER, buf, out, 0, root), out

    def gather(self, buf, root=0, out=None):
        """Root gets out of shape (size, *buf.shape); others get None."""
        if root.__class__ is int and 0 <= root < self.size:  # the hot path: no tuples
            if self.rank != root:
                self._c.run(_GATHER, buf, None, 0, root)
                return None
            if out is not None:
                self._c.run(_GATHER, buf, out, 0, root)
                return out
        args, res = self._gather_args(buf, root, out)
        self._c.run(*args)
        return res

    def _allgather_args(self, buf, out):
        if out is None:
            out = _empty_like(buf, (self.size,) + _shape(buf))
        return (_ALLGATHER, buf, out, 0, 0), out

    def allgather(self, buf, out=None):
        """Every rank gets out of shape (size, *buf.shape)."""
        args, res = self._allgather_args(buf, out)
        self._c.run(*args)
        return res

    def _scatter_args(self, buf, root, out):
        root = self._root(root)
        if out is None:
            if buf is None:
                raise ArgumentError("scatter: pass out= (the shape of one block) on every rank")
            shp = _shape(buf)
            if not shp or shp[0] != self.size:
                raise ArgumentError(f"scatter: buf's first dimension must be size ({self.size})")
            out = _empty_like(buf, shp[1:])
        return (_SCATTER, buf if self.rank == root else None, out, 0, root), out

    def scatter(self, buf, root=0, out=None):
        """Root's buf of shape (size, *s) is split; rank i gets block i in out (shape s).
        Non-roots may pass buf=None with out=, or a buf of the full shape to size out."""
        args, res = self._scatter_args(buf, root, out)
        self._c.run(*args)
        return res

    def _reduce_scatter_args(self, buf, op, out):
        if out is None:
            shp = _shape(buf)
            if not shp or shp[0] != self.size:
                raise ArgumentError(f"reduce_scatter: buf's first dimension must be size ({self.size}), or pass out=")
            out = _empty_like(buf, shp[1:])
        return (_REDUCE_SCATTER, buf, out, _op_code(op), 0), out

    def reduce_scatter(self, buf, op="sum", out=None, counts=None):
        """buf of shape (size, *s) reduced over ranks; rank i gets block i (shape s). With
        counts (one per rank), buf is read flat and rank i gets counts[i] elements."""
        if counts is not None:
            try:
                code = _op_code(op)
            except (ArgumentError, AttributeError):
                code = -1  # refused on every rank (C), not here alone while the others wait
            return self._reduce_scatter_counts(buf, code, counts, out)
        args, res = self._reduce_scatter_args(buf, op, out)
        self._c.run(*args)
        return res

    def _alltoall_args(self, buf, out):
        if out is None:
            out = _empty_like(buf, _shape(buf))
        return (_ALLTOALL, buf, out, 0, 0), out

    def alltoall(self, buf, out=None):
        """Block j of rank i's buf (first dimension size) lands in block i of rank j's out."""
        args, res = self._alltoall_args(buf, out)
        self._c.run(*args)
        return res

    # -- nonblocking: same arguments, return a Request whose wait() gives the result
    def _start(self, args, result):
        return Request(self._c.start(*args), result)

    def ibcast(self, buf, root=0):
        """bcast in the background: a Request whose wait() gives its result."""
        return self._start((_BCAST, None, buf, 0, self._root(root)), buf)

    def iallreduce(self, buf, op="sum", out=None):
        """allreduce in the background: a Request whose wait() gives its result."""
        out = buf if out is None else out
        return self._start((_ALLREDUCE, buf, out, _op_code(op), 0), out)

    def ireduce(self, buf, op="sum", root=0, out=None):
        """reduce in the background: a Request whose wait() gives its result."""
        return self._start(*self._reduce_args(buf, op, root, out))

    def igather(self, buf, root=0, out=None):
        """gather in the background: a Request whose wait() gives its result."""
        return self._start(*self._gather_args(buf, root, out))

    def iallgather(self, buf, out=None):
        """allgather in the background: a Request whose wait() gives its result."""
        return self._start(*self._allgather_args(buf, out))

    def iscatter(self, buf, root=0, out=None):
        """scatter in the background: a Request whose wait() gives its result."""
        return self._start(*self._scatter_args(buf, root, out))

    def ireduce_scatter(self, buf, op="sum", out=None):
        """reduce_scatter in the background: a Request whose wait() gives its result."""
        return self._start(*self._reduce_scatter_args(buf, op, out))

    def ialltoall(self, buf, out=None):
        """alltoall in the background: a Request whose wait() gives its result."""
        return self._start(*self._alltoall_args(buf, out))

    # -- communicators ---------------------------------------------------------
    def split(self, color, key=0):
        """Ranks with equal color form a new communicator ordered by (key, rank);
        color=None (or negative) joins none and gets None."""
        sub = self._split(color, key)
        return None if sub is None else timeline.made(sub)

    def _split(self, color, key=0):
        c = -1 if color is None else int(color)
        sub = self._c.split(c, int(key))
        self._splits += 1  # every rank splits alike: the count and the color name the sub's secret
        secret = hashlib.sha256(self._secret + b"split %d %d" % (self._splits, c)).digest()
        if sub is None:
            return None
        made = Communicator(sub, launcher=self.launcher, placement=self._placement, timeout=self._timeout,
                            secret=secret)
        if made.nodes > 1:  # its goodbye goes over this one's connections: before this one's
            self._spanning.append(weakref.ref(made))
        return made

    def set_algorithm(self, collective, name):
        """Force an algorithm ("flat", "rsag", ... or "auto") for one collective,
        on every rank alike (HBMCOLL_ALGO does the same from the environment)."""
        if collective not in _KINDS:
            raise ArgumentError(f"unknown collective {collective!r}: one of {', '.join(_KINDS)}")
        self._c.set_algorithm(_KINDS[collective], name)

    def empty(self, shape, dtype="float32"):
        """hbmcoll.empty(shape, dtype, comm=self)."""
        return empty(shape, dtype, comm=self)

    def _allow_any_thread(self):
        """Calls may come from any thread, in the same order on every rank (torch's contract)."""
        self._c.allow_any_thread()

    def bind_thread(self):
        """Make the calling thread the one that issues this communicator's collectives.

        Collectives from two threads could pair up differently on each rank, so only one
        thread may issue them: the one that created the communicator, until another calls
        bind_thread() (after the first has stopped using it). Others get hbmcoll.Error at
        once. Request.wait()/test(), close() and hbmcoll.empty() work from any thread."""
        self._c.bind_thread()

    def close(self):
        """Leave the communicator (its segments go when the last rank has left). Across nodes
        it is collective between the nodes: each waits, at most 60 s, for the others' goodbye."""
        for ref in reversed(self._spanning):  # newest first, as on every rank: each goodbye is collective
            sub = ref()
            if sub is not None:
                sub.close()
        self._spanning = []
        atexit.unregister(self.close)
        self._c.close()

    def abort(self, reason=None):
        """Fail the communicator on every rank: they raise Error, or reason's class (an
        hbmcoll.Error subclass, e.g. PeerLostError when this rank lost a peer elsewhere)."""
        if reason is None:
            self._c.abort()
        else:
            self._c.abort(reason.code)

    @property
    def closed(self):
        return self._c.closed

    def _transports(self):
        if self.nodes > 1:
            span = self._c.span()  # None once closed
            return (f"shared memory in the node; between nodes the bridge, {span[5] if span else '(closed)'}; "
                    "send/recv over libfabric tagged messages")
        return ("shared memory" + (f" (single copy for large {' and '.join(self.single_copy)})"
                                   if self.single_copy else "") +
                "; send/recv over shared memory")

    @property
    def cross_rank(self):
        """Among the nodes that have this local rank (Horovod's cross rank), this node's number."""
        return sum(n > self.local_rank for n in self._per_node[:self.node])

    @property
    def cross_size(self):
        """How many nodes have this local rank (Horovod's cross size)."""
        return sum(n > self.local_rank for n in self._per_node)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def meet(rank, size, key, timeout, placement, launcher, local_rank=None, local_size=None, wait=None):
    """The Communicator of the ranks that meet under key (_core.Comm; timeout as it takes it).
    wait: the communicator's limit on a wait (default: HBMCOLL_TIMEOUT)."""
    core = _core.Comm(rank, size, key, timeout, placement)
    return Communicator(core, local_rank, local_size, launcher, placement, wait, key=key)


def empty(shape, dtype="float32", comm=None):
    """A NumPy array of shape and dtype inside comm's shared arena (in HBM where the node has
    it): collectives whose buffers all live there skip the copy through the staging cells
    (bench/README.md has what that gains against MPI). Uninitialised, like numpy.empty; it
    lives as long as the communicator."""
    import numpy as np

    if comm is None:
        raise ArgumentError("hbmcoll.empty needs comm=")
    dt = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = 1
    for s in shape:
        n *= int(s)
    raw = comm._c.arena_alloc(n * dt.itemsize)  # across nodes: the node's arena
    return np.frombuffer(raw, dtype=dt, count=n).reshape(shape)


class _SendRequest:
    """An isend in flight: wait() returns None once buf may be reused."""

    __slots__ = ("_req", "_timeout")

    def __init__(self, req, timeout):
        self._req, self._timeout = req, timeout

    def wait(self, timeout=None):
        """None once done; hbmcoll.TimeoutError after timeout seconds (default: the communicator's
        limit, if any), and the send stays in flight."""
        self._req.wait(self._timeout if timeout is None else timeout)

    def test(self):
        return self._req.test()

    @property
    def done(self):
        return self._req.done


class _RecvRequest:
    """An irecv in flight: wait() gives the buffer, .status what came."""

    __slots__ = ("_req", "_buf", "status", "_timeout")

    def __init__(self, req, buf, status, timeout):
        self._req, self._buf, self._timeout = req, buf, timeout
        self.status = status if status is not None else Status()

    def wait(self, timeout=None):
        """buf once the message is in; hbmcoll.TimeoutError after timeout seconds (default: the
        communicator's limit, if any), and then no later message lands in buf."""
        self.status.source, self.status.tag, self.status.nbytes = self._req.wait(
            self._timeout if timeout is None else timeout)
        return self._buf

    def test(self):
        return self._req.test()

    @property
    def done(self):
        return self._req.done
