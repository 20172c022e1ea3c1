"""The job's secret: what keeps two jobs apart and the rendezvous unguessable.

The local ranks of one job meet on an abstract Unix socket whose name is a hash of the job key.
A key built only from what the launcher shows (hydra_pmi_proxy's pid, a Slurm job id) can be
computed by another local user, who could then bind the name first and stop the job. So every
key also carries a secret nonce of the job:

- hbmcoll-run on one node draws one for each launch (HBMCOLL_JOB_KEY); across nodes, and under any
  launcher, a user may set HBMCOLL_JOB_KEY (16 characters or more across nodes);
- an mpi4py communicator broadcasts one; torch's process groups agree on one in torch's store;
- under torchrun, mpiexec (MPICH, Open MPI) and srun, local rank 0 draws one and hands it to
  the others through a file in a directory only this user can read (`exchange` below): the
  launcher's identity (agent pid, proxy pid, job.step) names the file, the nonce names the socket.

The file lives only while the ranks meet: rank 0 removes it once the communicator exists (or
failed). If a live rank 0 of another job already owns the same file, the two jobs cannot be told
apart, and init() refuses rather than let their ranks pair up.
"""
import errno
import hashlib
import os
import secrets
import stat
import sys
import time

from .. import errors
from ..errors import BootstrapError

_POLL_S = 0.01
_WARN_S = 60.0


class SameIdentityError(BootstrapError):
    """Two live jobs have the same launcher identity on this node."""


def _start_time(pid):
    """The process's start time in clock ticks (field 22 of /proc/pid/stat), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


def _owned_private_dir(path):
    """True when path is a real directory of this uid that nobody else may enter."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and stat.S_IMODE(st.st_mode) & 0o077 == 0)


def shared_file_problem(st, path, what):
    """Why a secret's file (st: its os.stat) must not be trusted, or None: like ssh with a key,
    refuse one that group or others may read or write, or that another user owns."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return (f"{what} {path} has mode {mode:04o}: group or others may read or write it; "
                f"make it private with chmod 600 {path}")
    if st.st_uid not in (os.getuid(), 0):
        return f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}) or root"
    return None


def private_dir(say=None):
    """A directory only this uid can read: $XDG_RUNTIME_DIR's, else one in the temp dir.

    A name already taken by another user (squatting) costs a line and the next name, never
    the job: every rank walks the same names and takes the first that is its own."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = runtime if runtime and os.path.isdir(runtime) else os.environ.get("TMPDIR", "/tmp")
    name = os.path.join(base, f"hbmcoll-{os.getuid()}")
    for i in range(16):
        path = name if i == 0 else f"{name}.{i}"
        try:
            if _owned_private_dir(path):
                if i and say:
                    say(f"{name} is not a private directory of uid {os.getuid()} (another user "
                        f"may have made it): the rendezvous uses {path}")
                return path
        except OSError:
            continue
    raise errors.SystemCallError(errno.EEXIST, f"hbmcoll: no private directory for the rendezvous under {base} "
                  f"({name} and 15 more are taken); set HBMCOLL_JOB_KEY to a secret value "
                  "unique to this job (the same on all its ranks) instead")


def _say(text):
    print(f"hbmcoll: {text}", file=sys.stderr, flush=True)


class Exchange:
    """Rank 0 publishes a fresh nonce for `key`; the other local ranks read it."""

    def __init__(self, key, local_rank):
        self.key, self.local_rank = key, local_rank
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        self.path = os.path.join(private_dir(_say), f"job-{digest}")
        self.nonce = None

    def _read(self):
        """(nonce, pid) of the file's live writer, or None."""
        try:
            with open(self.path) as f:
                problem = shared_file_problem(os.fstat(f.fileno()), self.path, "the rendezvous file")
                nonce, pid, started = f.read().split()
        except (OSError, ValueError):
            return None
        if problem:  # rank 0 writes it 0600: someone else changed it
            raise BootstrapError(problem)
        return (nonce, int(pid)) if _start_time(int(pid)) == int(started) else None

    def publish(self):
        live = self._read()
        if live is not None and live[1] != os.getpid():
            raise SameIdentityError(
                f"another job with the same identity ({self.key.split('/')[0]}) is starting on "
                f"this node (its rank 0 is pid {live[1]}): their ranks could pair up. Set "
                "HBMCOLL_JOB_KEY to a value unique to each job (the same on all its ranks), or "
                "start each job with its own launcher")
        self.nonce = secrets.token_hex(16)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{self.nonce} {os.getpid()} {_start_time(os.getpid())}\n")
        os.replace(tmp, self.path)
        return self.nonce

    def fetch(self, timeout=None):
        """Wait (Ctrl-C ends it) for rank 0's nonce; a stall gets a line at 60 s, 120 s, ...;
        past `timeout` seconds (HBMCOLL_TIMEOUT), TimeoutError."""
        start = time.monotonic()
        next_warn = start + _WARN_S
        while True:
            if timeout and time.monotonic() - start > timeout:
                raise errors.TimeoutError(f"local rank {self.local_rank} found no rank 0 starting the "
                                   f"job's rendezvous ({self.path}) within {timeout:g} s")
            live = self._read()
            if live is not None:
                self.nonce = live[0]
                return self.nonce
            now = time.monotonic()
            if now >= next_warn:
                _say(f"local rank {self.local_rank} has waited {now - start:.0f} s for local "
                     f"rank 0 to start the job's rendezvous ({self.path})")
                next_warn = start + 2 * (now - start)
            time.sleep(_POLL_S)

    def done(self):
        """Rank 0, once the communicator exists or failed: nothing more to find there."""
        live = self._read() if self.local_rank == 0 and self.nonce is not None else None
        if live is not None and live[0] == self.nonce:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
