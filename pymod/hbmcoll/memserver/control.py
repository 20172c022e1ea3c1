"""The memory server's control connections (server.py drives them from its one loop).

Nothing here blocks. A connection's bytes in and out are buffered, and the loop hands each the
bytes its socket has: a message cut anywhere (a trickled length, half a body) waits in its inbox,
and an answer the socket cannot take yet waits in its outbox. A connection is first a handshake
(the server's nonce out; the client's hello in, within HANDSHAKE_S and MAX_MSG bytes), then a
client (control messages in, answers out). A message that is too long, not a JSON object, or has
a field of the wrong type or out of range, and a handshake past its deadline, send their sender
one error and drop it alone: its socket is shut for writing and closed once the peer has read the
error and hung up, or after GOODBYE_S (closing at once, with bytes unread, would reset the
connection and the error could be lost on the way).

Every message is checked here before the server acts on it: check_hello for the hello's fields
(once its proof holds), check_request for the ops, whose fields REQUESTS lists.
"""
import json
import math
import secrets
import socket
import struct

from .protocol import DTYPES, HANDSHAKE_S, MAX_LEASE_S, MAX_MSG, lease_ok

# a connection: its hello (the token's proof), then, proven, its card; then a client (or closing)
HELLO, PROVEN, CLIENT, CLOSING = "hello", "proven", "client", "closing"
GOODBYE_S = 1.0             # a dropped connection's time to read its error
MAX_OUTBOX = 1 << 20        # answers a client leaves unread, at most: then it is dropped
MAX_NAME = 1024             # a buffer's name, in bytes
MAX_NDIM = 32
MAX_EXTENT = 1 << 60        # a shape's entries and element count (bytes stay within int64)
MAX_CARD = 256              # an endpoint card's bytes (COLL_NET_CARD_MAX)
MAX_REPLY_TO = 1 << 48      # an offset in the client's pool


class Refused(Exception):
    """A message or a connection the server does not take: the text goes to its sender, which is
    then dropped."""


