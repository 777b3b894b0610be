"""The checkpoints' part of the trainer (toolbox/concern.py): what a restarted job resumes from (ResumePoint), last.ckpt
(LastCheckpoint), writes in the background and retried reads (BackgroundCheckpointIO), the trained model (Export),
torch.compile's cache (CompileCache).

    python app/example/train.py ... --checkpoint.dirpath ckpts --last_checkpoint_every_n_steps 50 --model_dir out
"""

import functools

from jsonargparse.typing import PositiveFloat

from sagemaker_lightning.boot import signals
from sagemaker_lightning.checkpoints import compile_cache
from sagemaker_lightning.checkpoints.compile_cache import CompileCache
from sagemaker_lightning.checkpoints.export import Export
from sagemaker_lightning.checkpoints.interval import AUTO_INTERVAL_S
from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO
from sagemaker_lightning.checkpoints.last import LastCheckpoint
from sagemaker_lightning.checkpoints.layout import MODEL_DIR, sharding
from sagemaker_lightning.checkpoints.resume import ResumePoint
from sagemaker_lightning.launch.platforms import kubeflow, sagemaker
from sagemaker_lightning.stop import restarts
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares
from sagemaker_lightning.toolbox.lightning_package import made

EVERY_N_STEPS = Setting(
    "last_checkpoint_every_n_steps",
    int | None,
    None,
    "last.ckpt every N optimizer steps (after the validation that follows, if one does), besides each epoch's end and "
    f"SIGTERM (0: not by steps; null: not by steps where SIGTERM reaches the trainer, else about every {AUTO_INTERVAL_S} "
    "s of training)",
)
COMPILE_CACHE = Setting(  # compiled once per job, not once per restart (compile_cache.py)
    "compile_cache",
    bool,
    False,
    f"torch.compile's cache saved with the checkpoints ({compile_cache.FILE}) and loaded when the job resumes: it holds "
    "code torch runs, so turn it on only where no one else can write the checkpoint location",
)
STOP_GRACE = Setting(
    "stop_grace_s",
    PositiveFloat | None,
    None,
    f"seconds from a stop's SIGTERM to SIGKILL (null: {sagemaker.GRACE_S} on SageMaker, {kubeflow.TERMINATION_GRACE_S} "
    "elsewhere: Kubernetes' terminationGracePeriodSeconds); a first save of last.ckpt that would not fit is said",
)


def resume_point(model_checkpoint, model, sharded: bool, announce: bool) -> ResumePoint | None:
    """What the job resumes from, when checkpoint.dirpath is set; `model`: the LightningModule, whose state dict a
    single-file checkpoint must fit; `sharded`: under fsdp; `announce`: on global rank 0."""
    if not (model_checkpoint and model_checkpoint.dirpath):
        return None
    strict = getattr(model, "strict_loading", True)
    return ResumePoint(
        dirpath=model_checkpoint.dirpath, model=model.state_dict(), strict=strict, sharded=sharded, announce=announce
    )


@declares(MODEL_DIR, EVERY_N_STEPS, COMPILE_CACHE, STOP_GRACE)
def concern(ctx: Context) -> Part:
    """In a platform's job, or where the job resumes from checkpoint.dirpath (outside a job the runtime's checkpointing
    starts with that setting): LastCheckpoint (after every ModelCheckpoint: it saves the state their choice of the best
    checkpoint made), Export, CompileCache where compile_cache is true, and the trainer's CheckpointIO; fit resumes
    from the resume point's candidate unless given another ckpt_path. Elsewhere Export wherever model_dir is set.
    Where a stop's SIGTERM cannot reach the training processes, LastCheckpoint is told why (boot/signals.py) and saves
    by time instead; in a job, the stop's grace its first save is compared with (stop/restarts.py)."""
    config, plan, pl, model_dir = ctx.config, ctx.plan, ctx.pl, MODEL_DIR.of(ctx.config)
    sharded = sharding(ctx.arguments.get("strategy"))
    point = resume_point(ctx.model_checkpoint, ctx.model, sharded, ctx.plan.rank_zero)
    export = made(Export, pl)(model_dir, ctx.config_yaml)
    if not (plan.in_job or point):
        return Part(callbacks=[export] if model_dir else [])
    unprotected = None if not plan.in_job or signals.forwarded() else signals.why_unreached()
    every, grace = EVERY_N_STEPS.of(config), restarts.grace_s(STOP_GRACE.of(config), plan.on_sagemaker)
    grace = grace if plan.in_job else None
    ledger = ctx.goodput and ctx.goodput.ledger
    shards = None
    if sharded:  # DCP's DefaultStager came after torch 2.5, the SMDDP flavors' (no fsdp there): imported for fsdp only
        from sagemaker_lightning.checkpoints.sharded_writer import ShardedWriter

        shards = functools.partial(ShardedWriter, timeout_s=plan.timeout_s)
    io = made(BackgroundCheckpointIO, pl)(resume_point=point, busy=ctx.status.busy, ledger=ledger, sharded=shards)
    last = made(LastCheckpoint, pl)(
        every, ctx.model_checkpoint, unprotected=unprotected, resume_point=point, grace_s=grace, ledger=ledger, io=io
    )
    cache = [made(CompileCache, pl)(ctx.model_checkpoint)] if COMPILE_CACHE.of(config) else []

    def attach(trainer) -> None:
        if point and point.candidate:
            trainer.ckpt_path = point.candidate

    return Part(callbacks=[export, *cache], after_checkpoints=[last], plugins=[io], attach=attach)
