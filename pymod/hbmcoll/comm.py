"""The Communicator: the Python face of a libcoll communicator.

Arguments are checked here and in _core before any communication; the
collective itself runs in C with the GIL released. Result buffers that the
caller did not pass (out=None) are made here, of the caller's kind (NumPy
array, torch tensor, bytearray).
"""
import os
import secrets
import sys
import socket
import threading

from . import _core
from . import job_secret
from . import launch_env
from .errors import ArgumentError

_OPS = {"sum": _core.SUM, "prod": _core.PROD, "min": _core.MIN, "max": _core.MAX,
        "avg": _core.AVG, "mean": _core.AVG, "average": _core.AVG}
_KINDS = {"barrier": _core.BARRIER, "bcast": _core.BCAST, "gather": _core.GATHER,
          "scatter": _core.SCATTER, "allgather": _core.ALLGATHER, "reduce": _core.REDUCE,
          "allreduce": _core.ALLREDUCE, "reduce_scatter": _core.REDUCE_SCATTER,
          "alltoall": _core.ALLTOALL}
_BCAST, _ALLREDUCE, _REDUCE, _GATHER = _core.BCAST, _core.ALLREDUCE, _core.REDUCE, _core.GATHER
_ALLGATHER, _SCATTER, _REDUCE_SCATTER = _core.ALLGATHER, _core.SCATTER, _core.REDUCE_SCATTER
_ALLTOALL = _core.ALLTOALL
_init_count = 0
_init_lock = threading.Lock()


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
        self._req.wait(timeout)
        return self._result

    def test(self):
        return self._req.test()

    @property
    def done(self):
        return self._req.done


class Communicator:
    """Processes on one node that run collectives together.

    Every rank must call the same collectives in the same order with matching
    counts, dtypes, ops and roots; if they do not, all get MismatchError.
    After any failure (MismatchError, PeerLostError, TimeoutError, Ctrl-C)
    the communicator is closed for good.
    """

    def __init__(self, core, local_rank=None, local_size=None, launcher="single", placement=None):
        self._c = core
        self.rank = core.rank
        self.size = core.size
        self.local_rank = self.rank if local_rank is None else local_rank
        self.local_size = self.size if local_size is None else local_size
        self.launcher = launcher
        self._placement = placement

    @property
    def pu(self):
        """The PU (OS index) this rank is pinned to, or None."""
        return self._placement.pu if self._placement is not None else None

    @property
    def single_copy(self):
        """True when large bcast and gather copy straight between the ranks' own buffers:
        asked for with HBMCOLL_CMA=1 and process_vm_readv/writev works between every pair
        (not across PID namespaces, nor where seccomp or Yama refuse it). Otherwise they
        stage through the shared segment, which was faster where we measured (cma.c)."""
        return self._c.single_copy

    def __repr__(self):
        return f"<hbmcoll.Communicator rank {self.rank} of {self.size}>"

    # -- helpers ---------------------------------------------------------------
    def _root(self, root):
        if not isinstance(root, int) or isinstance(root, bool):
            raise TypeError("root must be an int")
        if not 0 <= root < self.size:
            raise ArgumentError(f"root {root} is not a rank of this communicator (size {self.size})")
        return root

    # -- collectives -----------------------------------------------------------
    def barrier(self):
        self._c.run(_core.BARRIER)

    def ibarrier(self):
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

    def reduce_scatter(self, buf, op="sum", out=None):
        """buf of shape (size, *s) reduced over ranks; rank i gets block i (shape s)."""
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
        return self._start((_BCAST, None, buf, 0, self._root(root)), buf)

    def iallreduce(self, buf, op="sum", out=None):
        out = buf if out is None else out
        return self._start((_ALLREDUCE, buf, out, _op_code(op), 0), out)

    def ireduce(self, buf, op="sum", root=0, out=None):
        return self._start(*self._reduce_args(buf, op, root, out))

    def igather(self, buf, root=0, out=None):
        return self._start(*self._gather_args(buf, root, out))

    def iallgather(self, buf, out=None):
        return self._start(*self._allgather_args(buf, out))

    def iscatter(self, buf, root=0, out=None):
        return self._start(*self._scatter_args(buf, root, out))

    def ireduce_scatter(self, buf, op="sum", out=None):
        return self._start(*self._reduce_scatter_args(buf, op, out))

    def ialltoall(self, buf, out=None):
        return self._start(*self._alltoall_args(buf, out))

    # -- communicators ---------------------------------------------------------
    def split(self, color, key=0):
        """Ranks with equal color form a new communicator ordered by (key, rank);
        color=None (or negative) joins none and gets None."""
        c = -1 if color is None else int(color)
        sub = self._c.split(c, int(key))
        return None if sub is None else Communicator(sub, launcher=self.launcher,
                                                     placement=self._placement)

    def set_algorithm(self, collective, name):
        """Force an algorithm ("flat", "rsag", ... or "auto") for one collective,
        on every rank alike (HBMCOLL_ALGO does the same from the environment)."""
        if collective not in _KINDS:
            raise ArgumentError(f"unknown collective {collective!r}: one of {', '.join(_KINDS)}")
        self._c.set_algorithm(_KINDS[collective], name)

    def empty(self, shape, dtype="float32"):
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
        self._c.close()

    def abort(self):
        """Fail the communicator on every rank (they raise Error)."""
        self._c.abort()

    @property
    def closed(self):
        return self._c.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def empty(shape, dtype="float32", comm=None):
    """A NumPy array inside comm's shared arena: collectives on it skip a copy."""
    import numpy as np

    if comm is None:
        raise ArgumentError("hbmcoll.empty needs comm=")
    dt = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    n = 1
    for s in shape:
        n *= int(s)
    raw = comm._c.arena_alloc(n * dt.itemsize)
    return np.frombuffer(raw, dtype=dt, count=n).reshape(shape)


