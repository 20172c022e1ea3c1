"""hbmcoll.RemoteBuffer: a named buffer on memory servers (hbmcoll-memserver, memserver.py).

    rb = hbmcoll.RemoteBuffer("weights", (1024, 1024), "float32")   # servers, token: from the env
    rb.write(a); rb.accumulate(g, alpha=-0.01); a = rb.read(); rb.version
    with rb.lock(timeout=5): ...
    req = rb.iaccumulate(g); ...; req.wait()

The buffer is striped over the servers given (part k of its elements on server k), for bandwidth
and capacity. Each process keeps one connection per server: a TCP control connection, which
proves the token, and a bridge endpoint (libfabric) whose pool stages the requests and takes the
replies. NumPy arrays, torch CPU tensors and hbmcoll.empty arrays go in as they are; their
bytes are copied once into the pool (the endpoint's registered memory).

A read never mixes two writes: a server applies a request whole, chunks and all, before the
next; a striped buffer's writes hold its lock, and its read is repeated until every part shows
as many whole writes (accumulates may land between the parts' reads: they add up alike).
"""
import os
import secrets
import socket
import threading
import time

import numpy as np

from . import memproto as ms
from .comm import _is_numpy
from .errors import ArgumentError, Error, MismatchError, PeerLostError, TimeoutError
from .in_order import InOrder

_connections = {}
_connections_lock = threading.Lock()


def _servers(servers):
    text = servers if servers is not None else os.environ.get("HBMCOLL_MEMSERVERS", "")
    found = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    if not found:
        raise ArgumentError("RemoteBuffer: no memory servers: pass servers= or set HBMCOLL_MEMSERVERS=host:port,...")
    for s in found:
        host, _, port = s.rpartition(":")
        if not host or not port.isdigit():
            raise ArgumentError(f"memory server {s!r}: give host:port")
    return found


def _token(token):
    if token is not None:
        return ms.check_token(token, "RemoteBuffer token=") if token else _no_token()
    if os.environ.get("HBMCOLL_TOKEN") is not None:
        token = os.environ["HBMCOLL_TOKEN"]
        return ms.check_token(token, "HBMCOLL_TOKEN") if token else _no_token()
    if os.environ.get("HBMCOLL_TOKEN_FILE"):
        try:
            return ms.read_token(os.environ["HBMCOLL_TOKEN_FILE"])
        except OSError as exc:
            raise PermissionError(f"HBMCOLL_TOKEN_FILE: {exc}") from None
    return _no_token()


def _no_token():
    raise PermissionError("RemoteBuffer: no token: pass token= or set HBMCOLL_TOKEN or HBMCOLL_TOKEN_FILE")


