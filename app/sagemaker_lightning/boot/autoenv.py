"""Runs at the start of every Python process in the image (the .pth file docker/Dockerfile puts in site-packages):
on a SageMaker host, the launch plan's variables (plan.py) become defaults of the process's environment, so that a
plain Lightning script — a Trainer() without num_nodes, started by the toolkit or by SDK 3.x's driver — spans the
job unchanged: MASTER_ADDR, NODE_RANK, WORLD_SIZE, and Lightning's PL_TRAINER_NUM_NODES, PL_TRAINER_DEVICES and
PL_TRAINER_DEFAULT_ROOT_DIR (what it writes under its default root lands in output.tar.gz). Variables already set
stay; the runtime's LightningCLI sets its own from the resolved configuration. And the training toolkit's line that
SageMaker's own tuning objective (_tuning_objective_metric=validation:accuracy, text by design) is not JSON, which it
logs at each of its seven and more reads of hyperparameters.json a host, is kept out. In the training program itself,
the collector is paused while it starts (collector.py). Off SageMaker it does nothing.

    python -c "import os; print(os.environ.get('NODE_RANK'))"   # on the second host of a job: 1
"""

import logging
import os
import socket
import sys

from sagemaker_lightning.boot import collector
from sagemaker_lightning.launch import plan as launch_plan
from sagemaker_lightning.launch.hyperparameters import TUNING_OBJECTIVE
from sagemaker_lightning.launch.platforms import sagemaker


def said_by_toolkit(record: logging.LogRecord) -> bool:
    """Whether a record of the toolkit's logger is said: not its "Failed to parse hyperparameter" of SageMaker's own
    tuning objective (a project's value that is not JSON is still said)."""
    own = isinstance(record.args, tuple) and record.args[:1] == (TUNING_OBJECTIVE,)
    return not (own and str(record.msg).startswith("Failed to parse hyperparameter"))


def apply(env=os.environ) -> None:
    if not sagemaker.started(env):  # SageMaker only: elsewhere Lightning finds a plain script's cluster
        return
    if collector.training_program(sys.argv, env):
        collector.pause()  # until the runtime's LightningCLI has built its classes (collector.py)
    logging.getLogger("sagemaker-training-toolkit").addFilter(said_by_toolkit)  # made by name: before the toolkit
    try:
        plan = launch_plan.make_plan(env, {name for _, name in socket.if_nameindex()})
    except Exception:  # a bad environment: the runtime's CLI names it; a Python start never fails here
        return
    plan.apply(env, override=False)


apply()
