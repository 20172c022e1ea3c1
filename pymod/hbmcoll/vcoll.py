"""Collectives with a count per rank (MPI's v-variants), on both communicators:

    out = comm.allgatherv(buf, counts=None)            # every rank's buf, end to end, on every rank
    out = comm.gatherv(buf, root=0, counts=None)       # the same on root; None elsewhere
    out = comm.scatterv(buf, counts, root=0)           # rank i gets counts[i] of root's buf, in order
    out = comm.alltoallv(buf, sendcounts)              # sendcounts[j] of buf go to rank j, in order
    out = comm.reduce_scatter(buf, op, counts=counts)  # rank i gets counts[i] reduced elements

Counts are in elements of the buffers, which are read flat (C order); blocks lie end to end in
rank order (MPI's displacements as the running sum of the counts). Where counts may be left out,
they are gathered from the buffers' sizes. Where they are given, every rank must give the same
ones and its own buffer must match them, or every rank gets MismatchError.

Each runs in C (coll_run_v, libcoll/src/vcoll.c): one small allgather checks every rank's
arguments against every other's, then the fixed-size collective of the kind moves the blocks,
each padded to the largest one when they differ (size x the largest block instead of the sum).
"""
import operator

import numpy as np

from . import _core


def _flat_like(buf, n):
    """A new flat buffer of n elements of buf's kind and dtype."""
    if type(buf).__module__.startswith("torch"):
        import torch
        return torch.empty(n, dtype=buf.dtype)
    return np.empty(n, np.asarray(memoryview(buf)).dtype)


_MOVED = {"int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"}  # libcoll's dtypes


def _int(x):
    """x as a C int, or -1 (out of every range: the call is refused on every rank, not here alone)."""
    try:
        x = operator.index(x)
    except TypeError:
        return -1
    return x if -2 ** 31 <= x < 2 ** 31 else -1


def _odd_item(buf):
    """The item size of a buffer whose dtype libcoll has no name for (bool, int16, complex, ...),
    else 0: those move as bytes where nothing is reduced."""
    if type(buf).__module__.startswith("torch"):
        return 0 if str(buf.dtype).split(".")[-1] in _MOVED else buf.element_size()
    try:
        dtype = np.asarray(memoryview(buf)).dtype if not isinstance(buf, np.ndarray) else buf.dtype
    except (TypeError, ValueError):
        return 0  # not a buffer: the C call says so on every rank
    return 0 if dtype.name in _MOVED else dtype.itemsize


def _bytes(buf):
    """buf's elements as bytes (the same memory)."""
    if buf is None:
        return None
    if type(buf).__module__.startswith("torch"):
        import torch
        return buf.reshape(-1).view(torch.uint8)
    return np.asarray(memoryview(buf)).reshape(-1).view(np.uint8)


def _scaled(counts, item):
    """counts x item, or counts as they are when they are not integers (refused in C, on every rank)."""
    try:
        return None if counts is None else [operator.index(k) * item for k in counts]
    except TypeError:
        return counts


class VariableCollectives:
    def _run_v(self, kind, buf, out, counts, op=0, root=0):
        like = buf if buf is not None else out
        item = _odd_item(like) if kind != _core.REDUCE_SCATTER and like is not None else 0
        if item:  # what nothing reduces moves as bytes: counts in bytes, the result viewed back
            made = []

            def make(n):
                made.append(_flat_like(like, n // item))
                return _bytes(made[-1])
            self._c.run_v(kind, _bytes(buf), _bytes(out), _scaled(counts, item), op, _int(root), make)
            return made[0] if made else None
        return self._c.run_v(kind, buf, out, counts, op, _int(root), lambda n: _flat_like(like, n))

    def allgatherv(self, buf, counts=None, out=None):
        """Every rank's buf, flat and end to end in rank order, into out (default: new)."""
        made = self._run_v(_core.ALLGATHER, buf, out, counts)
        return out if out is not None else made if made is not None else _flat_like(buf, 0)

    def gatherv(self, buf, root=0, counts=None, out=None):
        """allgatherv's result on root; None elsewhere."""
        mine = self.rank == root
        made = self._run_v(_core.GATHER, buf, out if mine else None, counts, root=root)
        if not mine:
            return None
        return out if out is not None else made if made is not None else _flat_like(buf, 0)

    def scatterv(self, buf, counts, root=0, out=None):
        """Rank i gets counts[i] elements of root's flat buf (blocks in rank order) into out
        (default: new). Non-roots may pass buf=None with out=, or a buffer of the dtype wanted."""
        made = self._run_v(_core.SCATTER, buf, out, counts, root=root)
        return out if out is not None else made if made is not None else _flat_like(buf, 0)

    def alltoallv(self, buf, sendcounts, out=None):
        """sendcounts[j] elements of this rank's flat buf (blocks in rank order) go to rank j;
        out (default: new) gets every rank's block for this one, in rank order."""
        made = self._run_v(_core.ALLTOALL, buf, out, sendcounts)
        return out if out is not None else made if made is not None else _flat_like(buf, 0)

    def _reduce_scatter_counts(self, buf, op, counts, out):
        made = self._run_v(_core.REDUCE_SCATTER, buf, out, counts, op=op)
        return out if out is not None else made if made is not None else _flat_like(buf, 0)
