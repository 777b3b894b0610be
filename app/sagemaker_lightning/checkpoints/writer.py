"""Whole-file checkpoints written in the background: a save holds the training only for a copy of its state.

A save (`Writer.save`) copies the checkpoint's tensors into host buffers kept from one save to the next (pinned, from
a GPU), the rest of the checkpoint deep-copied, and returns; one writer thread writes that snapshot: locally
torch.save to the hidden partial name, last.ckpt's previous file kept (retention.py), then the rename (atomic.py), so
that at every moment a complete last.ckpt or last-previous.ckpt exists; to S3 (s3://) torch.save into a pipe that
boto3's managed multipart upload reads as it is written, the previous object kept by a server-side copy beside it
(s3_transfer.upload: the object appears whole when its upload ends, once that copy of the old one is done, and not at
all when torch.save or the copy fails).

At most one save is in flight: a save asked for while one is written waits for it (its buffers are the snapshot
being written), never skipped; goodput counts the wait as checkpoint stall, and the first such wait says once, in a
line with the figures, that saves come faster than they are written and what to set instead. A save of the state
just saved (the same step, loops, callbacks and tensors: last.ckpt after the best checkpoint at an epoch's end) is a
hard link, or a server-side copy, of that file: each state written once. A removal (ModelCheckpoint's top-k) waits its turn behind
the writes. A write that fails is one line in the training thread, at the next save or wait (a full disk, S3 denied).
After a fit (`close`, its teardown) the thread is gone and a save is written before it returns, a failure raised as
itself: Lightning's contract for trainer.save_checkpoint.

Measured with scripts/bench_checkpoint.py (25M parameters with Adam, 302 MB; 2 AMD EPYC cores, torch 2.14.1, moto
5.2.5; docs/performance.md): a save's stall 0.023 s (the copy into kept buffers 0.022 s), the synchronous save it
replaced 0.33-0.62 s. S3's figures: s3_transfer.py.

    python -c "from sagemaker_lightning.checkpoints.writer import Writer; w = Writer(); w.save({'x': 1}, '/tmp/a.ckpt'); w.wait()"
"""

import concurrent.futures
import copy
import functools
import io
import os
import pickle
import time

import fsspec
import torch

from sagemaker_lightning import lines
from sagemaker_lightning.checkpoints import s3_transfer
from sagemaker_lightning.checkpoints.atomic import replacing
from sagemaker_lightning.checkpoints.layout import LAST
from sagemaker_lightning.checkpoints.retention import keep_previous
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.goodput import STATE_KEY as GOODPUT
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import remote

VOLATILE = (GOODPUT,)  # callbacks' states that change between two saves of one moment: goodput's clock


