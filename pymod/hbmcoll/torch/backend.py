"""hbmcoll as a torch.distributed backend: registering ``"hbmcoll"`` and making its process groups
(process_group.py is the group itself).

Importing this module (``import hbmcoll.torch`` does it) registers the backend ``"hbmcoll"`` for
CPU tensors:

    import hbmcoll.torch
    dist.init_process_group("hbmcoll")

Groups: the world group joins the communicator of the launcher's environment (``hbmcoll.init``)
when that environment describes the same rank and size, across nodes too; otherwise (``mp.spawn`` with explicit
ranks, sub-groups from ``new_group``) rank 0 of the group puts a fresh job key into the group's
torch Store, the other members read it, and the members build an hbmcoll communicator of their own;
members on several nodes (by node name, through the store) also swap their rendezvous addresses
and a secret through the store, and build the job's Communicator across them.
That needs only the members: torch calls the creator on members only, so ``comm.split`` (which the
whole parent communicator must call) cannot be used for ``new_group``.
"""
import os
import secrets

import torch.distributed as dist

from .. import comm as _comm
from .. import timeline
from ..errors import ArgumentError
from ..launch import env as launch_env
from ..launch import job as _job
from ..tools import tune_cache
from . import ddp
from .process_group import BACKEND, ProcessGroupHbmcoll


# ---- creating groups -----------------------------------------------------------------------------

def _timeout_s(timeout):
    """torch's group timeout (default 30 min) is the hard limit, as for gloo; HBMCOLL_TIMEOUT,
    parsed and checked in C, wins over it (None here hands the choice to C)."""
    if os.environ.get("HBMCOLL_TIMEOUT") or timeout is None:
        return None
    s = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    return s if s > 0 else None


def _store_key(store, rank):
    """A job key the group's members agree on: rank 0 draws it, the others read it."""
    name = "hbmcoll/key"
    if rank == 0:
        store.set(name, f"u{os.getuid()}.torch.{secrets.token_hex(16)}")
    return store.get(name).decode()


_world_placement = None


def _node_names(store, rank, size):
    """Every member's node name (HBMCOLL_NODE, else the hostname), by group rank."""
    from ..nodes.where import node_name

    store.set(f"hbmcoll/node/{rank}", node_name(os.environ))
    return [store.get(f"hbmcoll/node/{r}").decode() for r in range(size)]


def _store_swap(store, rank, size):
    """swap(value): every member's value (JSON), by group rank, through the group's store."""
    import json
    calls = [0]

    def swap(value):
        calls[0] += 1
        store.set(f"hbmcoll/swap{calls[0]}/{rank}", json.dumps(value))
        return [json.loads(store.get(f"hbmcoll/swap{calls[0]}/{r}")) for r in range(size)]
    return swap


def _env_matches(rank, size):
    try:
        info = launch_env.detect()
    except ValueError:
        return None
    if info.launcher == "single" or info.rank != rank or info.size != size:
        return None
    return info


def create(store, rank, size, timeout):
    """The creator torch calls for init_process_group/new_group(backend="hbmcoll")."""
    global _world_placement
    tune_cache.apply()  # this host's measured thresholds, where the environment sets none
    ddp.install()  # DDP models over this backend keep their buckets in the shared arena
    t = _timeout_s(timeout)
    default_group = not dist.is_initialized()
    info = _env_matches(rank, size) if default_group else None
    if info is not None:  # across nodes too: init() returns the job's Communicator then
        comm = _job.init(timeout=t)
        _world_placement = comm._placement
    else:
        names = _node_names(store, rank, size)
        key = _store_key(store, rank)
        if len(set(names)) > 1:  # members on several nodes: they meet through the store
            comm = _job._init_by_names(rank, size, names, key, _store_swap(store, rank, size),
                                        0, t, "torch.distributed", None if default_group else _world_placement)
            comm._allow_any_thread()
            return ProcessGroupHbmcoll(timeline.made(comm), rank, size)
        if default_group or _world_placement is None:
            info = launch_env.LaunchInfo(rank=rank, size=size, local_rank=rank, local_size=size,
                                         job_key=key, launcher="torch.distributed")
            placement = _job._place(info)
            if default_group:
                _world_placement = placement
        else:
            placement = _world_placement
        comm = _comm.meet(rank, size, key, t or 0.0, placement, "torch.distributed", wait=t)
    # torch's contract: every rank issues the group's collectives in the same order, whichever
    # threads they come from (DDP's reducer, comm hooks on completer threads); as with gloo.
    comm._allow_any_thread()
    return ProcessGroupHbmcoll(comm if info is not None else timeline.made(comm), rank, size)


def register():
    """Register the "hbmcoll" backend with torch.distributed (idempotent)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create, devices=["cpu"])


def communicator(group=None):
    """The hbmcoll Communicator behind a process group of this backend (default: WORLD)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, ProcessGroupHbmcoll):
        raise ArgumentError(f"{pg!r} is not an hbmcoll process group")
    return pg.comm


register()
