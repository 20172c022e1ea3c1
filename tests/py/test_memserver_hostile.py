"""A memory server that cannot be killed or stalled from outside (memserver/server.py,
memserver/control.py): raw sockets against a real server (python -m hbmcoll.memserver).

- hellos that are not well formed (not JSON, not an object, fields of the wrong type, over the
  size limit) get a clear error and lose their connection; the server serves on;
- a token holder's bad control messages (a negative shape, a non-numeric or endless lease, not
  JSON, an unknown op, over the size limit) get an error naming what was wrong, and only that
  sender is dropped; the client raises the server's refusal as an error;
- an idle handshake, a trickling one, and a token holder that never reads its answers stall no
  other client (reads with a short timeout are served while the bad connection stays open), and
  a handshake that does not end within its deadline is dropped;
- a stranger posing as the server (it cannot prove the token on the client's nonce) is refused
  by the client, which never sends it its card (a key to its pool);
- a note naming another client is dropped and counted, and a client's timeout says so.
"""
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hbmcoll
from hbmcoll.memserver import protocol as ms
from test_memserver import ENV, TOKEN, servers  # noqa: F401  (servers: the fixture)


def _connect(addr, rcvbuf=None):
    host, port = addr.rsplit(":", 1)
    sock = socket.socket()
    if rcvbuf:  # before connecting, so the window it offers stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(20)
    sock.connect((host, int(port)))
    return sock


def _frame(body):
    return struct.pack("<I", len(body)) + body


def _next(sock):
    """The server's next message, or None once it closed the connection."""
    try:
        return ms.recv_msg(sock)
    except ConnectionResetError:
        return None


def _refused(sock, words):
    """The server answers with an error naming words, then closes the connection."""
    got = _next(sock)
    assert isinstance(got, dict) and isinstance(got.get("error"), str), got
    assert all(w in got["error"] for w in words), (words, got)
    assert _next(sock) is None, "the connection stays open after the error"
    sock.close()
    return got["error"]


def _holder(addr, card, rcvbuf=None):
    """A connection that proved the token (card: a real endpoint's, for the server to add)."""
    sock = _connect(addr, rcvbuf)
    nonce, mine = bytes.fromhex(_next(sock)["nonce"]), os.urandom(16)
    ms.send_msg(sock, {"proof": ms.proof(TOKEN, nonce), "nonce": mine.hex()})
    got = _next(sock)
    assert got and got.get("proof") == ms.proof(TOKEN, mine, "server"), got
    ms.send_msg(sock, {"card": card.hex(), "reply_to": ms.SLOT_BYTES})
    got = _next(sock)
    assert got and "slot" in got, got
    return sock


@pytest.fixture
def card():
    from hbmcoll import _core
    from hbmcoll.nodes.where import iface_to
    ep = _core.Bridge(iface_to("127.0.0.1"), 2 * ms.SLOT_BYTES)
    yield ep.card()
    ep.close()


def _still_serving(rb, x):
    rb.write(x)
    assert np.array_equal(rb.read(), x)


BAD_HELLOS = [  # (the hello's bytes, words the error names)
    (b"[1]", ["not a JSON object"]),
    (b"null", ["not a JSON object"]),
    (b'"proof"', ["not a JSON object"]),
    (b"not json", ["not JSON"]),
    (b"{", ["not JSON"]),
    (b"\xff\xfe\x00", ["not JSON"]),
    (b"[" * 3000, ["not JSON"]),                 # nested past the parser's recursion
    (b"{}", ["token does not match"]),
    (b'{"proof": 5}', ["token does not match"]),
    (b'{"proof": [1, 2]}', ["token does not match"]),
    (b'{"proof": {"a": 1}}', ["token does not match"]),
]


def test_hellos_that_are_not_well_formed_drop_only_their_sender(servers):
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("h", (100,), "float32", servers=addrs, token=TOKEN, timeout=30)
    for k, (hello, words) in enumerate(BAD_HELLOS):
        sock = _connect(addrs)
        assert "nonce" in _next(sock)
        sock.sendall(_frame(hello))
        _refused(sock, words)
        _still_serving(rb, np.full(100, k, np.float32))
    sock = _connect(addrs)  # a length over the limit is refused before its bytes come
    assert "nonce" in _next(sock)
    sock.sendall(struct.pack("<I", 0xFFFFFFF0))
    _refused(sock, ["4294967280 bytes", f"at most {ms.MAX_MSG}"])
    _still_serving(rb, np.ones(100, np.float32))


