"""scripts/first_model.py's check that the rebuild it times holds the change it made, without Docker: the changed
file as a container of the rebuilt image would read it back.

    .venv/bin/pytest tests/unit/scripts/test_first_model.py
"""

import subprocess

import pytest

from first_model import CHANGED, IN_IMAGE, change_missing

pytestmark = pytest.mark.unit

BEFORE = "class ImageClassifier:\n    pass\n"
AFTER = BEFORE + "# a one-line change, 0123abcd\n"


def read_back(stdout: str = "", returncode: int = 0, stderr: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["docker", "run"], returncode, stdout, stderr)


def test_a_rebuild_that_holds_the_change_passes():
    assert change_missing(AFTER, read_back(AFTER)) is None


@pytest.mark.parametrize("built", [BEFORE, AFTER + "\n", ""], ids=["the old file", "other content", "empty"])
def test_a_rebuild_without_the_change_is_named(built):
    assert change_missing(AFTER, read_back(built)) == (
        f"error: the rebuilt image's {IN_IMAGE} is not the changed {CHANGED}: the rebuild left the change out, so its "
        "time measures nothing; build with the clone's context and without a stale cache"
    )


def test_a_file_the_image_lacks_is_named_with_the_containers_error():
    missing = read_back(returncode=1, stderr="cat: /opt/x/model.py: No such file or directory\n")
    assert change_missing(AFTER, missing) == (
        f"error: could not read {IN_IMAGE} from the rebuilt image (exit 1: cat: /opt/x/model.py: No such file or "
        "directory)"
    )
    assert change_missing(AFTER, read_back(returncode=125)).endswith("(exit 125: no output)")
