"""What hbmcoll.torch and hbmcoll.tensorflow share of Horovod's API: the op names, their
check, and the job functions (init, shutdown, rank, size, barrier, ...) over one hbmcoll
communicator; each module makes one Job and exports its bound methods under Horovod's names."""
from ..errors import ArgumentError

# Horovod's op names (hbmcoll's op strings)
Average, Sum, Min, Max, Product = "avg", "sum", "min", "max", "prod"
Adasum = "adasum"


def op_of(average, op):
    """The op of a Horovod call from its op= and deprecated average= arguments."""
    if op is None:
        op = Average if average is None or average else Sum
    elif average is not None:
        raise ArgumentError("pass either op= or the deprecated average=, not both")
    if op == Adasum:
        raise ArgumentError("hbmcoll does not implement Adasum; use Average or Sum")
    if op not in (Average, Sum, Min, Max, Product):
        raise ArgumentError(f"unknown op {op!r}: use Average, Sum, Min, Max or Product")
    return op


class Job:
    """The communicator behind a module's hvd.* functions.

    `default` makes the communicator when init() is given none; `owned(comm)` says whether
    shutdown() may close it (hbmcoll.torch does not close torch.distributed's); `any_thread`
    lets the framework's own threads issue collectives (Communicator.bind_thread explains why
    that is refused by default)."""

    def __init__(self, module, default, owned=lambda comm: True, any_thread=False):
        self._module = module
        self._default = default
        self._owned = owned
        self._any_thread = any_thread  # the framework's threads issue the collectives
        self.comm = None

    def init(self, comm=None):
        """Join the job (idempotent): the given hbmcoll Communicator, else one made from the
        launcher's environment (hbmcoll-run, torchrun, mpiexec, srun)."""
        if comm is not None:
            self.comm = comm
        elif self.comm is None or self.comm.closed:
            self.comm = self._default()
        if self._any_thread:
            self.comm._allow_any_thread()
        return self.comm

    def get(self):
        if self.comm is None:
            raise ArgumentError(f"{self._module} has not been initialised: call init() first")
        return self.comm

    def is_initialized(self):
        """True between init() and shutdown()."""
        return self.comm is not None and not self.comm.closed

    def shutdown(self):
        """Leave the job: close the communicator init() made or was given."""
        c, self.comm = self.comm, None
        if c is not None and self._owned(c):
            c.close()

    def rank(self):
        """This process's rank in the job."""
        return self.get().rank

    def size(self):
        """How many ranks the job has."""
        return self.get().size

    def local_rank(self):
        """This process's rank on its node."""
        return self.get().local_rank

    def local_size(self):
        """How many ranks this node has."""
        return self.get().local_size

    def cross_rank(self):
        """Horovod's: among the nodes that have this local rank, this node's number (0 on one node)."""
        return self.get().cross_rank

    def cross_size(self):
        """Horovod's: how many nodes have this local rank (1 on one node)."""
        return self.get().cross_size

    def barrier(self):
        self.get().barrier()

    def join(self):
        """Horovod's join() for ranks that ran out of data: here every rank must call the same
        collectives, so this is a barrier (returns the last rank, as Horovod does)."""
        self.get().barrier()
        return self.get().size - 1
