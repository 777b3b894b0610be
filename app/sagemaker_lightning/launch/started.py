"""When a job's attempt started, for its goodput (goodput.py): PID 1 records the container's start in STARTED_AT as it
starts the command; a process without the image's entrypoint takes its own start. No torch, no Lightning: PID 1
imports it.

    python -c "from sagemaker_lightning.launch import started; print(started.started_at())"
"""

import os
import time

STARTED_AT = "SAGEMAKER_LIGHTNING_STARTED_AT"  # the container's start (time.time()), as PID 1 gives it its command


def started_at(env=os.environ) -> float:
    """When this attempt started: the job's container (PID 1's record), else this process (a process without the
    image's entrypoint: SDK 3.x's driver, a laptop; and the ranks torchrun restarted inside a job, whose attempt
    begins with them)."""
    try:
        if not int(env.get("TORCHELASTIC_RESTART_COUNT") or 0):
            return float(env[STARTED_AT])
    except (KeyError, ValueError):
        pass
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()
