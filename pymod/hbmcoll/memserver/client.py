"""hbmcoll.RemoteBuffer: a named buffer on memory servers (hbmcoll-memserver, server.py).

    rb = hbmcoll.RemoteBuffer("weights", (1024, 1024), "float32")   # servers, token: from the env
    rb.write(a); rb.accumulate(g, alpha=-0.01); a = rb.read(); rb.version
    with rb.lock(timeout=5): ...
    req = rb.iaccumulate(g); ...; req.wait()

The buffer is striped over the servers given (part k of its elements on server k), for bandwidth
and capacity. Each process keeps one connection per server: a TCP control connection, which
proves the token, and a bridge endpoint (libfabric) whose pool stages the requests and takes the
replies. NumPy arrays, torch CPU tensors and hbmcoll.empty arrays go in as they are; their
bytes are copied once into the pool (the endpoint's registered memory).

A read never mixes two writes (protocol.py has the protocol's guarantees): a server applies a
write whole, chunks and all, and a read never waits for a writer stopped half way (the server
drops its chunks past a deadline). A striped buffer's writes hold its lock, every part carries
the write's id, and a read is whole when every part holds the same write id (accumulates land
part by part and leave it alone). Writes and accumulates carry their dtype, which must be the
buffer's. A write made under rb.lock() carries the lock's fencing token: once the lease ran out
the server refuses it (hbmcoll.Error, "the lock's lease ran out") and writes nothing. Writes
without the lock stay allowed. Every reply is awaited for timeout= (protocol.DATA_TIMEOUT_S
unless given). A connection that failed is dropped and made again at the next call; a buffer
whose server restarted meanwhile is gone with it (PeerLostError), never read from the new one.
"""
import hmac
import itertools
import os
import secrets
import select
import socket
import threading
import time

import numpy as np

from ..nodes import netaddr
from ..comm import _is_numpy
from ..errors import ArgumentError, Error, MismatchError, PeerLostError, TimeoutError
from .in_order import InOrder
from .lock import BufferLock, lock_lost
from . import protocol as ms

_connections = {}
_connections_lock = threading.RLock()  # (a connection failing as it is made calls fail() under it)
_WID_BASE = secrets.randbits(31) << 32  # this process's write ids: its own, with a sequence
_wids = itertools.count(1)


def _wid():
    return _WID_BASE | (next(_wids) & 0xFFFFFFFF) | (1 << 63)  # never 0: 0 is "never written"