BAD_REQUESTS = [  # (the message, words the error names)
    ({"op": "open", "name": "b", "shape": [-1], "dtype": "float32"}, ["shape", "-1"]),
    ({"op": "open", "name": "b", "shape": ["4"], "dtype": "float32"}, ["shape"]),
    ({"op": "open", "name": "b", "shape": 4, "dtype": "float32"}, ["shape"]),
    ({"op": "open", "name": "b", "shape": [1 << 62, 4], "dtype": "float32"}, ["shape"]),
    ({"op": "open", "name": "b", "shape": [4], "whole": [True], "dtype": "float32"}, ["whole"]),
    ({"op": "open", "name": "b", "shape": [4], "dtype": "complex32"}, ["dtype", "float32"]),
    ({"op": "open", "name": 5, "shape": [4], "dtype": "float32"}, ["name"]),
    ({"op": "open", "name": "n" * 2000, "shape": [4], "dtype": "float32"}, ["name", "2000"]),
    ({"op": "lock", "id": 1, "lease": "soon"}, ["lease", "soon"]),
    ({"op": "lock", "id": 1, "lease": -1}, ["lease"]),
    ({"op": "lock", "id": 1, "lease": 1e300}, ["lease"]),
    ({"op": "lock", "id": [1]}, ["id"]),
    ({"op": "unlock", "id": "1"}, ["id"]),
    ({"op": "cancel"}, ["id"]),
    ({"op": 5}, ["request"]),
    ({"op": "frobnicate"}, ["request", "frobnicate"]),
    ({}, ["request"]),
    (b'{"op": "lock", "id": 1, "lease": NaN}', ["lease"]),
    (b'{"op": "lock", "id": 1, "lease": 1e400}', ["lease"]),  # inf
    (b"[1]", ["not a JSON object"]),
    (b"not json", ["not JSON"]),
    (struct.pack("<I", 1 << 20), [f"at most {ms.MAX_MSG}"]),  # a length prefix alone
]


def test_a_token_holders_bad_control_messages_drop_only_their_sender(servers, card):
    addrs = servers(1)
    rb = hbmcoll.RemoteBuffer("c", (100,), "float32", servers=addrs, token=TOKEN, timeout=30)
    for k, (msg, words) in enumerate(BAD_REQUESTS):
        sock = _holder(addrs, card)
        if isinstance(msg, dict):
            ms.send_msg(sock, msg)
        else:
            sock.sendall(msg if msg.startswith(struct.pack("<I", 1 << 20)) else _frame(msg))
        _refused(sock, words)
        _still_serving(rb, np.full(100, k, np.float32))


def test_the_client_raises_the_servers_refusal(servers):
    """What the client does not check itself (a name too long) comes back from the server as
    an error naming it."""
    addrs = servers(1)
    code = ("import hbmcoll\ntry:\n hbmcoll.RemoteBuffer('n' * 2000, (4,), servers=%r)\n"
            "except hbmcoll.Error as e:\n print('refused:', e)") % addrs
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert "refused:" in out.stdout and "name" in out.stdout and "1024" in out.stdout, (out.stdout, out.stderr[-2000:])
    for lease in ("soon", -1, float("inf")):  # and what it checks, before sending
        rb = hbmcoll.RemoteBuffer("l", (4,), servers=addrs, token=TOKEN, timeout=30)
        with pytest.raises(hbmcoll.ArgumentError, match="lease"):
            with rb.lock(lease=lease):
                pass
    with pytest.raises(hbmcoll.ArgumentError, match="shape"):
        hbmcoll.RemoteBuffer("s", (4, -1), servers=addrs, token=TOKEN, timeout=30)
    _still_serving(rb, np.ones(4, np.float32))


def _reads_are_served(rb, x, seconds):
    """Reads for a while; each must come back within the client's timeout (4 s)."""
    until = time.monotonic() + seconds
    n = 0
    while time.monotonic() < until or n < 3:
        assert np.array_equal(rb.read(), x)
        n += 1
    return n


def _open_and_silent(sock):
    sock.setblocking(False)
    try:
        with pytest.raises(BlockingIOError):  # no answer, no end of file: still open
            sock.recv(1)
    finally:
        sock.setblocking(True)


