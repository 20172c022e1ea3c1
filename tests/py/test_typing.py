"""The public API is typed (py.typed and __init__.pyi, PEP 561) and documented: mypy accepts a
script that uses it as the README does and names the mistakes in one that does not; every
public function and method has a docstring."""
import inspect
import os
import subprocess
import sys

import pytest

import hbmcoll

PYMOD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pymod")

GOOD = '''
import numpy as np
import hbmcoll

comm = hbmcoll.init(timeout=30)
x = np.ones(4, np.float32)
y: np.ndarray = comm.allreduce(x, op="sum")
req = comm.iallreduce(x)
z: np.ndarray = req.wait(timeout=1.0)
parts = comm.allgatherv(x, counts=[4] * comm.size)
status = hbmcoll.Status()
comm.send(x, dest=1, tag=3)
got = comm.recv(np.empty(4), source=hbmcoll.ANY_SOURCE, status=status)
who: int = status.source
names: list[str] = comm.allgather_object("a")
sub = comm.split(comm.rank % 2)
rb = hbmcoll.RemoteBuffer("w", (4,), "float32")
with rb.lock(timeout=5):
    rb.accumulate(x, alpha=-0.1)
try:
    comm.barrier()
except hbmcoll.PeerLostError as e:
    code: int = e.code
'''

BAD = '''
import numpy as np
import hbmcoll

comm = hbmcoll.init()
comm.allreduce(np.ones(4), ops="sum")
comm.send(np.ones(4))
n: str = comm.rank
'''


def _mypy(tmp_path, text):
    pytest.importorskip("mypy")
    script = tmp_path / "script.py"
    script.write_text(text)
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--ignore-missing-imports",
                           "--cache-dir", str(tmp_path / "cache"), str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, MYPYPATH=PYMOD))


def test_mypy_accepts_the_api_as_documented(tmp_path):
    res = _mypy(tmp_path, GOOD)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_names_the_mistakes(tmp_path):
    out = _mypy(tmp_path, BAD).stdout
    assert 'Unexpected keyword argument "ops"' in out, out
    assert 'Missing positional argument "dest"' in out, out
    assert 'Incompatible types in assignment (expression has type "int", variable has type "str")' in out, out


def _public(obj):
    return [(n, f) for n, f in inspect.getmembers(obj) if not n.startswith("_") and callable(f)]


def test_every_public_function_has_a_docstring():
    import hbmcoll.comm
    missing = []
    for cls in (hbmcoll.comm.Communicator, hbmcoll.RemoteBuffer,
                hbmcoll.Request, hbmcoll.Status):
        missing += [f"{cls.__name__}.{n}" for n, f in _public(cls) if not (f.__doc__ or "").strip()]
    missing += [n for n in hbmcoll.__all__ if callable(getattr(hbmcoll, n)) and not getattr(hbmcoll, n).__doc__]
    torch = pytest.importorskip("torch")  # noqa: F841
    import hbmcoll.torch as hvd
    missing += [f"hbmcoll.torch.{n}" for n in hvd.__all__
                if callable(getattr(hvd, n)) and not (getattr(hvd, n).__doc__ or "").strip()]
    assert not missing, missing
