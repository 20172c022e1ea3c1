"""The node layer's rendezvous: the bridge endpoints of a job's nodes find each other.

Member 0 listens on TCP at (addr, port); every other member connects and both sides prove they
hold the job's secret before anything else crosses (HMAC-SHA256 over fresh nonces of both, so
neither the secret nor a replayable answer is ever sent). Each member then sends its blob (its
bridge card: its endpoint's address and the key of its registered pool; and what the node layer
says about its node), and once all have come member 0 answers every member with all blobs, or
with the one error that ends the job (say, two nodes that claim the same rank). A peer that
cannot prove the secret is refused and never sees a card. Member 0 serves every connection at
once, each with its own deadline and size limit: a stranger that connects and says nothing (or
says it slowly) is dropped and delays nobody.

The connections stay open: they are how a lost node is noticed (Watch). When a node goes away
its connections close without a goodbye (or, when its link went down, the kernel's keepalive ends
them), member 0 closes all of its own, and every member's watch fires. A member that closes
says so, with how many calls it made: a member in a later call is told at once (Watch).

    blobs, watch = exchange(me, (addr, port), secret, card, members(n), timeout)
    ...                                   # bridge.watch(watch.fileno(), "the job's other nodes")
    watch.close()                         # finished (watch.abort() on a failure)
"""
import hashlib
import hmac
import os
import select
import selectors
import socket
import struct
import sys
import threading
import time

from . import netaddr
from ..errors import BootstrapError

MAGIC = b"HBMN1\0"
NONCE = 32
KEEPALIVE_S = 5  # a node whose link is down is lost after about 10 s (_keepalive)
HANDSHAKE_S = 10  # how long member 0 gives one connection to prove the secret and send its blob
BLOB_LIMIT = 1 << 16  # a member's blob at most (its card and its node's ranks)
MAX_SHAKES = 64  # connections proving the secret at once; more are closed at once
SAY_MISSING_S = 10  # member 0 says who is missing once it has waited this long


