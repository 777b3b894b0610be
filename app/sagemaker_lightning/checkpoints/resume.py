"""Which checkpoint a (re)started job resumes from, chosen once for all ranks: one entry (ResumePoint) for a
single-file last.ckpt and for fsdp's sharded saves (sharded_saves.py).

A restarted (spot) job finds its checkpoint directory as SageMaker restored it from checkpoint_s3_uri. It resumes
from last.ckpt there, or, when last.ckpt cannot be resumed from (cut short, of another model), from the newest
checkpoint that can, said in one line. Global rank 0 chooses, once every rank has joined, and every rank loads its
choice (ResumePoint): a rank choosing on its own after a read that failed for it alone would train from another step
than its peers, or its collectives would stop matching theirs. A read that fails for a transient reason (S3
throttling, a timeout, a dropped connection) is tried again, never taken for a corrupt file; only a file that does not
load is skipped (io.read: weights only). Under fsdp the newest complete sharded save is rank 0's choice.

    python -c "from sagemaker_lightning.checkpoints import resume; print(resume.resume_path('ckpts'))"
"""

from collections.abc import Callable, Mapping
from typing import TypeVar

import fsspec
import torch

from sagemaker_lightning.checkpoints import sharded_saves
from sagemaker_lightning.checkpoints.io import read
from sagemaker_lightning.checkpoints.layout import LAST, unlinked
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import remote

NEEDED = ("state_dict", "optimizer_states", "loops", "global_step")  # what resuming a fit reads from a checkpoint
T = TypeVar("T")


class Unresumable(Exception):
    """Why a checkpoint cannot be resumed from."""


def resumable_step(url: str, model: Mapping | None, strict: bool = True) -> int:
    """The global step of the checkpoint at `url`; raises Unresumable when a fit cannot resume from it: it must load,
    hold what a fit resumes from and, when `model` (its state dict) is given, fit the model. A read that keeps
    failing (a UserError) or the host's memory running out is not the file's fault: raised as it is."""
    try:
        checkpoint = read(url)
    except (UserError, MemoryError):
        raise
    except FileNotFoundError as e:
        raise Unresumable("it is gone") from e
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


def names(dirpath: str) -> list[str]:
    """The checkpoints in `dirpath` (a directory or an fsspec URL), last.ckpt first; none when it does not exist."""
    fs, root = fsspec.core.url_to_fs(dirpath)
    try:
        found = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    except FileNotFoundError:
        return []
    return sorted((n for n in found if n.endswith(".ckpt") and not n.startswith(".")), key=lambda n: n != LAST)


def resume_path(dirpath: str, model: Mapping | None = None, strict: bool = True, announce: bool = True) -> str | None:
    """The checkpoint a (re)started job resumes from, in `dirpath`: last.ckpt, else (it is missing, or cannot be
    resumed from: resumable_step) the checkpoint there with the highest step that can be, said in one line when
    `announce`; None when there is no checkpoint. Raises UserError naming last.ckpt (or another checkpoint) and why,
    when none can be resumed from."""
    candidates = names(dirpath)
    url = {name: dirpath.rstrip("/") + "/" + name for name in candidates}
    steps, problems = {}, {}
    for name in candidates:
        try:
            steps[name] = resumable_step(url[name], model, strict)
        except Unresumable as e:
            problems[name] = str(e)
        if name == LAST and name in steps:
            break  # the usual case: the others need not be read
    if not steps:
        if not problems:
            return None
        name, why = next(iter(problems.items()))
        raise UserError(
            f"cannot resume from {url[name]}: {why}; delete it (and its copy under the job's checkpoint_s3_uri), or "
            "set checkpoint.dirpath to another location to start afresh"
        )
    newest = LAST if LAST in steps else max(steps, key=steps.get)
    if newest != LAST and announce:
        why = f"{problems[LAST]}" if LAST in problems else "there is none"
        say(
            f"resuming from {url[newest]} (step {steps[newest]}), the newest checkpoint that can be: not from last.ckpt, {why}"
        )
    return url[newest]


def on_rank_zero(decide: Callable[[], T]) -> T:
    """decide() on global rank 0, its result on every rank (torch.distributed's group, once it exists). When it fails
    there, the other ranks fail too, in one line, instead of waiting for a result that never comes."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return decide()
    result: list = [None]
    error = None
    if dist.get_rank() == 0:
        try:
            result = [("chosen", decide())]
        except Exception as e:
            error, result = e, [("failed", str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")]
    dist.broadcast_object_list(result, src=0)
    if error is not None:
        raise error
    outcome, value = result[0]
    if outcome == "failed":
        raise UserError(f"global rank 0 could not choose the checkpoint to resume from: {value}")
    return value


class ResumePoint:
    """The checkpoint the job resumes from, the same on every rank (module docstring). Before the ranks have joined,
    trainer.ckpt_path is set to `candidate`: last.ckpt's path when the directory holds any checkpoint (a listing,
    the same on every host); under fsdp the newest complete sharded save this host holds. When Lightning loads it,
    once the ranks have joined, `choose` gives rank 0's choice; under fsdp the strategy loads rank 0's candidate (it
    broadcasts the path: sharding.FullyShardedStrategy.load_checkpoint). A checkpoint in a local directory that is a
    symbolic link (last.ckpt, fsdp's last.ckpt/ or a save in it, a best checkpoint) fails the job here, in one line:
    the saves would write and delete where it points (location.unlinked)."""

    def __init__(self, *, dirpath: str, model: Mapping | None, strict: bool, sharded: bool, announce: bool):
        """model: its state dict; strict: its strict_loading; sharded: under fsdp; announce: on global rank 0,
        where a save skipped as cut short is said."""
        self.dirpath, self.model, self.strict = dirpath, model, strict
        for name in [] if remote(dirpath) else names(dirpath):  # a link among them: refused before any is read
            unlinked(f"{dirpath.rstrip('/')}/{name}", dirpath)
        if sharded:  # fsdp: the newest complete save in last.ckpt/, its skipped ones said once
            self.candidate = sharded_saves.resume_path(dirpath, announce)
        else:
            sharded_saves.refuse_sharded(dirpath)
            self.candidate = f"{dirpath.rstrip('/')}/{LAST}" if names(dirpath) else None
        self.chosen: str | None = None

    def choose(self, path: str) -> str:
        """The checkpoint to load when Lightning asks for `path`: rank 0's choice for the candidate, else `path`."""
        if self.candidate is None or str(path) != self.candidate:
            return path
        if self.chosen is None:
            chosen = on_rank_zero(lambda: resume_path(self.dirpath, self.model, self.strict))
            if chosen is None:
                raise UserError(f"the checkpoints in {self.dirpath} went away while the job started; restart it")
            self.chosen = chosen
        return self.chosen
