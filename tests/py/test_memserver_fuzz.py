"""A memory server under a seeded storm of bad input (memserver/server.py, memserver/control.py,
memserve.c): thousands of malformed hellos (not objects, not JSON, nested past the parser, huge
lengths, truncated, random bytes, a wrong type or value in every field), malformed control
messages from token holders, junk data requests (bad heads in a real connection's request slot),
and idle and trickling handshakes, all while a well-behaved client writes, reads, locks,
accumulates and shakes hands again, checking its data every time. At the end the server is alive
and serving, and every bad connection was dropped.

The generator is random.Random(SEED): a failure repeats with the same inputs (HBMCOLL_FUZZ_SEED
picks another seed; HBMCOLL_FUZZ_CASES another count).
"""
import json
import os
import random
import struct
import subprocess
import sys
import time

import numpy as np

import hbmcoll
from hbmcoll.memserver import protocol as ms
from test_memserver import ENV, TOKEN, servers  # noqa: F401  (servers: the fixture)
from test_memserver_hostile import _connect, _frame, _holder, card  # noqa: F401  (card: the fixture)

SEED = int(os.environ.get("HBMCOLL_FUZZ_SEED", "30"))
CASES = int(os.environ.get("HBMCOLL_FUZZ_CASES", "6000"))

CHECKER = r"""
import os, select, sys, numpy as np, hbmcoll
from hbmcoll.memserver import client as remote
n = 300000  # 1.2 MB of int32: three chunks a request
rb = hbmcoll.RemoteBuffer("fuzz-check", (n,), "int32", servers=addr, timeout=20)
print(rb._parts[0][1], flush=True)  # its id, which the junk leaves alone
k = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    k += 1
    rb.write(np.full(n, k, np.int32))
    a = rb.read()
    assert (a == k).all(), ("wrong data", k, np.unique(a)[:8])
    if k % 10 == 0:
        with rb.lock(timeout=20, lease=30):
            rb.accumulate(np.ones(n, np.int32))
            k += 1
            assert (rb.read() == k).all(), ("wrong sum", k)
    if k % 25 == 0:  # a fresh handshake, amid the bad ones
        remote._Connection(addr, os.environ["HBMCOLL_TOKEN"], 20).close()
print("ok", k, flush=True)
"""

WRONG = [None, True, False, 0, -1, 1.5, 2 ** 70, float("nan"), float("inf"), "", "x", "zz", [], [1], {}, {"a": 1},
         "ab" * 300]


def _wrong(rng, *also):
    return rng.choice(WRONG + list(also))


def _dropped(sock):
    """Reads what the server says until it closes: its messages (each must be an error)."""
    got, data = [], b""
    sock.settimeout(20)
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    while len(data) >= 4:
        n = struct.unpack_from("<I", data)[0]
        got.append(json.loads(data[4:4 + n]))
        data = data[4 + n:]
    sock.close()
    return got


