"""A local AWS API server, moto in server mode, for what only AWS runs: S3, ECR and CreateTrainingJob.

boto3, s3fs and both SageMaker SDKs reach it through AWS_ENDPOINT_URL; every test starts from an empty server.
"""

import subprocess
import sys
import urllib.request

import pytest


@pytest.fixture(scope="session")
def moto_endpoint(free_port, wait_until_up):
    url = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", url.rsplit(":", 1)[1]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until_up(server, f"{url}/moto-api/", timeout_s=60)
    yield url
    server.terminate()
    server.wait()


@pytest.fixture
def aws(moto_endpoint, monkeypatch) -> dict[str, str]:
    """The environment (also set in this process) that points AWS clients at a fresh moto server."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"))
    env = {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return env
