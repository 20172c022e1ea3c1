"""The framework-free part of parameter sharing through memory servers (ShmCaffe's modes): one
float32 buffer of a model's parameters on the servers, its first contents, the push of a worker's
change and the pull of everyone's, and the step counters behind a staleness bound. The torch
helper (hbmcoll/torch/param_sharing.py) and the Keras callback (hbmcoll/tensorflow/param_sharing.py)
sit on it.
"""
import time

import numpy as np

from ..errors import ArgumentError, TimeoutError
from .client import RemoteBuffer

MAX_WORKERS = (1 << 10) - 1  # step counters: slot 0 says how many slots were taken


def check_mode(mode, staleness, overlap=None):
    """overlap, from the arguments: True unless a staleness bound needs the exchange in step."""
    if mode not in ("async", "hybrid"):
        raise ArgumentError(f"parameter sharing mode {mode!r}: 'async' or 'hybrid'")
    if staleness is not None and (not isinstance(staleness, int) or staleness < 0):
        raise ArgumentError(f"staleness={staleness!r}: a number of steps >= 0, or None (unbounded)")
    if overlap and staleness is not None:
        raise ArgumentError("overlap=True has no staleness bound: the exchange runs behind the steps; "
                            "give staleness=None, or overlap=False")
    return staleness is None if overlap is None else bool(overlap)


class SharedParameters:
    """n float32 parameters named `name` on the servers, as one worker (or group) sees them."""

    def __init__(self, n, servers=None, token=None, name="parameters", staleness=None, timeout=300, workers=None):
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ArgumentError(f"workers={workers!r}: the number of workers (groups in hybrid), >= 1, or None")
        self.staleness, self.timeout, self.steps, self.workers = staleness, timeout, 0, workers or 1
        self.buffer = RemoteBuffer(name, (n,), "float32", servers=servers, token=token, timeout=timeout)
        # [workers that started, workers that finished]: finish() waits for the two to meet, so
        # every worker ends on the same parameters
        self.members = RemoteBuffer(name + "/members", (2,), "int32", servers=servers, token=token,
                                    timeout=timeout)
        self.iters = None
        if staleness is not None:
            self.iters = RemoteBuffer(name + "/steps", (MAX_WORKERS + 1,), "int32", servers=servers, token=token,
                                      timeout=timeout)

    def start(self, flat):
        """flat (this worker's parameters) becomes the shared ones: the first worker to hold the
        buffer's lock writes its own. With a staleness bound, each worker takes a step counter."""
        with self.buffer.lock(timeout=self.timeout):
            if self.buffer.version == 0:
                self.buffer.write(flat)
        self.buffer.read(out=flat)
        self.members.accumulate(np.array([1, 0], np.int32))
        self._base = np.array(flat, np.float32)  # what the overlapped exchange counts changes from
        if self.iters is not None:
            # Slot 0 counts the slots taken; the lock orders the joins. The join adds to slot 0
            # alone: the running workers count their steps meanwhile, and a write of the whole
            # array would drop those steps (and hang everyone waiting on them).
            with self.iters.lock(timeout=self.timeout):
                taken = int(self.iters.read()[0])
                if taken >= MAX_WORKERS:
                    raise ArgumentError(f"parameter sharing: more than {MAX_WORKERS} workers")
                self.slot = taken + 1
                self._count(1, slot=0)

    def push_pull(self, change, flat):
        """This worker's change of its parameters onto the shared ones; flat becomes theirs."""
        self.buffer.accumulate(change)
        self.steps += 1
        if self.iters is not None:
            self._count(1)
            self._wait_for_slowest()
        self.buffer.read(out=flat)

    # The overlapped exchange (no staleness bound): the push of the change made since the last
    # exchange and the pull of everyone's run on the buffer's worker thread while this worker takes
    # its next steps. How often it exchanges follows the link: as often as the last one finishes.
    def begin(self, flat):
        """Starts pushing flat's change since the last exchange, and pulling the sum."""
        if getattr(self, "_sent", None) is None:
            self._sent, self._delta, self._pulled = (np.empty_like(flat) for _ in range(3))
        np.copyto(self._sent, flat)
        np.subtract(self._sent, self._base, out=self._delta)
        self._pending = (self.buffer.iaccumulate(self._delta), self.buffer.iread(out=self._pulled))

    def ready(self):
        """True when no exchange is in flight, or the one in flight has finished."""
        return getattr(self, "_pending", None) is None or self._pending[1].test()

    def merge(self, flat):
        """The finished exchange into flat, in place: flat moves by what the others added since
        (the pull less what was pushed), keeping the steps taken meanwhile. False: none was in
        flight."""
        if getattr(self, "_pending", None) is None:
            return False
        for req in self._pending:
            req.wait()
        flat += self._pulled
        flat -= self._sent
        self._base, self._pulled, self._pending = self._pulled, self._base, None
        return True

    def _wait_for_slowest(self):
        until = time.monotonic() + self.timeout
        while True:
            counts = self.iters.read()
            if self.steps - counts[1:counts[0] + 1].min() <= self.staleness:
                return
            if time.monotonic() > until:
                raise TimeoutError(f"parameter sharing: waited {self.timeout} s for the slowest worker "
                                   f"(staleness {self.staleness})")
            time.sleep(0.001)

    def _count(self, k, slot=None):
        one = np.zeros(MAX_WORKERS + 1, np.int32)
        one[self.slot if slot is None else slot] = k
        self.iters.accumulate(one)

    def finish(self, flat, overlapped=False):
        """This worker trains no more: its change not yet pushed goes out (overlapped), the others
        stop waiting for it (with a staleness bound), and once every worker (the `workers` given,
        else every one that has started) has finished, flat becomes the shared parameters: every
        worker ends on the same model."""
        if overlapped:
            self.merge(flat)
            self.buffer.accumulate(flat - self._base)
        if self.iters is not None:
            self._count(1 << 30)
        self.members.accumulate(np.array([0, 1], np.int32))
        until = time.monotonic() + self.timeout
        while True:
            started, finished = (int(v) for v in self.members.read())
            if finished >= max(started, self.workers):
                break
            if time.monotonic() > until:
                raise TimeoutError(f"parameter sharing: {max(started, self.workers) - finished} of "
                                   f"{max(started, self.workers)} workers had not "
                                   f"finished after {self.timeout} s; this worker keeps its own parameters")
            time.sleep(0.005)
        self.buffer.read(out=flat)
