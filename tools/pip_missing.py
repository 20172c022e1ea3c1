"""Install the given pip requirements that are not satisfied yet (quietly)."""
import subprocess
import sys
from importlib import metadata


def satisfied(req):
    name, _, version = req.partition("==")
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return not version or have.split("+")[0] == version  # 2.13.0+cpu satisfies 2.13.0


missing = [r for r in sys.argv[1:] if not satisfied(r)]
if missing:
    print("installing Python packages:", " ".join(missing), flush=True)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *missing])
