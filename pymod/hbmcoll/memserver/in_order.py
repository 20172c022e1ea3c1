"""Calls that must run one at a time, in the order they were made (a RemoteBuffer's requests to
its memory servers, client.py): a blocking call waits for the nonblocking ones made before it and then runs in the
caller's thread; nonblocking calls run on one worker thread, started on first use, and return a
Request.

    order = InOrder(run)          # run(fn): runs fn under the owner's rules (lock, failures)
    order.call(fn)                # fn's result
    req = order.start(fn, result) # req.wait() -> result, or fn's exception
    order.stop()                  # after the calls made so far
"""
import queue
import threading

from ..errors import TimeoutError


class Request:
    """A call in flight. wait() returns its result."""

    def __init__(self, result):
        self._result, self._error = result, None
        self._event = threading.Event()

    def wait(self, timeout=None):
        if not self._event.wait(timeout):
            raise TimeoutError(f"the collective did not finish in {timeout} s; it is still in flight")
        if self._error is not None:
            raise self._error
        return self._result

    def test(self):
        return self._event.is_set()

    @property
    def done(self):
        return self._event.is_set()


class InOrder:
    def __init__(self, run):
        self._run = run
        self._queue, self._worker, self._last = queue.Queue(), None, None

    def call(self, fn):
        last = self._last
        if last is not None:
            last._event.wait()
        return self._run(fn)

    def start(self, fn, result):
        req = Request(result)
        self._last = req
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="hbmcoll-across", daemon=True)
            self._worker.start()
        self._queue.put((fn, req))
        return req

    def stop(self):
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()

    def _serve(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, req = item
            try:
                self._run(fn)
            except BaseException as exc:
                req._error = exc
            req._event.set()
