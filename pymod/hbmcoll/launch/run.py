"""hbmcoll-run: start N ranks of a program on this node.

    python -m hbmcoll.run -n N [--bind share|core|cluster|none] [--memory POLICY] [--timeout SECONDS]
                          [--tag-output] [--nnodes K --node-rank R --master ADDR[:PORT]]  (IPv6: [ADDR]:PORT)
                          (prog [args...] | -m module [args...])

Across nodes, run it on each of the K nodes with the same -n, --nnodes and --master (the address
of node 0) and the node's own --node-rank, and the same HBMCOLL_JOB_KEY in every node's
environment: node R's ranks are R*N .. R*N+N-1, and the nodes meet at ADDR (port PORT + 1,
PORT defaulting to 29500 and left to torch's store), as under torchrun.

Each rank gets HBMCOLL_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/JOB_KEY (read by hbmcoll.launch.env) and
torch's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, so torch scripts
run unchanged. When a rank fails (non-zero exit or a signal) the others get SIGTERM, then SIGKILL
after HBMCOLL_KILL_GRACE seconds (default 5); the launcher exits with the first failing rank's code
(128+signum for a signal), or 128+signum if it was itself stopped by a signal.

Signals, one scheme: every rank runs in its own session (setsid, as torchrun does), so a terminal's
Ctrl-C, Ctrl-\\ or hangup reaches only the launcher, which forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to
each rank's process group exactly once; a second such signal means SIGKILL to all. Had the ranks
stayed in our group, Ctrl-C would reach them directly and a forwarded copy would arrive twice, while
`kill -INT <launcher>` would reach nobody. Ctrl-Z stops the ranks with SIGSTOP (SIGTSTP is discarded
for their process groups, which are orphaned) and SIGCONT follows when we are resumed.

No orphans: if the launcher is killed with SIGKILL it cannot forward anything, so each rank asks
the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG, set in preexec_fn between fork
and exec; os.posix_spawn has no such hook). It covers the rank itself, not processes the rank
starts; those are reached by signalling the rank's process group in every other case. No zombies:
every rank is waited for before we exit.

Only the standard library is used, so this file also runs by path without the C extension.
"""

import argparse
import ctypes
import hashlib
import hmac
import os
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time

def _sibling(name):
    """A standard-library module of this package, loaded by path: this file runs by path too
    (name relative to this folder: "env", "../nodes/netaddr")."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        f"_hbmcoll_{os.path.basename(name)}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


launch_env = _sibling("env")
netaddr = _sibling("../nodes/netaddr")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
VALUE_OPTS = {"-n", "--np", "--nproc-per-node", "--bind", "--memory", "--timeout", "--nnodes", "--node-rank", "--master",
              "--memservers", "--memserver-capacity"}
PR_SET_PDEATHSIG = 1


def _policy_words():
    """The planner's words for --memory and --bind (one list, in libhbmcoll); without the
    extension (this file run by path) none, and the ranks' init() names what it takes."""
    try:
        from hbmcoll import _core
        return _core.policy_words()
    except ImportError:
        return {"memory": None, "bind": None}


def _say(msg):
    print(f"hbmcoll-run: {msg}", file=sys.stderr, flush=True)


def _ranks(k):
    return f"{k} rank" if k == 1 else f"{k} ranks"


