"""Point-to-point messages between two ranks of a communicator, as mpi4py's Send/Recv:

    comm.send(buf, dest, tag=0)
    comm.recv(buf, source=hbmcoll.ANY_SOURCE, tag=hbmcoll.ANY_TAG, status=None)
    req = comm.isend(buf, dest, tag=0); req = comm.irecv(buf, source, tag); req.wait()
    comm.sendrecv(sendbuf, dest, recvbuf, source, sendtag=0, recvtag=ANY_TAG)

Messages from one rank to another arrive in the order they were sent (MPI's non-overtaking
rule). A receive takes the first message from its source (any, with ANY_SOURCE) whose tag
matches (any, with ANY_TAG). A message longer than the receive buffer is a MismatchError; a
shorter one fills its front, and status.nbytes says how much came.

Messages travel over a stream socket per pair of ranks: a Unix socket between the ranks of one
node, TCP across nodes. The collectives' shared segments are not used, because a pair's messages
must never wait for ranks that take no part. Each rank listens from the communicator's creation
on. A connection proves it comes from the communicator (a keyed hash of the communicator's
secret) before any message is taken from it.

On one node the secret comes from the communicator's key (what its ranks met by, with the
job's secret nonce in it) and the socket names from the secret, so making a communicator costs
no message; across nodes rank 0 broadcasts a secret and the ranks gather their TCP addresses.

One thread per communicator progresses the receives. An irecv then completes while its caller
is blocked in a send, so MPI's irecv-send-wait pattern never deadlocks. A blocking send runs in
its caller's thread; an isend runs on a thread of its destination, behind the earlier ones.
"""
import hashlib
import hmac
import os
import queue
import secrets
import select
import socket
import struct
import threading
import time

import numpy as np

from .buffers import flat_bytes
from .errors import ArgumentError, BootstrapError, MismatchError, PeerLostError, TimeoutError
from .in_order import Request

ANY_SOURCE = -1
ANY_TAG = -1
_HEAD = struct.Struct("<qQ")  # tag, bytes
_HELLO = struct.Struct("<i32s")  # the sender's rank, its proof
_PROBE_S = 1.0  # how often a receive waiting on a silent rank checks that it still listens


class Status:
    """What a receive took: source, tag, nbytes (status= of recv, or Request.status)."""

    def __init__(self):
        self.source, self.tag, self.nbytes = ANY_SOURCE, ANY_TAG, 0

    def __repr__(self):
        return f"<hbmcoll.Status source {self.source} tag {self.tag} nbytes {self.nbytes}>"


def _bytes_of(buf, writable=False):
    return flat_bytes(buf, "send/recv", writable)[0]


class _Receive:
    def __init__(self, source, tag, raw, status):
        self.source, self.tag, self.raw = source, tag, raw
        self.status = status if status is not None else Status()
        self.error, self.event = None, threading.Event()

    def matches(self, source, tag):
        return self.source in (ANY_SOURCE, source) and self.tag in (ANY_TAG, tag)

    def finish(self, source, tag, nbytes, error=None):
        self.status.source, self.status.tag, self.status.nbytes, self.error = source, tag, nbytes, error
        self.event.set()


def secret_of(key):
    """A communicator's secret, from the key its ranks met by."""
    return hashlib.sha256(b"hbmcoll-p2p\0" + key.encode()).digest()


def _unix_name(secret, rank):
    return "\0hbmcoll-p2p-" + hashlib.sha256(secret + b"%d" % rank).hexdigest()[:40]


def _tcp_listener(address):
    """A TCP socket bound at address: within HBMCOLL_PORTS' point-to-point part when it is set (the
    first free port there), else on any port."""
    from .launch import env as launch_env
    ports = launch_env.port_range(os.environ)
    tries = range(ports[0] + launch_env.PORTS_P2P, ports[0] + launch_env.PORTS_BRIDGE) if ports else [0]
    for port in tries:
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((address, port))
            return sock
        except OSError:
            sock.close()
    raise OSError(f"no free port for point-to-point in HBMCOLL_PORTS' part {tries.start}-{tries.stop - 1}")


