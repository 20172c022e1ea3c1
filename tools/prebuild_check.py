"""The check setup.py runs before it compiles anything: a C compiler that runs, Python's headers,
hwloc's headers (2.3 or newer) and library. What is missing comes back as one message that
names it and the package bringing it on Debian/Ubuntu, RHEL/Fedora and SUSE, instead of a
compiler error deep in pip's output.

memkind is not checked: numa/scratch.c opens it at run time, when there is HBM to use. libfabric
is optional too (loaded when a job spans nodes), but its headers decide at build time whether
the bridge between nodes is compiled in (libcoll/src/net.h), so their absence is a note.

The compiler is the one setuptools will use: $CC, else the one Python was built with, with
$CPPFLAGS, $CFLAGS and $LDFLAGS as setuptools adds them.

    python3 tools/prebuild_check.py       # the same check by hand: exit 1 and the message
"""
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile

FAMILIES = (("Debian/Ubuntu", "apt-get install"), ("RHEL/Fedora", "dnf install"),
            ("SUSE", "zypper install"))
# what may be missing -> its package in each family, in FAMILIES' order
PACKAGES = {
    "compiler": ("gcc", "gcc", "gcc"),
    "python": ("python3-dev", "python3-devel", "python3-devel"),
    "hwloc": ("libhwloc-dev", "hwloc-devel", "hwloc-devel"),
    "libfabric": ("libfabric-dev", "libfabric-devel", "libfabric-devel"),
}
TRIVIAL = "int main(void) { return 0; }\n"
PYTHON_H = "#include <Python.h>\nint main(void) { return Py_IsInitialized(); }\n"
HWLOC_H = "#include <hwloc.h>\n"
# the placement layer reads memory attributes (HBM against DDR): hwloc 2.3 and newer
HWLOC = ("#include <hwloc.h>\n"
         "int main(void) {\n"
         "  hwloc_topology_t t; hwloc_memattr_id_t id = HWLOC_MEMATTR_ID_BANDWIDTH;\n"
         "  return hwloc_topology_init(&t) + (int)id;\n"
         "}\n")
FABRIC = "#include <rdma/fabric.h>\nint main(void) { return FI_MAJOR_VERSION < 1; }\n"
_done = False


def compiler():
    """setuptools' compiler command as a list (CC may carry flags, as in `gcc -pthread`)."""
    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def _flags(*names):
    return [f for n in names for f in shlex.split(os.environ.get(n, ""))]


def _first_error(text):
    """The compiler's first line saying what went wrong, from "error:" on (no temporary path)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln[ln.find("error:"):] if "error:" in ln else ln
    return lines[0] if lines else "(no output)"


def _try(cc, tmp, name, source, args):
    """'' when cc builds source with args, else the compiler's first error line."""
    src = os.path.join(tmp, name + ".c")
    with open(src, "w") as f:
        f.write(source)
    out = os.path.join(tmp, name + (".o" if "-c" in args else ""))
    try:
        p = subprocess.run(cc + [src, "-o", out] + args, capture_output=True, text=True,
                           timeout=120)
    except OSError as e:
        return f"{cc[0]}: {e.strerror}"
    return "" if p.returncode == 0 else _first_error(p.stderr + p.stdout)


def _python_includes():
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(["-I" + paths["include"], "-I" + paths["platinclude"]]))


def _install_lines(keys):
    return [f"  {fam + ':':<15}{cmd} " + " ".join(dict.fromkeys(PACKAGES[k][i] for k in keys))
            for i, (fam, cmd) in enumerate(FAMILIES)]


def check():
    """(error, notes): error is the one message to stop with (None when the build can go on),
    notes are lines worth saying anyway."""
    cc = compiler()
    cflags, ldflags = _flags("CPPFLAGS", "CFLAGS"), _flags("LDFLAGS")
    missing, notes = [], []      # missing: (key, what, the compiler's line)
    with tempfile.TemporaryDirectory(prefix="hbmcoll-check-") as tmp:
        why = _try(cc, tmp, "trivial", TRIVIAL, cflags + ldflags)
        if why:
            missing.append(("compiler", f"a working C compiler (tried `{' '.join(cc)}`, "
                                        "from $CC or Python's configuration)", why))
        else:
            why = _try(cc, tmp, "python", PYTHON_H, ["-c"] + cflags + _python_includes())
            if why:
                missing.append(("python", f"Python's headers (Python.h for {sys.executable}, "
                                          f"looked in {sysconfig.get_paths()['include']})", why))
            why = _try(cc, tmp, "hwloc_h", HWLOC_H, ["-c"] + cflags)
            old = "" if why else _try(cc, tmp, "hwloc", HWLOC, ["-c"] + cflags)
            if why:
                missing.append(("hwloc", "hwloc's headers (hwloc.h)", why))
            elif old:
                missing.append(("hwloc", "hwloc 2.3 or newer (the hwloc.h found has no memory "
                                         "attributes)", old))
            else:
                why = _try(cc, tmp, "hwloc_link", HWLOC, cflags + ldflags + ["-lhwloc"])
                if why:
                    missing.append(("hwloc", "hwloc's library (libhwloc.so, -lhwloc)", why))
            if _try(cc, tmp, "fabric", FABRIC, ["-c"] + cflags):
                notes.append("hbmcoll: libfabric's headers (rdma/fabric.h) are not here: this "
                             "build has no bridge between nodes (jobs on one node only). For "
                             "jobs across nodes install " + " / ".join(
                                 f"{p} ({fam})" for p, (fam, _) in
                                 zip(PACKAGES["libfabric"], FAMILIES)) + " and build again.")
    if not missing:
        return None, notes
    lines = ["hbmcoll cannot be built here; it needs:"]
    lines += [f"  {what}  [{why}]" for _, what, why in missing]
    lines.append("Install, then build again:")
    lines += _install_lines([k for k, _, _ in missing])
    return "\n".join(lines), notes


def run_once():
    """setup.py's entry: the notes on stderr, and exit with the message when something is
    missing. Later calls in the same build do nothing."""
    global _done
    if _done:
        return
    _done = True
    error, notes = check()
    for n in notes:
        print(n, file=sys.stderr)
    if error:
        sys.exit(error)


if __name__ == "__main__":
    run_once()
    print("hbmcoll: the compiler, Python's headers and hwloc are all here")
