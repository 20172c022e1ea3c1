"""Collectives of Python objects, as mpi4py's lowercase calls and torch's *_object ones: any
picklable object, of any size on each rank. Both communicators (one node, across nodes) have
them; they run on the array collectives, sizes first, so every rank knows what it receives.

    value = comm.bcast_object(value, root=0)
    values = comm.allgather_object(value)          # a list, rank order
    values = comm.gather_object(value, root=0)     # a list on root, None elsewhere

The bytes come from the job's own ranks (as with mpi4py): unpickling them trusts the job.
"""
import pickle

import numpy as np


def _pickled(obj):
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)


class ObjectCollectives:
    def bcast_object(self, obj, root=0):
        """root's obj on every rank (root gets its own object back)."""
        data = _pickled(obj) if self.rank == root else None
        n = np.array([0 if data is None else data.size], np.int64)
        self.bcast(n, root=root)
        buf = data.copy() if data is not None else np.empty(int(n[0]), np.uint8)
        self.bcast(buf, root=root)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def _padded(self, obj):
        data = _pickled(obj)
        sizes = self.allgather(np.array([data.size], np.int64)).reshape(-1)
        buf = np.zeros(int(sizes.max()), np.uint8)
        buf[:data.size] = data
        return buf, sizes

    def allgather_object(self, obj):
        """Every rank's obj, as a list in rank order, on every rank."""
        buf, sizes = self._padded(obj)
        rows = self.allgather(buf)
        return [pickle.loads(rows[i, :sizes[i]].tobytes()) for i in range(self.size)]

    def gather_object(self, obj, root=0):
        """Every rank's obj, as a list in rank order, on root; None elsewhere."""
        buf, sizes = self._padded(obj)  # an allgather of the sizes: every rank pads alike
        rows = self.gather(buf, root=root)
        if self.rank != root:
            return None
        return [pickle.loads(rows[i, :sizes[i]].tobytes()) for i in range(self.size)]
