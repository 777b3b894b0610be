"""The runtime's layout as docs/architecture.md draws it: every module of app/sagemaker_lightning/ has its row there
and every row its module; each room's __init__.py is a docstring that imports nothing; no module imports a module that
imports it back (at any depth, imports inside functions included); no file is much longer than one sitting's read.

    .venv/bin/pytest tests/unit/test_architecture.py
"""

import ast
import os
import re

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "app", "sagemaker_lightning")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
TABLE = "## Every module of the runtime"  # the section whose rows name the modules, one a row
MOST_LINES = 300  # a file a reader takes in one sitting


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def modules(package: str = PACKAGE) -> dict[str, str]:
    """Each .py file under the package, by its path from the package's folder ("boot/entrypoint.py")."""
    found = {}
    for folder, _, names in os.walk(package):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found[os.path.relpath(path, package)] = path
    return found


def documented(text: str) -> set[str]:
    """The modules the table names: its rows' first cells, `room/module.py`."""
    section = text.split(TABLE, 1)[1].split("\n## ", 1)[0]
    return {m[1] for line in section.splitlines() if (m := re.match(r"\|\s*`([\w/]+\.py)`\s*\|", line))}


def imported(path: str, package: str = PACKAGE) -> set[str]:
    """The package's modules `path` imports, anywhere in it, as paths from the package's folder."""
    tree = ast.parse(read(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        if not name.startswith("sagemaker_lightning."):
            continue
        relative = name.split(".", 1)[1].replace(".", os.sep)
        for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
            if os.path.isfile(os.path.join(package, candidate)):
                found.add(candidate)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops of `graph` (module → the modules it imports), each once, from its first module."""
    found, done = [], set()

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                loop = path[path.index(nxt) :]
                if frozenset(loop) not in done:
                    done.add(frozenset(loop))
                    found.append(loop + [nxt])
            elif len(path) < 12:
                visit(nxt, path + [nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


def test_every_module_has_its_row_and_every_row_its_module():
    actual = {name for name in modules() if not name.endswith("__init__.py")}
    rows = documented(read(ARCHITECTURE))
    assert not actual - rows, f"modules docs/architecture.md does not name: {sorted(actual - rows)}"
    assert not rows - actual, f"rows of docs/architecture.md whose module is gone: {sorted(rows - actual)}"


def test_the_check_fails_for_a_module_without_a_row(tmp_path):
    """The test above can fail: a module added to a copy of the package is one the table does not name."""
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / "new_module.py").write_text('"""New."""\n')
    rows = documented(read(ARCHITECTURE))
    assert "boot/new_module.py" in set(modules(str(tmp_path))) - rows


def test_each_rooms_init_is_a_docstring_that_imports_nothing():
    rooms = [name for name in modules() if name.endswith("__init__.py") and os.sep in name]
    assert {"boot", "launch", "cli", "parallel", "checkpoints", "data", "stop", "health", "tracking"} <= {
        name.split(os.sep)[0] for name in rooms
    }
    for name in rooms:
        tree = ast.parse(read(os.path.join(PACKAGE, name)))
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr), f"{name} holds more than its docstring"


def test_no_module_imports_a_module_that_imports_it_back():
    graph = {name: imported(path) - {name} for name, path in modules().items()}
    assert cycles(graph) == []
    assert cycles({"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}}) == [["a.py", "b.py", "c.py", "a.py"]]


@pytest.mark.parametrize("folder", ["app", "scripts"])
def test_no_file_is_past_one_sittings_read(folder):
    long = {}
    for base, _, names in os.walk(os.path.join(ROOT, folder)):
        for name in names:
            if name.endswith(".py") and (n := len(read(os.path.join(base, name)).splitlines())) > MOST_LINES:
                long[os.path.relpath(os.path.join(base, name), ROOT)] = n
    assert long == {}