def _bad_hello(rng, addr, card):
    """One connection with a bad hello; True when the server must answer it with an error."""
    sock = _connect(addr)
    nonce = bytes.fromhex(ms.recv_msg(sock)["nonce"])
    kind = rng.randrange(8)
    good = {"proof": ms.proof(TOKEN, nonce), "nonce": os.urandom(16).hex()}
    if kind == 0:    # not an object
        body, told = json.dumps(rng.choice([[1], 1, "x", None, True, 2.5, [], [[{}]], "proof"])).encode(), True
    elif kind == 1:  # not JSON
        body, told = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\x00{", True
    elif kind == 2:  # nested past the parser
        body, told = rng.choice([b"[", b'{"a":']) * rng.randint(1000, ms.MAX_MSG), True
    elif kind == 3:  # a length over the limit, and maybe some of it
        sock.sendall(struct.pack("<I", rng.randint(ms.MAX_MSG + 1, (1 << 32) - 1)) + os.urandom(rng.randrange(64)))
        return sock, True
    elif kind == 4:  # truncated, then gone
        data = _frame(json.dumps(good).encode())
        sock.sendall(data[:rng.randrange(len(data))])
        sock.close()
        return None, False
    elif kind == 5:  # random bytes, then gone
        sock.sendall(os.urandom(rng.randint(1, 600)))
        sock.close()
        return None, False
    elif kind == 6 and rng.random() < 0.5:  # the hello: a field of the wrong type or value
        hello = dict(good)
        field = rng.choice(["proof", "nonce"])
        hello[field] = _wrong(rng, "16", good["nonce"][:31], good["nonce"] * 5)  # none a nonce
        if rng.random() < 0.3:
            del hello[field]
        body, told = json.dumps(hello).encode(), True
    elif kind == 6:  # proven, then a card message with a field of the wrong type or value
        ms.send_msg(sock, good)
        assert ms.recv_msg(sock)["proof"] == ms.proof(TOKEN, bytes.fromhex(good["nonce"]), "server")
        joined = {"card": card.hex(), "reply_to": ms.SLOT_BYTES}
        field = rng.choice(["card", "reply_to"])
        joined[field] = _wrong(rng, card.hex()[:-2], "ff" + card.hex()[2:], card.hex()[:7], 1 << 49, "16")
        if field == "reply_to" and joined[field] == 0 and type(joined[field]) is int:
            joined[field] = -4  # 0 is a good offset
        if rng.random() < 0.3:
            del joined[field]
        body, told = json.dumps(joined).encode(), True
    else:            # a wrong proof with a good card
        hello = dict(good, proof=ms.proof(TOKEN + "x", nonce))
        body, told = json.dumps(hello).encode(), True
    sock.sendall(_frame(body[:ms.MAX_MSG]))
    return sock, told


BASE = {"open": {"op": "open", "name": "fuzz-open", "shape": [4], "whole": [2, 2], "dtype": "float32"},
        "lock": {"op": "lock", "id": 1, "lease": 5}, "unlock": {"op": "unlock", "id": 1, "token": 1},
        "cancel": {"op": "cancel", "id": 1}}
BAD = {"name": ["n" * 1100, 7, None, [], {}],
       "shape": [[-1], [True], [1.5], ["4"], [1 << 61], [1] * 33, [1 << 40, 1 << 40], 4, None, "4", {}],
       "dtype": ["complex32", "object", "", "float32 ", 1, None, ["float32"]],
       "id": ["1", 1.0, True, None, -1, 0, 1 << 40, [1], {}],
       "lease": ["soon", -1, 0, float("nan"), float("inf"), 1e9, True, [5], {}],
       "token": ["1", -1, 1.5, True, 1 << 64, [1], {}],
       "op": ["frobnicate", "OPEN", 5, None, [], ""]}
BAD["whole"] = BAD["shape"]


def _bad_request(rng, addr, card):
    """A token holder's bad control message: the holder is told and dropped."""
    sock = _holder(addr, card)
    kind = rng.randrange(10)
    if kind == 0:
        sock.sendall(_frame(bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) + b"}"))
    elif kind == 1:
        sock.sendall(_frame(json.dumps(rng.choice([[BASE["lock"]], 1, None, "open"])).encode()))
    elif kind == 2:
        sock.sendall(struct.pack("<I", rng.randint(ms.MAX_MSG + 1, (1 << 32) - 1)))
    else:
        msg = dict(BASE[rng.choice(list(BASE))])
        field = rng.choice([f for f in BAD if f in msg])
        if rng.random() < 0.15 and field not in ("whole", "lease", "token"):
            del msg[field]  # a required field missing
        else:
            msg[field] = rng.choice(BAD[field])
        ms.send_msg(sock, msg)
    return sock