class Conn:
    """One control connection: its socket (nonblocking), inbox, outbox and state."""

    def __init__(self, sock, now, group=None):
        sock.setblocking(False)
        self.sock, self.state, self.client = sock, HELLO, None
        self.group = group  # the peer's address (an IPv6 one's /64): handshakes counted together
        self.inbox, self.outbox = bytearray(), bytearray()
        self.nonce = secrets.token_bytes(16)
        self.deadline = now + HANDSHAKE_S  # the handshake's; then None; closing: the goodbye's
        self.shut = False
        self.send({"nonce": self.nonce.hex()})

    def fileno(self):
        return self.sock.fileno()

    def receive(self):
        """Take what the socket has into the inbox; False at end of file (or a failed socket)."""
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if data and self.state != CLOSING:  # a dropped connection's bytes are read, not heard
            self.inbox += data
        return bool(data)

    def next_message(self):
        """The inbox's next whole message, or None (none whole yet). Refused: one too long, not
        JSON, or not an object."""
        if len(self.inbox) < 4 or self.state == CLOSING:
            return None
        what = "the hello" if self.state in (HELLO, PROVEN) else "a control message"
        n = struct.unpack_from("<I", self.inbox)[0]
        if n > MAX_MSG:  # refused before its bytes come
            raise Refused(f"{what} of {n} bytes is over the limit: at most {MAX_MSG} are taken")
        if len(self.inbox) < 4 + n:
            return None
        body = bytes(self.inbox[4:4 + n])
        del self.inbox[:4 + n]
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            raise Refused(f"{what} is not JSON") from None
        if not isinstance(msg, dict):
            raise Refused(f"{what} is not a JSON object but {_show(msg)}")
        return msg

    def send(self, obj):
        """Queue obj and send what the socket takes now; False: drop the connection (it failed,
        or left more than MAX_OUTBOX of answers unread)."""
        data = json.dumps(obj).encode()
        self.outbox += struct.pack("<I", len(data)) + data
        return self.flush()

    def flush(self):
        try:
            while self.outbox:
                sent = self.sock.send(self.outbox)
                del self.outbox[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return False
        if self.state == CLOSING and not self.outbox and not self.shut:
            self.shut = True
            try:
                self.sock.shutdown(socket.SHUT_WR)  # the error, then end of file
            except OSError:
                pass
        return len(self.outbox) <= MAX_OUTBOX

    def goodbye(self, text, now):
        """Send text as an error, then close (the server closes it when the peer hangs up, or
        past the deadline this sets)."""
        self.state, self.deadline, self.inbox = CLOSING, now + GOODBYE_S, bytearray()
        if len(self.outbox) > MAX_OUTBOX:  # it does not read: nothing more to say
            self.outbox = bytearray()
        self.send({"error": text})


def _show(value):
    """A value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _name(op, field, v):
    if not isinstance(v, str):
        raise Refused(f"{op}: the {field} must be a string, not {_show(v)}")
    n = len(v.encode("utf-8", "surrogatepass"))
    if n > MAX_NAME:
        raise Refused(f"{op}: the {field} has {n} bytes, more than the {MAX_NAME} a {field} may have")


def _shape(op, field, v):
    if not isinstance(v, list) or len(v) > MAX_NDIM or not all(_is_int(d) and 0 <= d <= MAX_EXTENT for d in v):
        raise Refused(f"{op}: the {field} must be a list of at most {MAX_NDIM} non-negative integers, not {_show(v)}")
    if math.prod(v) > MAX_EXTENT:
        raise Refused(f"{op}: the {field} {_show(v)} has more elements than any server holds")


def _dtype(op, field, v):
    if not isinstance(v, str) or v not in DTYPES:
        raise Refused(f"{op}: dtype {_show(v)}: one of {', '.join(DTYPES)}")


def _buffer_id(op, field, v):
    if not _is_int(v) or not 1 <= v < 1 << 31:
        raise Refused(f"{op}: the {field} must be a buffer's number (a positive integer), not {_show(v)}")


def _fence_token(op, field, v):
    if v is not None and (not _is_int(v) or not 0 <= v < 1 << 63):
        raise Refused(f"{op}: the {field} must be the lock's fencing token (an integer >= 0), not {_show(v)}")


def _lease(op, field, v):
    if v is not None and not lease_ok(v):
        raise Refused(f"{op}: lease {_show(v)}: a number of seconds, more than 0 and at most {MAX_LEASE_S:g}")


REQUIRED, OPTIONAL = True, False
REQUESTS = {  # op -> (field, check, required); fields not listed are ignored
    "open": (("name", _name, REQUIRED), ("shape", _shape, REQUIRED), ("whole", _shape, OPTIONAL),
             ("dtype", _dtype, REQUIRED)),
    "lock": (("id", _buffer_id, REQUIRED), ("lease", _lease, OPTIONAL)),
    "unlock": (("id", _buffer_id, REQUIRED), ("token", _fence_token, OPTIONAL)),
    "cancel": (("id", _buffer_id, REQUIRED),),
    "stats": (),  # the notes the data path dropped (server.py)
}


def check_request(msg):
    """Refused unless msg (a dict) is one of REQUESTS with its fields well formed."""
    op = msg.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        raise Refused(f"unknown request {_show(op)}: one of {', '.join(REQUESTS)}")
    _fields(op, msg, REQUESTS[op])


def check_hello(msg):
    """Refused unless the hello's nonce (the client's challenge to the server) is well formed
    (its proof is checked first)."""
    _fields("hello", msg, (("nonce", _nonce, REQUIRED),))


def check_card(msg):
    """Refused unless a proven client's card and reply_to are well formed."""
    _fields("card", msg, (("card", _card, REQUIRED), ("reply_to", _reply_to, REQUIRED)))


def _is_hex(v, least, most):
    """v is a str of least..most bytes in hex."""
    if not isinstance(v, str) or not 2 * least <= len(v) <= 2 * most or len(v) % 2:
        return False
    try:
        bytes.fromhex(v)
    except ValueError:
        return False
    return True


def _nonce(op, field, v):
    if not _is_hex(v, 16, 64):
        raise Refused(f"{op}: the {field} must be 16 to 64 bytes in hex, not {_show(v)}")


def _fields(op, msg, fields):
    for field, check, required in fields:
        if field in msg:
            check(op, field, msg[field])
        elif required:
            raise Refused(f"{op}: no {field}")


def _card(op, field, v):
    if not _is_hex(v, 1, MAX_CARD):
        raise Refused(f"{op}: the {field} must be an endpoint's card in hex (at most {MAX_CARD} bytes), not {_show(v)}")


def _reply_to(op, field, v):
    if not _is_int(v) or not 0 <= v <= MAX_REPLY_TO:
        raise Refused(f"{op}: {field} must be an offset in the client's pool (an integer from 0), not {_show(v)}")
