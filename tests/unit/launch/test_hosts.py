"""Whether the job's host names resolve within the timeout (launch/hosts.py)."""

import pytest

from sagemaker_lightning.launch.hosts import unresolved

pytestmark = pytest.mark.unit


def test_unresolved_names_the_host():
    assert unresolved(["localhost"], 1) is None
    assert unresolved(["localhost", "no-such-host.invalid"], 0) == "no-such-host.invalid"
