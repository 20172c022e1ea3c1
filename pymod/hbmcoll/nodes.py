"""The node layer's rendezvous: the bridge endpoints of a job's nodes find each other.

Member 0 listens on TCP at (addr, port); every other member connects and both sides prove they
hold the job's secret before anything else crosses (HMAC-SHA256 over fresh nonces of both, so
neither the secret nor a replayable answer is ever sent). Each member then sends its blob (its
bridge card: its endpoint's address and the key of its registered pool; and what the node layer
says about its node), and once all have come member 0 answers every member with all blobs, or
with the one error that ends the job (say, two nodes that claim the same rank). A peer that
cannot prove the secret is refused and never sees a card.

The connections stay open: they are how a lost node is noticed (Watch). When a node goes away
its connections close without a goodbye (or, when its link went down, the kernel's keepalive ends
them), member 0 closes all of its own, and every member's watch fires.

    blobs, watch = exchange(me, (addr, port), secret, card, members(n), timeout)
    ...                                   # bridge.watch(watch.fileno(), "the job's other nodes")
    watch.close()                         # finished (watch.abort() on a failure)
"""
import hashlib
import hmac
import os
import select
import socket
import struct
import threading
import time

from .errors import BootstrapError

MAGIC = b"HBMN1\0"
NONCE = 32
KEEPALIVE_S = 5  # a node whose link is down is lost after about 10 s (_keepalive)


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


def _recv_blob(sock, deadline, limit=1 << 16):
    (n,) = struct.unpack("!I", _recv_exact(sock, 4, deadline))
    if n > limit:
        raise ConnectionError("a message longer than the protocol allows")
    return _recv_exact(sock, n, deadline)


class Watch:
    """What a member's bridge watches for lost nodes (fileno(): one end of a socket pair that a
    thread closes when the job can no longer go on), and how members leave.

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
        try:
            while live and not self._stop:
                for fd, _ in ep.poll(0.2):
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


def _serve(srv, where, secret, blob, complete, deadline):
    blobs, socks = {0: blob}, {}
    verdict = None
    while verdict is None:
        left = deadline - time.monotonic() if deadline else None
        if left is not None and left <= 0:
            raise BootstrapError(f"member 0 waited at {where} for the other nodes; {len(blobs)} came "
                                 f"(members {sorted(blobs)})")
        srv.settimeout(min(left, 1.0) if left is not None else 1.0)
        try:
            conn, _ = srv.accept()
            _keepalive(conn)
        except socket.timeout:
            continue
        try:
            head = _recv_exact(conn, len(MAGIC) + 4 + NONCE, deadline)
            if head[:len(MAGIC)] != MAGIC:
                raise ConnectionError("not an hbmcoll member")
            (who,) = struct.unpack("!I", head[len(MAGIC):len(MAGIC) + 4])
            theirs = head[len(MAGIC) + 4:]
            mine = os.urandom(NONCE)
            conn.sendall(mine + _proof(secret, b"server", theirs, mine))
            answer = _recv_exact(conn, 32, deadline)
            their_blob = _recv_blob(conn, deadline)
            if not hmac.compare_digest(answer, _proof(secret, b"client", mine, theirs, head[:len(MAGIC) + 4],
                                                      their_blob)):
                raise ConnectionError("it does not hold the job's secret")
            if who == 0 or who in blobs:
                raise ConnectionError(f"member number {who} came twice")
        except (ConnectionError, OSError, struct.error):
            conn.close()  # refused: it never sees a card
            continue
        blobs[who], socks[who] = their_blob, conn
        try:
            verdict = b"O" + _pack(blobs) if complete(blobs) else None
        except BootstrapError as exc:
            verdict = b"E" + str(exc).encode()
    for s in socks.values():
        _send_blob(s, verdict)
    if verdict[:1] == b"E":
        for s in socks.values():
            s.close()
        raise BootstrapError(verdict[1:].decode())
    return blobs, Watch(list(socks.values()), relay=True)


def _pack(blobs):
    return b"".join(struct.pack("!II", k, len(b)) + b for k, b in sorted(blobs.items()))


def _unpack(data):
    blobs, at = {}, 0
    while at < len(data):
        k, n = struct.unpack("!II", data[at:at + 8])
        blobs[k] = data[at + 8:at + 8 + n]
        at += 8 + n
    return blobs


def _join(me, where, secret, blob, deadline):
    addr, port = where
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=1.0)
            _keepalive(sock)
            break
        except OSError:
            if deadline and time.monotonic() > deadline:
                raise BootstrapError(f"member {me} found no member 0 listening at {addr}:{port} in time")
            time.sleep(0.05)
    try:
        mine = os.urandom(NONCE)
        head = MAGIC + struct.pack("!I", me)
        sock.sendall(head + mine)
        reply = _recv_exact(sock, NONCE + 32, deadline)
        theirs, proof = reply[:NONCE], reply[NONCE:]
        if not hmac.compare_digest(proof, _proof(secret, b"server", mine, theirs)):
            raise BootstrapError(f"the listener at {addr}:{port} does not hold the job's secret: refused")
        sock.sendall(_proof(secret, b"client", theirs, mine, head, blob))
        _send_blob(sock, blob)
        verdict = _recv_blob(sock, deadline, limit=1 << 24)
    except (ConnectionError, OSError) as exc:
        sock.close()
        raise BootstrapError(f"member {me}: member 0 at {addr}:{port} refused or dropped us ({exc}); "
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
        return _serve(where, "%s:%d" % where.getsockname()[:2], secret, blob, complete, deadline)
    try:
        srv = socket.create_server(where, reuse_port=False)
    except OSError as exc:
        raise BootstrapError(f"member 0 cannot listen at {where[0]}:{where[1]} ({os.strerror(exc.errno)}): the rendezvous "
                             "address (MASTER_ADDR, HBMCOLL_MASTER) must be this node's, and the port "
                             "(HBMCOLL_PORT) free") from None
    with srv:
        return _serve(srv, "%s:%d" % where, secret, blob, complete, deadline)


def members(n):
    """The complete() of a rendezvous of members 0..n-1."""
    def complete(blobs):
        if any(k >= n for k in blobs):
            raise BootstrapError(f"a member numbered {max(blobs)} came to a rendezvous of {n}")
        return len(blobs) == n
    return complete
