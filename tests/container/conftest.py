"""The image, built from this checkout, and SageMaker local mode (real SDK, real docker compose) around it.

Without a Docker engine the tier is skipped, or fails when REQUIRE_ALL_TIERS=1 (as in CI).
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "sagemaker-lightning:test"


def docker_problem() -> str | None:
    """Why local mode cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine answers `docker info`"
    compose = subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    if not compose and shutil.which("docker-compose") is None:
        return "neither `docker compose` nor docker-compose"
    return None


@pytest.fixture(scope="session")
def image() -> str:
    problem = docker_problem()
    if problem:
        if os.environ.get("REQUIRE_ALL_TIERS") == "1":
            pytest.fail(f"container tier required but {problem}")
        pytest.skip(problem)
    name, tag = IMAGE.split(":")
    build = subprocess.run(["make", "build", "FLAVOR=pypi", f"IMAGE={name}", f"TAG={tag}"], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    return IMAGE


@pytest.fixture
def local_job(image, tmp_path):
    """Run scripts/run_sagemaker.py in local mode; return (exit code, output without colours, output dir)."""

    def run(instance_count: int, data_dir: str, *words: str, sdk: str = "v2"):
        """words: run_sagemaker.py options and key=value hyperparameters; sdk: which venv's SDK runs it."""
        out = tmp_path / "runs"
        python = sys.executable if sdk == "v2" else os.path.join(ROOT, ".venv-sdk3", "bin", "python")
        cmd = [python, os.path.join(ROOT, "scripts", "run_sagemaker.py"), "--image", image,
               "--instance-type", "local", "--instance-count", str(instance_count),
               "--input", data_dir, "--output", str(out), *words]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        # local mode never removes its containers: remove this job's
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={image}"], capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
        output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr).replace("\r", "")
        return proc.returncode, output, out

    return run
