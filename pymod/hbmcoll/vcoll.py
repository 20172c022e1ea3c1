"""Collectives with a count per rank (MPI's v-variants), on both communicators:

    out = comm.allgatherv(buf, counts=None)            # every rank's buf, end to end, on every rank
    out = comm.gatherv(buf, root=0, counts=None)       # the same on root; None elsewhere
    out = comm.scatterv(buf, counts, root=0)           # rank i gets counts[i] of root's buf, in order
    out = comm.alltoallv(buf, sendcounts)              # sendcounts[j] of buf go to rank j, in order
    out = comm.reduce_scatter(buf, op, counts=counts)  # rank i gets counts[i] reduced elements

Counts are in elements of the buffers, which are read flat (C order); blocks lie end to end in
rank order (MPI's displacements as the running sum of the counts). Where counts may be left out,
they are gathered from the buffers' sizes. Where they are given, every rank must give the same
ones and its own buffer must match them, or every rank gets MismatchError: the counts travel
with the first exchange, so the check costs no extra round.

Each runs on the fixed-size collective of its kind, every block padded to the largest one. That
moves size x the largest block instead of the sum of the blocks: near the same for blocks of
similar sizes, and up to size times more when one block dwarfs the others.
"""
import zlib

import numpy as np

from .buffers import flat_bytes
from .errors import ArgumentError, MismatchError


def _raw(buf):
    return flat_bytes(buf, "the v-collectives")


def _look(buf):
    """(bytes, item size, dtype code, what is wrong or None): a bad buffer is a problem every
    rank hears of (_agree_counts), never one rank's error while the others wait."""
    try:
        raw, item = _raw(buf)
    except (ArgumentError, TypeError, ValueError, BufferError) as exc:
        return np.zeros(0, np.uint8), 1, 0, str(exc)
    dtype = buf.dtype if hasattr(buf, "dtype") else "B"
    return raw, item, zlib.crc32(str(dtype).replace("torch.", "").encode()), None


def _flat_like(buf, n):
    """A new flat buffer of n elements of buf's kind and dtype."""
    if type(buf).__module__.startswith("torch"):
        import torch
        return torch.empty(n, dtype=buf.dtype)
    return np.empty(n, np.asarray(memoryview(buf)).dtype)


def _counts(counts, size):
    """(counts as int64, or None; what is wrong with them, or None)."""
    if counts is None:
        return None, None
    try:
        c = np.array(counts, np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError):
        return None, f"counts {counts!r}: give {size} integers >= 0"
    if c.size != size or (c < 0).any():
        return None, f"give {size} counts >= 0, one per rank"
    return c, None


def _crc(c):
    return -1 if c is None else zlib.crc32(c.tobytes())