def _servers(servers):
    text = servers if servers is not None else os.environ.get("HBMCOLL_MEMSERVERS", "")
    found = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    if not found:
        raise ArgumentError("RemoteBuffer: no memory servers: pass servers= or set HBMCOLL_MEMSERVERS=host:port,...")
    for s in found:
        try:
            host, _ = netaddr.split(s)
        except ValueError:
            host = ""
        if not host:
            raise ArgumentError(f"memory server {s!r}: give host:port ([v6-address]:port for IPv6)")
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
        host, port = netaddr.split(addr)
        self.addr, self.timeout, self.dead = addr, timeout, False
        self.token, self.ep = token, None
        until = time.monotonic() + (timeout or 30)  # the whole handshake's
        while True:  # closed before its answer: a flood of connections at the server pushed it out
            self._connect(host, port, until)
            # Both sides prove the token, each on the other's nonce, before this side sends its card
            # (a key to its pool): a stranger posing as the server learns nothing of use.
            try:
                self.sock.settimeout(max(until - time.monotonic(), 0.1))
                hello, mine = self._recv(), secrets.token_bytes(16)
                ms.send_msg(self.sock, {"proof": ms.proof(token, bytes.fromhex(hello["nonce"])), "nonce": mine.hex()})
                answer = self._answer()
                break
            except (PeerLostError, ConnectionError):  # (a refusal, PermissionError, is final)
                self.sock.close()
                if time.monotonic() > until:
                    raise
                self.dead = False
                time.sleep(0.1)
            except BaseException:
                self.sock.close()
                raise
        try:
            self._joined(host, mine, answer)
        except BaseException:
            self.close()
            raise

    def _joined(self, host, mine, answer):
        """The handshake's second half: the server's proof checked, then the cards swapped."""
        from .. import _core
        from ..nodes.where import iface_to
        addr, token = self.addr, self.token
        self.sock.settimeout(self.timeout or 30)
        self.ep = _core.Bridge(iface_to(host), 2 * ms.SLOT_BYTES, None, netaddr.family(host))
        given = answer.get("proof")
        if not isinstance(given, str) or not hmac.compare_digest(given, ms.proof(token, mine, "server")):
            self.close()
            raise PermissionError(f"the memory server at {addr} could not prove the token: refused (this client "
                                  "sent it nothing but its own proof)")
        self.peer = self.ep.add_peer(bytes.fromhex(answer["card"]))
        ms.send_msg(self.sock, {"card": self.ep.card().hex(), "reply_to": ms.SLOT_BYTES})
        answer = self._answer()
        self.slot, self.index = answer["slot"], answer["client"]
        self.ep.watch(self.sock.fileno(), f"the memory server at {addr}")
        self.pool = np.frombuffer(self.ep.pool(), np.uint8)
        self.number, self.half = 0, 0
        self.replies = {}                 # request number -> status, of replies seen
        self.lock = threading.Lock()      # the data path: one caller's requests at a time
        self.ctl_lock = threading.Lock()  # the control connection: one exchange at a time
        self.local_locks = {}             # buffer id -> [this process's lock of it, depth, token] (lock.py)

    def _connect(self, host, port, until):
        while True:  # a server started beside the job (hbmcoll-run --memservers) may still be starting
            try:
                self.sock = socket.create_connection((host, int(port)), timeout=max(until - time.monotonic(), 0.1))
                return
            except ConnectionRefusedError as exc:
                if time.monotonic() > until:
                    raise PeerLostError(f"no memory server at {self.addr} ({exc.strerror or exc})") from None
                time.sleep(0.2)
            except OSError as exc:
                raise PeerLostError(f"no memory server at {self.addr} ({exc.strerror or exc})") from None

    def _answer(self):
        """The server's next message during the handshake; its refusal raised."""
        answer = self._recv()
        if "error" in answer:
            self.close()
            if answer["error"].startswith("refused"):
                raise PermissionError(f"memory server {self.addr}: {answer['error']}")
            raise Error(f"memory server {self.addr}: {answer['error']}")
        return answer

    def _recv(self):
        try:
            msg = ms.recv_msg(self.sock)
        except socket.timeout:
            raise TimeoutError(f"the memory server at {self.addr} did not answer in {self.sock.gettimeout()} s") from None
        except OSError as exc:
            msg, _ = None, exc
        if msg is None:
            self.fail()
            raise PeerLostError(f"the connection to the memory server at {self.addr} closed: the server is gone")
        return msg

    def fail(self):
        """This connection is done: the next call makes another (the server may have restarted)."""
        self.dead = True
        with _connections_lock:
            if _connections.get((self.addr, self.token)) is self:
                del _connections[self.addr, self.token]

    def hung_up(self):
        """Whether the server closed this idle connection (it stopped, or restarted at the same
        address): an idle control socket has nothing to read but the server's goodbye or its end
        of file. One in an exchange is live enough; that exchange finds out."""
        if self.dead or not self.ctl_lock.acquire(blocking=False):
            return self.dead
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            readable = True
        finally:
            self.ctl_lock.release()
        self.dead = bool(readable)  # (the caller holds _connections_lock, and replaces it)
        return self.dead

    def drop(self):
        """fail(), and the server told at once (the socket shut): it frees this connection's locks,
        and no answer still on its way can be read as another request's."""
        self.fail()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def control(self, msg, timeout=None, until_key=None, drains=False):
        """Send msg; the answer (the first that has until_key, when given: the others are dropped).
        Answers come in order, so one that came too late would be taken for the next request's: a
        timeout drops the connection, unless the caller drains the late answer itself (drains)."""
        with self.ctl_lock:
            try:
                ms.send_msg(self.sock, msg)
            except OSError:
                self.fail()
                raise PeerLostError(f"the connection to the memory server at {self.addr} closed") from None
            self.sock.settimeout(timeout if timeout is not None else (self.timeout or None))
            try:
                got = self._recv()
                while until_key is not None and until_key not in got:
                    got = self._recv()
                return got
            except TimeoutError:
                if not drains:
                    self.drop()
                raise
            finally:
                self.sock.settimeout(self.timeout or None)

    def request(self, op, bid, off, length, src=None, alpha=0.0, flags=ms.FIRST | ms.LAST, dst=None, dtype=0,
                fence=0, wid=0):
        """One request; its reply's (version, the last write's id). src: bytes to send; dst:
        where a read's land; dtype: the code of src's dtype (protocol.dtype_code)."""
        return self.run([(op, bid, off, length, flags | dtype << 16, src, dst, alpha, fence, wid)])

    def run(self, requests, allow=(ms.OK,)):
        """requests ((op, buffer id, offset, length, flags, src, dst, alpha, fence, write id),
        each of at most half a slot) with two in flight: one travels while the server applies
        the other. The last reply's (version, the last write's id); None after a refusal in
        allow; another refusal raises."""
        if self.dead:
            raise PeerLostError(f"the connection to the memory server at {self.addr} failed before")
        with self.lock:
            flight, got, refused = [], None, ms.OK
            try:
                for req in requests:
                    if len(flight) == 2:
                        got, status = self._reply(*flight.pop(0))
                        refused = refused or status
                    if not refused:
                        flight.append(self._post(*req))
                for f in flight:
                    got, status = self._reply(*f)
                    refused = refused or status
            except BaseException:
                self.fail()  # a request left in flight: this connection's numbers are lost
                raise
            if refused not in allow:
                raise _refusal(self.addr, refused)
            return got if refused == ms.OK else None

    def _post(self, op, bid, off, length, flags, src, dst, alpha, fence=0, wid=0):
        number, half = (self.number + 1) & ms.NUMBER, self.half
        at = half * ms.HALF
        ms.HEAD.pack_into(self.pool, at, ms.MAGIC, op | flags, bid, off, length, alpha, number, fence, wid)
        if src is not None:
            self.pool[at + ms.HEAD_BYTES:at + ms.HEAD_BYTES + length] = src
        self.ep.write(self.peer, at, self.slot + at, ms.HEAD_BYTES + (length if src is not None else 0),
                      self.index | (half << 16), self.timeout or ms.DATA_TIMEOUT_S)
        self.number, self.half = number, half ^ 1  # only once sent: the server waits for numbers in order
        return number, half, length, dst

    def _reply(self, number, half, length, dst):
        """Request number's reply: ((version, the last write's id), status); a read's bytes into dst."""
        wait = self.timeout or ms.DATA_TIMEOUT_S
        until = time.monotonic() + wait
        while number not in self.replies:
            note = self.ep.poll(0.05)
            if note is not None:
                self.replies[note & ms.NUMBER] = note >> 28
            elif time.monotonic() > until:
                raise TimeoutError(f"the memory server at {self.addr} did not answer in {wait} s{self._lost()}")
        at = ms.SLOT_BYTES + half * ms.HALF
        status = self.replies.pop(number)
        if status != ms.OK:
            return None, status
        if dst is not None:
            dst[:] = self.pool[at + ms.REPLY.size:at + ms.REPLY.size + length]
        return ms.REPLY.unpack_from(self.pool, at), ms.OK

    def _lost(self):
        """For a timeout's message: the notes the server dropped before its data path (from no
        peer of its endpoint, or naming another client), which a lost request would be among."""
        try:
            got = self.control({"op": "stats"}, timeout=2)
            return (f" (request {self.number} on this connection; the server dropped {got['no_peer']} note(s) from "
                    f"no peer of its endpoint and {got['forged']} naming another client)")
        except Exception:  # the server is gone or stuck: the timeout says enough
            return ""

    def close(self):
        try:
            self.sock.close()
        finally:
            if self.ep is not None:
                self.ep.close()


