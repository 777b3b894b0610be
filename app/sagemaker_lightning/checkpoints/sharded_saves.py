"""Sharded checkpoints (trainer.strategy=fsdp, fsdp.py) on disk: their layout, when a save is complete, and which
one a (re)started job resumes from.

Under checkpoint.dirpath (SageMaker: /opt/ml/checkpoints) `last.ckpt/` is a directory with one folder per save,
`step-<global step>-<ns>/`, holding one file per rank (`__<rank>_0.distcp`, its shards), DCP's `.metadata` and
`meta.pt` (loops, callbacks, the training loader's position). A save counts once DCP's `.metadata` (written after
every rank has written its file) and `meta.pt` (renamed into place) load and every file `.metadata` names is there at
the size it records: a kill during a save, or an upload to S3 cut short, leaves an incomplete folder that resume
skips. After each save the complete save before it stays too, never fewer (sharded_writer.py, which writes them):
SageMaker uploads the directory in the background and deletes in S3 what is deleted here, so a save still uploading
when the job is reclaimed must not be the only one. Each rank writes into its own host's directory; on SageMaker each
host's /opt/ml/checkpoints goes to the same checkpoint_s3_uri and comes back whole on every host of a restarted job,
and a shared directory (one host, local mode, FSx, EFS) holds all files at once. The best checkpoints
(ModelCheckpoint) stay single files, gathered on rank 0: model.pt is made of them.

A save is read so that nothing in it runs, whoever wrote it: DCP reads `.metadata` as any pickle and each non-tensor
item (an optimizer's param_groups) with torch.load(weights_only=False); here `.metadata` admits only the classes DCP
writes to it (MetadataUnpickler) and the items are read weights only (WeightsOnlyPlanner).

    python -c "from sagemaker_lightning.checkpoints import sharded_saves; print(sharded_saves.resume_path('ckpts'))"
"""

import collections
import enum
import os
import pickle
import re
import zipfile
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import filesystem, metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from sagemaker_lightning.checkpoints.io import PATHS, UnsafeGlobal, admitted, refusal
from sagemaker_lightning.checkpoints.layout import LAST, META, METADATA, unlinked
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import remote

# what DCP's .metadata holds (Metadata, pickled whole by FileSystemWriter): its dataclasses, each item's storage info,
# torch.Size, dtypes, layouts (pickled as torch.serialization._get_layout), the save's path, collections
METADATA_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata")
METADATA_CLASSES += ("ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")
METADATA_GLOBALS = {
    (g.__module__, g.__qualname__): g
    for g in (
        *(getattr(metadata, name, None) for name in METADATA_CLASSES),  # those this torch has
        filesystem._StorageInfo,
        torch.Size,
        torch.serialization._get_layout,
        *PATHS,
        collections.OrderedDict,
        set,
        frozenset,
    )
    if g is not None
}
METADATA_GLOBALS.update({("torch", n): dtype for n, dtype in vars(torch).items() if isinstance(dtype, torch.dtype)})
METADATA_GLOBALS.update({("pathlib", path.__name__): path for path in PATHS})  # as older Pythons name them
SAVE = re.compile(r"step-(\d+)-(\d+)")