def _keepalive(sock):
    """A link that goes down leaves the connection open but silent: the kernel's keepalive probes
    (after KEEPALIVE_S idle, then every second, 5 unanswered) end it, so the watch fires."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 5)


def _proof(secret, *parts):
    return hmac.new(secret, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock, n, deadline):
    out = b""
    while len(out) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()) if deadline else None)
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def _send_blob(sock, blob):
    sock.sendall(struct.pack("!I", len(blob)) + blob)


def _recv_blob(sock, deadline, limit=BLOB_LIMIT):
    (n,) = struct.unpack("!I", _recv_exact(sock, 4, deadline))
    if n > limit:
        raise ConnectionError("a message longer than the protocol allows")
    return _recv_exact(sock, n, deadline)


class Watch:
    """What a member's bridge watches for lost nodes (fileno(): one end of a socket pair that a
    thread closes when the job can no longer go on; the C layer shuts it when one of its calls
    failed, and the thread then ends the connections too), and how members leave.

    Exit is a message. A member that closes says so with the number of the communicator's
    calls it made (member k to member 0, which tells every other member; member 0 tells all);
    a member that is in a later call (calls, counted by the communicator through began()) will
    never see the leaver there, and its watch fires at once. End of file without a goodbye is
    a lost node: member 0 then closes every connection, so every member's watch fires.

    close() is collective, as the endpoints must not close while a peer's last write to them is
    still completing: each member says goodbye once its own writes completed, and member 0
    answers everyone after all said it or were lost; only then do they close. abort() says
    nothing and waits for nothing (the others take it as this node lost).
    """

    BYE, LEFT, ALL = b"B", b"L", b"A"  # k -> 0 "I leave after n calls"; 0 -> k "a member did"; 0 -> k "all did"

    def __init__(self, socks, relay):
        self._socks, self._relays = list(socks), relay  # relay: member 0
        self.calls = 0       # calls the communicator began
        self.left = None     # fewest calls of a member that left, None while none has
        self._lock = threading.Lock()
        self._bye, self._gone = set(), set()  # fds that said goodbye (member 0); that reached end of file
        self._sending = threading.Lock()  # the thread and close() both send
        self._answered = threading.Event()
        self._stop = False
        self._mine, self._theirs = socket.socketpair()
        self._thread = threading.Thread(target=self._relay, name="hbmcoll-nodes-watch", daemon=True)
        self._thread.start()

    def fileno(self):
        return self._mine.fileno() if self._mine is not None else -1

    def began(self):
        """The communicator begins a call: the calls of a member that left before it, or None."""
        with self._lock:
            self.calls += 1
            return self.left if self.left is not None and self.left < self.calls else None

    def why(self):
        """Why this member's call cannot finish, when a member left before it; else None."""
        with self._lock:
            if self.left is None or self.left >= self.calls:
                return None
            more = self.calls - self.left
            return (f"another node's ranks closed the communicator while this rank is in a collective they never "
                    f"made ({more} more than they did): every rank must make the same collectives")

    def _leave(self, n):
        with self._lock:
            self.left = n if self.left is None else min(self.left, n)
            fire = self.calls > n
        if fire:
            self._theirs.close()

    def _send_all(self, msg):
        with self._sending:
            for s in self._socks:
                if s.fileno() not in self._gone:
                    try:
                        s.sendall(msg)
                    except OSError:
                        pass

    def _relay(self):
        ep = select.epoll()
        live = {s.fileno(): s for s in self._socks}
        held = dict.fromkeys(live, b"")
        for fd in live:
            ep.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        failed = self._theirs.fileno()  # the C layer shuts fileno()'s end when a call fails (hier.c)
        ep.register(failed, select.EPOLLIN | select.EPOLLRDHUP)
        try:
            while live and not self._stop:
                for fd, _ in ep.poll(0.2):
                    if fd == failed:
                        if not self._stop:  # this node ended the job's communicator: the others learn it
                            self._drop()
                        return
                    try:
                        data = live[fd].recv(4096)
                    except OSError:
                        data = b""
                    if data:
                        held[fd] = self._take(fd, held[fd] + data)
                        continue
                    ep.unregister(fd)
                    del live[fd]
                    said = fd in self._bye or self._answered.is_set()
                    self._gone.add(fd)
                    if not said and not self._stop:  # a lost node (or member 0 gone)
                        self._drop()
                        return
        finally:
            ep.close()

    def _take(self, fd, buf):
        """Act on the whole messages in buf; the rest (a part of one) is returned."""
        while buf:
            kind = buf[:1]
            if kind == self.ALL:
                self._answered.set()
                buf = buf[1:]
                continue
            if len(buf) < 9:
                return buf
            (n,) = struct.unpack("!Q", buf[1:9])
            buf = buf[9:]
            if kind == self.BYE and self._relays:  # member k leaves: tell the others
                self._bye.add(fd)
                self._send_all(self.LEFT + struct.pack("!Q", n))
            self._leave(n)
        return buf

    def _drop(self):
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._theirs.close()

    def _wait(self, until, timeout):
        end = time.monotonic() + timeout
        while not until() and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.01)

    def close(self, timeout=60):
        """This member finished (its writes completed): goodbye, and wait for everyone's."""
        self._finish(True, timeout)

    def abort(self):
        """This member failed: close without goodbye, so the others' watches fire."""
        self._finish(False, 0)

    def _finish(self, graceful, timeout):
        if self._mine is None:
            return  # finished already (an abort, then close)
        if graceful:
            done = struct.pack("!Q", self.calls)
            if self._relays:  # member 0: this member leaves too; everyone's goodbye, then the answer
                self._send_all(self.LEFT + done)
                self._wait(lambda: len(self._bye | self._gone) >= len(self._socks), timeout)
                self._send_all(self.ALL)
            else:  # member k: goodbye, then member 0's answer (or its end)
                self._send_all(self.BYE + done)
                self._wait(self._answered.is_set, timeout)
        self._stop = True
        self._thread.join()
        for s in self._socks:
            s.close()
        self._socks = []
        self._mine.close()
        self._theirs.close()
        self._mine = None


class _Handshake:
    """One connection to member 0's rendezvous, proving the secret: fed bytes as they come (the
    serve loop never waits on one connection), done with a blob, or failed."""

    HEAD = len(MAGIC) + 4 + NONCE

    def __init__(self, conn, secret, deadline):
        self.conn, self.secret, self.deadline = conn, secret, deadline
        self.got, self.mine, self.who = b"", None, None

    def feed(self, data):
        """The member's (number, blob) once it proved the secret; None while more must come.
        ConnectionError for a stranger, a wrong proof or a message beyond the limits."""
        self.got += data
        if self.mine is None:
            if len(self.got) < self.HEAD:
                return None
            head = self.got[:self.HEAD]
            if head[:len(MAGIC)] != MAGIC:
                raise ConnectionError("not an hbmcoll member")
            (self.who,) = struct.unpack("!I", head[len(MAGIC):len(MAGIC) + 4])
            self.mine = os.urandom(NONCE)
            self.conn.sendall(self.mine + _proof(self.secret, b"server", head[len(MAGIC) + 4:], self.mine))
        rest = self.got[self.HEAD:]
        if len(rest) < 36:
            return None
        (n,) = struct.unpack("!I", rest[32:36])
        if n > BLOB_LIMIT:
            raise ConnectionError("a message longer than the protocol allows")
        if len(rest) < 36 + n:
            return None
        if len(rest) > 36 + n:
            raise ConnectionError("more than the protocol says")
        head, blob = self.got[:self.HEAD], rest[36:]
        if not hmac.compare_digest(rest[:32], _proof(self.secret, b"client", self.mine, head[len(MAGIC) + 4:],
                                                     head[:len(MAGIC) + 4], blob)):
            raise ConnectionError("it does not hold the job's secret")
        return self.who, blob


