"""Checkpoints a restarted job resumes from: last.ckpt every N steps, at each epoch end and on SIGTERM, written
atomically.

SageMaker syncs /opt/ml/checkpoints (or the job's checkpoint_local_path) to checkpoint_s3_uri and restores it on a
restarted (spot) job; the runtime's LightningCLI resumes from last.ckpt there (cli.py), or from the newest checkpoint
that can be resumed from when last.ckpt cannot. checkpoint.dirpath may be an s3:// URL as well.

    python app/example/train.py ... --checkpoint.dirpath ckpts --last_checkpoint_every_n_steps 50
"""

import io
import json
import os
import time
import zipfile
from collections.abc import Mapping

import fsspec
import fsspec.implementations.local
import torch

from sagemaker_lightning import sharding
from sagemaker_lightning.callbacks import say
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.flavor import attribute


class AtomicCheckpointIO:
    """Each checkpoint goes to a temporary name first and is renamed when complete: a kill during a save never
    leaves a broken file under the real name (remote paths are written as Lightning writes them)."""

    BASE = "plugins.io.TorchCheckpointIO"

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = str(path)
        if "://" in path:
            return super().save_checkpoint(checkpoint, path, storage_options)
        partial = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.partial")
        try:
            super().save_checkpoint(checkpoint, partial, storage_options)
        except BaseException:
            if os.path.exists(partial):
                os.remove(partial)
            raise
        os.replace(partial, path)


AUTO_INTERVAL_S = 60  # where no SIGTERM arrives: last.ckpt about this often, so a stop loses about a minute at most
MEASURED_STEPS = 3  # steps timed (after the first, which compiles and warms up) to choose that interval


def interval_steps(seconds_per_step: float, target_s: float = AUTO_INTERVAL_S) -> int:
    """Optimizer steps in about `target_s` seconds of training, at least 1."""
    return max(1, round(target_s / max(seconds_per_step, 1e-9)))


class LastCheckpoint:
    """last.ckpt, what a restarted job resumes from: every `every_n_steps` optimizer steps, at each epoch end, and
    when SageMaker stops the job (SIGTERM on StopTrainingJob or spot interruption: Lightning stops every rank at the
    same step boundary, where they save it together). The training loader's state in it (resumable.py) makes a
    resumed run continue as the uninterrupted one would.

    Where SIGTERM cannot reach the training processes (`unprotected` says why: PID 1 is not the image's entrypoint,
    as under SDK 3.x's driver), a stop kills them without warning: every_n_steps=None then means about every
    AUTO_INTERVAL_S of training, the steps counted from the measured step time, and rank 0 says what bounds the loss."""

    BASE = "callbacks.Callback"

    def __init__(self, every_n_steps: int | None, checkpoint, unprotected: str | None = None):
        """every_n_steps: 0 for epoch ends and SIGTERM only; None: 0, or about a minute where `unprotected`.
        checkpoint: the ModelCheckpoint whose directory (its dirpath, once set up) holds last.ckpt."""
        self.every_n_steps = every_n_steps if every_n_steps is not None or unprotected else 0
        self.checkpoint, self.unprotected = checkpoint, unprotected
        self._saved_step = -1
        self._timing = None  # (first step timed, its clock) while the interval is being measured

    def save(self, trainer) -> str:
        path = os.path.join(self.checkpoint.dirpath, "last.ckpt")
        with sharding.sharded_saves(trainer.strategy):  # fsdp: a folder of one file per rank (sharding.py)
            trainer.save_checkpoint(path, weights_only=False)  # every rank calls it; rank 0 writes (atomically)
        self._saved_step = trainer.global_step
        if trainer.is_global_zero:
            say(f"saved last.ckpt at epoch {trainer.current_epoch} step {trainer.global_step}")
        return path

    def setup(self, trainer, pl_module, stage):
        # last among the callbacks, after every ModelCheckpoint: its on_validation_end must see their new best. A new
        # list, not an in-place move: Lightning is iterating over the old one to call this hook
        trainer.callbacks = [c for c in trainer.callbacks if c is not self] + [self]

    def on_validation_end(self, trainer, pl_module):
        # saved at this step before this validation: that last.ckpt names the best checkpoint as it was, which
        # ModelCheckpoint may just have replaced and deleted; a run resumed from it would export a missing file
        if trainer.global_step == self._saved_step and not trainer.sanity_checking:
            self.save(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_steps is None:
            self._measure(trainer, step)
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._saved_step:
            self.save(trainer)

    def _measure(self, trainer, step: int) -> None:
        """Time MEASURED_STEPS steps after the first; rank 0's interval, the same on every rank (a broadcast)."""
        if self._timing is None:
            self._timing = (step, time.monotonic())
        elif step - self._timing[0] >= MEASURED_STEPS:
            n = interval_steps((time.monotonic() - self._timing[1]) / (step - self._timing[0]))
            self.every_n_steps = trainer.strategy.broadcast(n, src=0)
            self._announce(
                trainer, f"last.ckpt every {self.every_n_steps} steps (about {AUTO_INTERVAL_S} s of training)"
            )

    def _announce(self, trainer, bound: str) -> None:
        if trainer.is_global_zero:
            say(
                f"no SIGTERM reaches the training processes ({self.unprotected}): a stop (spot interruption, "
                f"StopTrainingJob) loses what was trained since the last checkpoint; {bound} bounds it "
                "(last_checkpoint_every_n_steps sets another interval)"
            )

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_step != self._saved_step:
            self.save(trainer)

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, attribute(self.pl, "utilities.exceptions.SIGTERMException")):
            self.save(trainer)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        self._saved_step = checkpoint["global_step"]
        if trainer.is_global_zero:
            path = str(trainer.ckpt_path).rstrip("/")
            name = os.path.basename(path)
            if os.path.basename(os.path.dirname(path)) == "last.ckpt":  # fsdp: a sharded save inside last.ckpt/
                name = "last.ckpt"
            say(f"resuming at epoch {checkpoint['epoch']} step {checkpoint['global_step']} from {name}")

    def on_train_start(self, trainer, pl_module):
        if self.unprotected and self.every_n_steps is not None:
            self._announce(
                trainer,
                f"last.ckpt every {self.every_n_steps} steps"
                if self.every_n_steps
                else "last.ckpt at each epoch's end",
            )


