"""Parameter sharing through memory servers (ShmCaffe's two modes), for torch models:
hbmcoll.torch.ParameterSharing.

    sharing = hbmcoll.torch.ParameterSharing(model, optimizer, mode="async")
    for x, y in data:
        optimizer.zero_grad(); loss_fn(model(x), y).backward()
        sharing.step()            # instead of optimizer.step()

async (ShmCaffe-A): each worker steps its optimizer on its own gradients, pushes the change of
its parameters to the shared buffer (an accumulate on the servers) and pulls the buffer's
current parameters back, with no barrier among workers. staleness=s bounds how far ahead of the
slowest worker one may run (in steps): a worker that would be more than s steps ahead waits.

hybrid (ShmCaffe-H): inside a group (group=, a communicator: by default the node's, from
hbmcoll.init()) the gradients are averaged first (allreduce over shared memory) and every rank
steps alike; then the group's rank 0 shares with the other groups asynchronously, as above, and
broadcasts the parameters it pulled to its group.

Every worker's first call opens the buffer: the one that creates it writes its parameters, the
others wait for them (version >= 1) and start from them.
"""
import time

import numpy as np
import torch

from .errors import ArgumentError, TimeoutError
from .remote import RemoteBuffer


class ParameterSharing:
    def __init__(self, model, optimizer, mode="async", servers=None, staleness=None, name="parameters",
                 token=None, group=None, timeout=300):
        if mode not in ("async", "hybrid"):
            raise ArgumentError(f"ParameterSharing mode {mode!r}: 'async' or 'hybrid'")
        if staleness is not None and (not isinstance(staleness, int) or staleness < 0):
            raise ArgumentError(f"staleness={staleness!r}: a number of steps >= 0, or None (unbounded)")
        self.params = [p for p in model.parameters()]
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in self.params):
            raise ArgumentError("ParameterSharing shares float32 CPU parameters")
        self.optimizer, self.mode, self.staleness, self.timeout = optimizer, mode, staleness, timeout
        self.group = group
        if mode == "hybrid" and self.group is None:
            import hbmcoll
            self.group = hbmcoll.init()
        self.sharer = self.group is None or self.group.rank == 0  # who talks to the servers
        n = sum(p.numel() for p in self.params)
        self.flat = torch.empty(n, dtype=torch.float32)
        self.steps = 0
        if self.sharer:
            self.buffer = RemoteBuffer(name, (n,), "float32", servers=servers, token=token, timeout=timeout)
            self.iters = RemoteBuffer(name + "/steps", (1 << 10,), "int32", servers=servers, token=token,
                                      timeout=timeout) if staleness is not None else None
            self._first_pull()
        if self.group is not None:
            self._gather()
            self.group.bcast(self.flat, root=0)
            self._scatter()

    def _gather(self):
        torch.cat([p.detach().reshape(-1) for p in self.params], out=self.flat)

    def _scatter(self):
        with torch.no_grad():
            at = 0
            for p in self.params:
                p.copy_(self.flat[at:at + p.numel()].view_as(p))
                at += p.numel()

    def _first_pull(self):
        """The first worker to hold the buffer's lock writes its parameters; all start from the
        buffer's. With a staleness bound, each worker also takes a step counter (its slot)."""
        self._gather()
        with self.buffer.lock(timeout=self.timeout):
            if self.buffer.version == 0:
                self.buffer.write(self.flat)
        self.buffer.read(out=self.flat)
        self._scatter()
        if self.iters is not None:
            with self.iters.lock(timeout=self.timeout):
                counts = self.iters.read()
                self.slot = int(counts[0]) + 1  # counts[0]: how many workers took a slot
                if self.slot >= len(counts):
                    raise ArgumentError(f"ParameterSharing: more than {len(counts) - 1} workers")
                counts[0] += 1
                self.iters.write(counts)

    def step(self):
        """In place of optimizer.step(), after backward()."""
        if self.group is not None and self.group.size > 1:  # hybrid: the group averages first
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.group.allreduce(flat, op="avg")
            at = 0
            for p, g in zip(self.params, grads):
                p.grad = flat[at:at + p.numel()].view_as(p).clone()
                at += p.numel()
        self._gather()
        before = self.flat.clone()
        self.optimizer.step()
        self.steps += 1
        if self.sharer:
            self._gather()
            self.buffer.accumulate(self.flat - before)  # my change, onto everyone's
            self._wait_for_slowest()
            self.buffer.read(out=self.flat)
        if self.group is not None:
            self.group.bcast(self.flat, root=0)
        self._scatter()

    def _wait_for_slowest(self):
        if self.iters is None:
            return
        self._count(1)
        until = time.monotonic() + self.timeout
        while True:
            counts = self.iters.read()
            if self.steps - counts[1:counts[0] + 1].min() <= self.staleness:
                return
            if time.monotonic() > until:
                raise TimeoutError(f"ParameterSharing: waited {self.timeout} s for the slowest worker "
                                   f"(staleness {self.staleness})")
            time.sleep(0.001)

    def _count(self, k):
        one = np.zeros(1 << 10, np.int32)
        one[self.slot] = k
        self.iters.accumulate(one)

    def finish(self):
        """This worker trains no more: the others stop waiting for it (with a staleness bound)."""
        if self.sharer and self.iters is not None:
            self._count(1 << 30)