def _serve(srv, where, secret, blob, complete, deadline):
    """Member 0's side: connections are served together (one selector, nothing blocks on one),
    each with its own deadline and size limit, so a silent or trickling stranger is dropped and
    never delays the members."""
    blobs, socks = {0: blob}, {}
    verdict = None
    started, told, refused = time.monotonic(), False, {}  # refused: peer address -> why
    sel = selectors.DefaultSelector()
    srv.setblocking(False)
    sel.register(srv, selectors.EVENT_READ)
    try:
        while verdict is None:
            now = time.monotonic()
            if deadline and now >= deadline:
                raise BootstrapError(f"member 0 waited at {where} for the other nodes {now - started:.0f} s: "
                                     f"{_who(complete, blobs)}{_refused(refused)}; is every node started, with "
                                     "the same HBMCOLL_JOB_KEY, master address and port?")
            if not told and now - started >= SAY_MISSING_S:
                told = True
                print(f"hbmcoll: the rendezvous at {where} has waited {SAY_MISSING_S:g} s: "
                      f"{_who(complete, blobs)}{_refused(refused)}", file=sys.stderr, flush=True)
            for key in list(sel.get_map().values()):  # handshakes past their own deadline
                if key.data is not None and now >= key.data.deadline:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
            wait = min([1.0] + [k.data.deadline - now for k in sel.get_map().values() if k.data is not None])
            for key, _ in sel.select(max(0.01, wait)):
                if key.data is None:
                    _accept(srv, sel, secret)
                    continue
                conn, shake = key.fileobj, key.data
                try:
                    data = conn.recv(65536)
                    if not data:  # after member 0's proof: the member found it wrong
                        raise ConnectionError("it hung up on member 0's proof of the job's secret (another "
                                              "HBMCOLL_JOB_KEY?)" if shake.mine is not None else "closed")
                    done = shake.feed(data)
                    if done is not None and (done[0] == 0 or done[0] in blobs):
                        raise ConnectionError(f"member number {done[0]} came twice")
                except (ConnectionError, OSError, struct.error) as exc:
                    if "secret" in str(exc):  # a node of another job, or with another HBMCOLL_JOB_KEY
                        refused[_peer_name(conn)] = str(exc)
                    sel.unregister(conn)
                    conn.close()  # refused: it never sees a card
                    continue
                if done is None:
                    continue
                sel.unregister(conn)
                conn.setblocking(True)
                blobs[done[0]], socks[done[0]] = done[1], conn
                try:
                    verdict = b"O" + _pack(blobs) if complete(blobs) else None
                except BootstrapError as exc:
                    verdict = b"E" + str(exc).encode()
                if verdict is not None:
                    break
    finally:
        for key in list(sel.get_map().values()):
            if key.data is not None:
                key.fileobj.close()  # strangers still proving nothing
        sel.close()
        srv.setblocking(True)
    for s in socks.values():
        s.settimeout(HANDSHAKE_S)
        try:
            _send_blob(s, verdict)
        except OSError:
            pass  # that member is gone: its watch end closes, the others' watches fire
        s.settimeout(None)
    if verdict[:1] == b"E":
        for s in socks.values():
            s.close()
        raise BootstrapError(verdict[1:].decode())
    return blobs, Watch(list(socks.values()), relay=True)


def _accept(srv, sel, secret):
    try:
        conn, _ = srv.accept()
    except (BlockingIOError, InterruptedError):
        return
    except OSError:  # out of descriptors, say: the others come again later
        return
    if sum(k.data is not None for k in sel.get_map().values()) >= MAX_SHAKES:
        conn.close()  # a flood of strangers: members connect again until they get in
        return
    conn.setblocking(False)
    _keepalive(conn)
    sel.register(conn, selectors.EVENT_READ, _Handshake(conn, secret, time.monotonic() + HANDSHAKE_S))