def _member(cls, name: str):
    """An enum member as Python 3.12's pickle names it (and Debian's 3.11, the image's): getattr(Enum, name). Only
    members of the admitted enums: getattr itself would reach anything (getattr(os, "system"))."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum) and cls in METADATA_GLOBALS.values()):
        raise UnsafeGlobal(f"its .metadata asks for getattr of {cls!r}, which no checkpoint's metadata does")
    if name not in cls.__members__:
        raise UnsafeGlobal(f"its .metadata asks for {cls.__name__}.{name}, which is no member of it")
    return cls[name]


METADATA_GLOBALS[("builtins", "getattr")] = _member
RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp")
MISFIT = re.compile(r"Missing key in checkpoint|Size mismatch between saved|Unexpected key")  # DCP's planner


def committer(files: list[str]) -> int | None:
    """The rank that tidies a directory after a save: the lowest whose file is in it (per host or shared)."""
    ranks = [int(m[1]) for f in files if (m := RANK_FILE.fullmatch(f))]
    return min(ranks) if ranks else None


def missing(save: Path) -> list[str]:
    """What a sharded save lacks to be resumed from: nothing once .metadata loads, meta.pt is whole (a zip archive
    ends with its directory) and every file .metadata names is there at the size it records (DCP writes each file's
    items one after the other: its size is the end of the last)."""
    if not (save / METADATA).is_file():
        return [METADATA]
    if not zipfile.is_zipfile(save / META):
        return [META if not (save / META).exists() else f"{META} (cut short)"]
    try:
        found = MetadataReader(save).read_metadata()
    except UnsafeGlobal:
        raise  # not cut short: a file no training job wrote
    except Exception:
        return [".metadata (does not load)"]
    sizes: dict[str, int] = {}
    for item in (found.storage_data or {}).values():
        sizes[item.relative_path] = max(sizes.get(item.relative_path, 0), item.offset + item.length)
    lacking = []
    for name, size in sorted(sizes.items()):
        if not (save / name).is_file():
            lacking.append(name)
        elif (actual := (save / name).stat().st_size) < size:
            lacking.append(f"{name} (cut short: {actual} of {size} bytes)")
    return lacking


def newest_complete(root: Path) -> tuple[Path | None, list[str]]:
    """The newest complete save in last.ckpt/, and a note for each newer one skipped: incomplete, or not loaded."""
    skipped = []
    for name in sorted((n for n in os.listdir(root) if SAVE.fullmatch(n)), reverse=True):
        try:
            lacking = missing(root / name)
        except UnsafeGlobal as e:
            skipped.append(f"{name}: {e}; it was not loaded (delete it, and its copy under checkpoint_s3_uri)")
            continue
        if not lacking:
            return root / name, skipped
        skipped.append(f"{name} lacks {', '.join(lacking[:3])} (a save cut short)")
    return None, skipped


def resume_path(dirpath: str, announce: bool = True) -> str | None:
    """Under fsdp, what a (re)started job resumes from: the newest complete save in checkpoint.dirpath's last.ckpt/
    (newer ones cut short are skipped, said when `announce`); None when there is none."""
    if remote(dirpath):
        raise UserError(
            f"checkpoint.dirpath={dirpath}: trainer.strategy=fsdp writes its sharded checkpoints to a directory of "
            "this machine; on SageMaker leave it unset (/opt/ml/checkpoints, synced to checkpoint_s3_uri)"
        )
    last = Path(dirpath) / LAST
    unlinked(str(last), dirpath)  # a link there would take the saves, and the prune after each, elsewhere
    if last.is_file():
        raise UserError(
            f"{last} was written by trainer.strategy=ddp (one file) and cannot take fsdp's sharded saves; resume "
            "it with ddp, or point checkpoint.dirpath elsewhere to start over"
        )
    if not last.is_dir():
        return None
    for entry in os.listdir(last):
        unlinked(str(last / entry), dirpath)
    save, skipped = newest_complete(last)
    for note in skipped if announce else []:
        say(f"not resuming from {note}")
    return str(save) if save else None


def refuse_sharded(dirpath: str) -> None:
    """Under any other strategy: a last.ckpt/ of fsdp's sharded saves is named, not skipped or overwritten."""
    if not remote(dirpath) and (Path(dirpath) / LAST).is_dir():
        raise UserError(
            f"{Path(dirpath) / 'last.ckpt'} holds sharded saves of trainer.strategy=fsdp; resume it with "
            "trainer.strategy=fsdp, or point checkpoint.dirpath elsewhere to start over"
        )


def step(name: str) -> int | None:
    """The global step of the save named `name` (SAVE); None for another name (a whole-file checkpoint's)."""
    found = SAVE.fullmatch(name)
    return int(found[1]) if found else None


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's .metadata admitting only the globals it holds (METADATA_GLOBALS): a planted file runs nothing."""

    def find_class(self, module, name):
        if (found := METADATA_GLOBALS.get((module, name))) is None:
            raise UnsafeGlobal(f"its .metadata names {module}.{name}, which no checkpoint's metadata holds")
        return found


