"""Joining the job: hbmcoll.init().

From the launcher's environment (hbmcoll-run, torchrun, mpiexec, srun; env.py): the ranks
of one node form a Communicator over shared memory; ranks on several nodes form one too, over
the node's communicator and the bridge (_core.join_nodes; nodes/where.py says where). From an
mpi4py communicator (or a torch Store, hbmcoll/torch/backend.py), ranks that know each other's node
names meet the same way (_init_by_names). Each rank is pinned and its buffers planned first
(_place), and its compute threads follow its share of the cores.
"""
import os
import secrets
import socket
import sys
import threading

from .. import _core
from .. import log, timeline
from ..nodes import netaddr
from ..comm import Communicator, meet
from ..errors import ArgumentError
from ..tools import tune_cache
from . import env as launch_env
from . import job_secret

_init_count = 0
_init_lock = threading.Lock()


def _place(info):
    """Pin this process and plan its buffers (numa/ layer); print the one
    notice line (no HBM, mbind refused, ...) once per job, from local rank 0."""
    from ..tools import topo

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
    the MPI ranks bootstrap over it. timeout: seconds any wait may last (default:
    HBMCOLL_TIMEOUT, else no limit). HBMCOLL_LOG and HBMCOLL_TIMELINE apply from here.
    """
    log.level()  # a bad HBMCOLL_LOG: every rank's error, before anything waits
    tune_cache.apply()  # this host's measured thresholds, where the environment sets none
    return timeline.made(_init(comm, timeout))


def _init(comm, timeout):
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
        return meet(info.rank, info.size, key, timeout, placement, info.launcher, info.local_rank, info.local_size,
                    timeout or env_timeout)
    finally:
        if exchange is not None:
            exchange.done()


def _init_across_nodes(info, generation, timeout, env_timeout):
    """This node's communicator over shared memory, then the bridge to the other nodes."""
    from ..nodes import where

    addr, base, secret = where.meeting_point(os.environ, info.launcher,  # its errors before anything waits
                                             timeout or env_timeout or where.RENDEZVOUS_S)
    return _join_nodes(info, f"{info.job_key}/node.w{generation}", _place(info), where.node_name(os.environ),
                       secret, addr, [base + ring for ring in range(info.local_size)], None, timeout, env_timeout)


def _join_nodes(info, key, placement, name, secret, addr, ports, listener, timeout, env_timeout):
    """The job's Communicator: this node's (made here, under key), then the nodes meet at addr
    (ring l at ports[l]; listener: the socket this rank listens on for its ring, or None) and the
    bridge's rings are built (libcoll/src/nodes_join.c). The bridge takes HBMCOLL_IFACE, else
    the interface toward addr."""
    from ..nodes import where

    wait = timeout or env_timeout or 0
    local = meet(info.local_rank, info.local_size, key, timeout, placement, info.launcher, wait=wait)
    try:
        iface = os.environ.get("HBMCOLL_IFACE") or where.iface_to(addr)
        where.confine_ports(os.environ)  # before libfabric loads
    except BaseException:
        local.close()
        raise
    try:
        core = _core.join_nodes(local._c, info.rank, info.size, name, secret, addr, ports,
                                listener.fileno() if listener is not None else 0, iface, netaddr.family(addr),
                                wait or where.RENDEZVOUS_S, wait)
    except BaseException:
        if not local.closed:  # the node's ranks failed alike: each reports before any exits
            where.leave_together(local)
        raise
    comm = Communicator(core, info.local_rank, info.local_size, info.launcher, placement, wait, key=key)
    if info.rank == 0:
        where.say(comm, os.environ)
    return comm


def _init_from_mpi(mpi_comm, generation, timeout):
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    key = mpi_comm.bcast(secrets.token_hex(16) if rank == 0 else None, root=0)
    from ..nodes import where

    names = mpi_comm.allgather(where.node_name(os.environ))
    if len(set(names)) > 1:
        return _init_by_names(rank, size, names, key, mpi_comm.allgather, generation, timeout, "mpi4py")
    info = launch_env.LaunchInfo(rank=rank, size=size, local_rank=rank, local_size=size,
                                 job_key=f"mpi.{os.getuid()}.{key}", launcher="mpi4py")
    placement = _place(info)
    return meet(rank, size, f"{info.job_key}/w{generation}", timeout, placement, "mpi4py")


def _init_by_names(rank, size, names, key, swap, generation, timeout, launcher, placement=None):
    """The Communicator of ranks across nodes that know each other's node names (names[r]) and can already
    swap small values (swap(v): every rank's v, by rank; MPI, a torch Store): the nodes meet as
    under a launcher, at rendezvous that node 0's ring carriers open on ports of their choosing,
    told to everyone by swap with the job's secret."""
    from ..nodes import where

    here = [r for r in range(size) if names[r] == names[rank]]
    local_rank, local_size = here.index(rank), len(here)
    order = list(dict.fromkeys(names))  # nodes by lowest rank
    rings = min(names.count(n) for n in order)
    listener = None
    if names[rank] == names[0] and local_rank < rings:
        here_at = where.listen_address(os.environ)
        listener = socket.create_server((here_at, 0), family=netaddr.family(here_at))
    at = swap(listener.getsockname()[:2] if listener else None)
    secret = swap(secrets.token_hex(32) if rank == 0 else None)[0]
    node0 = [r for r in range(size) if names[r] == names[0]]
    info = launch_env.LaunchInfo(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                                 job_key=f"{launcher}.{os.getuid()}.{key}/{order.index(names[rank])}",
                                 launcher=launcher)
    try:
        return _join_nodes(info, f"{info.job_key}/w{generation}", placement or _place(info), names[rank], secret,
                           at[0][0], [at[node0[ring]][1] for ring in range(rings)], listener, timeout,
                           _core.env_check())
    finally:
        if listener is not None:
            listener.close()
