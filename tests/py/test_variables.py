"""The HBMCOLL_* variables: one list in C (libcoll/src/variables.c), docs/reference.md's table generated
from it, and every name the sources read in the list (and none in it that nothing reads)."""
import re
import subprocess
import sys
from pathlib import Path

import hbmcoll.tools.variables as variables

TOP = Path(__file__).resolve().parents[2]
QUOTED = re.compile(r"[\"'](HBMCOLL_[A-Z0-9_]+)")


def _read_in_sources():
    found = set()
    for folder, pattern in (("pymod", "**/*.py"), ("pymod", "*.c"), ("libcoll/src", "*.c"), ("numa", "*.c")):
        for path in (TOP / folder).glob(pattern):
            found |= set(QUOTED.findall(path.read_text()))
    return found


def test_the_reference_shows_the_generated_table():
    reference = (TOP / "docs" / "reference.md").read_text()
    assert variables.table() in reference, \
        "docs/reference.md's variables table is stale: paste `python3 -m hbmcoll.variables`"
    assert reference.count(variables.BEGIN) == 1


def test_the_documented_command_prints_the_table():
    out = subprocess.run([sys.executable, "-m", "hbmcoll.variables"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert out.strip() == variables.table()


def test_every_variable_read_is_listed_and_every_listed_one_is_read():
    listed, read = variables.names(), _read_in_sources()
    assert read - listed == set(), "read but not in libcoll/src/variables.c"
    assert listed - read == set(), "listed but read nowhere"


def test_every_row_says_what_and_its_default():
    for v in variables.rows():
        assert v["meaning"] and v["default"] and v["scope"], v
        assert "|" not in v["meaning"] + v["default"], v  # would break the Markdown table
