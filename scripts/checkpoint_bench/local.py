"""Whole-file saves to a local folder, and what each costs the training thread: a synchronous save (torch.save to a
hidden partial name, then os.replace: the runtime's before issue 49), the runtime's own (checkpoints/writer.py),
Lightning's AsyncCheckpointIO, and a snapshot written by a thread or by a process, with a training-like loop running while the file is written.

    python scripts/bench_checkpoint.py --only local
"""

import math
import os
import queue
import threading
import time

import lightning.pytorch
import torch
import torch.multiprocessing

from checkpoint_bench import state
from sagemaker_lightning.checkpoints.atomic import replacing
from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO
from sagemaker_lightning.toolbox.lightning_package import made

ALONE_STEPS = 5  # training steps timed alone just before each background save: its baseline


def write_file(tree, path: str) -> float:
    """`tree` saved to `path` as the runtime writes a checkpoint (a partial name, then a rename); its seconds."""
    start = time.perf_counter()
    with replacing(path) as partial:
        torch.save(tree, partial)
    return time.perf_counter() - start


class ThreadWriter:
    """Writes a snapshot from a thread of this process: the training thread shares the GIL with it."""

    def __init__(self):
        self.thread = None
        self.write_s = math.nan

    def submit(self, tree, path: str) -> None:
        def run():
            self.write_s = write_file(tree, path)

        self.thread = threading.Thread(target=run, name="checkpoint-writer")
        self.thread.start()

    def done(self) -> bool:
        return not self.thread.is_alive()


def serve(requests, replies) -> None:
    """The writer process: says it is ready, then writes each (tree, path) request (its tensors in shared memory, not
    copied), answered with the write's seconds or the error's text; None ends it."""
    replies.put(0.0)
    while (request := requests.get()) is not None:
        try:
            replies.put(write_file(*request))
        except Exception as e:
            replies.put(f"{type(e).__name__}: {e}")


class ProcessWriter:
    """Writes a snapshot from a process of its own, started once (spawn: a process started with fork from a process
    with threads can inherit a held lock). The snapshot's tensors are in shared memory: a request passes their handles,
    not their bytes."""

    def __init__(self):
        context = torch.multiprocessing.get_context("spawn")
        self.requests, self.replies = context.Queue(), context.Queue()
        self.process = context.Process(target=serve, args=(self.requests, self.replies), daemon=True)
        start = time.perf_counter()
        self.process.start()
        self.replies.get(timeout=600)
        self.start_s = time.perf_counter() - start  # paid once, at setup: spawn, then Python and torch imported
        self.write_s = math.nan
        self.pending = False

    def submit(self, tree, path: str) -> None:
        self.requests.put((tree, path))
        self.pending = True

    def done(self) -> bool:
        if self.pending:
            try:
                reply = self.replies.get(timeout=0.001)
            except queue.Empty:
                return False
            if isinstance(reply, str):
                raise RuntimeError(f"the writer process failed: {reply}")
            self.write_s, self.pending = reply, False
        return True

    def close(self) -> None:
        self.requests.put(None)
        self.process.join(60)


def sync_save(tree, trainer, path: str) -> dict:
    stall = write_file(tree, path)
    return {"stall_s": stall, "write_s": stall, "steps": 0, "step_s": math.nan, "alone_s": math.nan}


def background_save(tree, trainer, path: str, snapshot, writer) -> dict:
    """One save through `writer` from `snapshot` (state.Snapshot, or state.cloned), then training steps until the
    file is written. The stall: the snapshot and the hand-over, what the training thread waits for. The steps' time
    alone is taken just before (this machine's load changes)."""
    alone_s = trainer.mean_s(ALONE_STEPS)
    start = time.perf_counter()
    copy = snapshot(tree)
    writer.submit(copy, path)
    stall = time.perf_counter() - start
    steps, step_s = trainer.until(writer.done)
    return {"stall_s": stall, "write_s": writer.write_s, "steps": steps, "step_s": step_s, "alone_s": alone_s}


def io_save(tree, trainer, path: str, io, finish) -> dict:
    """One save through a CheckpointIO that writes in the background, training steps until its file is complete (it
    appears whole: a rename), then `finish()` (joins the writer, raises a write's error)."""
    if os.path.exists(path):
        os.remove(path)
    alone_s = trainer.mean_s(ALONE_STEPS)
    start = time.perf_counter()
    io.save_checkpoint(tree, path)
    stall = time.perf_counter() - start
    steps, step_s = trainer.until(lambda: os.path.exists(path))
    finish()
    write_s = io.writer.write_s if isinstance(io, BackgroundCheckpointIO) else math.nan
    return {"stall_s": stall, "write_s": write_s, "steps": steps, "step_s": step_s, "alone_s": alone_s}