class MetadataReader(dcp.FileSystemReader):
    """DCP's reader of a save's files, its .metadata read by MetadataUnpickler (torch's reader: pickle.load). A
    refusal is kept in `refused`: dcp.load reports it as text inside an AssertionError."""

    refused: UnsafeGlobal | None = None

    def read_metadata(self, *args, **kwargs) -> metadata.Metadata:
        rank = kwargs.get("rank")  # where every rank wrote its own (torch 2.9 and later), as torch's reader names it
        name = METADATA if rank is None else f"__{rank}{METADATA}"
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as f:
            try:
                found = MetadataUnpickler(f).load()
            except UnsafeGlobal as e:
                self.refused = e
                raise
        if not isinstance(found, metadata.Metadata):
            raise pickle.UnpicklingError(f"its .metadata holds a {type(found).__name__}, not a checkpoint's metadata")
        for item in (found.storage_data or {}).values():  # DCP joins each to the save's folder: flat names only
            if item.relative_path in ("", ".", "..") or os.path.basename(item.relative_path) != item.relative_path:
                self.refused = UnsafeGlobal(f"its .metadata names {item.relative_path!r}, a file outside its folder")
                raise self.refused
        if getattr(found, "storage_meta", None) is None:  # what torch's reader does after its pickle.load
            found.storage_meta = metadata.StorageMeta()
        found.storage_meta.load_id = self.load_id
        return found


class WeightsOnlyPlanner(dcp.DefaultLoadPlanner):
    """DCP's load planner, the non-tensor items of a save read weights only (torch's: weights_only=False)."""

    def load_bytes(self, read_item, value) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def read(state: dict, path: Path) -> None:
    """dcp.load of `state` (tensors and items, filled in place) from the save at `path`, nothing in it run."""
    reader = MetadataReader(path)
    try:
        dcp.load(state, storage_reader=reader, planner=WeightsOnlyPlanner())
    except CheckpointException:
        if reader.refused:
            raise reader.refused from None
        raise


def load(strategy, path: Path, weights_only: bool = True) -> dict:
    """The save at `path` into the strategy's model and optimizers, as Lightning's ModelParallelStrategy loads one but
    read so that nothing in it runs (module docstring); returns meta.pt's content (loops, callbacks). A misfit, or a
    file that does not load, named in one line; resharding onto another world size said."""
    module = strategy.model
    try:
        with admitted(str(path / META)):
            state = {"state_dict": get_model_state_dict(module)}
            read(state, path)
            module.load_state_dict(state["state_dict"], strict=strategy.lightning_module.strict_loading)
            for i, optimizer in enumerate(strategy.optimizers):  # each on its own, after the model: as Lightning
                state = {f"optimizer_{i}": get_optimizer_state_dict(module, optimizer)}
                read(state, path)
                options = StateDictOptions(cpu_offload=True)
                set_optimizer_state_dict(module, optimizer, optim_state_dict=state[f"optimizer_{i}"], options=options)
            checkpoint = torch.load(path / META, weights_only=weights_only)
    except (CheckpointException, pickle.UnpicklingError) as e:
        cause = first_failure(e) if isinstance(e, CheckpointException) else e
        if MISFIT.search(str(cause)):
            raise UserError(
                f"{path} does not fit this model ({str(cause).splitlines()[0][:200]}); resume with the model it "
                "was saved from, or point checkpoint.dirpath elsewhere to start over"
            ) from e
        if isinstance(cause, pickle.UnpicklingError):  # a save planted, or replaced since it was chosen
            instead = refusal(cause, str(path)) or cause
            if isinstance(instead, UserError):
                raise instead from e
            raise UserError(
                f"cannot resume from {path}: {type(instead).__name__}: {instead}; delete it (and its copy under "
                "checkpoint_s3_uri), or point checkpoint.dirpath elsewhere to start over"
            ) from e
        raise cause from e
    saved = checkpoint.get("world_size", strategy.world_size)
    if saved != strategy.world_size and strategy.global_rank == 0:  # DCP reshards; a full file fits any world size
        say(
            f"resumed a checkpoint of {saved} processes on {strategy.world_size}: weights and optimizer state "
            "resharded; the rest of this epoch's batches differ from an uninterrupted run's"
        )
    return checkpoint


def first_failure(e: CheckpointException) -> BaseException:
    """The exception of the lowest failing rank: DCP's own is a BaseException that no `except Exception` sees."""
    return e.failures[min(e.failures)][0]