CONFIG = "checkpointconfig.json"  # SageMaker's checkpoint settings in the job's config directory, when it has any
NEEDED = ("state_dict", "optimizer_states", "loops", "global_step")  # what resuming a fit reads from a checkpoint


def local_path(env: Mapping[str, str]) -> str | None:
    """The checkpoint directory the job's CheckpointConfig names (checkpoint_local_path in the SDKs): its LocalPath in
    checkpointconfig.json, the file SageMaker writes beside hyperparameters.json (AWS's smdebug reads it there)."""
    path = os.path.join(env.get("SM_INPUT_CONFIG_DIR", "/opt/ml/input/config"), CONFIG)
    try:
        with open(path) as f:
            return json.load(f).get("LocalPath") or None
    except (OSError, ValueError, AttributeError):
        return None


class Unresumable(Exception):
    """Why a checkpoint cannot be resumed from."""


def resumable_step(fs, path: str, model: Mapping | None, strict: bool = True) -> int:
    """The global step of the checkpoint at `path` (on filesystem `fs`); raises Unresumable when a fit cannot resume
    from it: it must load, hold what a fit resumes from and, when `model` (its state dict) is given, fit the model."""
    try:
        if isinstance(fs, fsspec.implementations.local.LocalFileSystem):
            # a complete file in torch.save's zip format is mapped, its tensors not read
            mmap = zipfile.is_zipfile(path)
            checkpoint = torch.load(path, map_location="cpu", mmap=mmap, weights_only=False)
        else:
            with fs.open(path, "rb") as f:
                checkpoint = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=False)
    except Exception as e:
        raise Unresumable(f"it does not load ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    if not isinstance(checkpoint, dict) or (missing := [k for k in NEEDED if k not in checkpoint]):
        raise Unresumable(
            f"it is not a Lightning checkpoint to resume from (no {missing[0] if isinstance(checkpoint, dict) else 'dict'})"
        )
    saved = checkpoint["state_dict"]
    for key, tensor in (model or {}).items():  # a model whose layers are made later (configure_model) has none yet
        if key not in saved:
            if strict:
                raise Unresumable(f"it was written by another model: the model's {key} is not in it")
        elif not isinstance(tensor, torch.nn.parameter.UninitializedParameter) and saved[key].shape != tensor.shape:
            raise Unresumable(
                f"it was written by another model: {key} is {tuple(saved[key].shape)} there, "
                f"{tuple(tensor.shape)} in the model"
            )
    if model and strict and (extra := [k for k in saved if k not in model]):
        raise Unresumable(f"it was written by another model: its {extra[0]} is not in the model")
    return int(checkpoint["global_step"])


def resume_path(dirpath: str, model: Mapping | None = None, strict: bool = True, announce: bool = True) -> str | None:
    """The checkpoint a (re)started job resumes from, in `dirpath` (a directory, or an fsspec URL such as
    s3://bucket/prefix): last.ckpt, else (it is missing, or cannot be resumed from: resumable_step) the checkpoint
    there with the highest step that can be, said in one line when `announce`; None when there is no checkpoint.
    Raises UserError naming last.ckpt (or another checkpoint) and why, when none can be resumed from."""
    fs, root = fsspec.core.url_to_fs(dirpath)
    try:
        names = sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(root, detail=False))
    except FileNotFoundError:
        return None
    names = sorted((n for n in names if n.endswith(".ckpt") and not n.startswith(".")), key=lambda n: n != "last.ckpt")
    steps, problems = {}, {}
    for name in names:
        try:
            steps[name] = resumable_step(fs, f"{root}/{name}", model, strict)
        except Unresumable as e:
            problems[name] = str(e)
        if name == "last.ckpt" and name in steps:
            break  # the usual case: the others need not be read
    url = {name: dirpath.rstrip("/") + "/" + name for name in names}
    if not steps:
        if not problems:
            return None
        name, why = next(iter(problems.items()))
        raise UserError(
            f"cannot resume from {url[name]}: {why}; delete it (and its copy under the job's checkpoint_s3_uri), or "
            "set checkpoint.dirpath to another location to start afresh"
        )
    newest = "last.ckpt" if "last.ckpt" in steps else max(steps, key=steps.get)
    if newest != "last.ckpt" and announce:
        why = f"{problems['last.ckpt']}" if "last.ckpt" in problems else "there is none"
        say(
            f"resuming from {url[newest]} (step {steps[newest]}), the newest checkpoint that can be: not from last.ckpt, {why}"
        )
    return url[newest]