def runtime_save(tree, trainer, path: str, io) -> dict:
    """The runtime's own CheckpointIO (checkpoints/writer.py). The state's step moves on each time: the runtime writes
    a state it wrote last only once."""
    tree["global_step"] += 1
    return io_save(tree, trainer, path, io, io.wait)


def lightning_async_save(tree, trainer, path: str) -> dict:
    """Lightning's AsyncCheckpointIO over its TorchCheckpointIO: clones the tensors on the caller's thread, writes from
    a one-thread pool; its file appears whole when written (a transaction's rename)."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    io = AsyncCheckpointIO(TorchCheckpointIO())
    return io_save(tree, trainer, path, io, io.teardown)


def snapshot_times(tree, repeat: int) -> dict[str, list[float]]:
    """Seconds to copy `tree`'s tensors to host memory: fresh each time (AsyncCheckpointIO's clone), into buffers
    made once (the first fill pays their page faults: not timed), into shared-memory buffers; on a GPU into pinned ones."""
    gpu = any(t.is_cuda for t in state.tensors(tree))
    ways = {"clone (fresh memory)": state.cloned}
    ways["copy into reused buffers"] = state.Snapshot(tree).take
    ways["copy into reused shared buffers"] = state.Snapshot(tree, shared=True).take
    if gpu:
        ways["copy into reused pinned buffers"] = state.Snapshot(tree, pinned=True).take
        ways["copy into reused pinned shared buffers"] = state.Snapshot(tree, shared=True, pinned=True).take
    times = {}
    for name, take in ways.items():
        take(tree)
        times[name] = []
        for _ in range(repeat):
            start = time.perf_counter()
            take(tree)
            times[name].append(time.perf_counter() - start)
    return times


LABELS = {  # the ways, by their key in the figures
    "sync": "sync: torch.save, partial, rename (before)",
    "runtime": "the runtime's save (checkpoints/writer.py)",
    "lightning_async": "Lightning AsyncCheckpointIO (clone+thread)",
    "thread": "snapshot (reused) + writer thread",
    "process": "snapshot (reused, shared) + writer process",
}


def saves(tree, trainer, folder: str, repeat: int, keys=tuple(LABELS)) -> tuple[dict[str, list[dict]], float]:
    """Each way of saving `tree` to a file in `folder` (`keys` of LABELS), `repeat` times after a warm-up (the buffers'
    first fill, the writer process's first request), the training loop running after the save call returns until the
    file is complete; and the seconds the writer process took to start."""
    path = os.path.join(folder, "last.ckpt")
    private, shared = state.Snapshot(tree, pinned=True), state.Snapshot(tree, shared=True, pinned=True)
    thread, process = ThreadWriter(), None
    runtime = made(BackgroundCheckpointIO, lightning.pytorch)()
    ways = {
        "sync": lambda: sync_save(tree, trainer, path),
        "runtime": lambda: runtime_save(tree, trainer, path, runtime),
        "lightning_async": lambda: lightning_async_save(tree, trainer, path),
        "thread": lambda: background_save(tree, trainer, path, private.take, thread),
        "process": lambda: background_save(tree, trainer, path, shared.take, process),
    }
    results = {}
    try:
        for key in keys:
            save = ways[key]
            if key == "process":  # started here: its start would load the CPU while the other ways are timed
                process = ProcessWriter()
            save()
            results[key] = [save() for _ in range(repeat)]
    finally:
        if process:
            process.close()
    return results, process.start_s if process else math.nan


def second_copy(tree, folder: str, repeat: int) -> dict[str, list[float]]:
    """The same state under a second name: written again, or hard-linked (os.link)."""
    first, second = os.path.join(folder, "epoch=0-step=5.ckpt"), os.path.join(folder, "last.ckpt")
    write_file(tree, first)
    times = {"local: write it again": [], "local: hard link": []}
    for _ in range(repeat):
        times["local: write it again"].append(write_file(tree, second))
        os.remove(second)
        start = time.perf_counter()
        with replacing(second) as partial:
            os.link(first, partial)
        times["local: hard link"].append(time.perf_counter() - start)
        os.remove(second)
    return times
