"""Horovod's join() for ranks with less data (hbmcoll.torch): a rank that has run out calls
hvd.join(); the others go on calling hvd collectives, and the joined rank takes part in each
with nothing of its own (zeros for a sum, the identity of min, max or product) until every rank
has joined. join() then returns the rank that joined last, as Horovod's does.

How: before each hvd collective every rank adds a header to a small allreduce (sum). A rank
still in its loop says what it is about to call (kind, dtype, count, op, root); a joined rank
adds zeros. The sum says how many ranks are active and, divided by that, what they call; a
joined rank then makes the same call with neutral data. While a rank has joined, Average is
a sum divided by the active ranks (a joined rank has no data to average in). Allreduce (and
so grouped_allreduce and DistributedOptimizer), broadcast and barrier take joined ranks in;
the other calls raise NotSupportedError on every rank while one has joined. One allreduce of
64 bytes per call is the price, paid whether or not anyone joins.
"""
import numpy as np
import torch

from ..errors import MismatchError, NotSupportedError

ALLREDUCE, BCAST, BARRIER, OTHER = 1, 2, 3, 4
_NAMES = {ALLREDUCE: "allreduce", BCAST: "broadcast", BARRIER: "barrier", OTHER: "this call"}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = ["sum", "avg", "min", "max", "prod"]


class Joiner:
    def __init__(self):
        # per communicator, the headers this rank sent as active: the last to join sent the most
        self.active_calls = {}

    def header(self, comm, kind, buf=None, op="sum", root=0):
        """Every rank's header of the next call; returns how many ranks are active. Raises on
        every rank alike when the call cannot take joined ranks in."""
        h = self._header(comm, kind, buf, op, root)
        comm.allreduce(h)
        return self._active(comm, h, kind, root)

    def start_header(self, comm, buf, op="sum"):
        """An allreduce's header without waiting for it (DistributedOptimizer's buckets, whose
        allreduces follow at once and must not wait behind the ones in flight): finish_header()
        of what it returns gives the active ranks."""
        h = self._header(comm, ALLREDUCE, buf, op, 0)
        return comm.iallreduce(h), h

    def finish_header(self, comm, started):
        req, h = started
        req.wait()
        return self._active(comm, h, ALLREDUCE, 0)

    def _header(self, comm, kind, buf, op, root):
        self.active_calls[id(comm)] = self.active_calls.get(id(comm), 0) + 1
        return np.array([1, kind, DTYPES.index(buf.dtype) if buf is not None else 0,
                         buf.numel() if buf is not None else 0, OPS.index(op), root, 0, 0], np.int64)

    def _active(self, comm, h, kind, root):
        active = int(h[0])
        if active < comm.size:
            _check(h, active, comm.size)
            if kind == BCAST:
                _root_joined(comm, False, root)
        return active

    def join(self, comm):
        """The joined rank's loop: take part in the active ranks' calls until all have joined;
        returns the rank that joined last."""
        while True:
            h = np.zeros(8, np.int64)
            comm.allreduce(h)
            active = int(h[0])
            if active == 0:
                break
            kind, dtype, n, op, root = (int(v) // active for v in h[1:6])
            _check(h, active, comm.size)
            if kind == ALLREDUCE:
                comm.allreduce(_neutral(DTYPES[dtype], n, OPS[op]), "sum" if OPS[op] == "avg" else OPS[op])
            elif kind == BCAST:
                _root_joined(comm, comm.rank == root, root)
                comm.bcast(torch.empty(n, dtype=DTYPES[dtype]), root=root)
            else:
                comm.barrier()
        last = np.array([self.active_calls.pop(id(comm), 0) * comm.size + comm.rank], np.int64)
        comm.allreduce(last, "max")
        return int(last[0]) % comm.size


def _check(h, active, size):
    kind = int(h[1]) // active
    if any(int(v) % active for v in h[1:6]):
        raise MismatchError("the active ranks called different collectives while a rank had joined")
    if kind == OTHER:
        raise NotSupportedError(f"{_NAMES[kind]} while {size - active} of {size} ranks have joined: only "
                                "allreduce, grouped_allreduce, broadcast and barrier take joined ranks in")


def _root_joined(comm, mine, root):
    """A broadcast while ranks have joined: a second round says whether its root is one."""
    v = np.array([int(mine)], np.int64)
    comm.allreduce(v)
    if v[0]:
        raise NotSupportedError(f"broadcast from rank {root}, which has joined: it has nothing to send")


def _neutral(dtype, n, op):
    """n elements that leave op's result as the active ranks' alone."""
    if op in ("sum", "avg"):
        return torch.zeros(n, dtype=dtype)
    if op == "prod":
        return torch.ones(n, dtype=dtype)
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    big = float("inf") if dtype.is_floating_point else info.max
    return torch.full((n,), big if op == "min" else (-big if dtype.is_floating_point else info.min), dtype=dtype)