class VariableCollectives:
    def _agree_counts(self, what, problem, own=(), same=()):
        """Every rank's own fields (ints, a row per rank), once every rank knows whether any
        found its arguments wrong: all raise together, never one alone while the others wait.
        The same fields (counts, roots) must be equal on every rank."""
        fields = [problem is not None] + list(own) + list(same)
        row = self.allgather(np.array(fields, np.int64)).reshape(self.size, -1)
        if problem is not None:  # MismatchError on every rank, as for the fixed-size collectives
            raise MismatchError(f"{what}: {problem}")
        if row[:, 0].any():
            raise MismatchError(f"{what}: rank {int(np.nonzero(row[:, 0])[0][0])} gave wrong arguments "
                                "(its error says which)")
        if any(len(set(row[:, k])) > 1 for k in range(1 + len(own), row.shape[1])):
            raise MismatchError(f"{what}: the ranks gave different counts, roots or dtypes")
        return row[:, 1:1 + len(own)]

    def _sizes(self, what, buf, counts, root=-1):
        """buf's bytes and item size, and every rank's count, from the buffers' sizes: checked
        against counts where given, and the dtypes against each other."""
        raw, item, dtype, problem = _look(buf)
        mine = raw.size // item
        c, bad = _counts(counts, self.size)
        problem = problem or bad
        if problem is None and c is not None and mine != c[self.rank]:
            problem = f"this rank has {mine} elements; counts say {c[self.rank]}"
        return raw, item, self._agree_counts(what, problem, own=[mine], same=[_crc(c), root, dtype])[:, 0]

    def allgatherv(self, buf, counts=None, out=None):
        """Every rank's buf, flat and end to end in rank order, into out (default: new)."""
        raw, item, sizes = self._sizes("allgatherv", buf, counts)
        rows = self.allgather(_padded(raw, int(sizes.max()) * item))
        return _joined(rows, sizes * item, buf, out)

    def gatherv(self, buf, root=0, counts=None, out=None):
        """allgatherv's result on root; None elsewhere."""
        raw, item, sizes = self._sizes("gatherv", buf, counts, root)
        rows = self.gather(_padded(raw, int(sizes.max()) * item), root=root)
        return _joined(rows, sizes * item, buf, out) if self.rank == root else None

    def scatterv(self, buf, counts, root=0, out=None):
        """Rank i gets counts[i] elements of root's flat buf (blocks in rank order) into out
        (default: new). Non-roots may pass buf=None with out=, or a buffer of the dtype wanted."""
        c, problem = _counts(counts, self.size)
        if c is None and problem is None:
            problem = "give counts, one per rank"
        like = buf if buf is not None and (self.rank == root or out is None) else out
        raw, item, dtype, bad = _look(like) if like is not None else (None, 1, 0, "pass out= (or buf) on every rank")
        problem = problem or bad
        if problem is None and self.rank == root:
            raw, item, dtype, bad = _look(buf) if buf is not None else (None, 1, 0, "the root passes buf")
            problem = bad or (None if raw.size == c.sum() * item else
                              f"buf has {raw.size // item} elements; counts add up to {c.sum()}")
        self._agree_counts("scatterv", problem, same=[_crc(c), root, dtype])
        width = int(c.max()) * item
        rows = np.zeros((self.size, width), np.uint8)
        if self.rank == root:
            _split(raw, c * item, rows)
        mine = np.empty(width, np.uint8)
        self.scatter(rows, root=root, out=mine)
        res = out if out is not None else _flat_like(like, int(c[self.rank]))
        _into(res, mine[:c[self.rank] * item], "scatterv")
        return res

    def alltoallv(self, buf, sendcounts, out=None):
        """sendcounts[j] elements of this rank's flat buf (blocks in rank order) go to rank j;
        out (default: new) gets every rank's block for this one, in rank order."""
        raw, item, dtype, problem = _look(buf)
        c, bad = _counts(sendcounts, self.size)
        problem = problem or bad
        if problem is None and (c is None or raw.size != c.sum() * item):
            problem = f"sendcounts must add up to buf's {raw.size // item} elements"
        matrix = self._agree_counts("alltoallv", problem, own=c if c is not None else [0] * self.size,
                                    same=[dtype])
        rows = np.zeros((self.size, int(matrix.max()) * item), np.uint8)  # row j: what goes to rank j
        _split(raw, c * item, rows)
        got = self.alltoall(rows)
        return _joined(got, matrix[:, self.rank] * item, buf, out)

    def _reduce_scatter_counts(self, buf, op, counts, out):
        raw, item, dtype, problem = _look(buf)
        c, bad = _counts(counts, self.size)
        problem = problem or bad
        if problem is None and raw.size != c.sum() * item:
            problem = f"buf has {raw.size // item} elements; counts add up to {c.sum()}"
        self._agree_counts("reduce_scatter", problem, same=[_crc(c), dtype])
        width, flat = int(c.max()), buf.reshape(-1)
        rows = _flat_like(buf, self.size * width).reshape(self.size, width)
        at = np.concatenate([[0], np.cumsum(c)])
        for i in range(self.size):
            rows[i, :c[i]] = flat[at[i]:at[i + 1]]
            rows[i, c[i]:] = 0
        mine = self.reduce_scatter(rows, op=op)
        res = out if out is not None else _flat_like(buf, int(c[self.rank]))
        _into(res, _raw(mine)[0][:c[self.rank] * item], "reduce_scatter")
        return res


def _split(raw, nbytes, rows):
    """raw's blocks of nbytes[i] bytes, end to end, into the fronts of rows[i]."""
    at = 0
    for i, n in enumerate(nbytes):
        rows[i, :n] = raw[at:at + n]
        at += int(n)


def _padded(raw, width):
    row = np.zeros(width, np.uint8)
    row[:raw.size] = raw
    return row


def _joined(rows, nbytes, like, out):
    """Row i's first nbytes[i] bytes, end to end, into out (default: a new flat buffer)."""
    item = _raw(like)[1]
    total = int(nbytes.sum())
    res = out if out is not None else _flat_like(like, total // item)
    dst = _raw(res)[0]
    if dst.size != total:
        raise ArgumentError(f"out holds {dst.size} bytes; the result has {total}")
    at = 0
    for i, n in enumerate(nbytes):
        dst[at:at + n] = rows.reshape(len(nbytes), -1)[i, :n]
        at += int(n)
    return res


def _into(res, data, what):
    dst = _raw(res)[0]
    if dst.size != data.size:
        raise ArgumentError(f"{what}: out holds {dst.size} bytes; this rank's block has {data.size}")
    dst[:] = data
