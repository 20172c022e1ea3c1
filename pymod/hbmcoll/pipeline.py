"""A large allreduce across nodes with the node's stages overlapping the rings.

Where every local rank carries a ring, an allreduce is three stages: a local reduce-scatter
(local rank l gets slice l of the node's result), ring l reducing slice l across the nodes, and
a local allgather putting the slices together. Run once over the whole message, the node's
cores wait while the rings run and the link waits while the node works. Cut in chunks, chunk k
goes around the rings on the communicator's ring thread (the bridge runs without the GIL) while
the caller's thread reduce-scatters chunk k + 1 and allgathers chunk k - 1.

Every element is still reduced in the same order on every rank (its node's reduce-scatter, then
one member of its ring), so every rank gets the same bits, however the message is cut.
"""
import concurrent.futures
import os

from .comm import _empty_like
from .errors import ArgumentError

CANDIDATES = (1, 2, 4, 8)  # chunk counts tried
MIN_PIECE = 64 << 10       # no chunk's piece (a carrier's part) is smaller: each ring call costs steps
TRIES = 3                  # calls per candidate before the choice


class Tuner:
    """The chunk count for each size of message, chosen from the times of the first calls of that
    size on this host: whether overlapping pays depends on whether the link or the cores are the
    bound, which no constant knows. Node 0's local rank 0 proposes (its proposal rides in the
    call's descriptors, so every rank cuts the same way): it tries the candidates in turn, TRIES
    times each, then keeps the fastest by median. HBMCOLL_PIPELINE_CHUNKS=M fixes the count."""

    def __init__(self, proposer):
        self.proposer = proposer
        self.fixed = fixed_chunks()
        self._times = {}   # size class -> {chunk count: [seconds]}
        self.chosen = {}   # size class -> chunk count

    def pick(self, piece_bytes):
        """This rank's proposal for a call whose pieces are piece_bytes (0: not the proposer)."""
        if not self.proposer:
            return 0
        if self.fixed:
            return self.fixed
        key = piece_bytes.bit_length()
        if key in self.chosen:
            return self.chosen[key]
        times = self._times.setdefault(key, {m: [] for m in CANDIDATES if m == 1 or piece_bytes // m >= MIN_PIECE})
        tried = min(len(t) for t in times.values())
        if tried < TRIES:
            return next(m for m, t in times.items() if len(t) == tried)
        self.chosen[key] = min(times, key=lambda m: sorted(times[m])[TRIES // 2])
        return self.chosen[key]

    def took(self, piece_bytes, chunks, seconds):
        key = piece_bytes.bit_length()
        if self.proposer and not self.fixed and key not in self.chosen and chunks in self._times.get(key, ()):
            self._times[key][chunks].append(seconds)


def fixed_chunks():
    value = os.environ.get("HBMCOLL_PIPELINE_CHUNKS")
    if not value:
        return 0
    if not value.isdigit() or not 1 <= int(value) <= 255:
        raise ArgumentError(f"HBMCOLL_PIPELINE_CHUNKS={value!r}: a chunk count from 1 to 255, or unset "
                            "to choose by measurement")
    return int(value)


def allreduce_sliced(comm, src, base, code, dst, chunks):
    """dst (flat, len(src)) = src (flat) reduced over every rank of every node, with op `base`
    (its bridge code `code`), when every local rank carries a ring; in `chunks` chunks."""
    L, n = comm.local_size, len(src)
    S = -(-n // L)
    if L * S != n:  # pad to L equal slices; the pads are reduced among themselves and dropped
        padded = _empty_like(src, (L * S,))
        padded[:n] = src
        padded[n:] = 0
        src = padded
    piece = _empty_like(src, (S,))
    whole = dst if L * S == n else _empty_like(src, (L * S,))
    c = -(-S // max(1, chunks))
    bounds = [(a, min(a + c, S)) for a in range(0, S, c)] or [(0, 0)]

    def node_stage(k, first):
        a, b = bounds[k]
        if first:
            comm._local.reduce_scatter(src[L * a:L * b], op=base, out=piece[a:b])
        else:
            comm._local.allgather(piece[a:b], out=whole[L * a:L * b])

    def rings(k):
        a, b = bounds[k]
        comm._bridge.allreduce(piece[a:b], code, comm._timeout)

    if comm.nodes < 2 or len(bounds) == 1:
        for k in range(len(bounds)):
            node_stage(k, True)
            if comm.nodes > 1:
                rings(k)
            node_stage(k, False)
    else:
        _overlapped(comm, bounds, node_stage, rings)
    if whole is not dst:
        dst[:] = whole[:n]


def _overlapped(comm, bounds, node_stage, rings):
    """Chunk k's rings on the ring thread while this thread runs the node stages of k +- 1."""
    thread = comm._ring_thread()
    running = {}
    try:
        for k in range(len(bounds) + 1):
            if k < len(bounds):
                node_stage(k, True)
                running[k] = thread.submit(rings, k)
            if k:
                running.pop(k - 1).result()
                node_stage(k - 1, False)
    except BaseException:
        # end the ring thread's waits (they watch the job's connections) before the buffers go
        if comm._watch is not None:
            comm._watch.abort()
        concurrent.futures.wait(list(running.values()))
        raise


def ring_thread():
    """The thread a communicator's rings run on beside its node stages."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hbmcoll-rings")
