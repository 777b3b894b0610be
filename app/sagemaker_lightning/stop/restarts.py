"""What a job needs from its platform to survive a restart, said at the start in one line each:
  - a checkpoint directory that outlives the container: off SageMaker (which syncs its own to S3) checkpoint.dirpath on
    a shared volume or s3://; none, or one on the container's own filesystem, is a warning (ephemeral);
  - a stop's checkpoint inside the grace between SIGTERM and SIGKILL (Kubernetes: terminationGracePeriodSeconds, 30 s
    by default; SageMaker: 120 s): the first save's time, measured, is compared with stop_grace_s (grace_line);
  - under torchrun, which restart this is (TORCHELASTIC_RESTART_COUNT, per host) and why the previous attempt's
    processes on this host ended: each failure line they left in torchrun's error file (failure.report writes it),
    or none: a signal (restart_line); a store shared across attempts, which a restart cannot trust (shared_store_line);
    across SageMaker hosts, a checkpoint directory that is each host's own (unshared_line);
  - in a SageMaker tuning job's child, the checkpoint folder of its own that it resumes from, never a sibling's
    (child_line; launch/paths.py, child_checkpoint_dir).
No torch.

    python -c "from sagemaker_lightning.stop import restarts; print(restarts.ephemeral('/tmp/ckpt', open('/proc/self/mountinfo').read()))"
"""

import json
import os
import re
from collections.abc import Mapping

from sagemaker_lightning import failure
from sagemaker_lightning.launch.plan import UNSHARED_STORE
from sagemaker_lightning.launch.platforms import kubeflow, sagemaker
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import remote

STOP_MARGIN_S = 5  # what a stop takes besides the save: the ranks' agreement, the process's exit
EPHEMERAL_ROOTS = ("kubernetes.io~empty-dir",)  # a volume that goes with its pod (mountinfo's root field)
MOUNTINFO = "/proc/self/mountinfo"


def ephemeral(path: str, mountinfo: str) -> str | None:
    """Why `path` goes with this container (its own filesystem, an emptyDir), or None when it is on a mount that
    outlives it or a URL. `mountinfo`: /proc/self/mountinfo's text."""
    if remote(path):
        return None
    path = os.path.abspath(path)
    best = ("", "", "")  # (mount point, root, filesystem type) of the longest mount point above `path`
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        fstype = line.split(" - ", 1)[1].split()[0]
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
            best = (point, root, fstype)
    point, root, fstype = best
    if point == "/":
        return f"on this container's own filesystem ({fstype})"
    if any(mark in root for mark in EPHEMERAL_ROOTS):
        return "on an emptyDir volume, which goes with its pod"
    return None


def directory_line(dirpath: str | None, mountinfo: str) -> str | None:
    """The warning for a checkpoint directory a restarted pod or gang would not find, or None."""
    fix = "point checkpoint.dirpath at a shared volume (a PersistentVolumeClaim, NFS, FSx) or s3://"
    if not dirpath:
        return f"warning: no checkpoint.dirpath: a restarted pod or gang starts over from the first step; {fix}"
    if why := ephemeral(dirpath, mountinfo):
        return f"warning: checkpoint.dirpath={dirpath} is {why}: a restarted pod or gang starts over; {fix}"
    return None


def grace_s(given: float | None, on_sagemaker: bool) -> float:
    """stop_grace_s: the user's, else the platform's default."""
    return given or (sagemaker.GRACE_S if on_sagemaker else kubeflow.TERMINATION_GRACE_S)


def grace_line(save_s: float, grace: float) -> str | None:
    """The warning when a stop's save, as long as the one measured, would not end within the grace."""
    if save_s + STOP_MARGIN_S <= grace:
        return None
    return (
        f"warning: saving last.ckpt took {save_s:.1f} s; with a stop's {STOP_MARGIN_S} s more it does not fit the "
        f"{grace:g} s between SIGTERM and SIGKILL (stop_grace_s): a stop would lose its checkpoint; raise the pod's "
        "terminationGracePeriodSeconds and stop_grace_s together"
    )


def previous_failures(error_file: str, restart: int) -> dict[int, str | None]:
    """The previous attempt's processes on this host: local rank → its failure line, or None where it left none.
    torchrun keeps <log_dir>/<run id>/attempt_<n>/<local rank>/error.json (its documented layout)."""
    attempt = os.path.dirname(os.path.dirname(error_file))
    if not re.fullmatch(rf"attempt_{restart}", os.path.basename(attempt)):
        return {}
    before = os.path.join(os.path.dirname(attempt), f"attempt_{restart - 1}")
    found: dict[int, str | None] = {}
    for name in sorted(os.listdir(before) if os.path.isdir(before) else [], key=lambda n: (len(n), n)):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(before, name, "error.json")) as f:
                message = json.load(f).get("message")
            found[int(name)] = message.get("message") if isinstance(message, dict) else message
        except (OSError, ValueError, AttributeError):
            found[int(name)] = None
    return found