def _refusal(addr, status):
    why = f"the memory server at {addr} refused the request"
    if status == ms.FENCED:
        return Error(f"{why}: the lock's lease ran out (another holder may have it now); nothing was written")
    if status == ms.DROPPED:
        return Error(f"{why}: its earlier chunks were dropped (more than {ms.PARTIAL_S} s between two chunks, "
                     "or refused); nothing was written")
    if status == ms.DTYPE:
        return ArgumentError(f"{why}: its dtype (or element alignment) is not the buffer's")
    if status == ms.NOT_STAGED:
        return Error(f"{why}: the write to commit is no longer staged there; nothing was written")
    return ArgumentError(f"{why} (outside the buffer, or an accumulate its dtype cannot take)")


def _connection(addr, token, timeout):
    with _connections_lock:
        conn = _connections.get((addr, token))
        if conn is None or conn.hung_up():
            conn = _connections[addr, token] = _Connection(addr, token, timeout)
        return conn


def _dtype_name(dtype):
    name = str(dtype).replace("torch.", "")
    name = {"bool_": "bool"}.get(name, name)
    if name not in ms.DTYPES:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
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
        self.itemsize = ms.itemsize(self.dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.itemsize
        addrs, self._token, self._timeout = _servers(servers), _token(token), timeout
        n, S = self.nbytes // self.itemsize, len(addrs)
        bounds = [(k * n // S * self.itemsize, (k + 1) * n // S * self.itemsize) for k in range(S)]
        # (connection, buffer id, first byte, last byte); an empty part (fewer elements than
        # servers) is left out: it would hold no write's id. _opened: (its server's instance, open)
        self._parts, self._opened = [], []
        for k, (addr, (lo, hi)) in enumerate(zip(addrs, bounds)):
            if hi > lo or (k == S - 1 and not self._parts):
                msg = {"op": "open", "name": f"{name}#{k}/{S}", "shape": [(hi - lo) // self.itemsize],
                       "whole": list(self.shape), "dtype": self.dtype}
                conn = _connection(addr, self._token, timeout)
                got = self._open(conn, msg)
                self._parts.append((conn, got["id"], lo, hi))
                self._opened.append((got.get("instance"), msg))
        self._calls = InOrder(lambda fn: fn())

    def __repr__(self):
        return f"<hbmcoll RemoteBuffer {self.name!r} {self.shape} {self.dtype} on {len(self._parts)} server(s)>"

    def _open(self, conn, msg):
        got = conn.control(msg)
        if got.get("error") == "mismatch":
            raise MismatchError(f"RemoteBuffer {self.name!r}: {got['text']}")
        if "error" in got:
            raise Error(f"RemoteBuffer {self.name!r} on {conn.addr}: {got.get('text', got['error'])}")
        return got

    def _live(self):
        """The parts, each on a live connection: one that failed is made again, and the part
        opened again there, unless its server restarted meanwhile (its buffer is gone)."""
        for k, (conn, _, lo, hi) in enumerate(self._parts):
            if not conn.dead:
                continue
            instance, msg = self._opened[k]
            new = _connection(conn.addr, self._token, self._timeout)
            got = self._open(new, msg)
            if got.get("instance") != instance:
                raise PeerLostError(f"RemoteBuffer {self.name!r}: the memory server at {conn.addr} restarted, and "
                                    "this buffer is gone with it (its contents were lost); open it again")
            self._parts[k] = (new, got["id"], lo, hi)
        return self._parts

    def _chunks(self, op, raw, part, flags=0, alpha=0.0, fence=0, wid=0):
        """op over part's bytes of raw in requests of half a slot at most."""
        _, bid, lo, hi = part[:4]
        step, code = ms.HALF - ms.HEAD_BYTES, (ms.dtype_code(self.dtype) << 16 if op != ms.READ else 0)
        chunks = []
        for off in range(0, hi - lo, step):
            piece = raw[lo + off:lo + min(off + step, hi - lo)]
            first_last = (ms.FIRST if off == 0 else 0) | (ms.LAST if off + step >= hi - lo else 0)
            chunks.append((op, bid, off, piece.size, first_last | flags | code, None if op == ms.READ else piece,
                           piece if op == ms.READ else None, alpha, fence, wid))
        return chunks or [(op, bid, 0, 0, ms.FIRST | ms.LAST | flags | code, None, None, alpha, fence, wid)]

    def _fence(self):
        """The lock's token when this thread holds the buffer's lock, else 0; PeerLostError when it
        took the lock on a connection that failed since (the server let the lock go with it)."""
        lock_lost(self, self._parts[0][0])
        local = self._parts[0][0].local_locks.get(self._parts[0][1])
        return local[2] if local and local[1] and local[0]._is_owned() else 0

    def _write_whole(self, raw):
        """A write; striped, under the buffer's lock (reentrant, for a holder of rb.lock()): each
        part is staged with the write's id, then part 0 is committed (the write's moment,
        fenced), then the others (a reader of them commits it too, protocol.py)."""
        parts, wid = self._live(), _wid()
        if len(parts) == 1:
            return parts[0][0].run(self._chunks(ms.WRITE, raw, parts[0], fence=self._fence(), wid=wid))
        with self.lock(timeout=self._parts[0][0].timeout,
                       lease=min(max(ms.LEASE_S, self._parts[0][0].timeout or 0), ms.MAX_LEASE_S)):
            fence = self._fence()
            for part in parts:
                part[0].run(self._chunks(ms.WRITE, raw, part, ms.STAGE, fence=fence, wid=wid))
            got = parts[0][0].request(ms.COMMIT, parts[0][1], 0, 0, fence=fence, wid=wid)
            for conn, bid in (p[:2] for p in parts[1:]):  # already in, when a reader committed it
                conn.run([(ms.COMMIT, bid, 0, 0, ms.FIRST | ms.LAST, None, None, 0.0, 0, wid)],
                         allow=(ms.OK, ms.NOT_STAGED))
            return got

    def _read_whole(self, raw):
        """A read; striped, again until every part holds the same write (part 0's: the others are
        read naming it, and commit it if they hold it staged)."""
        parts = self._live()
        wait = self._parts[0][0].timeout or ms.DATA_TIMEOUT_S
        until = time.monotonic() + wait
        def part(p, wid=0):  # (version, write id), or None: a chunked read held too long, dropped
            return p[0].run(self._chunks(ms.READ, raw, p, wid=wid), allow=(ms.OK, ms.DROPPED))
        while True:
            got = part(parts[0])
            if got is not None and all((part(p, got[1]) or (0, None))[1] == got[1] for p in parts[1:]):
                return
            if time.monotonic() > until:
                raise TimeoutError(f"RemoteBuffer {self.name!r}: no whole read within {wait} s (the striped "
                                   "parts held different writes)")

    def _check(self, a, what="write"):
        name = _dtype_name(a.dtype) if hasattr(a, "dtype") else None
        if name != self.dtype:
            raise MismatchError(f"RemoteBuffer {self.name!r} holds {self.dtype}; this {what} gives {name}: convert "
                                f"it first (its bits are not reinterpreted)")
        raw = _raw(a)
        if raw.size != self.nbytes:
            raise ArgumentError(f"RemoteBuffer {self.name!r} holds {self.nbytes} bytes; this array has {raw.size}")
        return raw

    def _accumulate(self, raw, alpha):
        for part in self._live():
            part[0].run(self._chunks(ms.ACCUMULATE, raw, part, alpha=alpha, fence=self._fence()))

    def _check_accumulate(self, a):
        if self.dtype not in ms.ACCUMULATES:
            raise ArgumentError(f"RemoteBuffer {self.name!r}: a {self.dtype} buffer takes no accumulate (one of "
                                f"{', '.join(ms.ACCUMULATES)} does)")
        return self._check(a, "accumulate")

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
        """The buffer's contents become a's (a of the buffer's dtype)."""
        raw = self._check(a)
        self._calls.call(lambda: self._write_whole(raw))

    def iwrite(self, a):
        """write in the background, in order with this buffer\'s other calls: a Request."""
        raw = self._check(a)
        return self._calls.start(lambda: self._write_whole(raw), None)

    def accumulate(self, a, alpha=1.0):
        """buffer += alpha * a, applied by the server (no update is lost to a concurrent one);
        integer buffers take a whole alpha."""
        raw = self._check_accumulate(a)
        self._calls.call(lambda: self._accumulate(raw, float(alpha)))

    def iaccumulate(self, a, alpha=1.0):
        """accumulate in the background, in order with this buffer\'s other calls: a Request."""
        raw = self._check_accumulate(a)
        return self._calls.start(lambda: self._accumulate(raw, float(alpha)), None)

    @property
    def version(self):
        """How many writes and accumulates the buffer has taken (on its least updated server)."""
        return self._calls.call(lambda: min(conn.request(ms.READ, bid, 0, 0)[0] for conn, bid in
                                            (p[:2] for p in self._live())))

    def lock(self, timeout=None, lease=None):
        """with rb.lock(timeout=5): ... -- the buffer's lock (on its first server), held for a lease
        (default protocol.LEASE_S): a holder that dies or overruns it loses it, and its writes
        are refused from then on (fencing)."""
        return BufferLock(self, timeout, lease)


def new_token():
    """A random job token (for HBMCOLL_TOKEN or a token file)."""
    return secrets.token_hex(16)
