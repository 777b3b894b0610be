"""How a local-mode job ended, read from its log rather than from docker compose's exit code.

docker-compose 1.29 (Debian's, which the SDKs run when `docker compose` is missing) can exit 0 for a container that
exited 1: after `up --abort-on-container-exit` it reads the container's state once its log ends, and on a loaded
machine Docker has not recorded the exit yet (its maintainers call that exit code unreliable: docker/compose#3725).
The SDKs then report a failed job as done. Compose's own line for each container, "NAME exited with code N", comes
from waiting on the container and is exact: a local job failed when a container exited with another code than 0, as
SageMaker decides by each host's exit. Its reason is the failure line its hosts left (/opt/ml/output/failure, which
both SDKs' local mode pack into output.tar.gz beside model.tar.gz). A failure file alone proves nothing: a job whose
torchrun restarted a lost rank and then finished keeps the line of the attempt that failed.

Only a local job's log is kept, in memory, for those lines (and for children.py, which reads a child's objective from
it): a cloud job's end is its SDK's to say, so its log, hours long with --wait, passes straight through unkept.

    from jobs import outcome
    model, log = outcome.run(job)  # the model's URI; the log of a local job, None for a cloud job
    # a RuntimeError with the job's failure line if it failed
"""

import contextlib
import os
import re
import sys
import tarfile
from typing import NamedTuple

from jobs import sdk2, sdk3
from jobs.spec import Job

COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # compose colours each host's prefix
EXITED = re.compile(r"(?m)^(\S+) exited with code (-?\d+)\r?$")  # compose's line for each container, at a line's start


class Tee:
    """Standard output that also keeps what passes through it: the job's log, as both SDKs write it there."""

    def __init__(self, stream):
        self.stream, self.text = stream, []

    def write(self, text: str) -> int:
        self.text.append(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


class Result(NamedTuple):
    """What run() returns: the model.tar.gz URI (None for a cloud job that did not wait) and a local job's log (None
    for a cloud job, whose output is not kept)."""

    model: str | None
    log: str | None


def run(job: Job) -> Result:
    """Start the job with its SDK and wait as it asks; the model.tar.gz URI and, for a local job, its log (a cloud
    job's passes straight through: None), or a RuntimeError (as the SDKs raise for a failed job) with the failure line
    of a local job whose container exited with an error, whatever docker compose's own exit code said."""
    start = sdk2.run if job.sdk == "v2" else sdk3.run
    if not job.local:  # nothing reads a cloud job's log: kept, a long job's with --wait would fill memory for nothing
        return Result(start(job), None)
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        model = start(job)
    log = "".join(tee.text)
    if line := failed(log, model):
        raise RuntimeError(line)
    return Result(model, log)


def failed(log: str, model: str | None) -> str | None:
    """None when every container in the log of a local job exited 0; else the failure line its hosts left (the
    output.tar.gz beside `model`, a file:// URI), or the first container's exit when they left none."""
    exits = [(name, code) for name, code in EXITED.findall(COLOUR.sub("", log)) if code != "0"]
    if not exits:
        return None
    return (model and failure(model)) or f"container {exits[0][0]} exited with code {exits[0][1]}"


def failure(model: str) -> str | None:
    """The failure line a local job's hosts wrote (the output.tar.gz beside `model`, a file:// URI), or None."""
    packed = os.path.join(os.path.dirname(model.removeprefix("file://")), "output.tar.gz")
    if not os.path.isfile(packed):
        return None
    with tarfile.open(packed) as tar:
        member = next((m for m in tar.getmembers() if m.name.lstrip("./") == "failure" and m.isfile()), None)
        if member is None:
            return None
        text = tar.extractfile(member).read().decode(errors="replace").strip()
    return text.splitlines()[-1] if text else "its failure file is empty"
