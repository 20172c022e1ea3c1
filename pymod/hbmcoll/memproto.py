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
import math
import os
import struct

from .job_secret import shared_file_problem

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
MAX_LEASE_S = 86400.0              # a longer lease (or one not a finite number above 0) is refused
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32")
ALIGN = 4096
MIN_TOKEN_BYTES = 16               # a shorter token is refused (it could be guessed)
MAX_MSG = 4096                     # a control message's (and a hello's) bytes at most
HANDSHAKE_S = 5.0                  # a connection that has not proved the token by then is dropped


def lease_ok(lease):
    """A lock's lease as the server takes it: seconds, a finite number above 0, MAX_LEASE_S at most."""
    return (isinstance(lease, (int, float)) and not isinstance(lease, bool) and math.isfinite(lease)
            and 0 < lease <= MAX_LEASE_S)


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


def check_token(token, where):
    """token, or PermissionError (naming where it came from) when it is too short to be secret."""
    if len(token.encode()) < MIN_TOKEN_BYTES:
        raise PermissionError(f"{where}: the token has {len(token.encode())} bytes; a token must have at least "
                              f"{MIN_TOKEN_BYTES} bytes (draw one with python3 -c 'import secrets; "
                              "print(secrets.token_hex(16))')")
    return token


def read_token(path):
    """The token in the file at path; PermissionError if others may read or change the file (as
    ssh refuses such a key), or if the token is empty or short."""
    with open(path) as f:
        problem = shared_file_problem(os.fstat(f.fileno()), path, "the token file")
        if problem:
            raise PermissionError(problem)
        token = f.read().strip()
    if not token:
        raise PermissionError(f"the token file {path} is empty")
    return check_token(token, f"the token file {path}")
