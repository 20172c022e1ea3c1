"""hbmcoll-memserver: a memory server for remote shared buffers (Soft Memory Box's design).

    hbmcoll-memserver --listen ADDR:PORT --token-file FILE [--capacity SIZE] [--memory auto|hbm|ddr]
    python -m hbmcoll.memserver ...

The server places one pool by the node's plan (in HBM, through memkind, where the node has it),
registers it with the NIC (a bridge endpoint, libfabric) and serves named buffers out of it
to clients (hbmcoll.RemoteBuffer) that present the job's token.

Control, over TCP (one connection per client, length-prefixed JSON): the server's nonce; the
client's proof (HMAC-SHA256 of the nonce under the token) and a nonce of its own; the server's
proof on that nonce and its endpoint card; only then the client's card (a key to its pool, which
a stranger posing as the server must never get); the client's two slots in the server's pool
(requests in, replies out). Then `open` (the
first open of a name creates the buffer; a later one with another shape or dtype is refused),
`lock` / `unlock` (a lock is held for a lease: a holder that dies or overruns it loses it; each
grant carries a fencing token, increasing per buffer, which the data path checks on every write
made under the lock: a holder that lost its lock writes nothing). `open` answers with this
server's instance id, new at every start, so a client tells a restarted server from a
reconnection and never reads a new buffer for its old one.
No connection can stall or kill the server (control.py): the handshakes and control
messages are read and answered without blocking, in pieces as they come, a handshake has a
deadline, every message a size limit and a check of its fields, and a bad sender is sent the
reason and dropped alone.

Data, one-sided, in C without the GIL (_core.MemServe, pymod/memserve.c): a client writes a
request (a 64-byte head, then its bytes) into a half of its request slot, two in flight, with a
note naming it; the server applies it (write: copy; accumulate: y += alpha * x; read: copy out
the buffer's bytes behind its version) and answers by writing into the client's pool with a
note carrying the request's number and status. The server alone touches the buffers, one
request at a time; a write cut in chunks is gathered aside and applied whole at its last
chunk, so no read sees it half done or waits for it (protocol.py: the guarantees). Every
request is checked against its buffer's bounds and dtype. This loop hands over to the
control path whenever a socket stirs, and every 10 ms (lock leases, handshake
deadlines, SIGTERM).
"""
import argparse
import collections
import hmac
import ipaddress
import json
import os
import queue
import secrets
import selectors
import signal
import socket
import sys
import threading
import time

import numpy as np

from ..nodes import netaddr
from .protocol import ALIGN, DTYPES, HANDSHAKE_S, LEASE_S, SLOT_BYTES, dtype_code, itemsize, proof, read_token
from .control import CLIENT, CLOSING, HELLO, PROVEN, Conn, Refused, check_card, check_hello, check_request

MAX_HANDSHAKES = 64  # connections proving the token at once; past it, one of the busiest address goes


def _group(host):
    """The address whose handshakes are counted together: an IPv6 one's /64 (one host may hold it all)."""
    return str(ipaddress.ip_network(host + "/64", strict=False)) if ":" in host else host


def _crowding(waiting, group):
    """The handshake that goes for a newcomer from group when all are taken: the oldest of the
    group holding the most (the newcomer counted), so a stranger opening connections non-stop
    pushes out its own, not clients'; None: the newcomer itself (every group holds one)."""
    held = collections.Counter(c.group for c in waiting)
    held[group] += 1
    busiest, most = held.most_common(1)[0]
    return next((c for c in waiting if c.group == busiest), None) if most > 1 else None


class Buffer:
    def __init__(self, bid, name, shape, dtype, base, nbytes):
        self.id, self.name, self.shape, self.dtype = bid, name, shape, dtype
        self.base, self.nbytes = base, nbytes
        self.lock_holder, self.lease_until = None, 0.0
        self.token = 0  # the last lock grant's fencing token
        self.lock_waiters = collections.deque()  # (client, lease)


class Client:
    def __init__(self, index, conn, peer, slot):
        self.index, self.conn, self.peer, self.slot = index, conn, peer, slot
        self.sock = conn.sock
        self.reply = slot + SLOT_BYTES        # the reply slot, in the server's pool
        self.reply_to = 0                     # where replies land in the client's pool


