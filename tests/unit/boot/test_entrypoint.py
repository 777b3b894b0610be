"""The image's entrypoint: who gets SIGTERM (not a process on a stale registration's PID), and how long what the
command leaves gets once it ends (what it prepares: test_prepare.py; a bad dist_timeout: launch/test_plan.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.unit

# A launcher (as torchrun, mpirun or the toolkit are) that starts a trainer; each records the SIGTERM it receives
LAUNCHER = """
import os, signal, subprocess, sys
stopped = []
def stop(*args):  # after its trainer ended, or before (which could end the trainer before its checkpoint)
    when = "after" if os.path.exists(os.path.join(sys.argv[1], "trainer")) else "before"
    open(os.path.join(sys.argv[1], f"launcher {when} the trainer"), "w").close()
    stopped.append(args[0])
signal.signal(signal.SIGTERM, stop)
subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]])
if not stopped:  # signalled while it still waited for its trainer's exit: it ends now
    signal.pause()  # as torchrun with --max-restarts would restart the trainer: it ends when it is signalled
"""
TRAINER = """
import os, signal, sys, time
from sagemaker_lightning.boot import signals
def stop(*args):
    open(os.path.join(sys.argv[1], "trainer"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
signals.register(os.getpid())
open(os.path.join(sys.argv[1], "ready"), "w").close()
time.sleep(60)
"""


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGUSR1])
def test_sigterm_goes_to_the_registered_trainers_not_to_their_launcher(tmp_path, stop):
    """SIGTERM to the entrypoint (SageMaker's and Kubernetes' stop; SIGUSR1: HyperPod's graceful stop): the registered
    trainer gets SIGTERM and checkpoints; the launcher between them gets it only once the trainer has ended (mpirun or
    torchrun would end the trainer before its checkpoint is written; torchrun with --max-restarts would restart it)."""
    env = {**os.environ, "SAGEMAKER_LIGHTNING_RUN_DIR": str(tmp_path / "run"), "SAGEMAKER_BASE_DIR": str(tmp_path)}
    command = [
        sys.executable,
        "-m",
        "sagemaker_lightning.boot.entrypoint",
        sys.executable,
        "-c",
        LAUNCHER,
        str(tmp_path),
    ]
    pid1 = subprocess.Popen(command + [TRAINER], env=env)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and pid1.poll() is None, "the trainer did not start"
        time.sleep(0.1)
    pid1.send_signal(stop)
    assert pid1.wait(timeout=30) == 143
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "launcher after the trainer",
        "ready",
        "trainer",
    ]


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
    command = [sys.executable, "-m", "sagemaker_lightning.boot.entrypoint", "touch", str(tmp_path / "ran")]
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


HANG_S = 60  # a wait that ends a test which would otherwise hang: many times what it needs
# The entrypoint as PID 1 sees its processes: what its command leaves becomes its child (a child subreaper) and is
# waited for; LEFTOVER_GRACE_S from the first argument
AS_PID1 = """
import ctypes, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
from sagemaker_lightning.boot import entrypoint
entrypoint.LEFTOVER_GRACE_S = float(sys.argv.pop(1))
sys.exit(entrypoint.main())
"""


def as_pid1(tmp_path, grace_s: float, *command: str) -> subprocess.Popen:
    env = {**os.environ, "SAGEMAKER_LIGHTNING_RUN_DIR": str(tmp_path / "run"), "SAGEMAKER_BASE_DIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-c", AS_PID1, str(grace_s), *command], env=env)


def wait_for(path, pid1: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_S
    while not path.exists():
        assert time.monotonic() < deadline and pid1.poll() is None, f"no {path.name}"
        time.sleep(0.05)


# A process that runs on after the command: it records its PID, then (given "stays") ignores SIGTERM, else records it
LEFTOVER = """
import os, signal, sys, time
folder, name = sys.argv[1:3]
if sys.argv[3:] == ["stays"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *args: (open(os.path.join(folder, name + ".ended"), "w").close(), sys.exit()))
open(os.path.join(folder, name), "w").write(str(os.getpid()))
time.sleep(60)
"""
# PID 1's command: starts two leftovers (sshd for MPI), one ignoring SIGTERM, and ends, writing when
LEAVES = f"""
import os, subprocess, sys, time
folder = sys.argv[1]
for name, *how in (("stays", "stays"), ("goes",)):
    subprocess.Popen([sys.executable, "-c", {LEFTOVER!r}, folder, name, *how])
while not all(os.path.exists(os.path.join(folder, n)) for n in ("stays", "goes")):
    time.sleep(0.05)
open(os.path.join(folder, "ended"), "w").write(repr(time.monotonic()))
"""


def kill(pid_file) -> None:
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_what_the_command_leaves_gets_leftover_grace_s_not_more(tmp_path):
    """The command ends, leaving two processes: both get SIGTERM; the one that ends on it ends, and PID 1 ends
    LEFTOVER_GRACE_S after the command while the one ignoring it still runs (a stopped MPI job's container held on
    for its sshd)."""
    grace_s = 1.0
    pid1 = as_pid1(tmp_path, grace_s, sys.executable, "-c", LEAVES, str(tmp_path))
    try:
        assert pid1.wait(timeout=HANG_S) == 0
        ended_s = time.monotonic() - float((tmp_path / "ended").read_text())
        assert (tmp_path / "goes.ended").exists()  # SIGTERM reached what the command left
        assert os.path.exists(f"/proc/{(tmp_path / 'stays').read_text()}")  # not waited for: it sleeps on
        assert ended_s >= grace_s  # its grace given
    finally:
        pid1.kill()
        kill(tmp_path / "stays")
        kill(tmp_path / "goes")


# PID 1's command: an unrelated process (its own session, ignoring SIGTERM, recording it) on a PID an earlier trainer
# registered, then a trainer that registers and stops on SIGTERM
STALE = """
import os, signal, subprocess, sys, time
from sagemaker_lightning.boot import signals
folder = sys.argv[1]
other = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *args: open(os.path.join(sys.argv[1], "signalled"), "w").close())
open(os.path.join(sys.argv[1], "other"), "w").write(str(os.getpid()))
time.sleep(60)
''', folder], start_new_session=True)
while not os.path.exists(os.path.join(folder, "other")):
    time.sleep(0.05)
os.makedirs(os.path.join(signals.RUN_DIR, "trainers"), exist_ok=True)
open(os.path.join(signals.RUN_DIR, "trainers", str(other.pid)), "w").write("1")
signal.signal(signal.SIGTERM, lambda *args: sys.exit(143))
signals.register(os.getpid())
open(os.path.join(folder, "ready"), "w").close()
time.sleep(60)
"""


def test_a_stop_neither_signals_nor_waits_for_a_process_on_a_stale_registration(tmp_path):
    """SIGTERM to PID 1: the trainer gets it and ends; the process on the stale registration's PID gets nothing, and
    PID 1 ends while it still runs (it used to wait for it: up to STOP_GRACE_S)."""
    pid1 = as_pid1(tmp_path, 1.0, sys.executable, "-c", STALE, str(tmp_path))
    try:
        wait_for(tmp_path / "ready", pid1)
        pid1.send_signal(signal.SIGTERM)
        assert pid1.wait(timeout=HANG_S) == 143
        assert os.path.exists(f"/proc/{(tmp_path / 'other').read_text()}")  # not waited for: it sleeps on
        assert not (tmp_path / "signalled").exists()
    finally:
        pid1.kill()
        kill(tmp_path / "other")