def test_an_idle_handshake_stalls_no_client(servers):
    addrs = servers(1)
    x = np.arange(1000, dtype=np.float32)
    rb = hbmcoll.RemoteBuffer("i", (1000,), "float32", servers=addrs, token=TOKEN, timeout=4)
    rb.write(x)
    idle = _connect(addrs)
    assert "nonce" in _next(idle)
    _reads_are_served(rb, x, 1.5)
    code = ("import numpy as np, hbmcoll\nrb = hbmcoll.RemoteBuffer('i', (1000,), servers=%r, timeout=4)\n"
            "print(int(rb.read().sum()))") % addrs  # a new client's handshake too
    out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == str(int(x.sum())), out.stderr[-2000:]
    _open_and_silent(idle)
    idle.settimeout(30)  # then dropped at its deadline
    _refused(idle, ["handshake", f"{ms.HANDSHAKE_S:g} s"])


def test_a_trickling_handshake_stalls_no_client_and_is_dropped_at_its_deadline(servers):
    addrs = servers(1)
    x = np.arange(1000, dtype=np.float32)
    rb = hbmcoll.RemoteBuffer("t", (1000,), "float32", servers=addrs, token=TOKEN, timeout=4)
    rb.write(x)
    slow = _connect(addrs)
    assert "nonce" in _next(slow)
    data, sent = _frame(b"{" + b" " * 1000 + b"}"), [0]

    def trickle():  # a byte every 0.2 s until the server answers
        while sent[0] < len(data) and not select.select([slow], [], [], 0.2)[0]:
            slow.send(data[sent[0]:sent[0] + 1])
            sent[0] += 1
    t = threading.Thread(target=trickle)
    t.start()
    try:
        _reads_are_served(rb, x, 2.0)
        assert sent[0] > 4 and t.is_alive()  # it was trickling meanwhile
    finally:
        t.join(60)
    assert not t.is_alive() and sent[0] < len(data)
    slow.settimeout(30)
    _refused(slow, ["handshake", f"{ms.HANDSHAKE_S:g} s"])


def test_a_token_holder_that_never_reads_its_answers_stalls_no_client(servers, card):
    """Its answers pile up in the server (a blocking send would hold the loop): it is dropped
    once they pass a bound, and the others are served throughout."""
    addrs = servers(1)
    x = np.arange(1000, dtype=np.float32)
    rb = hbmcoll.RemoteBuffer("r", (1000,), "float32", servers=addrs, token=TOKEN, timeout=4)
    rb.write(x)
    deaf = _holder(addrs, card, rcvbuf=4096)
    deaf.settimeout(None)  # its sends end only when the server drops it
    msg = _frame(b'{"op": "open", "name": "o", "shape": [1], "dtype": "float32"}')

    def flood():  # opens, never reading an answer, until the server drops it
        try:
            while True:
                deaf.sendall(msg * 64)
        except OSError:
            pass
    t = threading.Thread(target=flood)
    t.start()
    try:
        _reads_are_served(rb, x, 3.0)
        t.join(60)
        assert not t.is_alive(), "the server kept a client that leaves its answers unread"
    finally:
        if t.is_alive():
            deaf.shutdown(socket.SHUT_RDWR)  # ends the send blocked in it
            t.join(30)
        deaf.close()
    _still_serving(rb, x)


