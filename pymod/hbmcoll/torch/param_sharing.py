"""Parameter sharing through memory servers (ShmCaffe's two modes), for torch models:
hbmcoll.torch.ParameterSharing.

    sharing = hbmcoll.torch.ParameterSharing(model, optimizer, mode="async")
    for x, y in data:
        optimizer.zero_grad(); loss_fn(model(x), y).backward()
        sharing.step()            # instead of optimizer.step()
    sharing.finish()

async (ShmCaffe-A): each worker steps its optimizer on its own gradients, pushes the change of
its parameters to the shared buffer (an accumulate on the servers) and pulls the buffer's
current parameters back, with no barrier among workers. staleness=s bounds how far ahead of the
slowest worker one may run (in steps): a worker that would be more than s steps ahead waits.

hybrid (ShmCaffe-H): inside a group (group=, a communicator: by default the node's, from
hbmcoll.init()) the gradients are averaged first (allreduce over shared memory) and every rank
steps alike; then the group's rank 0 shares with the other groups asynchronously, as above, and
broadcasts the parameters it pulled to its group.

Without a staleness bound the exchange with the servers overlaps the training (overlap=True by
default): the push of the change made since the last exchange and the pull of the sum run in the
background while the next steps are taken, and when they finish the parameters move by what the
others added meanwhile; then the next exchange starts. A slow link is exchanged with less often
instead of holding every step. overlap=False (or a staleness bound) exchanges in step: every
step pushes and pulls before the next begins, so its parameters are fresher.

The first worker to reach the servers writes its parameters; every worker starts from them.
"""
import torch

from ..errors import ArgumentError
from ..launch.job import init as _init
from ..memserver.param_sharing import SharedParameters, check_mode


class ParameterSharing:
    """A torch model's parameters shared through memory servers, asynchronously (mode="async") or
    allreduced inside a group and asynchronous between groups (mode="hybrid"); the module's text
    says how. Call step() in place of optimizer.step() and finish() once at the end. servers and
    token default to HBMCOLL_MEMSERVERS and HBMCOLL_TOKEN; name tells jobs' buffers apart; a
    wait on the servers longer than timeout seconds raises TimeoutError. workers: how many
    workers share (groups, in hybrid); finish() waits for that many, else for every worker that
    has started, which a worker that starts late is not."""

    def __init__(self, model, optimizer, mode="async", servers=None, staleness=None, name="parameters",
                 token=None, group=None, timeout=300, overlap=None, workers=None):
        self.overlap = check_mode(mode, staleness, overlap)
        self.params = list(model.parameters())
        if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in self.params):
            raise ArgumentError("ParameterSharing shares float32 CPU parameters")
        self.optimizer, self.mode = optimizer, mode
        self.group = group
        self._made = None  # the communicator made here for the default group: finish() closes it
        if mode == "hybrid" and self.group is None:
            self._made = _init()
            # across nodes: this node's ranks (a split: finish() closes it before what it came from)
            self.group = self._made.split(self._made.node) if self._made.nodes > 1 else self._made
        self.sharer = self.group is None or self.group.rank == 0  # who talks to the servers
        self.flat = torch.empty(sum(p.numel() for p in self.params), dtype=torch.float32)
        self.shared = None
        self._gather()
        self._as_views()  # the parameters live in flat from here on: no gather or scatter per step
        if not self.overlap:  # the in-step exchange's change of one step (the overlapped one keeps its own)
            self.before, self.change = torch.empty_like(self.flat), torch.empty_like(self.flat)
        self.grads = torch.empty_like(self.flat) if self.group is not None and self.group.size > 1 else None
        self.merged = torch.zeros(1, dtype=torch.int32)  # overlapped: did this step take in the others'?
        if self.sharer:
            self.shared = SharedParameters(len(self.flat), servers, token, name, staleness, timeout, workers)
            self.shared.start(self.flat)
        if self.group is not None:
            self.group.bcast(self.flat, root=0)

    @property
    def buffer(self):
        """The RemoteBuffer of the shared parameters (on the group's rank 0 only)."""
        return self.shared.buffer if self.shared else None

    def _gather(self):
        torch.cat([p.detach().reshape(-1) for p in self.params], out=self.flat)

    def _as_views(self):
        at = 0
        for p in self.params:  # the optimizer holds the Parameter objects, which stay
            p.data = self.flat[at:at + p.numel()].view_as(p)
            at += p.numel()

    def step(self):
        """In place of optimizer.step(), after backward()."""
        if self.group is not None and self.group.size > 1:  # hybrid: the group averages first
            # the gradients may already be the views of self.grads given last step (zero_grad
            # without set_to_none, or accumulation): then they are in place; else they come in
            if not all(p.grad is not None and p.grad._base is self.grads for p in self.params):
                torch.cat([(torch.zeros_like(p) if p.grad is None else
                            p.grad.clone() if p.grad._base is self.grads else p.grad).reshape(-1)
                           for p in self.params], out=self.grads)
            self.group.allreduce(self.grads, op="avg")
            at = 0
            for p in self.params:  # views of the averaged gradients, until the next backward
                p.grad = self.grads[at:at + p.numel()].view_as(p)
                at += p.numel()
        if self.overlap:
            self.optimizer.step()
            self._exchange_behind()
            return
        if self.sharer:
            self.before.copy_(self.flat)
        self.optimizer.step()
        if self.sharer:
            torch.sub(self.flat, self.before, out=self.change)
            self.shared.push_pull(self.change, self.flat)
        if self.group is not None:
            self.group.bcast(self.flat, root=0)

    def _exchange_behind(self):
        """The overlapped exchange: when the one in flight has finished, its pull goes into the
        parameters and the next starts. The group's ranks step alike, so they need the parameters
        only on the steps that took in the others' (a flag says which)."""
        if self.sharer:
            self.merged[0] = 0
            if self.shared.ready():
                self.merged[0] = int(self.shared.merge(self.flat.numpy()))
                self.shared.begin(self.flat.numpy())
        if self.group is not None and self.group.size > 1:
            self.group.bcast(self.merged, root=0)
            if self.merged[0]:
                self.group.bcast(self.flat, root=0)

    def finish(self):
        """This worker trains no more (every rank of the job calls it). Its last change goes to the
        servers, the others stop waiting for it (with a staleness bound), and when every worker
        that started has finished, every worker's model holds the servers' final parameters: the
        same on every rank, so any rank's model is the one to checkpoint. The group's communicator
        closes if this made it."""
        if self.shared is not None:
            self.shared.finish(self.flat.numpy(), overlapped=self.overlap)
        if self.group is not None:
            self.group.bcast(self.flat, root=0)
        if self._made is not None:
            if self.group is not self._made:
                self.group.close()
            self._made.close()
            self._made = None
