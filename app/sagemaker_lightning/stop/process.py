"""The training process's life around the trainer: which of Lightning's own processes ended and how (named in the
failure line), whether a GPU is usable (asked by the failure line), and how a run that ended normally leaves its
process group.

    python -c "from sagemaker_lightning.stop import process; print(process.cuda_available())"
"""

import logging
import re
import sys
import time

from sagemaker_lightning import failure
from sagemaker_lightning.launch.plan import Plan

SETTLE_S = 1.0  # after the process group is destroyed, for gloo's threads to let go of their last tensors (leave_process_group)


def leave_process_group() -> None:
    """After a run that ended normally (every rank is past the export's broadcast: nothing pending, no peer gone), the
    process group and its subgroups (fsdp's device meshes) are destroyed here, whatever the backend (Lightning destroys
    NCCL's group at exit, not gloo's), and the process waits SETTLE_S with the GIL released: a gloo worker thread drops
    its last collective's tensors just after the collective completes, and needs the GIL for it; if the interpreter is
    finalizing by then, Python ends that thread mid-C++ and the finished job aborts (`terminate called without an
    active exception`, exit -6). Two-host fsdp on 2 AMD EPYC cores, torch 2.14.1 (scripts/soak_exit.py): 3 of 48 runs
    aborted with the group destroyed and no wait (at exit the group's threads still run: FSDP's state holds the
    group), 0 of 60 with the wait (20 of them with another process keeping one core busy). Not after a failure: a peer
    may be gone, and the teardown could wait for it. The abort is too rare to test in CI; the order and the wait are
    (tests/unit/boot/test_registrations.py)."""
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        time.sleep(SETTLE_S)


def ended_children(trainer, wait_s: float = 0) -> list[tuple[int, int]]:
    """(local rank, exit code) of each process that Lightning's process launcher started here (local ranks 1..) and
    that ended with an error, waiting up to `wait_s` for one: a killed process's connections close before it ends."""
    procs = getattr(getattr(getattr(trainer, "strategy", None), "launcher", None), "procs", None) or []
    deadline = time.monotonic() + wait_s
    while not (ended := [(rank, p.returncode) for rank, p in enumerate(procs, start=1) if p.poll()]):
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return ended


class EndedChild(logging.Filter):
    """Lightning's process launcher checks its processes every few seconds; when one has ended with an error it logs
    so, then SIGKILLs them all, this one included (on GPUs the others wait in a collective meanwhile): the failure line
    is written on that log record, before the kill."""

    LOGGERS = [
        f"{fabric}.strategies.launchers.subprocess_script" for fabric in ("lightning_fabric", "lightning.fabric")
    ]
    RECORD = re.compile(r"\[rank: (\d+)\] Child process with PID \d+ terminated with code (-?\d+)")

    def __init__(self, plan: Plan):
        super().__init__()
        self.plan = plan

    def filter(self, record: logging.LogRecord) -> bool:
        if found := self.RECORD.search(record.getMessage()):
            local_rank, code = int(found[1]), int(found[2])
            rank = self.plan.node_rank * self.plan.processes_per_host + local_rank
            failure.report(failure.process_ended(self.plan.host, rank, local_rank, code))
        return True

    def attach(self) -> None:
        for name in self.LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.INFO)  # the record is an INFO one: seen even where Lightning is made quieter
            logger.addFilter(self)


def cuda_available() -> bool:
    """Whether a GPU is usable here, asked only where torch is imported already."""
    torch = sys.modules.get("torch")
    return bool(torch and torch.cuda.is_available())
