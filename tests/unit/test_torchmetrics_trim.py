"""docker/torchmetrics_trim.py on a copy of the pinned torchmetrics' three modules that import scipy.signal: each
shim turned off, nothing else changed, a second run a no-op, and a module without the shim, or no torchmetrics, one
line and exit code 1.

    .venv/bin/pytest tests/unit/test_torchmetrics_trim.py
"""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "docker", "torchmetrics_trim.py")
MODULES = ("__init__.py", "audio/__init__.py", "functional/audio/__init__.py")


def test_the_scipy_shims_are_turned_off_once_and_a_missing_one_or_torchmetrics_stops_the_build(tmp_path):
    installed = importlib.util.find_spec("torchmetrics").submodule_search_locations[0]
    for name in MODULES:
        os.makedirs(tmp_path / "torchmetrics" / os.path.dirname(name), exist_ok=True)
        shutil.copy(os.path.join(installed, name), tmp_path / "torchmetrics" / name)

    def read():
        return {name: (tmp_path / "torchmetrics" / name).read_text().splitlines() for name in MODULES}

    def trim(*options):  # -S: no site-packages, so no torchmetrics unless this copy
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # this copy is the torchmetrics found
        return subprocess.run([sys.executable, *options, SCRIPT], env=env, capture_output=True, text=True, timeout=60)

    before = read()
    assert trim().returncode == 0
    after = read()
    for name in MODULES:
        changed = [(a, b) for a, b in zip(before[name], after[name], strict=True) if a != b]
        assert len(changed) == 1, name  # the guard's line only
        ((guard, off),) = changed
        assert guard.startswith("if ") and ("scipy" in guard or "SCIPI" in guard), guard
        assert off.startswith("if False:"), off
    assert trim().returncode == 0  # the dlc flavors' second run
    assert read() == after

    (tmp_path / "torchmetrics" / "audio" / "__init__.py").write_text("import torch\n")
    done = trim()
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert "audio/__init__.py has no scipy.signal shim" in done.stderr and "delete the step" in done.stderr

    shutil.rmtree(tmp_path / "torchmetrics")
    missing = trim("-S")
    assert missing.returncode == 1
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("error: torchmetrics is not installed")
