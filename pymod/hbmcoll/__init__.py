"""hbmcoll: collectives for Python processes on many-core nodes, and across nodes.

    import hbmcoll
    comm = hbmcoll.init()          # under hbmcoll-run, torchrun, mpiexec or srun
    comm.allreduce(grads)          # in place, NumPy arrays or torch tensors
    comm.bcast(params, root=0)

See docs/api.md for the whole API.
"""
from .errors import (ArgumentError, BootstrapError, CodedError, Error,  # noqa: F401
                     ForkedError, MismatchError, NotFoundError, NotSupportedError,
                     OutOfMemoryError, PeerLostError, SystemCallError, TimeoutError)
from .comm import Communicator, Request, empty  # noqa: F401
from .launch.job import init  # noqa: F401
from .p2p import ANY_SOURCE, ANY_TAG, Status  # noqa: F401
from .memserver.client import RemoteBuffer  # noqa: F401

from ._version import __version__  # noqa: F401

__all__ = ["init", "empty", "topology", "RemoteBuffer", "Communicator", "Request", "Status", "ANY_SOURCE",
           "ANY_TAG", "Error", "MismatchError",
           "PeerLostError", "TimeoutError", "ArgumentError", "OutOfMemoryError", "BootstrapError",
           "NotSupportedError", "ForkedError", "SystemCallError", "NotFoundError", "CodedError"]


def topology(ranks=None):
    """Topology facts and the placement plan of this machine (dict)."""
    from .tools.topo import topology as _topology

    return _topology(ranks=ranks)
