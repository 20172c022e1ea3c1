"""The memory servers' protocol (server.py serves it, client.py speaks it): the control
messages over TCP (length-prefixed JSON, the token's proof) and the data requests' head.

A data request is written one-sided into a half of the client's request slot in the server's
pool: a 64-byte head (HEAD), then its bytes. Its note names the client and the half (bit 16); a
client keeps up to two requests in flight, numbered in order, and its reply comes back in the
same half of its reply slot. The server's answer is written into the client's pool at
reply_to: REPLY (the buffer's version, and the id of the last write applied to it), then for a
read its bytes; its note is (status << 28) | the request's number.

What a server guarantees (pymod/memserve.c applies it):
- A request is applied whole. A write or accumulate cut in chunks (FIRST ... LAST) is gathered
  aside and applied at its last chunk: a reader never sees it half done and never waits for
  its writer. One whose next chunk comes PARTIAL_S late is dropped (DROPPED to its writer).
- A write or accumulate names its dtype (bits 16-23 of op | flags: an index into DTYPES); any
  other than the buffer's is refused (DTYPE), never reinterpreted.
- Fencing: a lock grant carries a token, increasing per buffer on the server that grants it
  (part 0's); a write made under the lock carries it, and is refused (FENCED) unless it is the
  holder's within its lease on that server, or below a token the server has seen elsewhere.
  A write without the lock (fence 0) is allowed, unfenced, as before.
- A striped write (several servers) holds the lock, stages every part whole (STAGE: kept aside
  under its write id) and then commits them (COMMIT), part 0 first. Part 0's commit is the
  write's moment, fenced like any write: a writer stalled past its lease is refused there and
  its staged parts are never seen. A read of part k > 0 names the write id part 0 holds (READ's
  id field): a part still holding that write staged commits it first, so a writer that stops
  between its commits leaves no torn buffer. The client's read is whole when every part holds
  the same write id (accumulates are applied part by part, and do not change it).
"""
import hashlib
import hmac
import json
import math
import os
import struct

from ..launch.job_secret import shared_file_problem

# magic, op | flags | dtype << 16, buffer id, offset, length, alpha, number, fencing token, write id
HEAD = struct.Struct("<IIQQQdQQQ")
HEAD_BYTES = 64
REPLY = struct.Struct("<QQ")       # version (writes and accumulates), the last write's id
MAGIC = 0x53424D48                 # "HMBS"
WRITE, ACCUMULATE, READ, COMMIT = 1, 2, 3, 4
FIRST, LAST, STAGE = 1 << 8, 1 << 9, 1 << 10
OK, REFUSED, FENCED, DTYPE, DROPPED, NOT_STAGED = range(6)  # a reply note's top 4 bits
NUMBER = (1 << 28) - 1             # a reply note's other bits: the request's number
SLOT_BYTES = 1 << 20               # each client's request slot and reply slot
HALF = SLOT_BYTES // 2             # a slot holds two requests (or replies) in flight
LEASE_S = 10.0                     # a lock's lease unless the client asks for another
PARTIAL_S = 5.0                    # a chunked request whose next chunk is this late is dropped
DATA_TIMEOUT_S = 30.0              # a client's wait for a reply, unless it gives timeout=
# a buffer's dtypes, numbered from 1 (the head's dtype code); ACCUMULATES take accumulate too
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
          "bfloat16", "float32", "float64", "complex64", "complex128")
ACCUMULATES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
MAX_LEASE_S = 86400.0              # a longer lease (or one not a finite number above 0) is refused
ALIGN = 4096
MIN_TOKEN_BYTES = 16               # a shorter token is refused (it could be guessed)
MAX_MSG = 4096                     # a control message's (and a hello's) bytes at most
HANDSHAKE_S = 5.0                  # a connection that has not proved the token by then is dropped


def lease_ok(lease):
    """A lock's lease as the server takes it: seconds, a finite number above 0, MAX_LEASE_S at most."""
    return (isinstance(lease, (int, float)) and not isinstance(lease, bool) and math.isfinite(lease)
            and 0 < lease <= MAX_LEASE_S)


def dtype_code(name):
    return DTYPES.index(name) + 1


def itemsize(name):
    return 2 if name == "bfloat16" else struct.calcsize({"bool": "?", "int8": "b", "uint8": "B", "int16": "h",
                                                         "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
                                                         "uint64": "Q", "float16": "e", "float32": "f",
                                                         "float64": "d", "complex64": "ff",
                                                         "complex128": "dd"}[name])


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


def proof(token, nonce, side="client"):
    """HMAC-SHA256 of a nonce under the token; the client's and the server's proofs differ, so
    neither can hand the other's back."""
    label = b"hbmcoll-memserver:" if side == "client" else b"hbmcoll-memserver-answer:"
    return hmac.new(token.encode(), label + nonce, hashlib.sha256).hexdigest()


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