def _pack(blobs):
    return b"".join(struct.pack("!II", k, len(b)) + b for k, b in sorted(blobs.items()))


def _unpack(data):
    blobs, at = {}, 0
    while at < len(data):
        k, n = struct.unpack("!II", data[at:at + 8])
        blobs[k] = data[at + 8:at + 8 + n]
        at += 8 + n
    return blobs


def _connect(me, addr, port, deadline):
    at = netaddr.join(addr, port)
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=1.0)
            _keepalive(sock)
            return sock
        except OSError:
            if deadline and time.monotonic() > deadline:
                raise BootstrapError(f"member {me} found no member 0 listening at {at} in time") from None
            time.sleep(0.05)


def _join(me, where, secret, blob, deadline):
    addr, port = where
    at = netaddr.join(addr, port)
    mine, head = os.urandom(NONCE), MAGIC + struct.pack("!I", me)
    while True:  # member 0 may close a connection unanswered (too many at once): again
        sock = _connect(me, addr, port, deadline)
        try:
            sock.sendall(head + mine)
            reply = _recv_exact(sock, NONCE + 32, deadline)
            break
        except (ConnectionError, OSError):
            sock.close()
            if deadline and time.monotonic() > deadline:
                raise BootstrapError(f"member {me}: member 0 at {at} never answered in time") from None
            time.sleep(0.1)
        except BaseException:
            sock.close()
            raise
    try:
        theirs, proof = reply[:NONCE], reply[NONCE:]
        if not hmac.compare_digest(proof, _proof(secret, b"server", mine, theirs)):
            raise BootstrapError(f"the listener at {at} does not hold the job's secret: refused")
        sock.sendall(_proof(secret, b"client", theirs, mine, head, blob))
        _send_blob(sock, blob)
        verdict = _recv_blob(sock, deadline, limit=1 << 24)
    except (ConnectionError, OSError) as exc:
        sock.close()
        raise BootstrapError(f"member {me}: member 0 at {at} refused or dropped us ({exc}); "
                             f"is the job's secret the same on every node?") from None
    except BaseException:
        sock.close()
        raise
    if verdict[:1] != b"O":
        sock.close()
        raise BootstrapError(verdict[1:].decode())
    return _unpack(verdict[1:]), Watch([sock], relay=False)


def exchange(me, where, secret, blob, complete, timeout=None):
    """Every member's blob by member number, and this member's Watch.

    Member 0 listens at where, (addr, port) or a listening socket; member numbers are unique
    and any others. complete(blobs), called by member 0 as members come, says when all have;
    a BootstrapError it raises is every member's error."""
    deadline = time.monotonic() + timeout if timeout else None
    secret = secret.encode() if isinstance(secret, str) else secret
    if me != 0:
        return _join(me, where, secret, blob, deadline)
    if isinstance(where, socket.socket):
        return _serve(where, netaddr.join(*where.getsockname()[:2]), secret, blob, complete, deadline)
    fam = netaddr.family(where[0])
    try:
        srv = socket.create_server((netaddr.resolve(where[0], fam), where[1]), family=fam, reuse_port=False)
    except OSError as exc:
        raise BootstrapError(f"member 0 cannot listen at {netaddr.join(*where)} ({os.strerror(exc.errno)}): the rendezvous "
                             "address (MASTER_ADDR, HBMCOLL_MASTER) must be this node's, and the port "
                             "(HBMCOLL_PORT) free") from None
    with srv:
        return _serve(srv, netaddr.join(*where), secret, blob, complete, deadline)


def members(n):
    """The complete() of a rendezvous of members 0..n-1."""
    def complete(blobs):
        if any(k >= n for k in blobs):
            raise BootstrapError(f"a member numbered {max(blobs)} came to a rendezvous of {n}")
        return len(blobs) == n
    complete.who = lambda blobs: (f"members {sorted(blobs)} of {n} came; missing: members "
                                  f"{sorted(set(range(n)) - set(blobs))}")
    return complete


def _peer_name(conn):
    try:
        return conn.getpeername()[0]
    except OSError:
        return "a peer that left"


def _refused(refused):
    return f"; refused connections from {', '.join(sorted(refused))}: {next(iter(refused.values()))}" if refused else ""


def _who(complete, blobs):
    """Who came and who is missing, as complete() can tell it."""
    who = getattr(complete, "who", None)
    return who(blobs) if who else f"{len(blobs)} came (members {sorted(blobs)})"
