"""The image, built from this checkout, and SageMaker local mode (real SDK, real docker compose) around it;
a local container registry for the push tests.

Without a Docker engine (or docker-registry) the tier is skipped, or fails when REQUIRE_ALL_TIERS=1 (as in CI).
"""

import os
import re
import shutil
import subprocess
import sys

import bcrypt
import certifi
import pytest
from compose_jobs import STARTED, remove_containers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The image the tier builds and runs; another name lets two checkouts test side by side on one engine
IMAGE = os.environ.get("TEST_IMAGE", "sagemaker-lightning:test")
# The CA bundle given to the build carries this line; test_image_secrets checks it never reaches the image
BUILD_MARKER = "sagemaker-lightning-build-secret-marker"
REGISTRY = "/usr/bin/docker-registry"  # Debian's docker-registry package: the reference registry (distribution v2)


def docker_problem(compose: bool = True) -> str | None:
    """Why local mode (compose: False, plain Docker) cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker command"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine answers `docker info`"
    if not compose:
        return None
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    if not plugin and shutil.which("docker-compose") is None:
        return "neither `docker compose` nor docker-compose"
    return None


def require(problem: str | None) -> None:
    """Skip the test for this problem (a failure when REQUIRE_ALL_TIERS=1: tests/conftest.py)."""
    if problem:
        pytest.skip(f"the container tier cannot run here: {problem}")


@pytest.fixture
def registry(free_port, wait_until_up, tmp_path):
    """A function that starts a container registry on 127.0.0.1 and returns its host:port; users: {name: password}.

    Docker pushes to 127.0.0.0/8 over plain HTTP without configuration. Stopped, its storage removed, after the test.
    """
    require(
        docker_problem(compose=False)
        or (None if os.path.exists(REGISTRY) else f"no {REGISTRY} (apt-get install docker-registry)")
    )
    servers = []

    def start(users: dict[str, str] | None = None) -> str:
        host = f"127.0.0.1:{free_port()}"
        root = tmp_path / f"registry-{len(servers)}"
        (root / "storage").mkdir(parents=True)
        config = (
            f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root / 'storage'}\nhttp:\n  addr: {host}\n"
        )
        if users:  # htpasswd entries must be bcrypt
            lines = [
                f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}\n"
                for user, password in users.items()
            ]
            (root / "htpasswd").write_text("".join(lines))
            config += f"auth:\n  htpasswd:\n    realm: test\n    path: {root / 'htpasswd'}\n"
        (root / "config.yml").write_text(config)
        servers.append(
            subprocess.Popen(
                [REGISTRY, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
        wait_until_up(servers[-1], f"http://{host}/v2/", timeout_s=30)  # with users: 401, up and asking for credentials
        return host

    yield start
    for server in servers:
        server.terminate()
        server.wait()


@pytest.fixture(scope="session")
def build_marker() -> str:
    return BUILD_MARKER


@pytest.fixture(scope="session")
def image(tmp_path_factory, make) -> str:
    """The pypi flavor built from this checkout, with the machine's CA bundle for pip (or certifi's) plus the marker."""
    require(docker_problem())
    source = os.environ.get("PIP_CA_BUNDLE") or os.environ.get("PIP_CERT") or ""
    bundle = tmp_path_factory.mktemp("build") / "ca-bundle.pem"
    with open(source if os.path.isfile(source) else certifi.where()) as f:
        bundle.write_text(f.read() + f"\n# {BUILD_MARKER}: a build secret, never to be found in the image\n")
    name, tag = IMAGE.split(":")
    build = make(
        "build", "FLAVOR=pypi", f"IMAGE={name}", f"TAG={tag}", f"PIP_CA_BUNDLE={bundle}", capture_output=True, text=True
    )
    assert build.returncode == 0, build.stdout[-5000:] + build.stderr[-5000:]
    return IMAGE


@pytest.fixture(autouse=True)
def no_job_left():
    """A test, passed or failed, leaves none of its jobs (compose_jobs.start_job) or their containers, and touches
    no other's."""
    STARTED.clear()
    yield
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        remove_containers(proc.folder)


@pytest.fixture
def local_job(image, tmp_path):
    """Run scripts/run_sagemaker.py in local mode; return (exit code, output without colours, output dir)."""

    def run(instance_count: int, data_dir: str, *words: str, sdk: str = "v2", env: dict | None = None, command=()):
        """words: run_sagemaker.py options and key=value hyperparameters; sdk: which venv's SDK runs it; command:
        the words before the options (["tune"])."""
        out, env = tmp_path / "runs", {"TMPDIR": str(tmp_path / "tmp"), **(env or {})}  # the test's own (compose_jobs)
        os.makedirs(env["TMPDIR"], exist_ok=True)
        python = sys.executable if sdk == "v2" else os.path.join(ROOT, ".venv-sdk3", "bin", "python")
        cmd = [
            python,
            os.path.join(ROOT, "scripts", "run_sagemaker.py"),
            *command,
            "--image",
            image,
            "--instance-type",
            "local",
            "--instance-count",
            str(instance_count),
            "--input",
            data_dir,
            "--output",
            str(out),
            *words,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, **env})
        finally:
            remove_containers(tmp_path)
        output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr).replace("\r", "")
        return proc.returncode, output, out

    return run
