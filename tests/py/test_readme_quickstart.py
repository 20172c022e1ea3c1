"""The README's Quick start, taken from README.md as it stands, runs unchanged on one node and
across two emulated nodes (hbmcoll-run --nnodes 2 in network namespaces, netnodes.py)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import netnodes

TOP = Path(__file__).resolve().parents[2]
PYMOD = str(TOP / "pymod")

# appended to the Quick start: what its comments promise, checked on every rank
CHECK = """
assert comm.size == int(os.environ["EXPECT_SIZE"]), comm.size
assert (grads == 1.0).all() and (params == 0).all()
if comm.rank == 0:
    assert losses.shape == (comm.size, 1) and (losses == 0.5).all(), losses
else:
    assert losses is None
print("quickstart ok", comm.rank, flush=True)
"""


def _quickstart(tmp_path):
    readme = (TOP / "README.md").read_text()
    section = readme[readme.index("## Quick start"):]
    body = re.search(r"```python\n(# train\.py\n.*?)```", section, re.S).group(1)
    script = tmp_path / "train.py"
    script.write_text("import os\n" + body + CHECK)
    return str(script)


def _env(**extra):
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("HBMCOLL_", "RANK", "WORLD_SIZE", "LOCAL_",
                                                                       "MASTER_"))}
    return dict(keep, PYTHONPATH=PYMOD, OMP_NUM_THREADS="1", HBMCOLL_QUIET="1", HBMCOLL_TIMEOUT="60", **extra)


def test_on_one_node(tmp_path):
    p = subprocess.run([sys.executable, "-m", "hbmcoll.run", "-n", "3", "--bind", "none", _quickstart(tmp_path)],
                       env=_env(EXPECT_SIZE="3"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("quickstart ok") == 3, p.stdout


def test_across_two_nodes(emulated_nodes, tmp_path):
    nodes = emulated_nodes(2)
    script = _quickstart(tmp_path)
    env = _env(EXPECT_SIZE="4", HBMCOLL_JOB_KEY="q" * 32)
    procs = [nodes.popen(i, [sys.executable, "-m", "hbmcoll.run", "-n", "2", "--nnodes", "2", "--node-rank", str(i),
                             "--master", "10.77.0.1:29870", script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(2)]
    for i, (rc, out, err) in enumerate(netnodes.finish(procs, 180)):
        assert rc == 0, (i, out, err[-3000:])
        assert out.count("quickstart ok") == 2, (i, out)
