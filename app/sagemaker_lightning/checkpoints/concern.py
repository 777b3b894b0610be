"""Checkpoints, one home: what a restarted job resumes from, and the trained model it ends with.

  atomic.py   the one atomic write (a partial name, then a rename) and the one rule for keeping the previous save
  io.py       how checkpoints are read (weights only, transient failures retried) and written (AtomicCheckpointIO);
              the paths a checkpoint's own state may have read or deleted (inside checkpoint.dirpath)
  last.py     last.ckpt every N steps, at each epoch's end and on a stop (LastCheckpoint)
  resume.py   which checkpoint a job resumes from, chosen on global rank 0, single-file or sharded (ResumePoint)
  sharded.py  fsdp's sharded saves: their layout, when one is complete, how one is written and read (nothing run)
  loader.py   a training loader that resumes mid-epoch (ResumableDataLoader, ResumableEpoch)
  export.py   model.pt and config.yaml in model_dir after fit (Export)
  compile_cache.py  torch.compile's cache saved with the checkpoints, loaded when the job resumes (CompileCache)

The hub (cli.py) asks for this concern's parts below, in the order it builds the trainer.

    python app/example/train.py ... --checkpoint.dirpath ckpts --last_checkpoint_every_n_steps 50 --model_dir out
"""

from collections.abc import Callable, Mapping

from sagemaker_lightning.boot import signals
from sagemaker_lightning.checkpoints.compile_cache import CompileCache
from sagemaker_lightning.checkpoints.export import Export
from sagemaker_lightning.checkpoints.io import AtomicCheckpointIO
from sagemaker_lightning.checkpoints.last import LastCheckpoint
from sagemaker_lightning.checkpoints.resume import ResumePoint
from sagemaker_lightning.cli.lightning_package import attribute, made
from sagemaker_lightning.data.resumable import make_training_loader_resumable
from sagemaker_lightning.stop import restarts


def resume_point(model_checkpoint, model, sharded_saves: bool, announce: bool) -> ResumePoint | None:
    """What the job resumes from, when checkpoint.dirpath is set; `model`: the LightningModule, whose state dict a
    single-file checkpoint must fit; `announce`: on global rank 0."""
    if not (model_checkpoint and model_checkpoint.dirpath):
        return None
    strict = getattr(model, "strict_loading", True)
    return ResumePoint(model_checkpoint.dirpath, model.state_dict(), strict, sharded_saves, announce)


def callbacks(pl, plan, config: Mapping, model_checkpoint, point, config_yaml: Callable[[], str]):
    """LastCheckpoint in a platform's job or where the job resumes from checkpoint.dirpath (outside a job the
    runtime's checkpointing starts with that setting); Export there too, and wherever model_dir is set; CompileCache
    beside them where compile_cache is true. Where a stop's SIGTERM cannot reach the training processes,
    LastCheckpoint is told why (signals.py) and saves by time instead; in a job, the stop's grace its first save is
    compared with (restarts.py)."""
    if not (plan.in_job or point):
        return [made(Export, pl)(config["model_dir"], config_yaml)] if config["model_dir"] else []
    unprotected = None if not plan.in_job or signals.forwarded() else signals.why_unreached()
    every, grace = config["last_checkpoint_every_n_steps"], restarts.grace_s(config["stop_grace_s"], plan.on_sagemaker)
    return [
        made(LastCheckpoint, pl)(every, model_checkpoint, unprotected, point, grace if plan.in_job else None),
        made(Export, pl)(config["model_dir"], config_yaml),
        *([made(CompileCache, pl)(model_checkpoint)] if config["compile_cache"] else []),
    ]


def plugins(pl, in_job: bool, point: ResumePoint | None) -> list:
    """The trainer's CheckpointIO, where LastCheckpoint is (callbacks): atomic writes, retried reads, rank 0's resume
    point."""
    return [made(AtomicCheckpointIO, pl)(point)] if in_job or point else []


def attach(pl, plan, trainer, owner, point: ResumePoint | None) -> None:
    """Once the trainer exists: in a job the training loader of `owner` (the data module, or the model) resumes
    mid-epoch (loader.py); fit() resumes from the resume point's candidate unless given another ckpt_path."""
    if plan.in_job:
        overridden = attribute(pl, "utilities.model_helpers.is_overridden")
        make_training_loader_resumable(owner, trainer, overridden)
    if point and point.candidate:
        trainer.ckpt_path = point.candidate