def _junk_data(rng, conn, own, avoid):
    """A junk data request in conn's request slot (its number right, all else random); it is
    answered, refused or applied, never hangs. own: this client's buffer (id, bytes)."""
    bid = rng.choice([own[0], own[0], 0, avoid + 1000, rng.randrange(1 << 64)])
    if bid == avoid:
        bid = own[0]
    op = rng.choice([ms.WRITE, ms.ACCUMULATE, ms.READ, ms.COMMIT, 0, 5, 255])
    op |= rng.choice([0, ms.FIRST, ms.LAST, ms.FIRST | ms.LAST]) | rng.choice([0, 0, ms.STAGE])
    op |= rng.choice([0, rng.randrange(1, len(ms.DTYPES) + 1), rng.randrange(256)]) << 16  # the dtype code
    if rng.random() < 0.1:
        op = rng.randrange(1 << 32)
    off = rng.choice([0, rng.randrange(own[1] + 8), own[1], (1 << 64) - 1, rng.randrange(1 << 64)])
    length = rng.choice([0, 4, rng.randrange(own[1] + 8), own[1], ms.HALF, (1 << 64) - 4, rng.randrange(1 << 64)])
    alpha = rng.choice([1.0, 0.5, -2.0, float("nan"), float("inf"), -float("inf"), 1e300, -2.0 ** 63])
    magic = ms.MAGIC if rng.random() < 0.8 else rng.randrange(1 << 32)
    with conn.lock:  # as remote._Connection._post writes a request, with these fields
        number, half = (conn.number + 1) & ms.NUMBER, conn.half
        at = half * ms.HALF
        fence = rng.choice([0, 1, rng.randrange(1 << 64)])  # a lock's fencing token it does not hold
        wid = rng.choice([0, rng.randrange(1 << 64)])
        ms.HEAD.pack_into(conn.pool, at, magic, op, bid, off, length, alpha, number, fence, wid)
        conn.ep.write(conn.peer, at, conn.slot + at, ms.HEAD_BYTES + min(length, own[1]), conn.index | (half << 16), 20)
        conn.number, conn.half = number, half ^ 1
        conn._reply(number, half, 0, None)


def test_a_storm_of_bad_input_leaves_the_server_serving_right_data(servers, card):
    addr = servers(1)
    rng = random.Random(SEED)
    checker = subprocess.Popen([sys.executable, "-c", f"addr = {addr!r}\n" + CHECKER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    slow = []
    try:
        avoid = int(checker.stdout.readline())
        junk = hbmcoll.RemoteBuffer("fuzz-junk", (1024,), "float32", servers=addr, token=TOKEN, timeout=20)
        conn, own = junk._parts[0][0], (junk._parts[0][1], 4096)
        trickle, last = _frame(b"{" + b" " * (ms.MAX_MSG - 2) + b"}"), 0.0  # a byte each 50 ms: the deadline ends it
        for k in range(8):  # idle and trickling handshakes, open throughout: dropped at their deadline
            sock = _connect(addr)
            assert "nonce" in ms.recv_msg(sock)
            sock.setblocking(False)
            slow.append([sock, k % 2 == 1, 0])
        started, counts = time.monotonic(), {"hello": 0, "request": 0, "data": 0}
        for case in range(CASES):
            kind = rng.choices(["hello", "request", "data"], [4, 2, 4])[0]
            counts[kind] += 1
            if kind == "hello":
                sock, told = _bad_hello(rng, addr, card)
                if sock is not None:
                    said = _dropped(sock)
                    assert not told or (said and all("error" in m for m in said)), (case, said)
            elif kind == "request":
                said = _dropped(_bad_request(rng, addr, card))
                assert said and all("error" in m for m in said), (case, said)
            else:
                _junk_data(rng, conn, own, avoid)
            assert checker.poll() is None, checker.communicate()[1][-3000:]
            if time.monotonic() - last < 0.05:
                continue
            last = time.monotonic()
            for s in slow:
                if s[1]:
                    try:
                        s[2] += s[0].send(trickle[s[2]:s[2] + 1])
                    except OSError:  # dropped already
                        pass
        took = time.monotonic() - started
        junk.write(np.arange(1024, dtype=np.float32))  # the junk's own connection still works
        assert np.array_equal(junk.read(), np.arange(1024, dtype=np.float32))
        out, err = checker.communicate("stop\n", timeout=60)
        assert checker.returncode == 0 and out.split()[-2] == "ok", err[-3000:]
        rounds = int(out.split()[-1])
        assert rounds >= 5, (rounds, took)  # it was served throughout, not once at the end
        rb = hbmcoll.RemoteBuffer("fuzz-check", (300000,), "int32", servers=addr, token=TOKEN, timeout=20)
        assert (rb.read() == rounds).all()
        time.sleep(max(0.0, ms.HANDSHAKE_S + 1 - took))
        for sock, _, _ in slow:  # every idle and trickling handshake was dropped
            sock.setblocking(True)
            said = _dropped(sock)
            assert said and "handshake" in said[-1]["error"], said
        print(f"fuzz: {counts} in {took:.1f} s, the checker's rounds {rounds}")
    finally:
        if checker.poll() is None:
            checker.kill()
            checker.communicate()
        for sock, _, _ in slow:
            sock.close()
