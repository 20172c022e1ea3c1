"""Horovod's process sets for hbmcoll.torch: collectives among a subset of the ranks.

    ps = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[ps])         # or hvd.add_process_set(ps), on every rank alike
    hvd.allreduce(t, process_set=ps)    # ranks 0 and 2 only; the others never take part
    ps.included(), ps.rank(), ps.size()
    hvd.remove_process_set(ps)

A process set is a sub-communicator of the job's (split), made when it is added: every rank
adds the same sets in the same order, and a set given different ranks on different ranks is a
MismatchError on all of them. A call with process_set= runs on the set's communicator; the
autograd functions keep their set for the backward pass. join() covers the global set: while a
member of another set has joined, calls on that set wait for it.
"""
import contextvars
import functools
import zlib

import numpy as np

from ..errors import ArgumentError, MismatchError

current = contextvars.ContextVar("hbmcoll_process_set", default=None)


class ProcessSet:
    """A subset of the job's ranks (sorted, without repeats)."""

    def __init__(self, ranks):
        self.ranks = sorted({int(r) for r in ranks})
        self.comm = None  # this rank's communicator of the set, once added (None: not a member)
        self.added = False

    def included(self):
        """True when this rank belongs to the set (and it was added)."""
        return self.comm is not None

    def rank(self):
        """This rank's number within the set."""
        return self._comm().rank

    def size(self):
        """How many ranks the set has."""
        return len(self.ranks)

    def _comm(self):
        if self.comm is None:
            raise ArgumentError(f"{self!r}: " + ("this rank is not in it" if self.added else
                                                 "not added yet (hvd.add_process_set, on every rank)"))
        return self.comm

    def __repr__(self):
        return f"<hbmcoll ProcessSet {self.ranks}>"


class GlobalProcessSet(ProcessSet):
    """Every rank of the job (hvd.global_process_set); calls without process_set= use it."""

    def __init__(self):
        super().__init__([])

    def __repr__(self):
        return "<hbmcoll global ProcessSet>"


def add(comm, ps):
    """ps's communicator, split from comm on every rank alike."""
    if not isinstance(ps, ProcessSet) or isinstance(ps, GlobalProcessSet):
        raise ArgumentError(f"add_process_set takes a ProcessSet, not {ps!r}")
    bad = [r for r in ps.ranks if not 0 <= r < comm.size] or (not ps.ranks and ["none"])
    crc = np.array([zlib.crc32(np.array(ps.ranks, np.int64).tobytes()), bool(bad)], np.int64)
    rows = comm.allgather(crc).reshape(comm.size, 2)
    if bad:
        raise ArgumentError(f"{ps!r}: ranks {bad} are not ranks of the job (size {comm.size})")
    if rows[:, 1].any() or len(set(rows[:, 0])) > 1:
        raise MismatchError(f"{ps!r}: the ranks added different process sets")
    ps.comm = comm.split(0 if comm.rank in ps.ranks else None, key=comm.rank)
    ps.added = True
    return ps


def remove(ps):
    """ps leaves: its communicator is closed on its members."""
    if ps.comm is not None:
        ps.comm.close()
    ps.comm, ps.added = None, False


def taking_process_set(fn):
    """fn(..., process_set=None): the call runs with process_set's communicator as the current one."""
    @functools.wraps(fn)
    def call(*args, process_set=None, **kw):
        if process_set is None or isinstance(process_set, GlobalProcessSet):
            return fn(*args, **kw)
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
        process_set._comm()
        with entered(process_set):
            return fn(*args, **kw)
    return call


class entered:
    """`with entered(ps):` calls in the block run on ps (None: the global set)."""

    def __init__(self, ps):
        self.ps = ps

    def __enter__(self):
        self.token = current.set(self.ps)

    def __exit__(self, *exc):
        current.reset(self.token)