def _place(info):
    """Pin this process and plan its buffers (numa/ layer); print the one
    notice line (no HBM, mbind refused, ...) once per job, from local rank 0."""
    from . import topo

    placement = topo.setup(info.local_rank, info.local_size)
    if info.local_rank == 0 and placement.notice and not os.environ.get("HBMCOLL_QUIET"):
        print(placement.notice, file=sys.stderr, flush=True)
    _follow_threads(placement.threads)
    return placement


def _follow_threads(n):
    """Compute threads follow the rank's share of the cores unless the user chose a number:
    OMP_NUM_THREADS and friends for what loads later, torch's and TensorFlow's intra-op pools
    where they are already imported (hbmcoll-run sets the variables per rank before start)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    for var in launch_env.THREAD_VARS:
        os.environ.setdefault(var, str(n))
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(n)
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(n)
        except (RuntimeError, AttributeError):
            pass  # TF's runtime already started: its pools keep their size


def _timeout_arg(timeout):
    """init(timeout=): seconds > 0, or None for HBMCOLL_TIMEOUT (parsed in C), else no limit."""
    if timeout is None:
        return 0.0
    try:
        t = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"timeout must be a number of seconds or None, not {timeout!r}") from None
    if not t > 0 or t == float("inf"):
        raise ArgumentError(f"timeout={timeout!r}: give a number of seconds > 0, or None for no limit")
    return t


def init(comm=None, timeout=None):
    """Join the job's communicator.

    With no argument, ranks are found from the launcher's environment
    (hbmcoll-run, torchrun, mpiexec, srun). With comm=<mpi4py communicator>,
    the MPI ranks bootstrap over it.
    """
    global _init_count
    with _init_lock:
        _init_count += 1
        generation = _init_count
    timeout = _timeout_arg(timeout)
    # every HBMCOLL_* variable as libcoll parses it: a malformed one is an ArgumentError
    # naming it before anything waits; HBMCOLL_TIMEOUT bounds the waits before libcoll's
    env_timeout = _core.env_check()
    if comm is not None:
        return _init_from_mpi(comm, generation, timeout)
    info = launch_env.detect()
    if info.size != info.local_size:
        return _init_across_nodes(info, generation, timeout, env_timeout)
    placement = _place(info)
    key = f"{info.job_key}/w{generation}"
    exchange = job_secret.Exchange(key, info.rank) if info.needs_secret else None
    try:
        if exchange is not None:
            key += "." + (exchange.publish() if info.rank == 0 else
                          exchange.fetch(timeout or env_timeout))
        core = _core.Comm(info.rank, info.size, key, timeout, placement)
    finally:
        if exchange is not None:
            exchange.done()
    return Communicator(core, info.local_rank, info.local_size, info.launcher, placement)


def _init_across_nodes(info, generation, timeout, env_timeout):
    """This node's communicator over shared memory, then the bridge to the other nodes."""
    from . import across, layout

    addr, base, secret = layout.meeting_point(os.environ, info.launcher)  # its errors before anything waits
    placement = _place(info)
    core = _core.Comm(info.local_rank, info.local_size, f"{info.job_key}/node.w{generation}", timeout,
                      placement)
    local = Communicator(core, info.local_rank, info.local_size, info.launcher, placement)
    try:
        iface = os.environ.get("HBMCOLL_IFACE") or layout.iface_to(addr)
        lay, bridge, watch = layout.find(local, info.rank, info.size, layout.node_name(os.environ), secret,
                                         lambda ring: (addr, base + ring), iface, timeout or env_timeout)
    except BaseException:
        local.close()
        raise
    if info.rank == 0:
        layout.say(lay, bridge, os.environ)
    return across.NodesCommunicator(local, lay, bridge, watch, info.rank, info.size, timeout or env_timeout,
                                    info.launcher, iface, layout.POOL_BYTES)


