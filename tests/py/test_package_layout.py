"""The Python package stays laid out by concern, without import circles.

Read with ast, nothing imported: every module of pymod/hbmcoll/ and its subpackages, and every
import of one of them by another. Both kinds count:

- module-level imports (run when the module loads), and
- function-level imports (an import inside a def, run when it is called; used to put off a slow
  import such as keras, or to dodge an import order: a circle all the same).

An import names its target as Python resolves it: `from . import x` is the submodule x where
there is one, else the package's __init__; `from .a import b` is a.b where that is a module, else
a where a binds the name in its __init__, else a module that is no .py file (the _core
extension) and no edge. That a submodule's import also runs its package's __init__ is not an edge
(every submodule would then import its package). Modules outside the package (torch, the _core
extension) are not nodes.
"""
import ast
import os

PKG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "pymod", "hbmcoll")

# Modules that may sit at the top of hbmcoll/; everything else lives in a subpackage named for its
# concern (torch/, tensorflow/, horovod/, memserver/, launch/, tools/).
TOP_LEVEL = {
    # the package's face: `import hbmcoll`, `python -m hbmcoll`, its version, its exceptions,
    # and what every layer reports through (HBMCOLL_LOG, HBMCOLL_TIMELINE)
    "__init__", "__main__", "_version", "errors", "log", "timeline",
    # the communicators and what they are made of (the one across nodes is nodes/)
    "comm", "p2p", "buffers", "objects", "vcoll", "clib",
}
# documented commands (`python -m hbmcoll.X`): each only re-exports and runs its module in launch/
# or tools/
COMMANDS = {"run", "tune", "bench", "topo", "variables"}
TOP_LEVEL |= COMMANDS


def _modules():
    """{dotted name: path} of every .py module in the package (a package is its __init__)."""
    found = {}
    for root, dirs, files in os.walk(PKG_DIR):
        dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(root, d, "__init__.py")))
        rel = os.path.relpath(root, os.path.dirname(PKG_DIR)).replace(os.sep, ".")
        for f in sorted(files):
            if f.endswith(".py"):
                stem = f[:-3]
                found[rel if stem == "__init__" else f"{rel}.{stem}"] = os.path.join(root, f)
    return found


def _is_package(path):
    return os.path.basename(path) == "__init__.py"


def _bound(path):
    """The names a module binds at its top level (assignments, defs, classes, imports)."""
    names = set()
    for node in ast.parse(open(path, encoding="utf-8").read(), path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _imports(name, path, modules):
    """[(target module, line, 'module level' | 'in a function')] of one module's imports."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    here = name if _is_package(path) else name.rpartition(".")[0]  # the package relative imports start from
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            where = "in a function" if in_function else "module level"
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in modules:
                        out.append((alias.name, child.lineno, where))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = here
                    for _ in range(child.level - 1):
                        base = base.rpartition(".")[0]
                    base = f"{base}.{child.module}" if child.module else base
                else:
                    base = child.module
                for alias in child.names:
                    if f"{base}.{alias.name}" in modules:
                        out.append((f"{base}.{alias.name}", child.lineno, where))
                    elif base in modules and alias.name in _bound(modules[base]):
                        out.append((base, child.lineno, where))
            visit(child, inner)

    visit(tree, False)
    return sorted(set(out), key=lambda e: (e[1], e[0]))


def _graph():
    modules = _modules()
    return modules, {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph):
    """Every elementary circle found by a depth-first walk (one per back edge), each as a list of
    (module, target, line, where) steps."""
    found, state, stack = [], {}, []

    def walk(m):
        state[m] = "open"
        for target, line, where in graph[m]:
            stack.append((m, target, line, where))
            if state.get(target) == "open":
                start = next(i for i, step in enumerate(stack) if step[0] == target)
                found.append(list(stack[start:]))
            elif target not in state:
                walk(target)
            stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            walk(m)
    return found


def test_the_package_has_no_import_circles():
    _, graph = _graph()
    cycles = _cycles(graph)
    text = ["  " + " -> ".join([c[0][0]] + [f"{t} (line {line}, {where})" for _, t, line, where in c])
            for c in cycles]
    assert not cycles, "import circles in hbmcoll:\n" + "\n".join(text)


def test_only_the_listed_modules_sit_at_the_top_of_the_package():
    modules, _ = _graph()
    top = {n.split(".", 1)[1] for n in modules if n.count(".") == 1 and not _is_package(modules[n])}
    stray = sorted(top - TOP_LEVEL)
    assert not stray, (f"modules at the top of hbmcoll/ outside its short list: {stray}; put each in "
                       "the subpackage of its concern (or, for a new concern, a new subpackage)")
    assert "hbmcoll" in modules


def test_the_commands_at_the_top_only_run_their_modules():
    """The modules kept for `python -m hbmcoll.X` hold no code of their own: a few lines each."""
    long = {}
    for name in COMMANDS:
        with open(os.path.join(PKG_DIR, name + ".py"), encoding="utf-8") as f:
            lines = f.read().splitlines()
        if len(lines) > 10:
            long[name] = len(lines)
    assert not long, f"command modules at the top with more than 10 lines: {long}"


def test_setup_py_ships_every_subpackage():
    """A fresh `pip install .` carries every subpackage: setup.py lists each in packages=."""
    setup_py = os.path.join(os.path.dirname(os.path.dirname(PKG_DIR)), "setup.py")
    listed = set()
    for node in ast.walk(ast.parse(open(setup_py, encoding="utf-8").read(), setup_py)):
        if isinstance(node, ast.keyword) and node.arg == "packages" and isinstance(node.value, ast.List):
            listed |= {elt.value for elt in node.value.elts if isinstance(elt, ast.Constant)}
    modules, _ = _graph()
    packages = {n for n, path in modules.items() if _is_package(path)}
    assert not packages - listed, f"setup.py's packages= lacks {sorted(packages - listed)}"


def test_the_walk_sees_both_kinds_of_import():
    """The graph is not empty by mistake: the package imports its modules at module level and some
    in functions."""
    _, graph = _graph()
    kinds = {where for edges in graph.values() for _, _, where in edges}
    assert kinds == {"module level", "in a function"}, kinds
