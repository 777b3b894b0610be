"""What the docs say that code must back: every test docs/reliability.md and docs/performance.md name as a promise's
proof exists (its file, and the test function in it, so merging or renaming tests cannot silently drop a proof); and
docs/resume-matrix.md is the interruption oracle's matrix as its cases make it (tests/plugins/oracle/cases.py).

    .venv/bin/pytest tests/unit/test_docs.py
"""

import ast
import os
import re

import pytest
from oracle import cases

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROOFS = ("reliability.md", "performance.md")  # the docs whose tables name the tests that prove each promise
# tests/<path>.py, tests/<path>.py::test_x or, after one of those on the same line, `::test_x` (that file's)
NAMED = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?|`::(\w+)`")


def named(text: str) -> list[tuple[str, str | None]]:
    """(file, test or None) of every test a doc names, each `::test` read against the file named before it."""
    found = []
    for line in text.splitlines():
        file = None
        for match in NAMED.finditer(line):
            file = match[1] or file
            if file:
                found.append((file, match[2] or match[3]))
    return found


def functions(path: str) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("doc", PROOFS)
def test_every_test_a_doc_names_exists(doc):
    with open(os.path.join(ROOT, "docs", doc)) as f:
        proofs = named(f.read())
    assert proofs, "the pattern no longer reads the doc's test names"
    missing = [
        f"{file}::{test}" if test else file for file, test in proofs if not os.path.isfile(os.path.join(ROOT, file))
    ]
    missing += [
        f"{file}::{test}"
        for file, test in proofs
        if test and os.path.isfile(os.path.join(ROOT, file)) and test not in functions(os.path.join(ROOT, file))
    ]
    assert not missing, f"docs/{doc} names tests that do not exist: {sorted(set(missing))}"


def test_the_resume_matrix_in_the_docs_is_the_oracles():
    with open(os.path.join(ROOT, "docs", "resume-matrix.md")) as f:
        written = f.read()
    assert written == cases.matrix(), "run: python tests/plugins/oracle/cases.py > docs/resume-matrix.md"
