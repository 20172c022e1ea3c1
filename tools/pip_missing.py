"""Install the given pip requirements that are not satisfied yet (quietly).

Requirements name distributions as pip does, not modules: importlib.metadata finds them by the
normalised name (myst-parser, myst_parser and Myst.Parser are one), so a package whose import
name differs (myst-parser: myst_parser; scikit-learn: sklearn) needs no mapping here."""
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
