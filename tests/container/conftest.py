"""The image, built from this checkout, and SageMaker local mode (real SDK, real docker compose) around it.

Without a Docker engine the tier is skipped, or fails when REQUIRE_ALL_TIERS=1 (as in CI).
"""

import os
import re
import shutil
import subprocess
import sys

import certifi
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = "sagemaker-lightning:test"
# The CA bundle given to the build carries this line; test_reliability checks it never reaches the image
BUILD_MARKER = "sagemaker-lightning-build-secret-marker"


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
def build_marker() -> str:
    return BUILD_MARKER


@pytest.fixture(scope="session")
def image(tmp_path_factory) -> str:
    """The pypi flavor built from this checkout, with the machine's CA bundle for pip (or certifi's) plus the marker."""
    problem = docker_problem()
    if problem:
        if os.environ.get("REQUIRE_ALL_TIERS") == "1":
            pytest.fail(f"container tier required but {problem}")
        pytest.skip(problem)
    source = os.environ.get("PIP_CA_BUNDLE") or os.environ.get("PIP_CERT") or ""
    bundle = tmp_path_factory.mktemp("build") / "ca-bundle.pem"
    with open(source if os.path.isfile(source) else certifi.where()) as f:
        bundle.write_text(f.read() + f"\n# {BUILD_MARKER}: a build secret, never to be found in the image\n")
    name, tag = IMAGE.split(":")
    build = subprocess.run(["make", "build", "FLAVOR=pypi", f"IMAGE={name}", f"TAG={tag}", f"PIP_CA_BUNDLE={bundle}"],
                           cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    yield IMAGE
    remove_containers(IMAGE)


def remove_containers(image: str) -> None:
    """Local mode never removes its containers."""
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={image}"], capture_output=True, text=True).stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


@pytest.fixture
def local_job(image, tmp_path):
    """Run scripts/run_sagemaker.py in local mode; return (exit code, output without colours, output dir)."""

    def run(instance_count: int, data_dir: str, *words: str, sdk: str = "v2", env: dict | None = None):
        """words: run_sagemaker.py options and key=value hyperparameters; sdk: which venv's SDK runs it."""
        out = tmp_path / "runs"
        python = sys.executable if sdk == "v2" else os.path.join(ROOT, ".venv-sdk3", "bin", "python")
        cmd = [python, os.path.join(ROOT, "scripts", "run_sagemaker.py"), "--image", image,
               "--instance-type", "local", "--instance-count", str(instance_count),
               "--input", data_dir, "--output", str(out), *words]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})
        remove_containers(image)
        output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr).replace("\r", "")
        return proc.returncode, output, out

    return run
