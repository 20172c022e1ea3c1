"""Point-to-point messages between two ranks of a communicator, as mpi4py's Send/Recv:

    comm.send(buf, dest, tag=0)
    comm.recv(buf, source=hbmcoll.ANY_SOURCE, tag=hbmcoll.ANY_TAG, status=None)
    req = comm.isend(buf, dest, tag=0); req = comm.irecv(buf, source, tag); req.wait()
    comm.sendrecv(sendbuf, dest, recvbuf, source, sendtag=0, recvtag=ANY_TAG)

Messages from one rank to another arrive in the order they were sent (MPI's non-overtaking
rule). A receive takes the first message from its source (any, with ANY_SOURCE) whose tag
matches (any, with ANY_TAG). A message longer than the receive buffer is a MismatchError; a
shorter one fills its front, and status.nbytes says how much came.

Every call runs in C (comm.CPointToPoint): on one node through the communicator's shared segment
(libcoll/src/p2p*.c), never waiting for ranks that take no part; across nodes as libfabric tagged
messages between every pair of ranks (libcoll/src/nodes_p2p.c), whose endpoints' addresses travel
over the communicator and whose tags carry a secret of the communicator's, so a stranger's message
is never taken (tests/py/test_strangers.py).
"""
import hashlib

ANY_SOURCE = -1
ANY_TAG = -1


class Status:
    """What a receive took: source, tag, nbytes (status= of recv, or Request.status)."""

    def __init__(self):
        self.source, self.tag, self.nbytes = ANY_SOURCE, ANY_TAG, 0

    def __repr__(self):
        return f"<hbmcoll.Status source {self.source} tag {self.tag} nbytes {self.nbytes}>"


def secret_of(key):
    """A communicator's secret, from the key its ranks met by (its splits' keys are made of it)."""
    return hashlib.sha256(b"hbmcoll-p2p\0" + key.encode()).digest()
