"""The trainer's distributed strategy: the launch plan's cluster, process-group backend and timeout, for every
strategy Lightning knows by name (ddp and its variants, deepspeed, ...) or a strategy object of the project's; `fsdp`
is the runtime's (fsdp.py: Lightning's own needs a GPU).

Lightning would guess the cluster itself: with mpi4py installed it tries MPI in a process mpirun did not start, and
without a timeout every collective waits torch's 30 minutes. The plan knows who started the processes.

    python -c "from sagemaker_lightning.parallel import strategy; help(strategy.arguments)"
"""

import inspect
from datetime import timedelta

from jsonargparse.typing import NonNegativeInt

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.plan import DEFAULT_TIMEOUT_S, Plan
from sagemaker_lightning.parallel import fsdp
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares, listed
from sagemaker_lightning.toolbox.lightning_package import attribute, made

# the plan's own settings: the hub completes the plan with them before any concern runs (cli/hub.py)
DIST_TIMEOUT = Setting("dist_timeout", int, DEFAULT_TIMEOUT_S, "seconds a rank waits for the others")
MAX_RESTARTS = Setting(  # platforms beyond SageMaker's training jobs (docs/platforms.md)
    "max_restarts",
    NonNegativeInt | None,
    None,
    "where the runtime starts torchrun (LAUNCHER=torchrun, a PyTorchJob or TrainJob): times every rank restarts from "
    "last.ckpt when one fails (null: the job's PET_MAX_RESTARTS, else 0)",
)


class LoneDDP:
    """DDP that leaves the model of a lone process unwrapped: with no other rank, DistributedDataParallel only adds
    work to every step (ResNet-18 batch 512 on an H100: 133 device copies for gradient buckets and buffer
    broadcasts, 5 collectives; 26,065 images/s wrapped vs 34,230 unwrapped, scripts/benchmark.py, torch 2.11)."""

    BASE = "strategies.DDPStrategy"

    def configure_ddp(self) -> None:
        if self.world_size > 1:
            super().configure_ddp()


def cluster_environment(pl, plan: Plan):
    """Lightning's cluster environment for the launcher: torchrun's variables, else MASTER_ADDR, NODE_RANK, ...
    (the plan set them for the process launcher, mpirun and srun). None outside a job: Lightning detects it."""
    if not plan.in_job:
        return None
    name = "TorchElasticEnvironment" if plan.launcher == "torchrun" else "LightningEnvironment"
    return attribute(pl, f"plugins.environments.{name}")()


def backend(plan: Plan) -> str | None:
    """The process-group backend: SMDDP's when the job enables it, else Lightning's choice (NCCL, gloo)."""
    if plan.backend == "smddp":
        try:
            import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401  registers the "smddp" backend
        except ImportError as e:
            raise UserError(
                "the job enables SMDDP (smdistributed dataparallel) but this image has no smdistributed.dataparallel; "
                "build FLAVOR=dlc-smddp or conda, or use pytorchddp"
            ) from e
    return plan.backend


def arguments(
    pl, plan: Plan, trainer_config: dict, plugins: list, fsdp_settings: fsdp.FSDPSettings | None = None
) -> dict:
    """Trainer arguments (`strategy`, `plugins`) that put the trainer on the plan's cluster, backend and timeout;
    `fsdp_settings`: the settings of trainer.strategy=fsdp."""
    cluster, chosen = cluster_environment(pl, plan), trainer_config.get("strategy", "auto")
    if chosen == "fsdp":  # FSDP2 on CPUs and GPUs, NCCL or gloo by device (fsdp.py); refused before SMDDP's import
        if plan.backend == "smddp":
            raise UserError(fsdp.SMDDP)
        timeout = timedelta(seconds=plan.timeout_s)
        return {"strategy": fsdp.strategy(pl, fsdp_settings or fsdp.FSDPSettings(), cluster, timeout, trainer_config)}
    wiring = {
        "cluster_environment": cluster,
        "process_group_backend": backend(plan),
        "timeout": timedelta(seconds=plan.timeout_s),
    }
    if chosen == "auto" and plan.world_size > 1:
        chosen = "ddp"  # what Lightning picks for several processes, here with the wiring
    registry = attribute(pl, "strategies.StrategyRegistry")
    if isinstance(chosen, str) and chosen in registry:
        cls, defaults = registry[chosen]["strategy"], registry[chosen]["init_params"]
        accepted = inspect.signature(cls.__init__).parameters
        if cls is attribute(pl, "strategies.DDPStrategy"):
            cls = made(LoneDDP, pl)
        return {"strategy": cls(**defaults, **{k: v for k, v in wiring.items() if k in accepted})}
    if plan.backend:
        raise UserError(f"SMDDP needs trainer.strategy=ddp, not {chosen!r}")
    if not isinstance(chosen, str):  # a strategy object the configuration built: wired where it was left unset
        if getattr(chosen, "cluster_environment", 1) is None:
            chosen.cluster_environment = cluster
        if hasattr(chosen, "_timeout") and chosen._timeout == attribute(pl, "strategies.ddp").default_pg_timeout:
            chosen._timeout = wiring["timeout"]
        return {}
    return {"plugins": [*plugins, cluster]} if cluster else {}


@declares(DIST_TIMEOUT, MAX_RESTARTS)
def concern(ctx: Context) -> Part:
    """The strategy (or, for a strategy object the configuration built, nothing: it is wired in place) on the plan's
    cluster, backend and timeout; trainer.strategy=fsdp with the `fsdp` settings."""
    plugins = listed(ctx.trainer.get("plugins"))
    return Part(arguments=arguments(ctx.pl, ctx.plan, ctx.trainer, plugins, ctx.init.get("fsdp")))


def torchrun_command(plan: Plan, python: str, argv: list[str]) -> list[str] | None:
    """The command that runs the script under torchrun, where the plan says the runtime starts it (LAUNCHER=torchrun
    on SageMaker, a PyTorchJob or TrainJob, several processes on a host where the platform started one): torchrun
    starts one process per device and, with a c10d rendezvous and --max-restarts, restarts them all when one fails.
    None otherwise."""
    if not plan.torchrun or plan.launcher != "process":
        return None
    return [python, "-m", "torch.distributed.run", *plan.torchrun, *argv]
