"""Run a function on N ranks of a fresh hbmcoll job, one spawned process per rank.

    from ranks import run_ranks, start_ranks, event
    results = run_ranks(4, fn, arg1, timeout=60)   # fn(comm, arg1) on every rank -> [value per rank]

Each rank is a new interpreter (subprocess: `python ranks.py`, nothing inherited but the
environment we build) that gets HBMCOLL_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE, a job key of its own
(HBMCOLL_JOB_KEY, unique per job), HBMCOLL_TIMEOUT (20 s unless the test says otherwise) and
HBMCOLL_BIND=none and HBMCOLL_TUNE=off (the built-in thresholds) before `import hbmcoll`; it then runs `fn(hbmcoll.init(), *args)`. `fn` must be
a module-level function of a file in tests/py (it is found again by module name and file path);
args and the return value must pickle. The result (or the formatted traceback) comes back over a
pipe; the parent waits for every rank, and after `timeout` seconds dumps the Python stacks of the
stragglers (faulthandler on SIGUSR1), kills them and reports them. run_ranks fails the test with
every rank's story unless every rank returned; start_ranks gives a Job for tests that want to
signal or kill ranks while they run, with `event(name)` as a rendezvous: a rank calls
`ranks.event("waiting")`, the test calls `job.wait_event(rank, "waiting")`.

Only the standard library is imported at the top, so the parent stays light. init_torch (with
free_port for the rendezvous) starts torch.distributed over a job's ranks for test_torch_*.py.
"""

import os
import pickle
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PYMOD = REPO / "pymod"
RESULT_FD_VAR = "RANKS_RESULT_FD"
DEFAULT_RANK_TIMEOUT = "20"  # HBMCOLL_TIMEOUT inside ranks: well below the harness timeout

# Launcher variables of any kind that must not leak from the environment pytest runs in.
_LAUNCH_PREFIXES = ("HBMCOLL_", "PMI_", "MPI_LOCAL", "OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_")
_LAUNCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT"}


# ---- child side --------------------------------------------------------------------------------

def _send(msg):
    fd = os.environ.get(RESULT_FD_VAR)
    if fd is None:
        return
    data = pickle.dumps(msg)
    buf = struct.pack("<I", len(data)) + data
    while buf:
        n = os.write(int(fd), buf)
        buf = buf[n:]


def event(name, payload=None):
    """Tell the parent this rank reached `name` (with its CLOCK_MONOTONIC time and a payload)."""
    _send(("event", name, time.monotonic(), payload))


def _load_fn(module, path, qualname):
    mod = sys.modules.get(module)
    if mod is None:
        import importlib.util
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        spec.loader.exec_module(mod)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _child_main():
    import ctypes
    import faulthandler

    # Die with the parent (pytest killed hard): never leave ranks behind.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stdin = sys.stdin.buffer
    (ln,) = struct.unpack("<I", stdin.read(4))
    module, path, qualname, args = pickle.loads(stdin.read(ln))
    code = 0
    try:
        fn = _load_fn(module, path, qualname)
        import hbmcoll
        comm = hbmcoll.init()
        event("init")
        value = fn(comm, *args)
        msg = ("ok", value)
    except BaseException as e:  # KeyboardInterrupt too: the test decides
        msg = ("error", type(e).__name__, str(e), traceback.format_exc())
        code = 1
    try:
        _send(msg)
    except Exception:
        _send(("error", "PicklingError", "result did not pickle", traceback.format_exc()))
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Stay alive until the parent has every rank's result: a rank that leaves at once could be
    # taken for a dead peer by ranks still finishing the last collective (see
    # test_failures.py::test_exit_after_last_collective, which leaves at once on purpose).
    stdin.read(1)
    # No interpreter finalisation: a test that leaves a request in flight must not hang at exit;
    # what close() and teardown do is tested explicitly where it matters.
    os._exit(code)


# ---- parent side -------------------------------------------------------------------------------

@dataclass
class RankResult:
    rank: int
    status: str = "running"     # ok | error | died | timeout | noresult
    value: object = None         # fn's return value (ok)
    exc_type: str = ""           # error: exception class name
    exc_text: str = ""           # error: str(exception)
    traceback: str = ""          # error: formatted traceback
    returncode: object = None
    output: str = ""             # the rank's stdout+stderr (faulthandler dumps land here)
    events: dict = field(default_factory=dict)  # name -> (monotonic time, payload)

    def describe(self):
        head = f"--- rank {self.rank}: {self.status}"
        if self.returncode is not None:
            rc = self.returncode
            head += f" (exit {rc}{' = ' + signal.Signals(-rc).name if rc < 0 else ''})"
        body = []
        if self.status == "ok":
            body.append(f"returned {self.value!r}"[:2000])
        if self.traceback:
            body.append(self.traceback.rstrip())
        if self.output.strip():
            out = self.output.strip()
            if len(out) > 6000:
                out = "...\n" + out[-6000:]
            body.append("output:\n" + out)
        return "\n".join([head] + body)


