"""What PID 1 prepares before the toolkit runs: which network interface replaces one the container lacks
(boot/prepare.py)."""

import pytest

from sagemaker_lightning.boot import prepare

pytestmark = pytest.mark.unit

ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010012AC\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000012AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
"""


def test_default_interface_is_the_default_routes():
    assert prepare.default_interface(ROUTES) == "eth0"
    assert prepare.default_interface(ROUTES.splitlines()[0]) is None


def test_a_missing_interface_is_replaced():
    config = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "ethwe"}
    assert prepare.repaired(config, {"lo", "eth0"}, "eth0") == {**config, "network_interface_name": "eth0"}


def test_an_existing_interface_stays():
    config = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}
    assert prepare.repaired(config, {"lo", "eth0"}, "eth0") is None
    assert prepare.repaired({**config, "network_interface_name": "ethwe"}, {"lo"}, None) is None  # nothing better