def _signame(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _split_argv(argv):
    """Split (launcher options, program args, module): a non-option, '--' or '-m' ends our options,
    so the program's own options are never parsed as ours."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], argv[i + 1:], None
        if a == "-m":
            return argv[:i], argv[i + 2:], (argv[i + 1] if i + 1 < len(argv) else "")
        if a.startswith("-m") and not a.startswith("--"):
            return argv[:i], argv[i + 1:], a[2:]
        if not a.startswith("-") or a == "-":
            return argv[:i], argv[i:], None
        i += 2 if a in VALUE_OPTS else 1
    return argv, [], None


def _parser():
    p = argparse.ArgumentParser(
        prog="hbmcoll-run",
        usage="%(prog)s -n N [options] (prog [args...] | -m module [args...])",
        description="Start N ranks of a program on this node for hbmcoll (and torch.distributed); "
                    "with --nnodes K, run it on each of the K nodes: the job has K x N ranks.")
    p.add_argument("-n", "--np", "--nproc-per-node", dest="n", type=int, required=True, metavar="N",
                   help="ranks on this node (torchrun's --nproc-per-node; mpiexec's -n is the "
                        "job's total, this is per node)")
    words = _policy_words()
    p.add_argument("--bind", choices=words["bind"],
                   help="pinning (HBMCOLL_BIND): share (default: each rank its share of its "
                        "cluster's cores), core (one core each), cluster, none")
    p.add_argument("--memory", choices=words["memory"], help="segment memory policy (HBMCOLL_MEMORY)")
    p.add_argument("--timeout", metavar="SECONDS",
                   help="deadline of each collective wait in the ranks (HBMCOLL_TIMEOUT); "
                        "not a time limit for the job")
    p.add_argument("--tag-output", action="store_true",
                   help="prefix each output line with '[rank] '")
    p.add_argument("--nnodes", type=int, default=1, metavar="K", help="nodes of the job (default 1)")
    p.add_argument("--node-rank", type=int, metavar="R", help="this node's number, 0..K-1")
    p.add_argument("--master", metavar="ADDR[:PORT]",
                   help="node 0's address, where the nodes meet (PORT default 29500; IPv6: [ADDR]:PORT)")
    p.add_argument("--memservers", type=int, default=0, metavar="K",
                   help="start K memory servers beside the job (on node 0) and give the ranks "
                        "HBMCOLL_MEMSERVERS and HBMCOLL_TOKEN")
    p.add_argument("--memserver-capacity", default="1G", metavar="SIZE", help="bytes each server holds (1G)")
    return p


def _memservers(args, env):
    """--memservers K: on one node, K servers on loopback with a fresh token; across nodes, node 0
    runs them at the master's address (ports PORT + 64 ..) and every node derives the token from
    HBMCOLL_JOB_KEY, so no node needs to be told. Returns stop() (None: no servers here)."""
    if args.memservers < 0:
        raise SystemExit(f"hbmcoll-run: --memservers must be >= 0, got {args.memservers}")
    if not args.memservers:
        return None
    k = args.memservers
    if args.nnodes == 1:
        host, ports, token = "127.0.0.1", [0] * k, secrets.token_hex(16)
    else:
        ports = launch_env.port_range(env)  # HBMCOLL_PORTS: the servers' part of the range
        host, base = env["MASTER_ADDR"], ports[0] + launch_env.PORTS_SERVERS if ports else int(env["MASTER_PORT"]) + 64
        ports = [base + i for i in range(k)]
        token = hmac.new(env["HBMCOLL_JOB_KEY"].encode(), b"memservers", hashlib.sha256).hexdigest()
    env["HBMCOLL_TOKEN"] = token
    if args.nnodes > 1 and args.node_rank != 0:
        env["HBMCOLL_MEMSERVERS"] = ",".join(netaddr.join(host, p) for p in ports)
        return None
    from ..memserver.server import start_beside
    _, env["HBMCOLL_MEMSERVERS"], stop = start_beside(k, host, ports, token, args.memserver_capacity)
    return stop


def _nodes_env(args, parser):
    """What a launch across nodes adds to every rank's environment (nothing on one node)."""
    if args.nnodes < 1:
        parser.error(f"--nnodes must be >= 1, got {args.nnodes}")
    if args.nnodes == 1:
        if args.node_rank not in (None, 0) or args.master:
            parser.error("--node-rank and --master go with --nnodes K > 1")
        return {"HBMCOLL_JOB_KEY": secrets.token_hex(16),  # secret, unique per launch
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    if args.node_rank is None or args.master is None:
        parser.error("across nodes give every node --node-rank R and --master ADDR[:PORT] (node 0's address)")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1}")
    if not os.environ.get("HBMCOLL_JOB_KEY"):
        parser.error("across nodes every node needs the same secret: set HBMCOLL_JOB_KEY "
                     "(e.g. to `openssl rand -hex 16`, shared with the other nodes)")
    try:
        addr, port = netaddr.split(args.master, 29500)
    except ValueError:
        addr, port = "", -1
    if not addr or not 0 < port < 65536 - 256:
        parser.error(f"--master {args.master!r}: give ADDR, ADDR:PORT or [IPv6-ADDR]:PORT, the port a number "
                     "below 65280")
    try:
        launch_env.port_range(os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    return {"HBMCOLL_MASTER": addr, "MASTER_ADDR": addr, "MASTER_PORT": str(port)}


def _command(prog_argv, module):
    if module is not None:
        return [sys.executable, "-m", module, *prog_argv]
    prog = prog_argv[0]
    if prog.endswith(".py") or shutil.which(prog) is None:
        return [sys.executable, *prog_argv]
    return prog_argv


def _free_port():
    # Racy by nature (the port is free now, not promised later), as in torchrun.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _planned_threads(n, env):
    """Threads per rank from the placement plan for n ranks (hbmcoll._core's, which init()
    applies); without the extension (this file run by path), the CPUs split evenly."""
    try:
        import json
        from hbmcoll import _core
        plan = json.loads(_core.numa_report(None, n, env.get("HBMCOLL_MEMORY"),
                                            env.get("HBMCOLL_BIND"), True))
        return [r["threads"] for r in plan["ranks"]]
    except (ImportError, OSError, ValueError, KeyError):
        return [max(1, len(os.sched_getaffinity(0)) // n)] * n


def _pdeathsig_preexec():
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, not in the child
    except (OSError, AttributeError):
        return None  # not Linux: no parent-death signal
    parent = os.getpid()

    def preexec():
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # we died before prctl took effect: act as the signal would
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


class _Job:
    def __init__(self, grace, tag):
        self.grace, self.tag = grace, tag
        self.procs = []        # Popen per rank, index = rank
        self.pending = []      # signals received, handled by the main loop (handlers stay trivial)
        self.signum = None     # the first forwarded signal: we were told to stop
        self.failed = None     # (rank, pid, returncode) of the first failing rank
        self.kill_at = None    # monotonic deadline for SIGKILL
        self.sel = selectors.DefaultSelector()

    def running(self):
        return [p for p in self.procs if p.returncode is None]

    def signal_all(self, sig):
        # Only ranks not yet reaped: a reaped pid (and group id) may already belong to someone else.
        for p in self.running():
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                try:  # the rank left its group (setpgid); signal it alone
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(self, sig):
        self.signal_all(sig)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    def start(self, cmd, env, n, threads, first=0):
        """Ranks first .. first+n-1 of the job, local ranks 0 .. n-1."""
        preexec = _pdeathsig_preexec()
        out = subprocess.PIPE if self.tag else None
        for rank in range(n):
            if any(sig in FORWARDED for sig in self.pending):
                break  # told to stop while starting: start no more
            renv = dict(env, HBMCOLL_RANK=str(first + rank), HBMCOLL_LOCAL_RANK=str(rank),
                        RANK=str(first + rank), LOCAL_RANK=str(rank))
            for var in launch_env.THREAD_VARS:
                renv.setdefault(var, str(threads[rank]))
            try:
                # stdin goes to rank 0 only (as with mpiexec), so ranks do not race for input.
                p = subprocess.Popen(cmd, env=renv, start_new_session=True, preexec_fn=preexec,
                                     stdin=None if rank == 0 else subprocess.DEVNULL,
                                     stdout=out, stderr=out)
            except OSError as e:
                _say(f"cannot start rank {rank}: {cmd[0]}: {e.strerror}")
                self.failed = (rank, None, 127)
                self.stop(signal.SIGTERM)
                break
            self.procs.append(p)
            if self.tag:
                for pipe, dest in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                    self.sel.register(pipe, selectors.EVENT_READ, (rank, dest, bytearray()))

    def on_signal(self, signum, frame):
        self.pending.append(signum)

    def handle_pending(self):
        while self.pending:
            sig = self.pending.pop(0)
            if sig == signal.SIGTSTP:
                self.signal_all(signal.SIGSTOP)
                os.kill(os.getpid(), signal.SIGSTOP)
                self.signal_all(signal.SIGCONT)  # runs once we are resumed
            elif self.signum is None:
                self.signum = sig
                _say(f"got {_signame(sig)}; forwarding it to {_ranks(len(self.running()))}")
                self.stop(sig)
            else:
                _say(f"got {_signame(sig)} again; killing all ranks")
                self.signal_all(signal.SIGKILL)

    def reaped(self, rank, p):
        rc = p.returncode
        if rc == 0 or self.failed is not None or self.signum is not None:
            return  # only the first failure is news; the rest follow from our stopping them
        self.failed = (rank, p.pid, rc)
        what = f"exited with code {rc}" if rc > 0 else f"was killed by {_signame(-rc)}"
        others = len(self.running())
        tail = f"; stopping the other {_ranks(others)}" if others else ""
        _say(f"rank {rank} (pid {p.pid}) {what}{tail}")
        self.stop(signal.SIGTERM)

    def pump(self, timeout):
        """Copy tagged output for up to `timeout` seconds (or just sleep when not tagging)."""
        if not self.sel.get_map():
            time.sleep(timeout)
            return
        for key, _ in self.sel.select(timeout):
            rank, dest, buf = key.data
            data = os.read(key.fd, 65536)
            buf += data
            *lines, rest = buf.split(b"\n")
            if not data:  # EOF: flush a last line without newline
                self.sel.unregister(key.fileobj)
                key.fileobj.close()
                lines, rest = lines + ([rest] if rest else []), b""
            if lines:
                dest.write(b"".join(b"[%d] %s\n" % (rank, line) for line in lines))
                dest.flush()
            buf[:] = rest

    def wait(self):
        while True:
            self.handle_pending()
            for rank, p in enumerate(self.procs):
                if p.returncode is None and p.poll() is not None:
                    self.reaped(rank, p)
            left = self.running()
            if not left:
                break
            if self.kill_at is not None and time.monotonic() >= self.kill_at:
                _say(f"{_ranks(len(left))} still running {self.grace:g} s after being told "
                     "to stop; sending SIGKILL")
                self.signal_all(signal.SIGKILL)
                self.kill_at = float("inf")
            self.pump(0.05)
        # Output still in the pipes; a process a rank left behind may hold them open, so give up
        # after a moment rather than wait for it.
        end = time.monotonic() + 2.0
        while self.sel.get_map() and time.monotonic() < end:
            self.pump(0.05)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        if self.signum is not None:
            return 128 + self.signum
        if self.failed is not None:
            rc = self.failed[2]
            return rc if rc > 0 else 128 - rc
        return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    opts, prog_argv, module = _split_argv(argv)
    args = parser.parse_args(opts)
    if module == "":
        parser.error("-m needs a module name")
    if module is None and not prog_argv:
        parser.error("no program given")
    if args.n < 1:
        parser.error(f"-n must be >= 1, got {args.n}")
    if args.timeout is not None:
        try:
            if float(args.timeout) <= 0:
                raise ValueError
        except ValueError:
            parser.error(f"--timeout must be a positive number of seconds, got {args.timeout!r}")
    try:
        grace = float(os.environ.get("HBMCOLL_KILL_GRACE", "5"))
        if grace < 0:
            raise ValueError
    except ValueError:
        parser.error(f"HBMCOLL_KILL_GRACE={os.environ['HBMCOLL_KILL_GRACE']!r} "
                     "is not a number >= 0")

    n, size = str(args.n), str(args.n * args.nnodes)
    env = dict(os.environ, HBMCOLL_SIZE=size, HBMCOLL_LOCAL_SIZE=n, WORLD_SIZE=size, LOCAL_WORLD_SIZE=n,
               **_nodes_env(args, parser))
    for var, value in (("HBMCOLL_BIND", args.bind), ("HBMCOLL_MEMORY", args.memory),
                       ("HBMCOLL_TIMEOUT", args.timeout)):
        if value is not None:
            env[var] = value
    # Each rank's OpenMP/BLAS threads: the cores of its share in the placement plan (what
    # init() pins it to), set before the rank starts, since those libraries read the variables
    # when they load. A variable the user set is kept.
    threads = _planned_threads(args.n, env)
    if args.tag_output:
        env.setdefault("PYTHONUNBUFFERED", "1")  # through a pipe Python would buffer whole blocks

    stop_servers = _memservers(args, env)
    try:
        job = _Job(grace, args.tag_output)
        for sig in (*FORWARDED, signal.SIGTSTP):
            if signal.getsignal(sig) != signal.SIG_IGN:  # keep what our caller ignored (nohup, &)
                signal.signal(sig, job.on_signal)
        job.start(_command(prog_argv, module), env, args.n, threads, (args.node_rank or 0) * args.n)
        return job.wait()
    finally:
        if stop_servers is not None:
            stop_servers()


if __name__ == "__main__":
    sys.exit(main())