class RanksFailed(AssertionError):
    pass


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCH_PREFIXES) and k not in _LAUNCH_VARS}
    paths = [str(PYMOD), str(HERE)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra:
        env.update(extra)
    return env


class Job:
    """N ranks running fn; see the module docstring."""

    keys = []  # every job key handed out in this process (leak checks look for them)

    def __init__(self, n, fn, args=(), timeout=60, env=None):
        module = fn.__module__
        path = sys.modules[module].__file__
        spec = pickle.dumps((module, path, fn.__qualname__, tuple(args)))
        self.n = n
        self.name = f"{fn.__name__} x{n}"
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.key = f"pytest.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        Job.keys.append(self.key)
        self.results = [RankResult(r) for r in range(n)]
        self.procs = []
        self._bufs = {}
        self._fds = {}
        self._sel = selectors.DefaultSelector()
        self._tmp = tempfile.mkdtemp(prefix="ranks-")
        self._outs = []
        env = dict(env or {})
        try:
            for r in range(n):
                e = clean_env({
                    "HBMCOLL_RANK": str(r), "HBMCOLL_SIZE": str(n),
                    "HBMCOLL_LOCAL_RANK": str(r), "HBMCOLL_LOCAL_SIZE": str(n),
                    "HBMCOLL_JOB_KEY": self.key,
                    "HBMCOLL_TIMEOUT": DEFAULT_RANK_TIMEOUT, "HBMCOLL_BIND": "none",
                    # the built-in thresholds, which tests choose their sizes around, whatever
                    # this host's tuning cache (python -m hbmcoll.tune) says; test_tune.py tests it
                    "HBMCOLL_TUNE": "off",
                })
                e.update({k: str(v) for k, v in env.items() if v is not None})
                for k, v in env.items():
                    if v is None:
                        e.pop(k, None)
                rfd, wfd = os.pipe()
                e[RESULT_FD_VAR] = str(wfd)
                out = open(os.path.join(self._tmp, f"rank{r}.out"), "w+b")
                self._outs.append(out)
                p = subprocess.Popen([sys.executable, str(HERE / "ranks.py")], env=e,
                                     stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                     pass_fds=(wfd,), cwd=str(HERE), start_new_session=True)
                os.close(wfd)
                self.procs.append(p)
                os.set_blocking(rfd, False)
                self._fds[rfd] = r
                self._bufs[r] = b""
                self._sel.register(rfd, selectors.EVENT_READ, r)
                p.stdin.write(struct.pack("<I", len(spec)) + spec)
                p.stdin.flush()
        except BaseException:
            self.kill_all()
            self.close()
            raise

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    # -- reading what ranks send
    def _pump(self, wait_s):
        for key, _ in self._sel.select(timeout=max(0.0, wait_s)):
            fd, r = key.fd, key.data
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                self._sel.unregister(fd)
                os.close(fd)
                del self._fds[fd]
                continue
            buf = self._bufs[r] + data
            while len(buf) >= 4:
                (ln,) = struct.unpack("<I", buf[:4])
                if len(buf) < 4 + ln:
                    break
                self._handle(r, pickle.loads(buf[4:4 + ln]))
                buf = buf[4 + ln:]
            self._bufs[r] = buf

    def _handle(self, r, msg):
        res = self.results[r]
        if msg[0] == "event":
            res.events[msg[1]] = (msg[2], msg[3])
        elif msg[0] == "ok":
            res.status, res.value = "ok", msg[1]
        else:
            res.status = "error"
            res.exc_type, res.exc_text, res.traceback = msg[1], msg[2], msg[3]

    def wait_event(self, rank, name, timeout=30):
        """Wait until `rank` sent event `name`; returns (time, payload)."""
        until = time.monotonic() + timeout
        while name not in self.results[rank].events and time.monotonic() < until:
            if rank not in self._fds.values():
                break  # its pipe is closed: the rank ended without the event
            self._pump(0.02)
        if name not in self.results[rank].events:
            self.kill_all()
            self.join(5)
            raise RanksFailed(f"rank {rank} never reached '{name}'\n" + self.report())
        return self.results[rank].events[name]

    def _release(self):
        """Let ranks that reported exit (each waits for one byte on stdin)."""
        for p in self.procs:
            if p.stdin and not p.stdin.closed:
                try:
                    p.stdin.write(b"g")
                    p.stdin.close()
                except (BrokenPipeError, OSError):
                    try:
                        p.stdin.close()
                    except OSError:
                        pass

    def _all_reported(self):
        return all(res.status != "running" or p.poll() is not None
                   for res, p in zip(self.results, self.procs))

    def signal(self, rank, sig):
        if self.procs[rank].poll() is None:
            os.kill(self.procs[rank].pid, sig)

    def kill_all(self):
        self._release()
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def join(self, timeout=None):
        """Wait for every rank (at most until the job's deadline, or `timeout` from now)."""
        until = self.deadline if timeout is None else time.monotonic() + timeout
        while time.monotonic() < until:
            if self._fds:
                self._pump(min(0.05, until - time.monotonic()))
            if self._all_reported():
                self._release()
            if all(p.poll() is not None for p in self.procs) and not self._fds:
                break
            if not self._fds:
                time.sleep(0.01)
        stragglers = [p for p in self.procs if p.poll() is None]
        if stragglers:
            for p in stragglers:  # Python stacks of every thread, into the rank's output
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
            for r, p in enumerate(self.procs):
                if p.poll() is None:
                    self.results[r].status = "timeout"
            self.kill_all()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        while self._fds:
            self._pump(0.05)
            if all(p.poll() is not None for p in self.procs):
                # every writer is gone: whatever is left is EOF soon
                self._pump(0)
                if not self._sel.select(timeout=0):
                    break
        for r, p in enumerate(self.procs):
            res = self.results[r]
            res.returncode = p.returncode
            if res.status == "running":
                res.status = "died" if p.returncode else "noresult"
            out = self._outs[r]
            out.flush()
            out.seek(0)
            res.output = out.read().decode(errors="replace")
        self.close()
        return self.results

    def close(self):
        for fd in list(self._fds):
            try:
                self._sel.unregister(fd)
            except Exception:
                pass
            os.close(fd)
        self._fds.clear()
        self._sel.close()
        for out in self._outs:
            out.close()
        self._outs = []
        if self._tmp:
            for f in os.listdir(self._tmp):
                os.unlink(os.path.join(self._tmp, f))
            os.rmdir(self._tmp)
            self._tmp = None

    def report(self):
        return f"job {self.name} (key {self.key}):\n" + "\n".join(
            r.describe() for r in self.results)

    def check(self):
        """Raise RanksFailed with every rank's story unless all returned."""
        if any(r.status != "ok" for r in self.results):
            bad = [f"{r.rank}:{r.status}" + (f"({r.exc_type})" if r.exc_type else "")
                   for r in self.results if r.status != "ok"]
            raise RanksFailed(f"ranks failed [{', '.join(bad)}] in " + self.report())
        return [r.value for r in self.results]


def start_ranks(n, fn, *args, timeout=60, env=None):
    return Job(n, fn, args, timeout=timeout, env=env)


def run_ranks(n, fn, *args, timeout=60, env=None, check=True):
    """fn(comm, *args) on n fresh ranks; returns each rank's value (check=True) or RankResults."""
    job = Job(n, fn, args, timeout=timeout, env=env)
    try:
        job.join()
    finally:
        job.kill_all()
        if job._tmp:
            job.join(5)
    return job.check() if check else job.results


# ---- torch.distributed inside ranks (test_torch_*.py) ---------------------------------------------

def free_port():
    """A TCP port of 127.0.0.1 that was free a moment ago (a rendezvous for torch.distributed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_torch(comm, port, use_env=True):
    """torch.distributed with backend hbmcoll over the ranks of `comm` (the harness's own hbmcoll
    communicator: we only take rank and size from it), plus a gloo group of the same ranks.
    use_env=False hides the launcher's variables: the backend then bootstraps through the
    torch Store (the mp.spawn case). Returns (torch.distributed, the gloo group)."""
    import warnings

    import torch.distributed as dist

    import hbmcoll.torch  # noqa: F401  (registers the backend)

    warnings.filterwarnings("ignore", category=FutureWarning)  # all_gather_into_tensor & co.
    r, p = comm.rank, comm.size
    if not use_env:
        for k in [k for k in os.environ if k.startswith("HBMCOLL_") and k not in
                  ("HBMCOLL_TIMEOUT", "HBMCOLL_BIND", "HBMCOLL_QUIET", "HBMCOLL_TUNE")]:
            del os.environ[k]
    dist.init_process_group("hbmcoll", init_method=f"tcp://127.0.0.1:{port}", rank=r,
                            world_size=p)
    gloo = dist.new_group(backend="gloo")
    return dist, gloo


_KEPT_GROUPS = []


def destroy_torch(dist):
    """dist.destroy_process_group(), keeping the group objects alive until the rank's os._exit:
    freeing a gloo group from Python's thread can deadlock in torch 2.13 (~ProcessGroupGloo
    joins its run-loop thread while holding the GIL, and that thread may need the GIL to drop a
    Python object; seen once in some 40 runs of a test whose DDP model held the last reference)."""
    _KEPT_GROUPS.extend(dist.distributed_c10d._world.pg_map)
    dist.destroy_process_group()


# ---- leak checks (failure tests) ------------------------------------------------------------------

def hbmcoll_files():
    """Names with 'hbmcoll' under /dev/shm and /tmp (memfd segments must never show up there)."""
    found = set()
    for d in ("/dev/shm", "/tmp"):
        try:
            found |= {os.path.join(d, f) for f in os.listdir(d) if "hbmcoll" in f.lower()}
        except FileNotFoundError:
            pass
    return found


def child_pids(pid=None):
    """Live processes whose parent is `pid` (default: this process), zombies included."""
    pid = os.getpid() if pid is None else pid
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            kids.append(int(d))
    return kids


def processes_with_env(needle):
    """pids of processes whose environment contains `needle` (e.g. a job key)."""
    hits = []
    b = needle.encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if b in f.read():
                    hits.append(int(d))
        except OSError:
            continue
    return hits


if __name__ == "__main__":
    _child_main()
