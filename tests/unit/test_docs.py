"""What the docs say that code makes: docs/resume-matrix.md is the interruption oracle's matrix as its cases make it
(tests/plugins/oracle/cases.py), so a case added or dropped shows there.

    .venv/bin/pytest tests/unit/test_docs.py
"""

import os

import pytest
from oracle import cases

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_resume_matrix_in_the_docs_is_the_oracles():
    with open(os.path.join(ROOT, "docs", "resume-matrix.md")) as f:
        written = f.read()
    assert written == cases.matrix(), "run: python tests/plugins/oracle/cases.py > docs/resume-matrix.md"
