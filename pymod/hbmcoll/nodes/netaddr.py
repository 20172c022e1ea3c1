"""Addresses of either family (IPv4, IPv6) as the job's TCP sockets and messages need them.

A job across nodes uses the family of its master address: an IPv4 address or a name with an
IPv4 address is IPv4 (as before), an IPv6 address (`fd00:9::1`, also `[fd00:9::1]`) or a name
with IPv6 addresses only is IPv6. Messages write `A:P` for IPv4, `[A]:P` for IPv6.

    host, port = split("[fd00:9::1]:29500", 29500)    # ("fd00:9::1", 29500)
    join(host, port)                                 # "[fd00:9::1]:29500"
    family(host)                                     # socket.AF_INET6
"""
import fcntl
import ipaddress
import socket
import struct

SIOCGIFADDR = 0x8915


def strip(host):
    """host without the brackets of `[v6]`."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def join(host, port):
    """`A:P`, or `[A]:P` when A is an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split(text, default_port=None):
    """(host, port) of `A`, `A:P`, `[V6]`, `[V6]:P` or a bare IPv6 address (its colons are its
    own: no port); ValueError when the port is no number or is missing without a default."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r}: write an IPv6 address with a port as [ADDR]:PORT")
        port = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, None
    if port is None or port == "":
        if default_port is None:
            raise ValueError(f"{text!r}: give a port (ADDR:PORT, [V6]:PORT)")
        return host, int(default_port)
    if not port.isdigit():
        raise ValueError(f"{text!r}: the port must be a number")
    return host, int(port)


def family(host):
    """AF_INET6 for an IPv6 address or a name with IPv6 addresses only, else AF_INET (also for
    a name that does not resolve: the caller's connect or bind names it)."""
    host = strip(host)
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        pass
    try:
        found = {a[0] for a in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError):
        return socket.AF_INET
    return socket.AF_INET6 if found == {socket.AF_INET6} else socket.AF_INET


def resolve(host, fam):
    """host as an address of family fam (a name resolved), or host itself when it does not."""
    host = strip(host)
    try:
        return socket.getaddrinfo(host, None, fam, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError, IndexError):
        return host


def toward(addr):
    """This host's address on the way to addr (of addr's family); OSError if there is no route."""
    fam = family(addr)
    with socket.socket(fam, socket.SOCK_DGRAM) as s:
        s.connect((resolve(addr, fam), 9))
        return s.getsockname()[0]


def iface_addresses(name, fam):
    """The addresses of family fam on interface `name`: IPv4 its one (SIOCGIFADDR), IPv6 all but
    the link-local ones (those need a scope that no peer could use)."""
    if fam == socket.AF_INET:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                got = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                return []
        return [socket.inet_ntoa(got[20:24])]
    try:
        with open("/proc/net/if_inet6") as f:
            rows = [line.split() for line in f]
    except OSError:
        return []
    return [str(ipaddress.IPv6Address(bytes.fromhex(r[0]))) for r in rows
            if len(r) == 6 and r[5] == name and int(r[3], 16) != 0x20]


def loopback(addr):
    """Whether addr is a loopback address (127/8, ::1)."""
    try:
        return ipaddress.ip_address(strip(addr)).is_loopback
    except ValueError:
        return False
