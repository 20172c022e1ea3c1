"""A RemoteBuffer's lock (`with rb.lock():`): granted by the server to a connection, shared by this
process's threads, fenced by the grant's token, and lost with its connection (client.py)."""
import threading

from ..errors import ArgumentError, Error, PeerLostError, TimeoutError
from . import protocol as ms

_held = threading.local()  # .locks: {(server address, buffer name): the connection this thread locked it on}


def _holds(conn, name):
    """This thread's record of the buffer locks it holds (every handle of a buffer shares it)."""
    if not hasattr(_held, "locks"):
        _held.locks = {}
    return _held.locks, (conn.addr, name)


def lock_lost(rb, conn):
    """Raise when this thread holds rb's lock, taken on a connection other than conn: that one
    failed, the server let the lock go with it, and another process may hold it now. Writing
    unfenced (the new connection holds no lock) would land as if it were still held."""
    locks, key = _holds(conn, rb.name)
    held = locks.get(key)
    if held is not None and held is not conn:
        raise PeerLostError(f"RemoteBuffer {rb.name!r}: the connection to {held.addr} that held this buffer's lock "
                            "failed, and the lock went with it (another process may hold it now); nothing was "
                            "written: leave the `with rb.lock()` block and take the lock again")


class BufferLock:
    """The server grants a lock to a connection, which this process's threads share: a thread
    first takes the process's own lock of the buffer (reentrant: a holder's striped write takes
    it again), and the outermost holder takes and gives back the server's. The grant's fencing
    token goes with every write the holding thread makes."""

    def __init__(self, rb, timeout, lease):
        self.rb, self.timeout, self.lease = rb, timeout, lease
        if lease is not None and not ms.lease_ok(lease):  # the server would drop the connection
            raise ArgumentError(f"RemoteBuffer {rb.name!r}: lock lease {lease!r}: a number of seconds, more than 0 "
                                f"and at most {ms.MAX_LEASE_S:g}")

    def __enter__(self):
        self.conn, self.bid = conn, bid = self.rb._live()[0][:2]
        lock_lost(self.rb, conn)  # held already (a striped write's own lock), on a connection gone since
        with conn.ctl_lock:
            local = conn.local_locks.setdefault(bid, [threading.RLock(), 0, 0])
        if not local[0].acquire(timeout=-1 if self.timeout is None else self.timeout):
            raise TimeoutError(f"RemoteBuffer {self.rb.name!r}: the lock was not free within {self.timeout} s")
        if local[1] == 0:
            try:
                got = conn.control({"op": "lock", "id": bid, "lease": self.lease}, timeout=self.timeout, drains=True)
            except TimeoutError:
                local[0].release()
                conn.control({"op": "cancel", "id": bid}, until_key="cancelled")  # a late grant is dropped
                raise TimeoutError(f"RemoteBuffer {self.rb.name!r}: the lock was not free within {self.timeout} s") from None
            except BaseException:
                local[0].release()
                raise
            if "error" in got:
                local[0].release()
                raise Error(f"RemoteBuffer {self.rb.name!r}: lock: {got['error']}")
            token = got.get("token")
            if type(token) is not int or token <= 0:  # not a grant: answers out of step
                local[0].release()
                conn.drop()
                raise Error(f"RemoteBuffer {self.rb.name!r}: lock: the server's answer {got!r} is no grant; "
                            "the connection was dropped")
            local[2] = token
            locks, key = _holds(conn, self.rb.name)
            locks[key] = conn
        local[1] += 1
        return self

    def __exit__(self, *exc):
        local = self.conn.local_locks[self.bid]
        local[1] -= 1
        try:
            if local[1] == 0 and self.conn.dead:  # failed (a timeout): the server frees the lock as it closes
                self.conn.drop()
            elif local[1] == 0:
                got = self.conn.control({"op": "unlock", "id": self.bid, "token": local[2]})
                if "error" in got and exc[0] is None:
                    raise Error(f"RemoteBuffer {self.rb.name!r}: unlock: {got['error']}")
        finally:
            if local[1] == 0:
                local[2] = 0
                locks, key = _holds(self.conn, self.rb.name)
                locks.pop(key, None)
            local[0].release()
