"""How a local-mode job ended, read from what it left rather than from docker compose's exit code.

docker-compose 1.29 (Debian's, which the SDKs run when `docker compose` is missing) can exit 0 for a container that
exited 1: `up --abort-on-container-exit` reads the container's state once its log ends, and on a loaded machine Docker
has not recorded the exit yet (its maintainers call that exit code unreliable: docker/compose#3725). The SDKs then
report a failed job as done. SageMaker itself decides by the failure file (/opt/ml/output/failure), which both SDKs'
local mode pack into output.tar.gz beside model.tar.gz: so does this.

    from jobs import outcome
    outcome.run(job)  # the model's URI; a RuntimeError with the job's failure line if it failed
    outcome.failure("file:///tmp/runs/lightning-20261129-183853/model.tar.gz")  # the job's failure line, or None
"""

import os
import tarfile

from jobs import sdk2, sdk3
from jobs.spec import Job


def run(job: Job) -> str | None:
    """Start the job with its SDK and wait as it asks; the model.tar.gz URI, or a RuntimeError (as the SDKs raise for
    a failed job) with the failure line a local job's hosts left, whatever docker compose's exit code said."""
    model = (sdk2.run if job.sdk == "v2" else sdk3.run)(job)
    if job.local and model and (line := failure(model)):
        raise RuntimeError(line)
    return model


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
