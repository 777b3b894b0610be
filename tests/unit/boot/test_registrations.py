"""How a training process ends, as PID 1 sees it: its stop registration (signals.py) goes with it, and one left by a
process that is gone (SIGKILLed: no exit handler ran) names no process of today, even when its PID is reused; a run
that ended normally waits SETTLE_S after leaving its process group (process.leave_process_group).

    .venv/bin/python -m pytest tests/unit/boot/test_registrations.py -q
"""

import os
import signal
import subprocess
import sys

import pytest

from sagemaker_lightning.boot import signals
from sagemaker_lightning.stop import process

pytestmark = pytest.mark.unit

HANG_S = 60  # a wait that ends a test which would otherwise hang: many times what it needs


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))
    return tmp_path / "run"


def python(code: str, run_dir, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "SAGEMAKER_LIGHTNING_RUN_DIR": str(run_dir)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, **kwargs)


def test_a_finished_trainer_leaves_no_registration(run_dir):
    """One that ends normally, one that ends on SIGTERM as a stopped trainer does: none left. A process it forks (a
    DataLoader worker) and that ends first does not take the trainer's registration with it."""
    code = """
import os, signal, sys, time
from sagemaker_lightning.boot import signals
signals.register(os.getpid())
if os.fork() == 0:
    sys.exit(0)  # a forked child ends normally, running the exit handlers it inherited
os.wait()
assert signals.registered() == [os.getpid()], signals.registered()
if sys.argv[1:] == ["stop"]:
    signal.signal(signal.SIGTERM, lambda *args: sys.exit(143))
    print("registered", flush=True)
    time.sleep(60)
"""
    assert python(code, run_dir).wait(timeout=HANG_S) == 0
    assert signals.registered() == [] and os.listdir(run_dir / "trainers") == []
    stopped = subprocess.Popen(
        [sys.executable, "-c", code, "stop"],
        env={**os.environ, "SAGEMAKER_LIGHTNING_RUN_DIR": str(run_dir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stopped.stdout.readline() == "registered\n"
    assert signals.registered() == [stopped.pid]
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=HANG_S) == 143
    assert os.listdir(run_dir / "trainers") == []


def test_a_registration_whose_process_is_gone_is_dropped(run_dir):
    """A trainer SIGKILLed (its exit handler never runs): its registration is dropped, not kept for its PID's next
    process; so is one whose PID now names a process that started later (the PID reused)."""
    trainer = python("import os, time; from sagemaker_lightning.boot import signals; signals.register(os.getpid()); "
                     "print(flush=True); time.sleep(60)", run_dir, stdout=subprocess.PIPE)  # fmt: skip
    trainer.stdout.readline()
    assert signals.registered() == [trainer.pid]
    trainer.kill()
    trainer.wait()
    assert signals.registered() == [] and os.listdir(run_dir / "trainers") == []

    other = subprocess.Popen(["sleep", "60"])  # an unrelated process, on a PID an earlier trainer registered
    try:
        (run_dir / "trainers" / str(other.pid)).write_text("1")  # that trainer's start: 1 tick after boot
        assert signals.registered() == [] and os.listdir(run_dir / "trainers") == []
    finally:
        other.kill()
        other.wait()


class Recorder:
    """What leave_process_group does, in order, and whether the process group was up then."""

    def __init__(self, torch_distributed):
        self.dist, self.destroy_group, self.done = torch_distributed, torch_distributed.destroy_process_group, []

    def destroy(self, *args):
        self.done.append(("destroy", self.dist.is_initialized()))
        self.destroy_group(*args)

    def sleep(self, seconds):
        self.done.append(("sleep", seconds, self.dist.is_initialized()))


SOAKED_S = 1.0  # the wait scripts/soak_exit.py found enough (0 aborts in 60 runs): a shorter one is untested


def test_a_normal_end_waits_after_leaving_the_process_group(monkeypatch, tmp_path):
    """The abort the wait prevents (a gloo thread ended mid-C++ at interpreter exit, 3 in 48 runs: process.SETTLE_S)
    cannot be shown in CI; what prevents it can: the group is destroyed, then the process sleeps (GIL released) for at
    least the wait the soak found enough. Without the wait, or with it before the destroy or too short, this fails."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    recorder = Recorder(dist)
    monkeypatch.setattr(dist, "destroy_process_group", recorder.destroy)
    monkeypatch.setattr(process.time, "sleep", recorder.sleep)  # time.sleep releases the GIL; a busy wait would not
    try:
        process.leave_process_group()
    finally:
        if dist.is_initialized():
            recorder.destroy_group()
    assert recorder.done == [("destroy", True), ("sleep", process.SETTLE_S, False)]
    assert process.SETTLE_S >= SOAKED_S
