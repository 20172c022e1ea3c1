"""Emulated nodes for tests and benches: network namespaces on one bridge (rdma-bridge.md 5).

    with NetNodes(3) as nodes:        # hbn<pid>n0..2, each with hbnet0 = 10.77.0.<i+1>/24
    with NetNodes(2, ipv6=True) ...   # hbnet0 = fd00:77::<i+1>/64 instead, and no IPv4 on it
        nodes.popen(i, [sys.executable, "-c", code], env=...)
        nodes.loss(1)                 # drop 1% of the bridge's frames (nft; no netem here)

The bridge lives in a namespace of its own; traffic goes only to addresses in namespaces made
here, and all of them are removed on exit (also after an error). usable() says why not (root,
iproute2) so tests can skip.
"""
import os
import signal
import subprocess
import time


def _sh(cmd, check=True):
    return subprocess.run(cmd, shell=True, check=check, capture_output=True, text=True)


def usable():
    """None when namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "emulated nodes need root (network namespaces)"
    probe = "hbnprobe%d" % os.getpid()
    if _sh(f"ip netns add {probe} && ip netns del {probe}", check=False).returncode != 0:
        return "ip netns add failed (iproute2 missing, or no namespaces here)"
    return None


def sweep():
    """Remove the namespaces of runs that were killed before they could (hbn<pid>..., pid gone)."""
    for line in _sh("ip netns list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        digits = name[3:].split("n")[0].split("br")[0] if name.startswith("hbn") else ""
        if digits.isdigit() and not os.path.exists(f"/proc/{digits}"):
            _sh(f"ip netns del {name}", check=False)


class NetNodes:
    def __init__(self, n, rate=None, tag=None, ipv6=False):
        tag = tag or "hbn%d" % os.getpid()
        self.bridge, self.names = tag + "br", ["%sn%d" % (tag, i) for i in range(n)]
        # ULA addresses (global scope: usable without an interface's scope id); nodad: usable at
        # once, not after duplicate address detection's second or so
        self.addrs = ["fd00:77::%x" % (i + 1) for i in range(n)] if ipv6 else ["10.77.0.%d" % (i + 1) for i in range(n)]
        self._add = "-6 addr add {}/64 dev hbnet0 nodad" if ipv6 else "addr add {}/24 dev hbnet0"
        self._rate = rate

    def __enter__(self):
        sweep()
        b = self.bridge
        try:
            _sh(f"ip netns add {b} && ip -n {b} link add hbbr0 type bridge && ip -n {b} link set hbbr0 up")
            for i, m in enumerate(self.names):
                _sh(f"ip netns add {m} && ip link add hbnet0 netns {m} type veth peer name hbp{i} netns {b} && "
                    f"ip -n {b} link set hbp{i} master hbbr0 up && "
                    f"ip -n {m} {self._add.format(self.addrs[i])} && ip -n {m} link set hbnet0 up && "
                    f"ip -n {m} link set lo up")
                if self._rate:
                    _sh(f"ip netns exec {m} tc qdisc add dev hbnet0 root tbf rate {self._rate} "
                        "burst 256kb latency 50ms")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for m in self.names + [self.bridge]:
            _sh(f"ip netns del {m}", check=False)

    def loss(self, pct):
        b = self.bridge
        _sh(f"ip netns exec {b} nft add table bridge hbloss && ip netns exec {b} nft add chain bridge hbloss "
            f"drops '{{ type filter hook forward priority 0 ; }}' && ip netns exec {b} nft add rule bridge "
            f"hbloss drops numgen random mod 100 '<' {pct} drop")

    def link_down(self, i):
        """Node i's link goes down (its veth, without closing any of its connections)."""
        _sh(f"ip -n {self.names[i]} link set hbnet0 down")

    def ssh_stand_in(self, path):
        """Write at path a stand-in for ssh (for mpiexec's launchers): `path [opts] ADDR CMD` runs CMD
        in the node that has address ADDR, as popen() would; returns path."""
        cases = "\n".join(f'  {a}) ns={m}; name=node{i};;' for i, (a, m) in enumerate(zip(self.addrs, self.names)))
        with open(path, "w") as f:
            f.write(f"""#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
host=$1; shift
case "$host" in
{cases}
  *) echo "ssh stand-in: $host is no emulated node" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$name" "$*"
""")
        os.chmod(path, 0o755)
        return path

    def popen(self, i, argv, **kw):
        """argv run in node i's network (and its own hostname, node<i>)."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[i], "unshare", "--uts", "sh", "-c",
                                 f'hostname node{i} && exec "$@"', "sh", *argv], **kw)


def kill_tree(pid):
    """SIGKILL pid and every process below it: launchers start ranks in sessions of their own
    (torchrun does), so a process group does not reach them."""
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
        except (ValueError, OSError, IndexError):
            continue
    tree, i = [pid], 0
    while i < len(tree):
        tree += parents.get(tree[i], [])
        i += 1
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def finish(procs, timeout):
    """(returncode, stdout, stderr) of each process; one still running after timeout seconds (in
    all) is killed with every process it started (they hold its pipes open), and its stderr ends
    with "(hung: killed)"."""
    out, until = [], time.monotonic() + timeout
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(0.1, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            o, e = p.communicate()
            e += "\n(hung: killed)"
        out.append((p.returncode, o, e))
    return out
