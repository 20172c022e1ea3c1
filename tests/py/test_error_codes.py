"""One error path: every hbmcoll exception carries libcoll's code (.code, .name), whether C or
Python raised it; -EINVAL and COLL_EBADARG are the same ArgumentError (a ValueError, not an
hbmcoll.Error: a misuse leaves the communicator usable); a malformed HBMCOLL_* value names
the variable; a placement fallback is printed."""

import errno
import subprocess
import sys

import numpy as np
import pytest

import ranks

try:
    import hbmcoll
    from hbmcoll import errors
except ImportError:  # not built yet: the fixtures say so
    hbmcoll = errors = None


def _env(**extra):
    return ranks.clean_env(extra)


def test_every_code_maps_to_one_class_with_its_code(comm1):
    cases = {errors.EMISMATCH: hbmcoll.MismatchError, errors.EPEERLOST: hbmcoll.PeerLostError,
             -errno.ETIMEDOUT: hbmcoll.TimeoutError, errors.EBADARG: hbmcoll.ArgumentError,
             -errno.EINVAL: hbmcoll.ArgumentError, -errno.ENOMEM: hbmcoll.OutOfMemoryError,
             errors.EBOOTSTRAP: errors.BootstrapError, errors.EFORKED: errors.ForkedError,
             errors.EABORTED: hbmcoll.Error, -errno.EPERM: errors.SystemCallError}
    for code, cls in cases.items():
        e = errors.from_code(code, "text")
        assert type(e) is cls and e.code == code and str(e).endswith("text"), (code, e)
        assert isinstance(e, errors.CodedError) and e.name != "UNKNOWN", code
        assert isinstance(e, hbmcoll.Error) != (cls is hbmcoll.ArgumentError), code
    assert isinstance(errors.from_code(errors.EBADARG), ValueError)
    assert isinstance(errors.from_code(-errno.ENOMEM), MemoryError)
    assert errors.from_code(-errno.EPERM).errno == errno.EPERM
    # the extension raises the same classes: _core re-exports them
    assert hbmcoll._core.Error is hbmcoll.Error and hbmcoll._core.MismatchError is hbmcoll.MismatchError


def test_classes_are_named_as_users_import_them():
    # a traceback prints "hbmcoll.PeerLostError: ...", and a pickled error comes back whole
    import pickle
    import traceback
    for name in ("Error", "PeerLostError", "BootstrapError", "ArgumentError", "NotFoundError"):
        cls = getattr(hbmcoll, name)
        assert cls is getattr(errors, name) and cls.__module__ == "hbmcoll", name
    e = errors.from_code(errors.EPEERLOST, "rank 0 died")
    assert traceback.format_exception_only(e) == ["hbmcoll.PeerLostError: rank 0 died\n"]
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is hbmcoll.PeerLostError and back.code == errors.EPEERLOST


def test_python_and_c_argument_errors_carry_the_code(comm1):
    with pytest.raises(hbmcoll.ArgumentError) as python_side:  # comm.py checks the op
        comm1.allreduce(np.ones(4), op="median")
    with pytest.raises(hbmcoll.ArgumentError) as c_side:  # the extension checks the algorithm
        comm1.set_algorithm("allreduce", "fastest")
    for e in (python_side.value, c_side.value):
        assert e.code == errors.EBADARG and e.name == "EBADARG" and isinstance(e, ValueError)


def test_topology_errors_carry_the_code():
    with pytest.raises(FileNotFoundError) as missing:
        hbmcoll._core.numa_report(topology="/nonexistent/topology.xml")
    assert missing.value.code == -errno.ENOENT and isinstance(missing.value, errors.CodedError)


@pytest.mark.parametrize("var, value", [("HBMCOLL_SPIN", "abc"), ("HBMCOLL_ARENA_BYTES", "1X"),
                                        ("HBMCOLL_TIMEOUT", "abc"), ("HBMCOLL_STAGE_STREAM_MIN", "fast")])
def test_malformed_variable_is_an_argument_error_naming_it(var, value):
    code = ("import hbmcoll\ntry:\n    hbmcoll.init()\nexcept hbmcoll.ArgumentError as e:\n"
            "    print(e.code, e.name, e)\n")
    res = subprocess.run([sys.executable, "-c", code], env=_env(**{var: value}),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"{errors.EBADARG} EBADARG") and var in res.stdout, res.stdout


def test_malformed_timeout_fails_before_waiting_for_peers():
    """A rank of a 2-rank job whose peer never comes: HBMCOLL_TIMEOUT=10s meant as "10"
    is refused at once, not after an unbounded wait for the peer."""
    code = "import hbmcoll\nhbmcoll.init()\n"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=_env(HBMCOLL_RANK="1", HBMCOLL_SIZE="2", HBMCOLL_LOCAL_RANK="1",
                                  HBMCOLL_LOCAL_SIZE="2", HBMCOLL_TIMEOUT="10s"))
    assert res.returncode == 1 and "hbmcoll.ArgumentError: HBMCOLL_TIMEOUT='10s'" in res.stderr, \
        res.stderr


def test_segment_beyond_the_address_space_limit_is_said():
    """The arena is virtual but counts against ulimit -v (and valgrind's limit): the error
    names the size and the variable to lower, not only "Cannot allocate memory"."""
    import resource

    code = "import hbmcoll\nhbmcoll.init()\n"
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # noqa: E731
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=_env(HBMCOLL_ARENA_BYTES="8G"), preexec_fn=limit)
    assert res.returncode == 1, res.stderr
    assert "hbmcoll.OutOfMemoryError: could not map the shared segment of 8.0 GiB" in res.stderr
    assert "HBMCOLL_ARENA_BYTES" in res.stderr, res.stderr


@pytest.mark.parametrize("var", ["HBMCOLL_TORCH_INLINE", "HBMCOLL_TORCH_DDP_ARENA"])
def test_malformed_torch_variable_is_refused(var):
    torch = pytest.importorskip("torch")  # noqa: F841
    code = ("import hbmcoll.torch, torch.distributed as dist\n"
            "dist.init_process_group('hbmcoll', init_method='tcp://127.0.0.1:%d', rank=0, "
            "world_size=1)\n" % ranks.free_port())
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(**{var: "maybe"}))
    assert res.returncode != 0 and f"{var}='maybe' is not valid" in res.stderr, res.stderr


def test_hbm_bind_fallback_is_printed():
    """Node 0 named HBM, strict binding, and arena parts larger than the node: the segment
    falls back to MPOL_PREFERRED, and the line saying so reaches stderr (it was dropped)."""
    free_kib = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
    arena = (free_kib // (1 << 20) + 8) << 30  # bytes: more GiB than the machine has
    code = "import hbmcoll; c = hbmcoll.init(); c.barrier(); c.close()"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(HBMCOLL_HBM_NODES="0", HBMCOLL_MEMORY="hbm_bind",
                                  HBMCOLL_ARENA_BYTES=str(arena)))
    assert res.returncode == 0, res.stderr
    assert "does not fit" in res.stderr and "MPOL_PREFERRED" in res.stderr, res.stderr
