"""What the runtime's LightningCLI checks around building the trainer, so that a job fails at its start, in one line,
not after hours of training or in a collective: the outputs can be written, the first host's name resolves, the
trainer's world is the job's.

    python -c "from sagemaker_lightning.cli import checks; checks.check_writable({'model_dir': '/tmp/out'})"
"""

import os
import tempfile
from collections.abc import Mapping

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.hosts import unresolved
from sagemaker_lightning.launch.plan import Plan
from sagemaker_lightning.toolbox.location import remote


def check_writable(paths: Mapping[str, str | None]) -> None:
    """Each output directory of `paths` (setting → directory) can be written; a URL is the store's to check."""
    for key, path in paths.items():
        if not path or remote(path):
            continue
        try:
            os.makedirs(path, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        except OSError as e:
            raise UserError(f"{key}={path} cannot be written ({e.strerror}); point it at a writable directory") from e


def check_first_host(plan: Plan) -> None:
    """The job's first host (MASTER_ADDR) resolves within dist_timeout: a Kubernetes pod's name resolves once its pod
    runs, which may be after this one starts."""
    if host := unresolved([plan.master_addr], plan.timeout_s):
        raise UserError(
            f"cannot resolve the first host {host!r} within dist_timeout={plan.timeout_s:g} s: its pod or container "
            "did not start, or the name is wrong; check the job's hosts (MASTER_ADDR, PET_MASTER_ADDR, SLURM_NODELIST) "
            "and its network"
        )


def check_world_size(plan: Plan, num_nodes: int, devices_per_node: int) -> None:
    """Fail before any collective call when the trainer's world differs from the cluster it runs on."""
    if not plan.in_job:
        return
    if num_nodes != len(plan.hosts):
        raise UserError(
            f"trainer.num_nodes={num_nodes} but the job has {len(plan.hosts)} hosts; "
            "leave trainer.num_nodes unset in a job"
        )
    if devices_per_node != plan.processes_per_host:
        raise UserError(
            f"trainer.devices={devices_per_node} but the launcher started {plan.processes_per_host} processes per "
            "host; leave trainer.devices unset or set it to that number"
        )