def tensors(tree, position=()):
    """(position, tensor) of every tensor in nested dicts, lists and tuples, in a fixed order."""
    if isinstance(tree, torch.Tensor):
        yield position, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from tensors(value, (*position, key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from tensors(value, (*position, i))


def skeleton(checkpoint: dict) -> bytes:
    """What a checkpoint holds besides its tensors' values (their shapes and dtypes, everything else), goodput's
    record aside: equal for two saves of one moment."""
    shapes = {id(t): (tuple(t.shape), t.dtype) for _, t in tensors(checkpoint)}  # deepcopy's memo: each in its place
    callbacks = {k: v for k, v in (checkpoint.get("callbacks") or {}).items() if k not in VOLATILE}
    return pickle.dumps(copy.deepcopy({**checkpoint, "callbacks": callbacks}, shapes))


class Snapshot:
    """Host buffers for a checkpoint's tensors, kept from one save to the next (the copy, not an allocation, is then
    the cost: 0.022 s against 0.12 s for fresh clones of 302 MB, measured above)."""

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}

    def _buffer(self, position: tuple, tensor: torch.Tensor) -> torch.Tensor:
        kept = self.buffers.get(position)
        if kept is None or kept.shape != tensor.shape or kept.dtype != tensor.dtype:
            kept = torch.empty_like(tensor, device="cpu", pin_memory=tensor.is_cuda)
            self.buffers[position] = kept
        return kept

    def take(self, checkpoint: dict) -> dict:
        """`checkpoint` with each tensor copied into its buffer and everything else deep-copied: nothing in it changes
        while training goes on."""
        memo, found, seen, used = {}, dict(tensors(checkpoint)), {}, set()
        for position, tensor in found.items():
            # tied weights (one tensor under two names) get one buffer and are saved once, as torch.save saves them
            same = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
            if same not in seen:
                buffer = self._buffer(position, tensor)
                if id(buffer) in used:  # shared by names tied at the last save, no longer tied now
                    del self.buffers[position]
                    buffer = self._buffer(position, tensor)
                used.add(id(buffer))
                seen[same] = buffer.copy_(tensor.detach(), non_blocking=tensor.is_cuda)
            self.buffers[position] = memo[id(tensor)] = seen[same]
        if any(t.is_cuda for t in found.values()):
            torch.cuda.synchronize()  # the copies into pinned memory are asynchronous
        self.buffers = {p: self.buffers[p] for p in found}  # a position gone (a changed optimizer) frees its buffer
        return copy.deepcopy(checkpoint, memo)

    def same(self, checkpoint: dict) -> bool:
        """Whether every tensor of `checkpoint` equals the one in its buffer (the last snapshot's)."""
        found = dict(tensors(checkpoint))
        if found.keys() != self.buffers.keys():
            return False
        return all(torch.equal(self.buffers[p], t.detach().cpu()) for p, t in found.items())


def named_last(path: str) -> bool:
    """Whether `path` (a path or a URL) is a last.ckpt, whose previous file is kept and whose save is said."""
    return path.rsplit("/", 1)[-1] == LAST


def persist(snapshot: dict, path: str) -> None:
    """The snapshot as the file at `path`, whole or not at all; last.ckpt's previous file kept just before."""
    if not remote(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # as Lightning's writer makes it
        with replacing(path) as partial:
            torch.save(snapshot, partial)
            if named_last(path):
                keep_previous(path)
        return
    if path.startswith("s3://"):  # the previous object kept while the new one is sent, before it appears
        s3_transfer.upload(snapshot, path, beside=functools.partial(keep_previous, path) if named_last(path) else None)
        return
    if named_last(path):
        keep_previous(path)  # before the new object replaces it (an upload's object appears only at its end)
    data = io.BytesIO()  # any other store: one put
    torch.save(snapshot, data)
    fs, where = fsspec.core.url_to_fs(path)
    fs.pipe(where, data.getvalue())


def duplicate(source: str, path: str) -> None:
    """`path` as a second name of the complete file `source`: a hard link, or a server-side copy in a store."""
    if named_last(path):
        keep_previous(path)
    if path.startswith("s3://"):
        s3_transfer.copy(source, path)
        return
    if remote(path):
        fs, target = fsspec.core.url_to_fs(path)
        fs.copy(fsspec.core.url_to_fs(source)[1], target)
        return
    with replacing(path) as partial:
        os.link(source, partial, follow_symlinks=False)  # a link planted at `source` is linked, not its target


def remove(path: str) -> None:
    fs, where = fsspec.core.url_to_fs(path)
    if fs.exists(where):
        fs.rm(where, recursive=True)


class Writer:
    """The background writer of one process's whole-file checkpoints (module docstring)."""

    def __init__(self):
        self._thread = None  # made at the first save, one thread: jobs run in the order they are asked
        # False once closed (a fit's teardown), until open(): a job runs in the calling thread, a failure raised there
        self.background = True
        self._snapshot = Snapshot()
        self._writing = None  # the future of the write that holds the snapshot's buffers
        self._jobs: list[tuple[str, concurrent.futures.Future]] = []  # (what, its future), not yet checked
        self._last = None  # (path, skeleton) of the last state written, while its file is there
        self.write_s = None  # the last write's time, from its snapshot to its complete file
        self._asked = None  # (clock, global_step) when the write in self._writing was asked for
        self._behind_said = False  # that saves come faster than they are written: said once
        self._failed = False  # a job failed: the ones after it are skipped (no delete of a best whose successor failed)
        # lines of saves written, said by the training thread: a line written from this thread could land between the
        # text and the newline of a project's print() (a CI run lost a step line so)
        self._said: list[str] = []

    def __getstate__(self):  # strategy="ddp_spawn" pickles the trainer's plugins into each new process
        self.wait()
        return {**self.__dict__, "_thread": None, "_snapshot": Snapshot(), "_writing": None, "_last": None}

    def queue(self, what: str, fn, *args, said: str | None = None) -> concurrent.futures.Future:
        """Run fn(*args) after the jobs asked for before (`what`: what it does, in the line of its failure); then
        `said` is to be said (announce): a save is said once its file is there. Closed: done when it returns."""
        if not self.background:
            self.wait()  # any job of the fit not yet checked
            fn(*args)
            if said:
                say(said)
            done = concurrent.futures.Future()
            done.set_result(None)
            return done
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")

        def job():
            if self._failed:
                raise RuntimeError("not done: a job before it failed")
            try:
                fn(*args)
            except BaseException:
                self._failed = True
                raise
            if said:
                self._said.append(said)

        future = self._thread.submit(job)
        self._jobs.append((what, future))
        return future

    def save(self, checkpoint: dict, path: str) -> None:
        """Write `checkpoint` to `path` in the background, or name the file that holds that very state."""
        self.announce()
        said = lines.saved(checkpoint.get("epoch"), checkpoint.get("global_step")) if named_last(path) else None
        if not self.background:  # nothing trains while it is written: no snapshot
            self.queue(f"writing {path}", persist, checkpoint, path, said=said)
            return
        shape = skeleton(checkpoint)
        if self._last and self._last[1] == shape and self._snapshot.same(checkpoint):
            if self._last[0] != path:  # else that file holds it already
                self.queue(f"linking {path}", duplicate, self._last[0], path, said=said)
            return
        asked, behind = time.monotonic(), self._writing is not None and not self._writing.done()
        self._check(self._writing)
        started = time.monotonic()
        if behind and not self._behind_said:  # each later save would say the same
            self._behind_said = True
            steps = checkpoint.get("global_step"), self._asked[1]
            setting = "last_checkpoint_every_n_steps" if named_last(path) else "checkpoint.every_n_train_steps"
            gap = steps[0] - steps[1] if all(isinstance(s, int) for s in steps) else None
            say(lines.behind(path, self.write_s, asked - self._asked[0], started - asked, gap, setting))
        snapshot = self._snapshot.take(checkpoint)
        self._writing = self.queue(f"writing {path}", self._timed, started, snapshot, path, said=said)
        self._last, self._asked = (path, shape), (asked, checkpoint.get("global_step"))

    def _timed(self, started: float, snapshot: dict, path: str) -> None:
        persist(snapshot, path)
        self.write_s = time.monotonic() - started

    def remove(self, path: str) -> None:
        """Remove `path` once the writes asked for before are done (a newer best checkpoint is complete first)."""
        if self._last and self._last[0] == path:
            self._last = None
        self.queue(f"removing {path}", remove, path)

    def wait(self) -> None:
        """Wait for every job asked for; the first that failed raises, as one line."""
        while self._jobs:
            self._check(self._jobs[0][1])
        self.announce()

    def close(self) -> None:
        """After a fit (its teardown): the thread ended once its jobs are done, the buffers freed; from now on each
        job runs in the calling thread, as Lightning writes a trainer.save_checkpoint after a fit (the file there when
        it returns, a failure raised as itself), until open()."""
        self.background = False
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        self._snapshot, self._last = Snapshot(), None

    def open(self) -> None:
        """A fit starts: its saves in the background again."""
        self.background = True

    def announce(self) -> None:
        """Say the saves written since the last call, from the calling (training) thread."""
        while self._said:
            say(self._said.pop(0))

    def _check(self, future) -> None:
        """Wait for `future` and the jobs before it, unless it was waited for; a UserError names the first that
        failed."""
        while any(job is future for _, job in self._jobs):
            what, job = self._jobs.pop(0)
            try:
                job.result()
            except Exception as e:
                for _, skipped in self._jobs:  # each ends at once: a job before it failed
                    skipped.exception()
                self._jobs.clear()
                self._last, self._failed = None, False
                raise UserError(
                    f"{what} failed in the background ({type(e).__name__}: {e}); the save before it is kept: free "
                    "space at checkpoint.dirpath or let the job write there, then restart it"
                ) from e
            if job is future:
                return
