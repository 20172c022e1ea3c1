"""HBMCOLL_TIMELINE=file.json: every rank's calls on a timeline that Chrome's trace viewer
(chrome://tracing) and Perfetto (ui.perfetto.dev) open, as Horovod's HOROVOD_TIMELINE does.

One file for the job: Chrome's trace event format, a JSON array of complete events ("ph": "X")
with the call's name, start and duration in microseconds of the wall clock, the bytes of its
buffer and, on one node, the algorithm it ran as, a process per rank ("rank R") and a thread per communicator. A nonblocking call lasts
until its request is first seen done (wait, test). Calls made inside others (an object
collective's allgathers) nest under them.

Each rank keeps its events in memory and adds them to the file when it has many and when it
exits, under an flock: it takes the closing bracket off, appends and closes the array again,
so the file is whole JSON whenever no rank is writing. Each node's first rank empties the file,
under the same lock, when the job's first communicator is made. With HBMCOLL_LOG=debug every call is also logged.
"""
import atexit
import fcntl
import functools
import json
import logging
import os
import threading
import time

from . import log

CALLS = ("barrier", "bcast", "allreduce", "reduce", "gather", "allgather", "scatter", "reduce_scatter",
         "alltoall", "gatherv", "allgatherv", "scatterv", "alltoallv", "send", "recv", "sendrecv",
         "bcast_object", "allgather_object", "gather_object")
STARTS = ("ibarrier", "ibcast", "iallreduce", "ireduce", "igather", "iallgather", "iscatter",
          "ireduce_scatter", "ialltoall", "isend", "irecv")
_FLUSH_AT = 10000
_state = {"path": None, "events": [], "pid": None, "comms": 0}
_lock = threading.Lock()


def _path():
    return os.environ.get("HBMCOLL_TIMELINE") or None


def watch(comm):
    """Times comm's calls (instance attributes over the methods) when a timeline or debug log
    is asked for; otherwise nothing changes and calls cost nothing more."""
    path, debug = _path(), log.enabled(logging.DEBUG)
    if path is None and not debug:
        return
    with _lock:
        first = _state["pid"] is None
        if first:
            _state["pid"], _state["path"] = comm.rank, path
            if path is not None:
                if comm.local_rank == 0:  # each node's first rank (a node-local path is emptied too)
                    with open(path, "a+b", buffering=0) as f:
                        fcntl.flock(f, fcntl.LOCK_EX)
                        f.truncate(0)
                        fcntl.flock(f, fcntl.LOCK_UN)
                atexit.register(flush)
        tid = _state["comms"]
        _state["comms"] += 1
    _event({"name": "thread_name", "ph": "M", "pid": _state["pid"], "tid": tid,
            "args": {"name": f"communicator {tid} ({type(comm).__name__}, rank {comm.rank} of {comm.size})"}})
    if first:
        _event({"name": "process_name", "ph": "M", "pid": _state["pid"], "args": {"name": f"rank {comm.rank}"}})
    for name in CALLS + STARTS:
        fn = getattr(comm, name, None)
        if fn is not None:
            setattr(comm, name, _timed(comm, tid, name, fn, name in STARTS))


def made(comm):
    """A communicator handed to the user (init, split, a torch group): timed, and logged at info."""
    watch(comm)
    if log.enabled(logging.INFO):
        log.communicator_made(comm, type(comm).__name__, comm._transports())
    return comm


def _nbytes(args):
    buf = args[0] if args else None
    if buf is None:
        return 0
    n = getattr(buf, "nbytes", None)
    if n is None and hasattr(buf, "element_size"):
        n = buf.numel() * buf.element_size()
    if n is None:
        try:
            n = memoryview(buf).nbytes
        except TypeError:
            n = 0
    return int(n)


def _timed(comm, tid, name, fn, starts):
    core = getattr(comm, "_c", None)  # one node's: it says which algorithm ran
    rank = comm.rank

    @functools.wraps(fn)
    def call(*args, **kw):
        t0, nbytes = time.time_ns(), _nbytes(args)
        got = fn(*args, **kw)
        if starts:
            return _TimedRequest(got, rank, tid, name, nbytes, t0)
        _done(rank, tid, name, nbytes, t0, algorithm=getattr(core, "algorithm", None))
        return got
    return call


def _done(rank, tid, name, nbytes, t0, note=None, algorithm=None):
    t1 = time.time_ns()
    args = {"bytes": nbytes}
    if note is not None:
        args["end"] = note
    if algorithm:
        args["algorithm"] = algorithm
    _event({"name": name, "ph": "X", "ts": t0 / 1000, "dur": (t1 - t0) / 1000, "pid": _state["pid"], "tid": tid,
            "args": args})
    log.say(logging.DEBUG, rank, f"{name} {nbytes} bytes {(t1 - t0) / 1e3:.1f} us" +
            (f" ({algorithm})" if algorithm else ""))


class _TimedRequest:
    """A request of a nonblocking call; its end is when it is first seen done."""

    def __init__(self, req, rank, tid, name, nbytes, t0):
        self._req, self._what, self._seen = req, (rank, tid, name, nbytes, t0), False

    def _saw(self):
        if not self._seen:
            self._seen = True
            _done(*self._what, note="seen done")

    def wait(self, timeout=None):
        got = self._req.wait(timeout)
        self._saw()
        return got

    def test(self):
        ok = self._req.test()
        if ok:
            self._saw()
        return ok

    @property
    def done(self):
        return self.test()

    def __getattr__(self, name):  # status (irecv), and whatever else the request has
        return getattr(self._req, name)


def _event(ev):
    if _state["path"] is None:
        return
    with _lock:
        _state["events"].append(ev)
        full = len(_state["events"]) >= _FLUSH_AT
    if full:
        flush()


def flush():
    """This rank's events into the file: whole JSON again when done (see the module's text)."""
    with _lock:
        events, _state["events"] = _state["events"], []
    path = _state["path"]
    if not events or path is None:
        return
    text = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
    with open(path, "a+b", buffering=0) as f:  # unbuffered: every byte is written before the unlock
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            end = f.seek(0, os.SEEK_END)
            if end == 0:
                f.write(b"[\n" + text.encode() + b"\n]\n")
            else:
                f.truncate(end - 3)  # the "\n]\n" that closed the array
                f.write(b",\n" + text.encode() + b"\n]\n")
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