class _Connection:
    """This process's connection to one memory server."""

    def __init__(self, addr, token, timeout):
        from . import _core
        from .layout import iface_to
        host, _, port = addr.rpartition(":")
        self.addr, self.timeout = addr, timeout
        until = time.monotonic() + (timeout or 30)
        while True:  # a server started beside the job (hbmcoll-run --memservers) may still be starting
            try:
                self.sock = socket.create_connection((host, int(port)), timeout=timeout or 30)
                break
            except ConnectionRefusedError as exc:
                if time.monotonic() > until:
                    raise PeerLostError(f"no memory server at {addr} ({exc.strerror or exc})") from None
                time.sleep(0.2)
            except OSError as exc:
                raise PeerLostError(f"no memory server at {addr} ({exc.strerror or exc})") from None
        hello = self._recv()
        self.ep = _core.Bridge(iface_to(host), 2 * ms.SLOT_BYTES)
        ms.send_msg(self.sock, {"proof": ms.proof(token, bytes.fromhex(hello["nonce"])), "card": self.ep.card().hex(),
                                "reply_to": ms.SLOT_BYTES})
        answer = self._recv()
        if "error" in answer:
            self.close()
            if answer["error"].startswith("refused"):
                raise PermissionError(f"memory server {addr}: {answer['error']}")
            raise Error(f"memory server {addr}: {answer['error']}")
        self.peer = self.ep.add_peer(bytes.fromhex(answer["card"]))
        self.slot, self.index = answer["slot"], answer["client"]
        self.ep.watch(self.sock.fileno(), f"the memory server at {addr}")
        self.pool = np.frombuffer(self.ep.pool(), np.uint8)
        self.number, self.half = 0, 0
        self.replies = {}                 # request number -> status, of replies seen
        self.lock = threading.Lock()      # the data path: one caller's requests at a time
        self.ctl_lock = threading.Lock()  # the control connection: one exchange at a time
        self.local_locks = {}             # buffer id -> [this process's lock of it, depth] (_Lock)

    def _recv(self):
        try:
            msg = ms.recv_msg(self.sock)
        except socket.timeout:
            raise TimeoutError(f"the memory server at {self.addr} did not answer in {self.sock.gettimeout()} s") from None
        except OSError as exc:
            msg, _ = None, exc
        if msg is None:
            raise PeerLostError(f"the connection to the memory server at {self.addr} closed: the server is gone")
        return msg

    def control(self, msg, timeout=None, until_key=None):
        """Send msg; the answer (the first that has until_key, when given: the others are dropped)."""
        with self.ctl_lock:
            try:
                ms.send_msg(self.sock, msg)
            except OSError:
                raise PeerLostError(f"the connection to the memory server at {self.addr} closed") from None
            self.sock.settimeout(timeout if timeout is not None else (self.timeout or None))
            try:
                got = self._recv()
                while until_key is not None and until_key not in got:
                    got = self._recv()
                return got
            finally:
                self.sock.settimeout(self.timeout or None)

    def request(self, op, bid, off, length, src=None, alpha=0.0, flags=ms.FIRST | ms.LAST, dst=None):
        """One request; its reply's (version, whole writes). src: bytes to send; dst: where a
        read's land."""
        return self.run([(op, bid, off, length, flags, src, dst, alpha)])

    def run(self, requests):
        """requests ((op, buffer id, offset, length, flags, src, dst, alpha), each of at most
        half a slot) with two in flight: one travels while the server applies the other. The
        last reply's (version, whole writes)."""
        with self.lock:
            flight, got, refused = [], None, False
            for req in requests:
                if len(flight) == 2:
                    got, bad = self._reply(*flight.pop(0))
                    refused = refused or bad
                if not refused:
                    flight.append(self._post(*req))
            for f in flight:
                got, bad = self._reply(*f)
                refused = refused or bad
            if refused:
                raise ArgumentError(f"the memory server at {self.addr} refused the request (outside the buffer, "
                                    "or an accumulate its dtype cannot take)")
            return got

    def _post(self, op, bid, off, length, flags, src, dst, alpha):
        number, half = (self.number + 1) & ms.NUMBER, self.half
        at = half * ms.HALF
        ms.HEAD.pack_into(self.pool, at, ms.MAGIC, op | flags, bid, off, length, alpha, number)
        if src is not None:
            self.pool[at + ms.HEAD_BYTES:at + ms.HEAD_BYTES + length] = src
        self.ep.write(self.peer, at, self.slot + at, ms.HEAD_BYTES + (length if src is not None else 0),
                      self.index | (half << 16), self.timeout or 0)
        self.number, self.half = number, half ^ 1  # only once sent: the server waits for numbers in order
        return number, half, length, dst

    def _reply(self, number, half, length, dst):
        """Request number's reply: ((version, whole writes), refused); a read's bytes into dst."""
        until = time.monotonic() + self.timeout if self.timeout else None
        while number not in self.replies:
            note = self.ep.poll(0.05)
            if note is not None:
                self.replies[note & ms.NUMBER] = note >> 28
            elif until is not None and time.monotonic() > until:
                raise TimeoutError(f"the memory server at {self.addr} did not answer in {self.timeout} s")
        at = ms.SLOT_BYTES + half * ms.HALF
        if self.replies.pop(number) == ms.REFUSED:
            return None, True
        if dst is not None:
            dst[:] = self.pool[at + ms.REPLY.size:at + ms.REPLY.size + length]
        return ms.REPLY.unpack_from(self.pool, at), False

    def close(self):
        try:
            self.sock.close()
        finally:
            self.ep.close()


def _connection(addr, token, timeout):
    with _connections_lock:
        conn = _connections.get((addr, token))
        if conn is None:
            conn = _connections[addr, token] = _Connection(addr, token, timeout)
        return conn