def max_restarts(env: Mapping[str, str]) -> int:
    """How many times torchrun restarts its worker group (TORCHELASTIC_MAX_RESTARTS), 0 where it does not."""
    restarts = env.get("TORCHELASTIC_MAX_RESTARTS", "0")
    return int(restarts) if restarts.isdigit() else 0


def shared_store_line(env: Mapping[str, str]) -> str | None:
    """The warning for torchrun that restarts its ranks over a store it keeps across attempts (its default since torch
    2.4): a restarted rank may read a dead rank's address there and fail again (gloo: "Connection refused"; seen here
    with torch 2.14.1, tests/container/test_platforms.py). The torchrun the runtime starts has a new store each time."""
    restarts = max_restarts(env)
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or restarts == 0:
        return None
    return (
        f"warning: torchrun restarts the ranks (--max-restarts={restarts}) over one store for every attempt: a "
        f"restarted rank can read a dead rank's address and fail again; start torchrun with {UNSHARED_STORE}=1"
    )


def unshared_line(plan, dirpath: str | None, env: Mapping[str, str]) -> str | None:
    """The warning for in-job recovery across SageMaker hosts whose checkpoint directory is each host's own
    (/opt/ml/checkpoints: SageMaker restores it on every host only when it restarts the job): a restart that puts
    global rank 0 on another host, or any rank on a host that did not write last.ckpt, finds none."""
    restarts = max_restarts(env)
    if not (plan.on_sagemaker and len(plan.hosts) > 1 and restarts > 0):
        return None
    if dirpath and remote(dirpath):
        return None
    return (
        f"warning: torchrun restarts the ranks (max_restarts={restarts}) but checkpoint.dirpath={dirpath} is each "
        "host's own: a restarted rank on a host that did not write last.ckpt finds none; set checkpoint.dirpath to "
        "s3://... (or a file system every host mounts) for in-job recovery across hosts"
    )


def child_line(plan, dirpath: str | None) -> str | None:
    """In a tuning job's child that keeps the plan's checkpoint directory: the folder of its own (Plan.checkpoint_dir)
    inside the one all the tuning job's children share."""
    if not (plan.objective and plan.job_name and dirpath and dirpath == plan.checkpoint_dir):
        return None
    return (
        f"tuning job's child {plan.job_name}: its checkpoints in {dirpath}, a folder of its own in the checkpoint "
        "directory every child of the tuning job shares: a restart of this child resumes its own, never a sibling's"
    )


def restart_line(env: Mapping[str, str], host: str) -> str | None:
    """Under torchrun after a restart of this host's processes: which restart, and how the previous ones ended."""
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if restart <= 0:
        return None
    ended = previous_failures(env.get("TORCHELASTIC_ERROR_FILE", ""), restart)
    said = "; ".join(
        f"local rank {r}: {line}"
        if line
        else f"local rank {r} ended without a line (a signal: SIGKILL, most often the out-of-memory killer, or a crash)"
        for r, line in ended.items()
    )
    return (
        f"restart {restart} of torchrun's worker group on host {host} (TORCHELASTIC_RESTART_COUNT={restart}): every "
        f"rank resumes from last.ckpt{'; before it, ' + said if said else ''}"
    )


def announce(plan, dirpath: str | None) -> None:
    """At the start of a job's trainer: the restart line (each host's first process), the previous attempt's line
    taken out of the host's failure file (failure.forget); on global rank 0 the warnings
    on what a restart could not use: a store shared across torchrun's attempts, a checkpoint directory that is each
    SageMaker host's own, or (elsewhere) one that goes with the container; and a tuning job's child's own folder.
    torchrun's variables as the plan read them (Plan.environment)."""
    env = plan.environment
    if plan.launcher == "torchrun" and env.get("LOCAL_RANK") == "0" and (line := restart_line(env, plan.host)):
        say(line)
        failure.forget(env)  # the previous attempt's line, now in the restart line: a later failure names the job's
    if not plan.rank_zero:
        return
    for line in (shared_store_line(env), unshared_line(plan, dirpath, env), child_line(plan, dirpath)):
        if line:
            say(line)
    if not plan.on_sagemaker:
        try:
            with open(MOUNTINFO) as f:
                mounts = f.read()
        except OSError:
            mounts = ""
        if line := directory_line(dirpath, mounts):
            say(line)
