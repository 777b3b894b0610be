"""A job's start, once the runtime's LightningCLI has parsed its configuration (hub.py, step 2): the launch plan
completed with the resolved trainer settings (`completed`, pure), then, in a platform's job, what starts it (`start`):
the plan's variables set, the trainer's nodes and devices the job's, the first host resolvable (checks.py), torchrun
started where the plan says (the process torchrun starts runs the script again: docs/architecture.md), the plan said,
what a restart needs (stop/restarts.py), the stop's signal registered and a local rank's end named (stop/process.py).

    python -c "from sagemaker_lightning.cli import job; help(job.completed)"
"""

import os
import sys

from sagemaker_lightning.boot import signals
from sagemaker_lightning.cli import checks
from sagemaker_lightning.launch.plan import Plan
from sagemaker_lightning.launch.platforms.cluster import PER_HOST
from sagemaker_lightning.lines import say
from sagemaker_lightning.parallel import strategy
from sagemaker_lightning.stop import process, restarts


def completed(plan: Plan, config) -> Plan:
    """`plan` with the subcommand's resolved configuration: the trainer's accelerator and devices, the data's workers,
    dist_timeout and max_restarts."""
    trainer = config.get("trainer") or {}  # a project's trainer class may take none of Trainer's arguments
    workers = next((config[k] for k in ("data.num_workers", "data.init_args.num_workers") if k in config), True)
    accelerator, devices = trainer.get("accelerator", "auto"), trainer.get("devices", "auto")
    timeout, restarts = strategy.DIST_TIMEOUT.of(config), strategy.MAX_RESTARTS.of(config)
    return plan.completed(
        accelerator=accelerator, devices=devices, timeout_s=timeout, workers=bool(workers), max_restarts=restarts
    )


def start(plan: Plan, config) -> None:
    """The job's start, in a platform's job (module docstring); the trainer's settings in `config` set to the job's."""
    if not plan.in_job:
        return
    trainer = config.get("trainer") or {}
    plan.apply(os.environ, override=True)
    if trainer.get("num_nodes") == 1:  # Lightning's default: the job's hosts (another fails the world check)
        trainer.num_nodes = len(plan.hosts)
    if "devices" in trainer and trainer.devices in ("auto", -1, "-1", None):
        trainer.devices = plan.processes_per_host
    checks.check_first_host(plan)
    if command := strategy.torchrun_command(plan, sys.executable, sys.argv):
        os.execv(command[0], command)  # torchrun starts one process per device instead (Plan.torchrun)
    if plan.rank_zero:
        say(plan.line())
    restarts.announce(plan, config.get("checkpoint.dirpath"))
    signals.register(os.getpid())  # the image's entrypoint passes SIGTERM on to this process
    if plan.launcher == PER_HOST:
        process.EndedChild(plan).attach()  # a local rank killed for memory is named, not this process