class Server:
    def __init__(self, host, port, token, capacity, iface=None, max_clients=64, memory="auto"):
        from .. import _core
        from ..nodes.where import iface_to
        self.token, self.capacity = token, capacity
        host, fam = netaddr.strip(host), netaddr.family(host)
        self.iface = iface or iface_to(host)
        self.where, self.memory = placed_pool(memory, capacity + max_clients * 2 * SLOT_BYTES)
        from ..nodes.where import confine_ports
        confine_ports(os.environ)  # HBMCOLL_PORTS: its endpoint listens within the range
        self.ep = _core.Bridge(self.iface, pool=self.memory, family=fam)
        self.data = _core.MemServe(self.ep, max_clients)
        self.free_slots = list(range(max_clients))[::-1]
        self.clients, self.buffers, self.by_name = {}, {}, {}
        self.conns = {}  # every control connection (control.Conn), oldest first
        self.used = 0
        self.listener = socket.create_server((netaddr.resolve(host, fam), port), family=fam, reuse_port=False)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, None)
        self.stopping = False
        self.instance = secrets.token_hex(8)  # new at every start: its buffers are not an old instance's

    def describe(self):
        return (f"hbmcoll-memserver: {self.capacity} bytes for buffers at "
                f"{netaddr.join(*self.listener.getsockname()[:2])}, {self.where}, bridge: {self.ep.describe()}")

    # -- control --------------------------------------------------------------------------------
    def _accept(self):
        for _ in range(MAX_HANDSHAKES):  # what waits, a batch at a time
            try:
                sock, peer = self.listener.accept()
            except OSError:  # none left; or out of descriptors: it waits in the backlog
                return
            refused = [c for c in self.conns if c.state == CLOSING and c.client is None]
            told = [c for c in refused if not c.outbox]  # their goodbye went out
            if len(refused) >= MAX_HANDSHAKES and told:  # a flood of bad hellos: their goodbyes hold no more
                self._close(min(told, key=lambda c: c.deadline))
            starting = [c for c in self.conns if c.state in (HELLO, PROVEN)]
            if len(starting) >= MAX_HANDSHAKES:
                # one that proved the token is not pushed out; one pushed out is closed at once, so
                # a flood holds no descriptors here (a goodbye would keep each open a while)
                victim = _crowding([c for c in starting if c.state == HELLO], _group(peer[0]))
                if victim is None:
                    sock.close()
                    continue
                self._close(victim)
            conn = Conn(sock, time.monotonic(), _group(peer[0]))
            self.conns[conn] = None
            self.sel.register(sock, selectors.EVENT_READ, conn)
            self._watch(conn)

    def _hello(self, conn, hello):
        """A connection's hello: its proof of the token and a nonce of its own, which the server
        proves the token on in turn, with its card. Only then does the client send its card (a
        key to its pool): a stranger posing as the server never gets one. Refused otherwise."""
        given = hello.get("proof")
        want = proof(self.token, conn.nonce).encode()
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), want):
            raise Refused("refused: the token does not match the server's")
        check_hello(hello)
        if not self.free_slots:
            raise Refused(f"the server serves at most {len(self.clients)} clients")
        conn.state = PROVEN
        conn.send({"proof": proof(self.token, bytes.fromhex(hello["nonce"]), "server"),
                   "card": self.ep.card().hex()})

    def _join(self, conn, msg):
        """A proven connection's card and reply_to: it becomes a client, or Refused."""
        check_card(msg)
        if not self.free_slots:
            raise Refused(f"the server serves at most {len(self.clients)} clients")
        index = self.free_slots.pop()
        try:
            client = Client(index, conn, self.ep.add_peer(bytes.fromhex(msg["card"])),
                            self.capacity + index * 2 * SLOT_BYTES)
            client.reply_to = msg["reply_to"]
            self.data.add_client(index, client.peer, client.slot, client.reply, client.reply_to)
        except Exception as exc:  # the card or reply_to the bridge refused: this client's fault alone
            self.free_slots.append(index)
            raise Refused(f"hello: the bridge refused the client's endpoint: {exc}") from None
        conn.state, conn.deadline, conn.client = CLIENT, None, client
        self.clients[index] = client
        if not conn.send({"slot": client.slot, "slot_bytes": SLOT_BYTES, "client": index}):
            self._drop(client)

    def _stir(self, conn, events):
        """A connection's socket is ready (events): its answers out, its messages in and handled."""
        if conn not in self.conns:
            return  # closed earlier in this round
        if (events & selectors.EVENT_WRITE and not conn.flush()) or \
                (events & selectors.EVENT_READ and not conn.receive()):  # it failed, or hung up
            return self._drop(conn.client) if conn.state == CLIENT else self._close(conn)
        try:
            while conn in self.conns and conn.state != CLOSING and (msg := conn.next_message()) is not None:
                if conn.state == HELLO:
                    self._hello(conn, msg)
                elif conn.state == PROVEN:
                    self._join(conn, msg)
                else:
                    check_request(msg)
                    answer = self._request(conn.client, msg)
                    if answer is not None:
                        self._answer(conn.client, answer)
        except Refused as why:
            self._refuse(conn, str(why))
        if conn in self.conns:
            self._watch(conn)

    def _watch(self, conn):
        """Wake for conn's socket to take its answers only while some wait."""
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
        if self.sel.get_key(conn.sock).events != events:
            self.sel.modify(conn.sock, events, conn)

    def _refuse(self, conn, why):
        """conn's sender is told why, and dropped alone."""
        if conn.state == CLIENT:
            return self._drop(conn.client, why)
        if conn.state != CLOSING:
            conn.goodbye(why, time.monotonic())
            self._watch(conn)

    def _close(self, conn):
        if conn in self.conns:
            del self.conns[conn]
            self.sel.unregister(conn.sock)
            conn.sock.close()

    def _answer(self, client, obj):
        if not client.conn.send(obj):
            return self._drop(client)
        self._watch(client.conn)

    def _request(self, client, msg):
        op = msg.get("op")
        if op == "open":
            return self._open(msg)
        if op == "stats":  # notes the data path dropped before any client's request: a timeout names them
            return {"forged": self.data.dropped(), "no_peer": self.ep.dropped()}
        buf = self.buffers.get(msg.get("id"))
        if buf is None:
            return {"error": "no such buffer"}
        if op == "lock":
            buf.lock_waiters.append((client, float(msg.get("lease") or LEASE_S)))
            self._grant(buf)
            return None  # answered when granted
        if op == "cancel":  # a lock wait the client gave up: not granted, or given back
            buf.lock_waiters = collections.deque((c, t) for c, t in buf.lock_waiters if c is not client)
            if buf.lock_holder is client:
                self._release(buf)
                self._grant(buf)
            return {"cancelled": True}
        if op == "unlock":
            if buf.lock_holder is not client or (msg.get("token") is not None and msg["token"] != buf.token):
                return {"error": "unlock of a lock this client does not hold (its lease ran out)"}
            self._release(buf)
            self._grant(buf)
            return {"ok": True}
        return {"error": f"unknown request {op!r}"}

    def _open(self, msg):
        name, shape, dtype = str(msg.get("name")), [int(d) for d in msg.get("shape", [])], str(msg.get("dtype"))
        whole = [int(d) for d in msg.get("whole", shape)]
        if dtype not in DTYPES:
            return {"error": f"dtype {dtype!r}: one of {', '.join(DTYPES)}"}
        buf = self.by_name.get(name)
        if buf is not None:
            if buf.shape != shape or buf.dtype != dtype or buf.whole != whole:
                return {"error": "mismatch", "text": f"it exists with shape {tuple(buf.whole)} and dtype "
                                                     f"{buf.dtype}, not {tuple(whole)} and {dtype}"}
        else:
            nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize(dtype)
            base = -(-self.used // ALIGN) * ALIGN
            if base + nbytes > self.capacity:
                return {"error": "capacity", "text": f"buffer {name!r} needs {nbytes} bytes; the server has "
                                                     f"{self.capacity - base} of {self.capacity} left"}
            self.used = base + nbytes
            buf = Buffer(len(self.buffers) + 1, name, shape, dtype, base, nbytes)
            self.data.add_buffer(buf.id, base, nbytes, dtype, dtype_code(dtype), itemsize(dtype))
            buf.whole = whole
            self.buffers[buf.id], self.by_name[name] = buf, buf
        return {"id": buf.id, "nbytes": buf.nbytes, "version": self.data.version(buf.id)[0], "instance": self.instance}

    def _grant(self, buf):
        if buf.lock_holder is not None and time.monotonic() > buf.lease_until:
            self._release(buf)  # the lease ran out
        while buf.lock_holder is None and buf.lock_waiters:
            client, lease = buf.lock_waiters.popleft()
            if client.index in self.clients and self.clients[client.index] is client:
                buf.token += 1  # the data path takes this token alone, within the lease
                self.data.set_fence(buf.id, buf.token, lease)
                buf.lock_holder, buf.lease_until = client, time.monotonic() + lease
                self._answer(client, {"ok": True, "lease": lease, "token": buf.token})

    def _release(self, buf):
        """The lock is free: its holder's token changes nothing more."""
        buf.lock_holder = None
        if buf.token:
            self.data.set_fence(buf.id, buf.token, 0)

    def _drop(self, client, why=None):
        """A client gone (told why, when given): its slots, holds, parked requests and locks go
        with it."""
        if self.clients.get(client.index) is not client:
            return
        del self.clients[client.index]
        self.data.drop_client(client.index)
        if why is None:
            self._close(client.conn)
        else:
            client.conn.goodbye(why, time.monotonic())
            self._watch(client.conn)
        self.free_slots.append(client.index)
        for buf in self.buffers.values():
            buf.lock_waiters = collections.deque((c, s) for c, s in buf.lock_waiters if c is not client)
            if buf.lock_holder is client:
                self._release(buf)
                self._grant(buf)

    # -- the loop ------------------------------------------------------------------------------
    def serve(self):
        while not self.stopping:
            fds = [self.listener.fileno()] + [c.fileno() for c in self.conns]
            for index in self.data.serve(fds, 0.01):  # the clients whose answers could not leave
                if index in self.clients:
                    self._drop(self.clients[index])
            for key, events in self.sel.select(timeout=0):
                if key.data is None:
                    self._accept()
                else:
                    self._stir(key.data, events)
            now = time.monotonic()
            for conn in [c for c in self.conns if c.deadline is not None and now > c.deadline]:
                if conn.state in (HELLO, PROVEN):
                    self._refuse(conn, f"refused: the handshake did not end within {HANDSHAKE_S:g} s")
                else:  # a dropped connection's time to read its error is over
                    self._close(conn)
            for buf in self.buffers.values():
                if buf.lock_holder is not None and time.monotonic() > buf.lease_until:
                    self._grant(buf)

    def close(self):
        for client in list(self.clients.values()):
            self._drop(client)
        for conn in list(self.conns):
            self._close(conn)
        self.sel.close()
        self.listener.close()
        try:
            self.ep.flush(1.0)
        except Exception:
            pass
        self.ep.close()


def placed_pool(memory, nbytes):
    """(where, the pool's memory): nbytes placed as this node's plan says (numa/: HBM through
    memkind or mbind where the node has it, DDR else), or in DDR (memory "ddr"); "hbm" refuses
    a node without HBM. where: one phrase, e.g. "in HBM (node 4)", with the plan's notice."""
    from .. import _core
    if memory == "ddr":
        os.environ["HBMCOLL_MEMORY"] = "ddr"
    elif memory == "hbm" and os.environ.get("HBMCOLL_MEMORY", "auto") in ("auto", "ddr"):
        os.environ["HBMCOLL_MEMORY"] = "hbm_preferred"
    try:
        placement = _core.Placement(0, 1)
    except ValueError as exc:
        raise SystemExit(f"hbmcoll-memserver: {exc}") from None
    plan = json.loads(placement.report(True))
    hbm, notice = plan.get("hbm_nodes") or [], placement.notice.removeprefix("hbmcoll: ")
    if memory == "hbm" and not hbm:
        raise SystemExit(f"hbmcoll-memserver: --memory hbm: {notice}; use --memory auto (DDR here) or ddr")
    pool = _core.PoolMemory(placement, nbytes)
    kind = "HBM" if pool.node in hbm and os.environ.get("HBMCOLL_MEMORY") != "ddr" else "DDR"
    why = f": {notice}" if notice and not notice.startswith("buffers in") else ""
    return f"pool in {kind} (node {pool.node}){why}", pool


READY_S = 120  # the longest a server beside the job may take to print its ready line
READY = " bytes for buffers at "  # in a server's ready line (main's describe)


class _Stderr(threading.Thread):
    """A child server's stderr, read for as long as it runs: the lines before its ready line are
    kept for the caller (libfabric's logs with FI_LOG_LEVEL, warnings), every line after goes
    on to ours, so a server that writes never blocks on a full pipe."""

    def __init__(self, p):
        super().__init__(daemon=True)
        self.p, self.lines, self.ready = p, queue.Queue(), False

    def run(self):
        for line in self.p.stderr:
            if self.ready:
                try:
                    sys.stderr.write(line)
                except (OSError, ValueError):  # our stderr is gone: the pipe is still drained
                    pass
                continue
            self.ready = READY in line
            self.lines.put(line)
        self.lines.put(None)

    def ready_line(self, where):
        """The ready line; the others before it passed on; SystemExit when the server ends or
        takes longer than READY_S."""
        until, seen = time.monotonic() + READY_S, []
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                line = False
            if not line:  # None: its stderr ended
                why = "it ended" if line is None else f"no ready line in {READY_S} s"
                raise SystemExit(f"hbmcoll-run: a memory server at {where} did not start ({why}): "
                                 f"{''.join(seen)[-2000:]}")
            if READY in line:
                return line
            seen.append(line)
            sys.stderr.write(line)


def start_beside(k, host, ports, token, capacity="1G"):
    """k servers as child processes on host (ports: k numbers, 0 for a free one), each ready (its
    line printed) before this returns: (processes, "host:port,...", stop()). hbmcoll-run's
    --memservers. stop() ends them with SIGTERM and removes the token file."""
    import shutil
    import subprocess
    import tempfile
    where = tempfile.mkdtemp(prefix="hbmcoll-memserver-")  # 0700: the token stays ours
    fd = os.open(os.path.join(where, "token"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # read_token's mode
    with os.fdopen(fd, "w") as f:
        f.write(token)
    procs, addrs = [], []

    def stop():
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(where, ignore_errors=True)
    try:
        for port in ports:
            if not port:
                with socket.socket(netaddr.family(host)) as s:
                    s.bind((netaddr.strip(host), 0))
                    port = s.getsockname()[1]
            p = subprocess.Popen([sys.executable, "-m", "hbmcoll.memserver", "--listen", netaddr.join(netaddr.strip(host), port),
                                  "--token-file", os.path.join(where, "token"), "--capacity", str(capacity)],
                                 stderr=subprocess.PIPE, text=True, errors="replace")
            procs.append(p)
            reader = _Stderr(p)
            reader.start()
            sys.stderr.write(reader.ready_line(netaddr.join(netaddr.strip(host), port)))
            addrs.append(netaddr.join(netaddr.strip(host), port))
    except BaseException:
        stop()
        raise
    return procs, ",".join(addrs), stop


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    try:
        return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except (ValueError, IndexError):
        raise SystemExit(f"hbmcoll-memserver: --capacity {text!r}: a size such as 1G, 512M or 1048576") from None


def main(argv=None):
    ap = argparse.ArgumentParser(prog="hbmcoll-memserver", description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="ADDR:PORT to serve at ([ADDR]:PORT for IPv6)")
    ap.add_argument("--token-file", required=True, help="a file holding the job's token")
    ap.add_argument("--capacity", default="1G", help="bytes for buffers (default 1G)")
    ap.add_argument("--memory", default="auto", choices=("auto", "ddr", "hbm"),
                    help="the pool's memory: auto (HBM where the node has it, else DDR), ddr, or hbm (refused "
                         "without HBM)")
    ap.add_argument("--iface", help="the bridge's interface (default: the one holding the listen address)")
    a = ap.parse_args(argv)
    try:
        host, port = netaddr.split(a.listen)
    except ValueError:
        host = ""
    if not host:
        raise SystemExit(f"hbmcoll-memserver: --listen {a.listen!r}: give ADDR:PORT ([ADDR]:PORT for IPv6)")
    try:
        token = read_token(a.token_file)
    except OSError as exc:
        raise SystemExit(f"hbmcoll-memserver: {exc}") from None
    server = Server(host, int(port), token, parse_size(a.capacity), a.iface, memory=a.memory)
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "stopping", True))
    print(server.describe(), file=sys.stderr, flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
