"""Collectives of Python objects, as mpi4py's lowercase calls and torch's *_object ones: any
picklable object, of any size on each rank. Both communicators (one node, across nodes) have
them; they run on the array collectives, sizes first, then the bytes (allgatherv, gatherv).

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

    def _sized(self, obj):
        """My pickled bytes, and every rank's byte count (an allgather: every rank knows them)."""
        data = _pickled(obj)
        return data, self.allgather(np.array([data.size], np.int64)).reshape(-1)

    def _unpickled(self, flat, sizes):
        at = np.concatenate([[0], np.cumsum(sizes)])
        return [pickle.loads(flat[at[i]:at[i + 1]].tobytes()) for i in range(self.size)]

    def allgather_object(self, obj):
        """Every rank's obj, as a list in rank order, on every rank."""
        data, sizes = self._sized(obj)
        return self._unpickled(self.allgatherv(data, counts=sizes), sizes)

    def gather_object(self, obj, root=0):
        """Every rank's obj, as a list in rank order, on root; None elsewhere."""
        data, sizes = self._sized(obj)
        flat = self.gatherv(data, root=root, counts=sizes)
        return None if flat is None else self._unpickled(flat, sizes)
