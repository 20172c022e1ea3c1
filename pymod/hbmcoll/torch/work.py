"""The torch backend's Work objects (what dist.* returns for async_op and DDP's futures) and
the completer threads that finish them without anyone calling wait() (process_group.py)."""
import queue
import threading

import torch
import torch.distributed as dist


class Done(dist._Work):
    """A collective that already ran in the caller's thread: complete from the start. Its
    future is made completed, once asked for: no callback to unwrap an error, as it cannot
    have failed (DDP asks for it after every bucket, with caches cold from the backward pass,
    where each Python and pybind step costs microseconds). wait(timeout) returns at once."""

    def __init__(self, result):
        super().__init__()
        self._result = result
        self._fut = None

    def wait(self, timeout=None):
        return True

    def get_future(self):
        f = self._fut
        if f is None:
            f = self._fut = torch.futures.Future()
            f.set_result(self._result)
        return f

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._result

    def synchronize(self):
        pass

    def __repr__(self):
        return "<hbmcoll.torch Work done>"


class Work(dist._Work):
    """A collective of this backend. wait() blocks until it is done, raising its error;
    wait(timeout) (a timedelta or seconds; 0 or None: no limit) raises hbmcoll.TimeoutError, a
    RuntimeError, if it is not done by then, and the collective stays in flight (wait again);
    HBMCOLL_TIMEOUT bounds every wait in any case. get_future() gives a torch Future whose
    value is the list of output tensors."""

    def __init__(self, req, finish, result, pg=None):
        super().__init__()
        self._req = req           # hbmcoll Request in flight (one that ran inline is a Done)
        self._finish = finish     # copies back/unpacks after the collective, or None
        self._result = result     # the future's value
        self._fut = torch.futures.Future()
        self._user_fut = None
        self._exc = None
        self._done = False
        self._lock = threading.Lock()
        self._pg = pg             # its completer threads complete the future, once asked for

    def _complete(self):
        """Finish the collective (once, whichever thread comes first)."""
        if self._done:
            return
        with self._lock:
            if self._done:
                return
            try:
                self._req.wait()
                if self._finish is not None:
                    self._finish()
                exc = None
            except BaseException as e:  # noqa: BLE001 - handed to every waiter
                exc = e
            self._req = self._finish = self._pg = None
            self._exc = exc
            self._done = True
        if exc is None:
            self._fut.set_result(self._result)
        else:
            self._fut.set_exception(exc)

    def wait(self, timeout=None):
        s = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        req = self._req
        if s and s > 0 and req is not None and not self._done:
            req.wait(s)           # not done in time: hbmcoll.TimeoutError, still in flight
        self._complete()
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self):
        # A future completed from Python with set_exception() holds the exception as its value:
        # C++ consumers (DDP's reducer) would take it for a result. A then() child of it is
        # marked failed in C++ when the callback raises, so that is what we hand out.
        f = self._user_fut
        if f is None:
            f = self._user_fut = self._fut.then(_unwrap)
            pg = self._pg
            if pg is not None and not self._done:
                # someone will wait on the future, maybe without calling wait(): from now on a
                # completer thread completes it (works never asked for are completed by wait())
                pg._enqueue(self)
        return f

    def is_completed(self):
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False              # another thread is completing it right now
        try:
            if self._done:
                return True
            try:
                if not self._req.test():
                    return False
            except BaseException:  # noqa: BLE001 - it failed: _complete() records that
                pass
        finally:
            self._lock.release()
        self._complete()
        return True

    def is_success(self):
        return self.is_completed() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._result

    def synchronize(self):
        pass

    def __repr__(self):
        return f"<hbmcoll.torch Work {'done' if self._done else 'running'}>"


def _unwrap(fut):
    return fut.value()


class _RecvWork(Work):
    """A recv: after wait(), _source_rank() says who sent (torch's recv with src=None asks)."""

    def _source_rank(self):
        return self._src.source

    def __init__(self, req, finish, result, pg=None):
        super().__init__(req, finish, result, pg)
        self._src = req.status


class _Completer:
    """Threads of a process group that complete started Works, so that their futures complete
    without anyone calling wait() (DDP waits on the futures).

    Completing a future runs its callbacks in the completing thread, and callbacks may start
    collectives and wait for them (PowerSGD's hook does): so whenever a thread takes a Work, it
    makes sure another one is free to take the next, and idle threads beyond two exit. Works are
    taken in the order they were started (hbmcoll runs them in that order); with two free
    threads two futures may complete in either order, which nothing depends on."""

    _MAX_IDLE = 2

    def __init__(self, name):
        self._q = queue.SimpleQueue()
        self._name = name
        self._lock = threading.Lock()
        self._free = 0
        self._threads = []
        self._stopping = False
        with self._lock:
            self._spawn()

    def _spawn(self):  # self._lock held
        self._free += 1
        t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}",
                             daemon=True)
        self._threads.append(t)
        t.start()

    def _run(self):
        q = self._q
        while True:
            w = q.get()
            with self._lock:
                self._free -= 1
                if w is None:
                    return
                if self._free == 0 and not self._stopping:
                    self._spawn()
            w._complete()
            del w
            with self._lock:
                if self._free >= self._MAX_IDLE:
                    self._threads.remove(threading.current_thread())
                    return
                self._free += 1

    def put(self, w):
        self._q.put(w)

    def stop(self):
        """Complete what was started, then end the threads."""
        with self._lock:
            self._stopping = True
            threads = list(self._threads)
        for _ in threads:
            self._q.put(None)
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join()
