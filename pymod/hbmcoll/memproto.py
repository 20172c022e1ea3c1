"""The memory servers' protocol (memserver.py serves it, remote.py speaks it): the control
messages over TCP (length-prefixed JSON, the token's proof) and the data requests' head.

A data request is written one-sided into a half of the client's request slot in the server's
pool: a 64-byte head (HEAD), then its bytes. Its note names the client and the half (bit 16); a
client keeps up to two requests in flight, numbered in order, and its reply comes back in the
same half of its reply slot. The server's answer is written
into the client's pool at reply_to: REPLY (the buffer's version, and how many whole writes it
took), then for a read its bytes; its note is (status << 28) | the request's number.
"""
import hashlib
import hmac
import json
import struct

HEAD = struct.Struct("<IIQQQdQ")  # magic, op | flags, buffer id, offset, length, alpha, number
HEAD_BYTES = 64
REPLY = struct.Struct("<QQ")       # version (writes and accumulates), whole writes
MAGIC = 0x53424D48                 # "HMBS"
WRITE, ACCUMULATE, READ = 1, 2, 3
FIRST, LAST = 1 << 8, 1 << 9
OK, REFUSED = 0, 1                 # a reply note's top 4 bits; the rest: the request's number
NUMBER = (1 << 28) - 1
SLOT_BYTES = 1 << 20               # each client's request slot and reply slot
HALF = SLOT_BYTES // 2             # a slot holds two requests (or replies) in flight
LEASE_S = 10.0                     # a lock's lease unless the client asks for another
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32")
ALIGN = 4096


def send_msg(sock, obj):
    data = json.dumps(obj).encode()
    sock.sendall(struct.pack("<I", len(data)) + data)


def recv_msg(sock):
    """The next message, or None at end of file."""
    head = _recv_exactly(sock, 4)
    if head is None:
        return None
    body = _recv_exactly(sock, struct.unpack("<I", head)[0])
    return None if body is None else json.loads(body)


def _recv_exactly(sock, n):
    data = b""
    while len(data) < n:
        got = sock.recv(n - len(data))
        if not got:
            return None
        data += got
    return data


def proof(token, nonce):
    return hmac.new(token.encode(), b"hbmcoll-memserver:" + nonce, hashlib.sha256).hexdigest()


def read_token(path):
    with open(path) as f:
        token = f.read().strip()
    if not token:
        raise SystemExit(f"hbmcoll-memserver: the token file {path} is empty")
    return token