def listen(secret, rank):
    """rank's socket on one node, bound before the communicator's ranks meet: once they have
    met, every rank's is there to connect to (and a refused connection means a dead rank)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(_unix_name(secret, rank))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise BootstrapError(f"send/recv: this rank's socket is taken ({exc.strerror}): a communicator "
                             "of the same key is open in this process") from None
    return sock


class Channels:
    """One communicator's point-to-point messages, made on every rank alike. One node: with the
    secret and the listener bound before the ranks met (listen()), or made here, and then the
    caller must make sure every rank's is bound before anyone connects (a barrier). Across
    nodes: tcp_address, and the secret and addresses travel over the communicator."""

    def __init__(self, comm, secret=None, listener=None, tcp_address=None, timeout=None):
        self.rank, self.size, self.timeout = comm.rank, comm.size, timeout or None
        if tcp_address is None:  # an abstract Unix name nobody can guess before it is bound
            self.secret = secret
            self.addrs = [(socket.AF_UNIX, _unix_name(secret, r)) for r in range(comm.size)]
            self.listener = listener if listener is not None else listen(secret, comm.rank)
        else:
            self.secret = comm.bcast_object(secrets.token_bytes(32) if comm.rank == 0 else None, root=0)
            self.listener = _tcp_listener(tcp_address)
            self.listener.listen(socket.SOMAXCONN)
            self.addrs = comm.allgather_object((self.listener.family, self.listener.getsockname()))
        self.listener.setblocking(False)  # the receiving thread accepts all that wait, then selects
        self.lock = threading.Lock()
        self.out, self.lanes = {}, {}         # dest -> socket; dest -> its isend thread's queue
        self.inc, self.lost = {}, {}          # socket -> source; source -> why it is gone
        self.posted, self.stash = [], []      # receives waiting, in post order; messages none took
        self.locks = {}                       # dest -> held while a message goes out to it
        self.cut = {}                         # dest -> why its stream may not be used again
        self.wake_r, self.wake_w = os.pipe()
        self.thread, self.closed = None, False

    def _proof(self, source, dest):
        return hmac.new(self.secret, b"p2p %d>%d" % (source, dest), hashlib.sha256).digest()

    # -- sending ---------------------------------------------------------------
    def _check_rank(self, r, what, any_ok=False):
        if not isinstance(r, int) or isinstance(r, bool):
            raise TypeError(f"{what} must be an int")
        if not (0 <= r < self.size or (any_ok and r == ANY_SOURCE)):
            raise ArgumentError(f"{what} {r} is not a rank of this communicator (size {self.size})")

    def _check_tag(self, tag, any_ok=False):
        if not isinstance(tag, int) or isinstance(tag, bool) or not (tag >= 0 or (any_ok and tag == ANY_TAG)):
            raise ArgumentError(f"tag {tag!r}: an int >= 0" + (", or ANY_TAG" if any_ok else ""))

    def _connection(self, dest):
        if dest in self.cut:
            raise PeerLostError(f"send: {self.cut[dest]}")
        sock = self.out.get(dest)
        if sock is None:
            family, addr = self.addrs[dest]
            until = time.monotonic() + (self.timeout or 30)
            while True:
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.settimeout(self.timeout or 30)
                    sock.connect(addr)
                    sock.sendall(_HELLO.pack(self.rank, self._proof(self.rank, dest)))
                    break
                except BlockingIOError:  # its queue of connections is full (it accepts when it receives)
                    sock.close()
                    if time.monotonic() > until:
                        raise TimeoutError(f"send: rank {dest} accepted no connection in {self.timeout or 30} s") \
                            from None
                    time.sleep(0.01)
                except OSError as exc:
                    sock.close()
                    raise PeerLostError(f"send: rank {dest} is not listening ({exc.strerror or exc})") from None
            if family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.timeout)
            self.out[dest] = sock
        return sock

    def _send_now(self, raw, dest, tag):
        sock = self._connection(dest)
        try:
            sock.sendall(_HEAD.pack(tag, raw.size) + (raw.tobytes() if raw.size <= 4096 else b""))
            if raw.size > 4096:
                sock.sendall(raw)
        except socket.timeout:
            self._drop_out(dest, f"no progress for {self.timeout} s")
            raise TimeoutError(f"send: rank {dest} took no message for {self.timeout} s") from None
        except OSError as exc:
            self._drop_out(dest, exc.strerror or str(exc))
            raise PeerLostError(f"send: rank {dest} is gone ({exc.strerror or exc})") from None

    def _drop_out(self, dest, why):
        """A stream cut mid-message: the receiver counts this rank as lost, so no new one opens."""
        self.cut[dest] = f"the stream to rank {dest} was cut in mid-message ({why})"
        sock = self.out.pop(dest, None)
        if sock is not None:
            sock.close()

    def send(self, buf, dest, tag=0):
        if self.closed:
            raise PeerLostError("send: the communicator is closed")
        self._check_rank(dest, "dest")
        self._check_tag(tag)
        raw = _bytes_of(buf)
        lane = self.lanes.get(dest)
        if lane is not None and lane.unfinished_tasks:  # behind this rank's isends to dest
            self.isend(buf, dest, tag).wait()
            return
        with self._lane_lock(dest):
            self._send_now(raw, dest, tag)

    def _lane_lock(self, dest):
        with self.lock:
            return self.locks.setdefault(dest, threading.Lock())

    def isend(self, buf, dest, tag=0):
        self._check_rank(dest, "dest")
        self._check_tag(tag)
        raw, req = _bytes_of(buf), Request(None)
        with self.lock:
            if self.closed:
                raise PeerLostError("isend: the communicator is closed")
            lane = self.lanes.get(dest)
            if lane is None:
                lane = self.lanes[dest] = queue.Queue()
                threading.Thread(target=self._lane, args=(dest, lane), name=f"hbmcoll-send-{dest}",
                                 daemon=True).start()
        lane.put((raw, tag, req))
        return req

    def _lane(self, dest, lane):
        while True:
            raw, tag, req = lane.get()
            try:
                if raw is None:
                    return
                with self._lane_lock(dest):
                    self._send_now(raw, dest, tag)
            except BaseException as exc:
                req._error = exc
            finally:
                if raw is not None:
                    req._event.set()
                lane.task_done()

    # -- receiving -------------------------------------------------------------
    def irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        self._check_rank(source, "source", any_ok=True)
        self._check_tag(tag, any_ok=True)
        recv = _Receive(source, tag, _bytes_of(buf, writable=True), status)
        with self.lock:
            if self.closed:
                raise PeerLostError("recv: the communicator is closed")
            for i, (src, t, data) in enumerate(self.stash):
                if recv.matches(src, t):
                    del self.stash[i]
                    self._fill(recv, src, t, data)
                    break
            else:
                if source != ANY_SOURCE and source in self.lost:
                    raise PeerLostError(f"recv: {self.lost[source]}")
                self.posted.append(recv)
                if self.thread is None:
                    self.thread = threading.Thread(target=self._progress, name="hbmcoll-recv", daemon=True)
                    self.thread.start()
        return _RecvRequest(recv, buf, self)

    def recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.irecv(buf, source, tag, status).wait()

    def _fill(self, recv, source, tag, data):
        if len(data) > recv.raw.size:
            recv.finish(source, tag, len(data), MismatchError(
                f"recv: the message from rank {source} (tag {tag}) has {len(data)} bytes; the buffer holds "
                f"{recv.raw.size}"))
            return
        recv.raw[:len(data)] = np.frombuffer(data, np.uint8)
        recv.finish(source, tag, len(data))

    def _progress(self):
        """The receiving thread: accepts connections, and takes each message into the first
        receive posted for it, or into the stash."""
        probed = time.monotonic()
        while True:
            with self.lock:
                if self.closed:
                    return
                socks = list(self.inc)
            try:
                ready, _, _ = select.select([self.listener, self.wake_r] + socks, [], [], _PROBE_S)
            except (OSError, ValueError):  # a socket closed under us: closing
                continue
            for s in ready:
                if s is self.listener:
                    self._accept_all()
                elif s == self.wake_r:
                    os.read(self.wake_r, 64)
                else:
                    self._take(s)
            if time.monotonic() - probed > _PROBE_S:
                probed = time.monotonic()
                self._probe_silent()

    def _accept_all(self):
        """Every connection waiting in the listener's queue (it is non-blocking)."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:  # none left (BlockingIOError), or closing
                return
            self._accept(sock)

    def _accept(self, sock):
        sock.settimeout(5)
        try:
            hello = _recv_exact(sock, _HELLO.size)
        except OSError:
            hello = None
        if hello is not None:
            source, proof = _HELLO.unpack(hello)
            if 0 <= source < self.size and hmac.compare_digest(proof, self._proof(source, self.rank)):
                sock.settimeout(self.timeout)
                with self.lock:
                    self.inc[sock] = source
                return
        sock.close()  # a probe, or not of this communicator: nothing is taken from it

    def _take(self, sock):
        source = self.inc[sock]
        try:
            head = _recv_exact(sock, _HEAD.size)
            if head is None:
                return self._lose(sock, f"rank {source} closed its connection")
            tag, n = _HEAD.unpack(head)
            with self.lock:
                recv = next((r for r in self.posted if r.matches(source, tag)), None)
                if recv is not None:
                    self.posted.remove(recv)
            if recv is not None and n <= recv.raw.size:
                got = _recv_into(sock, recv.raw[:n])
                if got:
                    recv.finish(source, tag, n)
                    return
                recv.finish(source, tag, 0, PeerLostError(f"recv: rank {source} died in mid-message"))
                return self._lose(sock, f"rank {source} died in mid-message")
            data = _recv_exact(sock, n)
            if data is None:
                return self._lose(sock, f"rank {source} died in mid-message")
            if recv is None:  # a receive posted while the bytes came takes them; else the stash
                with self.lock:
                    recv = next((r for r in self.posted if r.matches(source, tag)), None)
                    if recv is not None:
                        self.posted.remove(recv)
                    else:
                        self.stash.append((source, tag, data))
            if recv is not None:
                self._fill(recv, source, tag, data)
        except socket.timeout:
            self._lose(sock, f"rank {source} stopped in mid-message for {self.timeout} s")
        except OSError as exc:
            self._lose(sock, f"rank {source} is gone ({exc.strerror or exc})")

    def _lose(self, sock, why):
        with self.lock:
            source = self.inc.pop(sock)
            self.lost[source] = why
            failed = [r for r in self.posted if r.source == source]
            for r in failed:
                self.posted.remove(r)
        sock.close()
        for r in failed:
            r.finish(source, ANY_TAG, 0, PeerLostError(f"recv: {why}"))

    def _probe_silent(self):
        """A receive from a rank that never connected fails once that rank listens no more
        (its process is gone), instead of waiting for ever."""
        self._accept_all()  # a rank that sent and left may still wait in the queue: not lost
        with self.lock:
            connected = set(self.inc.values())
            silent = {r.source for r in self.posted if r.source != ANY_SOURCE and r.source not in connected}
        for source in silent:
            family, addr = self.addrs[source]
            probe = socket.socket(family, socket.SOCK_STREAM)
            probe.settimeout(_PROBE_S)
            try:
                probe.connect(addr)
            except (ConnectionRefusedError, FileNotFoundError):
                why = f"rank {source} is gone (it listens no more)"
                with self.lock:
                    if source in set(self.inc.values()):
                        continue  # it connected meanwhile: its messages decide
                    self.lost[source] = why
                    failed = [r for r in self.posted if r.source == source]
                    for r in failed:
                        self.posted.remove(r)
                for r in failed:
                    r.finish(source, ANY_TAG, 0, PeerLostError(f"recv: {why}"))
            except OSError:
                pass  # unreachable for now: the receive's own timeout decides
            finally:
                probe.close()

    def forget(self, recv):
        """A receive given up (its wait timed out): no later message lands in its buffer. False
        when a message was already being taken into it (its wait should then see it through)."""
        with self.lock:
            if recv in self.posted:
                self.posted.remove(recv)
                return True
            return False

    def close(self):
        """The sends queued so far go out (within the timeout), then every socket and thread ends."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            posted, self.posted = self.posted, []
            lanes = list(self.lanes.values())
        for lane in lanes:
            lane.put((None, 0, None))
        for lane in lanes:  # the isends before close() finish, or fail, before the sockets go
            _join(lane, self.timeout or 30)
        os.write(self.wake_w, b"x")
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        for r in posted:
            r.finish(ANY_SOURCE, ANY_TAG, 0, PeerLostError("recv: the communicator was closed"))
        with self.lock:
            socks = [self.listener] + list(self.inc) + list(self.out.values())
            self.inc, self.out = {}, {}
        for s in socks:
            s.close()
        if self.thread is None or not self.thread.is_alive():  # else it still selects on the pipe
            os.close(self.wake_r)
            os.close(self.wake_w)


class PointToPoint:
    """send/recv and friends on a communicator that made self._p2p (a Channels) on every rank."""

    def send(self, buf, dest, tag=0):
        """buf to rank dest; returns once buf may be reused (the bytes are on their way)."""
        self._p2p.send(buf, dest, tag)

    def isend(self, buf, dest, tag=0):
        """send in the background: a Request; buf must stay unchanged until it is done."""
        return self._p2p.isend(buf, dest, tag)

    def recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """The first message from source (any: ANY_SOURCE) with tag (any: ANY_TAG) into buf;
        returns buf. status (a Status) gets the source, tag and byte count."""
        return self._p2p.recv(buf, source, tag, status)

    def irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """recv in the background: a Request whose wait() gives buf and whose .status says what came."""
        return self._p2p.irecv(buf, source, tag, status)

    def sendrecv(self, sendbuf, dest, recvbuf, source=ANY_SOURCE, sendtag=0, recvtag=ANY_TAG, status=None):
        """sendbuf to dest and a message from source into recvbuf at once (no deadlock when two
        ranks swap); returns recvbuf."""
        got = self._p2p.irecv(recvbuf, source, recvtag, status)
        try:
            self._p2p.send(sendbuf, dest, sendtag)
        except BaseException:
            self._p2p.forget(got._recv)  # no later message lands in recvbuf
            raise
        return got.wait()


class _RecvRequest(Request):
    """An irecv in flight: wait() gives the buffer, .status what came."""

    def __init__(self, recv, buf, channels):
        super().__init__(buf)
        self._event, self.status, self._recv, self._timeout = recv.event, recv.status, recv, channels.timeout
        self._channels = channels

    def wait(self, timeout=None):
        timeout = self._timeout if timeout is None else timeout
        if not self._event.wait(timeout) and self._channels.forget(self._recv):
            raise TimeoutError(f"recv: no message from {_who(self._recv.source)} (tag {self._recv.tag}) "
                               f"in {timeout} s")
        self._event.wait()  # matched as the wait ran out: the message is on its way into the buffer
        if self._recv.error is not None:
            raise self._recv.error
        return self._result


def _join(lane, timeout):
    """Wait up to timeout s for a lane's queue to empty (queue.Queue.join has no timeout)."""
    until = time.monotonic() + timeout
    while lane.unfinished_tasks and time.monotonic() < until:
        time.sleep(0.005)


def _who(source):
    return "any rank" if source == ANY_SOURCE else f"rank {source}"


def _recv_exact(sock, n):
    """n bytes, or None at the end of the stream."""
    data = bytearray(n)
    return bytes(data) if _recv_into(sock, memoryview(data)) else None


def _recv_into(sock, view):
    """Fills view (memoryview or uint8 array) from sock: False if the stream ended first."""
    view = memoryview(view).cast("B") if not isinstance(view, memoryview) else view
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True
