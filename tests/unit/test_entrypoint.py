"""The image's entrypoint: which network interface replaces one the container lacks."""

from sagemaker_lightning import entrypoint

ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010012AC\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000012AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
"""


def test_default_interface_is_the_default_routes():
    assert entrypoint.default_interface(ROUTES) == "eth0"
    assert entrypoint.default_interface(ROUTES.splitlines()[0]) is None


def test_a_missing_interface_is_replaced():
    config = {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "ethwe"}
    assert entrypoint.repaired(config, {"lo", "eth0"}, "eth0") == {**config, "network_interface_name": "eth0"}


def test_an_existing_interface_stays():
    config = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}
    assert entrypoint.repaired(config, {"lo", "eth0"}, "eth0") is None
    assert entrypoint.repaired({**config, "network_interface_name": "ethwe"}, {"lo"}, None) is None  # nothing better


def test_unresolved_names_the_host():
    assert entrypoint.unresolved(["localhost"], 1) is None
    assert entrypoint.unresolved(["localhost", "no-such-host.invalid"], 0) == "no-such-host.invalid"