def _dtype_name(dtype):
    name = str(dtype).replace("torch.", "")
    if name not in ms.DTYPES:
        raise ArgumentError(f"RemoteBuffer dtype {dtype!r}: one of {', '.join(ms.DTYPES)}")
    return name


def _raw(x):
    if _is_numpy(x):
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    return x.detach().contiguous().reshape(-1).view(__import__("torch").uint8).numpy()


class RemoteBuffer:
    """A buffer of shape and dtype named `name` on the memory servers; see the module's text."""

    def __init__(self, name, shape, dtype="float32", servers=None, token=None, timeout=None):
        self.name, self.shape = name, tuple(int(d) for d in (shape if hasattr(shape, "__len__") else (shape,)))
        if any(d < 0 for d in self.shape):  # the server would drop the connection
            raise ArgumentError(f"RemoteBuffer {name!r}: shape {self.shape}: sizes must not be negative")
        self.dtype = _dtype_name(dtype)
        self.itemsize = 2 if self.dtype == "bfloat16" else np.dtype(self.dtype).itemsize
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.itemsize
        addrs, token = _servers(servers), _token(token)
        n, S = self.nbytes // self.itemsize, len(addrs)
        bounds = [(k * n // S * self.itemsize, (k + 1) * n // S * self.itemsize) for k in range(S)]
        self._parts = []  # (connection, buffer id, first byte, last byte)
        for k, (addr, (lo, hi)) in enumerate(zip(addrs, bounds)):
            conn = _connection(addr, token, timeout)
            got = conn.control({"op": "open", "name": f"{name}#{k}/{S}", "shape": [(hi - lo) // self.itemsize],
                                "whole": list(self.shape), "dtype": self.dtype})
            if got.get("error") == "mismatch":
                raise MismatchError(f"RemoteBuffer {name!r}: {got['text']}")
            if "error" in got:
                raise Error(f"RemoteBuffer {name!r} on {addr}: {got.get('text', got['error'])}")
            self._parts.append((conn, got["id"], lo, hi))
        self._calls = InOrder(lambda fn: fn())

    def __repr__(self):
        return f"<hbmcoll RemoteBuffer {self.name!r} {self.shape} {self.dtype} on {len(self._parts)} server(s)>"

    def _each_chunk(self, op, raw, alpha=0.0):
        """op over raw (this buffer's bytes), part by part, in chunks of half a slot: each part's
        (version, whole writes) after it."""
        step = ms.HALF - ms.HEAD_BYTES
        got = []
        for conn, bid, lo, hi in self._parts:
            chunks = []
            for off in range(0, hi - lo, step):
                piece = raw[lo + off:lo + min(off + step, hi - lo)]
                flags = (ms.FIRST if off == 0 else 0) | (ms.LAST if off + step >= hi - lo else 0)
                chunks.append((op, bid, off, piece.size, flags, None if op == ms.READ else piece,
                               piece if op == ms.READ else None, alpha))
            got.append(conn.run(chunks) if chunks else conn.request(ms.READ, bid, 0, 0))
        return got

    def _write_whole(self, raw):
        """A write; striped, it holds the buffer's lock (reentrant, for a holder of rb.lock()), so writes reach every part in one order and a read can tell a torn mix (_read_whole)."""
        if len(self._parts) == 1:
            return self._each_chunk(ms.WRITE, raw)
        with self.lock(timeout=self._parts[0][0].timeout,
                       lease=min(max(ms.LEASE_S, self._parts[0][0].timeout or 0), ms.MAX_LEASE_S)):
            return self._each_chunk(ms.WRITE, raw)

    def _read_whole(self, raw):
        """A read; striped, again until every part shows as many whole writes: one that ran
        between two parts' reads shows in one count and not the other."""
        until = time.monotonic() + (self._parts[0][0].timeout or 300)
        while True:
            got = self._each_chunk(ms.READ, raw)
            if len({w for _, w in got}) == 1:
                return
            if time.monotonic() > until:
                raise TimeoutError(f"RemoteBuffer {self.name!r}: no read between writes within the timeout "
                                   "(the striped parts kept changing)")

    def _check(self, a):
        raw = _raw(a)
        if raw.size != self.nbytes:
            raise ArgumentError(f"RemoteBuffer {self.name!r} holds {self.nbytes} bytes; this array has {raw.size}")
        return raw

    def read(self, out=None):
        """The buffer's contents, into out (default: a new NumPy array, or bfloat16 torch tensor)."""
        return self._calls.call(self._read_fn(out)[0])

    def iread(self, out=None):
        """read in the background, in order with this buffer\'s other calls: a Request."""
        return self._calls.start(*self._read_fn(out))

    def _read_fn(self, out):
        if out is None:
            if self.dtype == "bfloat16":
                import torch
                out = torch.empty(self.shape, dtype=torch.bfloat16)
            else:
                out = np.empty(self.shape, self.dtype)
        raw = _raw(out)
        if raw.size != self.nbytes or (not _is_numpy(out) and not out.is_contiguous()):
            raise ArgumentError(f"read: out must be contiguous and hold {self.nbytes} bytes")
        return (lambda: (self._read_whole(raw), out)[1]), out

    def write(self, a):
        """The buffer's contents become a's."""
        raw = self._check(a)
        self._calls.call(lambda: self._write_whole(raw))

    def iwrite(self, a):
        """write in the background, in order with this buffer\'s other calls: a Request."""
        raw = self._check(a)
        return self._calls.start(lambda: self._write_whole(raw), None)

    def accumulate(self, a, alpha=1.0):
        """buffer += alpha * a, applied by the server (no update is lost to a concurrent one)."""
        raw = self._check(a)
        self._calls.call(lambda: self._each_chunk(ms.ACCUMULATE, raw, float(alpha)))

    def iaccumulate(self, a, alpha=1.0):
        """accumulate in the background, in order with this buffer\'s other calls: a Request."""
        raw = self._check(a)
        return self._calls.start(lambda: self._each_chunk(ms.ACCUMULATE, raw, float(alpha)), None)

    @property
    def version(self):
        """How many writes and accumulates the buffer has taken (on its least updated server)."""
        return self._calls.call(lambda: min(conn.request(ms.READ, bid, 0, 0)[0] for conn, bid, _, _ in self._parts))

    def lock(self, timeout=None, lease=None):
        """with rb.lock(timeout=5): ... -- the buffer's lock (on its first server), held for a lease
        (default memproto.LEASE_S): a holder that dies or overruns it loses it."""
        return _Lock(self, timeout, lease)


class _Lock:
    """The server grants a lock to a connection, which this process's threads share: a thread
    first takes the process's own lock of the buffer (reentrant: a holder's striped write takes
    it again), and the outermost holder takes and gives back the server's."""

    def __init__(self, rb, timeout, lease):
        self.rb, self.timeout, self.lease = rb, timeout, lease
        if lease is not None and not ms.lease_ok(lease):  # the server would drop the connection
            raise ArgumentError(f"RemoteBuffer {rb.name!r}: lock lease {lease!r}: a number of seconds, more than 0 "
                                f"and at most {ms.MAX_LEASE_S:g}")
        self.conn, self.bid = rb._parts[0][:2]

    def __enter__(self):
        conn, bid = self.conn, self.bid
        with conn.ctl_lock:
            local = conn.local_locks.setdefault(bid, [threading.RLock(), 0])
        if not local[0].acquire(timeout=-1 if self.timeout is None else self.timeout):
            raise TimeoutError(f"RemoteBuffer {self.rb.name!r}: the lock was not free within {self.timeout} s")
        if local[1] == 0:
            try:
                got = conn.control({"op": "lock", "id": bid, "lease": self.lease}, timeout=self.timeout)
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
        local[1] += 1
        return self

    def __exit__(self, *exc):
        local = self.conn.local_locks[self.bid]
        local[1] -= 1
        try:
            if local[1] == 0:
                got = self.conn.control({"op": "unlock", "id": self.bid})
                if "error" in got and exc[0] is None:
                    raise Error(f"RemoteBuffer {self.rb.name!r}: unlock: {got['error']}")
        finally:
            local[0].release()


def new_token():
    """A random job token (for HBMCOLL_TOKEN or a token file)."""
    return secrets.token_hex(16)
