"""Shared fixtures of the hbmcoll pytest suite.

The multi-process machinery lives in ranks.py (importable by rank processes too); here it becomes
fixtures. Ranks import hbmcoll from pymod/ of this checkout: build it in place first with
`python3 setup.py -q build_ext --inplace`.
"""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PYMOD = HERE.parents[1] / "pymod"
for p in (str(HERE), str(PYMOD)):
    if p not in sys.path:
        sys.path.insert(0, p)

import ranks  # noqa: E402

# Every job the tests start runs on the built-in thresholds, which their sizes are chosen
# around, whatever this host's tuning cache says (python -m hbmcoll.tune); test_tune.py
# takes this off for its own jobs.
os.environ.setdefault("HBMCOLL_TUNE", "off")


def _require_core():
    try:
        import hbmcoll._core  # noqa: F401
    except ImportError as e:
        pytest.fail(f"hbmcoll._core is not built ({e}): run "
                    "`python3 setup.py -q build_ext --inplace` in the repository first",
                    pytrace=False)


def pytest_configure(config):
    # Started as `make test &` from a script, the shell hands us SIGINT ignored, and every
    # process we start would inherit that: the Ctrl-C tests rely on the default disposition.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line(
        "markers", "libbug(reason): the test shows a known library bug (fails until it is fixed; "
        "HBMCOLL_KNOWN_BUGS=xfail turns these into strict xfails)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("HBMCOLL_KNOWN_BUGS") != "xfail":
        return
    for item in items:
        m = item.get_closest_marker("libbug")
        if m is not None:
            reason = m.args[0] if m.args else m.kwargs.get("reason", "known library bug")
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


@pytest.fixture
def run_ranks():
    """run_ranks(n, fn, *args, timeout=60, env=None, check=True): fn(comm, *args) on n ranks."""
    _require_core()
    return ranks.run_ranks


@pytest.fixture
def start_ranks():
    """start_ranks(n, fn, *args, timeout=60, env=None) -> ranks.Job (signal, kill, wait_event)."""
    _require_core()
    jobs = []

    def start(n, fn, *args, **kw):
        job = ranks.start_ranks(n, fn, *args, **kw)
        jobs.append(job)
        return job

    yield start
    for job in jobs:  # a test that failed half way must not leave ranks behind
        job.kill_all()
        if job._tmp:
            job.join(5)


@pytest.fixture
def comm1(monkeypatch):
    """A size-1 communicator in the pytest process itself (argument checks, no peers). The
    environment stays that of a lone process without binding for the whole test."""
    _require_core()
    import hbmcoll

    for k in list(os.environ):
        if k.startswith(ranks._LAUNCH_PREFIXES) or k in ranks._LAUNCH_VARS:
            monkeypatch.delenv(k)
    monkeypatch.setenv("HBMCOLL_BIND", "none")
    monkeypatch.setenv("HBMCOLL_TIMEOUT", "10")
    monkeypatch.setenv("HBMCOLL_QUIET", "1")
    c = hbmcoll.init()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def emulated_nodes():
    """emulated_nodes(n): n emulated nodes (netnodes.NetNodes), removed after the test; the
    test is skipped where namespaces cannot be made (not root, no iproute2)."""
    import contextlib

    import netnodes

    why = netnodes.usable()
    if why:
        pytest.skip(why)
    with contextlib.ExitStack() as stack:
        yield lambda n, **kw: stack.enter_context(netnodes.NetNodes(n, **kw))


@pytest.fixture
def nothing_left_behind():
    """After the test: no file with 'hbmcoll' in its name under /dev/shm or /tmp, no child
    process, no process of the job (test_failures.py, test_mismatch.py use it)."""
    files_before = ranks.hbmcoll_files()
    keys_before = len(ranks.Job.keys)
    yield
    keys = ranks.Job.keys[keys_before:]
    deadline = time.monotonic() + 10
    while True:  # processes may take a moment to be reaped
        kids = ranks.child_pids()
        stray = [pid for k in keys for pid in ranks.processes_with_env(k)]
        new_files = ranks.hbmcoll_files() - files_before
        if not (kids or stray or new_files) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not new_files, f"files left behind: {sorted(new_files)}"
    assert not kids, f"child processes left behind: {kids}"
    assert not stray, f"processes of the job still running: {stray}"
