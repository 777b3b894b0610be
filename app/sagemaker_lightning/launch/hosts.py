"""Whether the job's host names resolve: a container's or pod's name resolves once it runs, which may be after this
one starts, so each is tried again every second until dist_timeout. PID 1 waits for every host of a SageMaker job
(boot/prepare.py), a training process for its first host (cli/checks.py). No torch.

    python -c "from sagemaker_lightning.launch.hosts import unresolved; print(unresolved(['localhost', 'x.invalid'], 0))"
"""

import socket
import time
from collections.abc import Callable


def unresolved(
    hosts: list[str], timeout_s: float, resolve: Callable[[str], str] = socket.gethostbyname, pause=time.sleep
) -> str | None:
    """The first of `hosts` whose name does not resolve within `timeout_s`, or None when all do."""
    deadline = time.monotonic() + timeout_s
    for host in hosts:
        while True:
            try:
                resolve(host)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    return host
                pause(1)
    return None
