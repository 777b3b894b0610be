"""The image's entrypoint: which network interface replaces one the container lacks, a bad dist_timeout, and who
gets SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sagemaker_lightning import entrypoint
from sagemaker_lightning.failure import UserError

pytestmark = pytest.mark.unit

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


def test_a_bad_dist_timeout_is_one_line_at_pid_1():
    for given in ("ten", "None", "0", -5, 1.5, True):
        with pytest.raises(UserError, match=r"dist_timeout=.* is not a positive whole number of seconds; e\.g\. 600"):
            entrypoint.dist_timeout({"dist_timeout": given})
    assert entrypoint.dist_timeout({"dist_timeout": "30"}) == entrypoint.dist_timeout({"dist_timeout": 30}) == 30
    # SDK 2.x's Estimator with source_dir JSON-encodes every value; run_sagemaker.py passes words as strings
    assert entrypoint.dist_timeout({"dist_timeout": '"30"'}) == 30
    with pytest.raises(UserError, match="dist_timeout='-3' is not"):
        entrypoint.dist_timeout({"dist_timeout": '"-3"'})
    with pytest.raises(UserError, match=r"dist_timeout=100000000000000 must be .* at most 2419200 \(28 days"):
        entrypoint.dist_timeout({"dist_timeout": "100000000000000"})  # timedelta's range: a traceback before


# A launcher (as torchrun, mpirun or the toolkit are) that starts a trainer; each records the SIGTERM it receives
LAUNCHER = """
import os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *args: open(os.path.join(sys.argv[1], "launcher"), "w").close())
subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]])
"""
TRAINER = """
import os, signal, sys, time
from sagemaker_lightning import signals
def stop(*args):
    open(os.path.join(sys.argv[1], "trainer"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
signals.register(os.getpid())
open(os.path.join(sys.argv[1], "ready"), "w").close()
time.sleep(60)
"""


def test_sigterm_goes_to_the_registered_trainers_not_to_their_launcher(tmp_path):
    """SIGTERM to the entrypoint (SageMaker's stop): the registered trainer gets it and checkpoints; the launcher
    between them does not (mpirun or torchrun would end the trainer before its checkpoint is written)."""
    env = {**os.environ, "SAGEMAKER_LIGHTNING_RUN_DIR": str(tmp_path / "run"), "SAGEMAKER_BASE_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "sagemaker_lightning.entrypoint", sys.executable, "-c", LAUNCHER, str(tmp_path)]
    pid1 = subprocess.Popen(command + [TRAINER], env=env)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and pid1.poll() is None, "the trainer did not start"
        time.sleep(0.1)
    pid1.send_signal(signal.SIGTERM)
    assert pid1.wait(timeout=30) == 143
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["ready", "trainer"]


def handles(pid: int, signum: int) -> bool:
    """Whether process `pid` has installed a handler for `signum` (its SigCgt mask in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signum - 1)))


def test_a_stop_while_the_job_waits_for_its_hosts_ends_it_at_once(tmp_path):
    """SIGTERM while PID 1 waits for a host that never comes up (up to dist_timeout): exit 143 within seconds, one
    line on stderr and in the failure file; nothing runs the command. A PID 1 without a handler ignores SIGTERM, and
    SageMaker's SIGKILL would end it 120 s later."""
    config = tmp_path / "input" / "config"
    config.mkdir(parents=True)
    hosts = {"current_host": "localhost", "hosts": ["localhost", "no-such-host.invalid"]}
    (config / "resourceconfig.json").write_text(json.dumps(hosts))
    (config / "hyperparameters.json").write_text(json.dumps({"dist_timeout": "300"}))
    (tmp_path / "output").mkdir()
    env = {**os.environ, "SAGEMAKER_LIGHTNING_RUN_DIR": str(tmp_path / "run"), "SAGEMAKER_BASE_DIR": str(tmp_path)}
    env["SAGEMAKER_LIGHTNING_EXAMPLE"] = str(tmp_path / "example")
    (tmp_path / "example").mkdir()
    command = [sys.executable, "-m", "sagemaker_lightning.entrypoint", "touch", str(tmp_path / "ran")]
    pid1 = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not handles(pid1.pid, signal.SIGTERM):  # the handler, set from the first instruction
        assert time.monotonic() < deadline and pid1.poll() is None, "the entrypoint did not start"
        time.sleep(0.05)
    time.sleep(1)  # inside the host wait
    pid1.send_signal(signal.SIGTERM)
    assert pid1.wait(timeout=15) == 143
    line = "stopped by SIGTERM while the job was starting (waiting for its hosts, exchanging SSH keys)"
    (error,) = [e for e in pid1.stderr.read().splitlines() if e.startswith("ERROR:")]
    assert error.startswith(f"ERROR: {line}")
    assert (tmp_path / "output" / "failure").read_text().startswith(line)
    assert not (tmp_path / "ran").exists()