def test_a_stranger_posing_as_the_server_never_gets_a_card():
    listener = socket.create_server(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % listener.getsockname()[1]
    heard = []

    def pose():  # a server's first message, then a proof it cannot make, then it listens
        sock, _ = listener.accept()
        sock.settimeout(5)
        ms.send_msg(sock, {"nonce": os.urandom(16).hex()})
        heard.append(ms.recv_msg(sock))
        from hbmcoll import _core
        from hbmcoll.nodes.where import iface_to
        ep = _core.Bridge(iface_to("127.0.0.1"), 2 * ms.SLOT_BYTES)
        ms.send_msg(sock, {"proof": ms.proof("a-guess-at-the-token-00", os.urandom(16), "server"),
                           "card": ep.card().hex()})
        try:
            heard.append(ms.recv_msg(sock))  # None: the client hung up, and said nothing more
        except OSError as exc:
            heard.append(exc)
        ep.close()
        sock.close()

    t = threading.Thread(target=pose)
    t.start()
    with pytest.raises(PermissionError, match="could not prove the token"):
        hbmcoll.RemoteBuffer("bait", (4,), "float32", servers=addr, token=TOKEN, timeout=10)
    t.join(20)
    listener.close()
    assert len(heard) == 2 and "proof" in heard[0] and "card" not in heard[0], heard
    assert heard[1] is None or isinstance(heard[1], OSError), heard  # no card after the failed proof


HANGS_UP = r"""
import socket, sys
sys.path.insert(0, sys.argv[2])
from hbmcoll.memserver import protocol as ms
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
while True:  # a server pushed too far: a nonce, the client's proof read, and the connection closed
    sock, _ = listener.accept()
    ms.send_msg(sock, {"nonce": "00" * 16})
    ms.recv_msg(sock)
    sock.close()
"""


def test_a_server_that_hangs_up_mid_handshake_is_tried_again_until_the_timeout(tmp_path):
    # A client pushed out before the server's answer (a flood at the server) connects again. Before,
    # the failing handshake took a lock the client's maker already held: it hung for ever.
    here = os.path.dirname(os.path.abspath(__file__))
    server = subprocess.Popen([sys.executable, "-c", HANGS_UP, "x", os.path.join(here, "..", "..", "pymod")],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = server.stdout.readline().strip()
        code = ("import time, hbmcoll\nt = time.monotonic()\ntry:\n    hbmcoll.RemoteBuffer('h', (4,), servers="
                f"'127.0.0.1:{port}', token='{TOKEN}', timeout=2)\nexcept hbmcoll.PeerLostError as e:\n"
                "    print('gave up after %.1f s: %s' % (time.monotonic() - t, e))")
        out = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    finally:
        server.kill()
        server.wait()
    assert "gave up after" in out.stdout and "closed" in out.stdout, (out.stdout, out.stderr[-2000:])
    assert 1.5 < float(out.stdout.split()[3]) < 30, out.stdout  # tried again until its 2 s, then gave up


def test_a_note_naming_another_client_is_dropped_counted_and_named_by_the_timeout(servers):
    """A request whose note names another client (here one that does not exist): the server drops
    the note, as only a note's sender may name itself, and counts it; the sender's wait for the
    answer ends at its timeout with that count in the message (how a lost note shows itself), and
    its next request, numbered as if the dropped one never was, is served."""
    rb = hbmcoll.RemoteBuffer("named", (8,), "float32", servers=servers(1), token=TOKEN, timeout=2)
    rb.write(np.arange(8, dtype=np.float32))
    conn, bid = rb._parts[0][:2]
    with conn.lock:
        number, at = (conn.number + 1) & ms.NUMBER, conn.half * ms.HALF
        ms.HEAD.pack_into(conn.pool, at, ms.MAGIC, ms.READ | ms.FIRST | ms.LAST, bid, 0, 32, 0.0, number, 0, 0)
        conn.ep.write(conn.peer, at, conn.slot + at, ms.HEAD_BYTES, (conn.index + 1) | (conn.half << 16), 5)
        with pytest.raises(hbmcoll.TimeoutError, match=r"did not answer in 2 s \(request \d+ on this connection; the "
                           r"server dropped 0 note\(s\) from no peer of its endpoint and 1 naming another client\)"):
            conn._reply(number, conn.half, 32, None)
    assert np.array_equal(rb.read(), np.arange(8, dtype=np.float32))


FLOOD = r"""
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
held, opened = [], 0
while True:  # bursts of connections, none waiting for the last; paced, so the server accepts each
    time.sleep(0.005)  # (one that keeps the listen queue full keeps everyone out: the kernel's part)
    for _ in range(64):
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind(("127.0.0.2", 0))
        sock.connect_ex((host, int(port)))
        held.append(sock)
    opened += 64
    if opened % 1024 == 0:
        print(opened, flush=True)
    while len(held) > 2000:
        held.pop(0).close()
"""


def test_a_stranger_opening_connections_non_stop_keeps_no_client_out(servers):
    # Before, the server dropped the longest waiting of its 64 handshakes, whoever's: a stranger
    # opening connections fast enough dropped every new client before it could prove the token.
    # Now the address that holds the most handshakes loses its own oldest.
    addrs = servers(1)
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, addrs], stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout.readline(), "the stranger could not start"  # 1024 connections opened
        for k in range(10):
            rb = hbmcoll.RemoteBuffer(f"flood{k}", (1000,), "float32", servers=addrs, token=TOKEN, timeout=10)
            _still_serving(rb, np.full(1000, k, np.float32))
            del rb
        assert flood.poll() is None, "the stranger stopped early"
    finally:
        flood.kill()
        flood.wait()
