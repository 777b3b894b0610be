"""This process's launch plan, read once when the runtime's LightningCLI is made (cli/hub.py): the environment, the
job's typed hyperparameters (hyperparameters.json) and its checkpoint directory (checkpointconfig.json), and what the
platform does not say of this host: its network interfaces, GPUs and name. No torch: the GPUs are counted where the
process has imported it.

    python -c "from sagemaker_lightning.launch import here; print(here.plan({}).line())"
"""

import socket
import sys
from collections.abc import Mapping

from sagemaker_lightning.launch import hyperparameters, paths
from sagemaker_lightning.launch.plan import Plan, make_plan


def interfaces() -> set[str]:
    """This host's network interfaces."""
    return {name for _, name in socket.if_nameindex()}


def host() -> dict:
    """What the plan asks of this host where the platform does not say: its GPUs (the CLI has imported torch by then;
    the count does not initialise CUDA) and its name."""
    torch = sys.modules.get("torch")
    return {"gpus": torch.cuda.device_count() if torch else 0, "hostname": socket.gethostname()}


def plan(env: Mapping[str, str]) -> Plan:
    """The plan from `env` and this host, before the trainer's settings complete it (cli/job.py)."""
    sent = hyperparameters.sent(env)
    read = {"checkpoint_dir": paths.checkpoint_dir(env), "objective": hyperparameters.objective(sent)}
    return make_plan(dict(env), interfaces(), **read, hyperparameters=hyperparameters.projects(sent), **host())