def _init_from_mpi(mpi_comm, generation, timeout):
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    key = mpi_comm.bcast(secrets.token_hex(16) if rank == 0 else None, root=0)
    from . import layout

    names = mpi_comm.allgather(layout.node_name(os.environ))
    if len(set(names)) > 1:
        return _init_from_mpi_nodes(mpi_comm, names, key, generation, timeout)
    info = launch_env.LaunchInfo(rank=rank, size=size, local_rank=rank, local_size=size,
                                 job_key=f"mpi.{os.getuid()}.{key}", launcher="mpi4py")
    placement = _place(info)
    core = _core.Comm(rank, size, f"{info.job_key}/w{generation}", timeout, placement)
    return Communicator(core, rank, size, "mpi4py", placement)


def _init_from_mpi_nodes(mpi_comm, names, key, generation, timeout):
    """The MPI communicator spans nodes: MPI carries the bootstrap (_init_by_names)."""
    return _init_by_names(mpi_comm.Get_rank(), mpi_comm.Get_size(), names, key, mpi_comm.allgather,
                          generation, timeout, "mpi4py")


def _init_by_names(rank, size, names, key, swap, generation, timeout, launcher, placement=None):
    """A NodesCommunicator of ranks that know each other's node names (names[r]) and can already
    swap small values (swap(v): every rank's v, by rank; MPI, a torch Store): the nodes meet as
    under a launcher, at rendezvous that node 0's ring carriers open on ports of their choosing,
    told to everyone by swap with the job's secret."""
    from . import across, layout

    here = [r for r in range(size) if names[r] == names[rank]]
    local_rank, local_size = here.index(rank), len(here)
    order = list(dict.fromkeys(names))  # nodes by lowest rank
    rings = min(names.count(n) for n in order)
    listener = None
    if names[rank] == names[0] and local_rank < rings:
        listener = socket.create_server((layout.listen_address(os.environ), 0))
    where = swap(listener.getsockname()[:2] if listener else None)
    secret = swap(secrets.token_hex(32) if rank == 0 else None)[0]
    node0 = [r for r in range(size) if names[r] == names[0]]
    env_timeout = _core.env_check()
    try:
        info = launch_env.LaunchInfo(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                                     job_key=f"{launcher}.{os.getuid()}.{key}/{order.index(names[rank])}",
                                     launcher=launcher)
        placement = placement or _place(info)
        core = _core.Comm(local_rank, local_size, f"{info.job_key}/w{generation}", timeout, placement)
        local = Communicator(core, local_rank, local_size, launcher, placement)
        try:
            iface = os.environ.get("HBMCOLL_IFACE") or layout.iface_to(where[0][0])
            lay, bridge, watch = layout.find(
                local, rank, size, names[rank], secret,
                lambda ring: listener if ring == local_rank and listener else tuple(where[node0[ring]]),
                iface, timeout or env_timeout)
        except BaseException:
            local.close()
            raise
    finally:
        if listener is not None:
            listener.close()
    if rank == 0:
        layout.say(lay, bridge, os.environ)
    return across.NodesCommunicator(local, lay, bridge, watch, rank, size, timeout or env_timeout, launcher,
                                    iface, layout.POOL_BYTES)
