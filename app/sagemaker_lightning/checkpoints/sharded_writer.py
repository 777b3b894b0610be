"""fsdp's sharded saves (last.ckpt/, layout in sharded_saves.py) written in the background: DCP's `async_save` stages
each rank's shards into host buffers kept from one save to the next (pinned, from a GPU) and returns; its writer
thread writes them, and the process's checkpoint writer (writer.py) then keeps the saves as retention.py's rule says:
the new one and the complete one before it, the others pruned, never a save still in flight.

Every rank calls `save` at the same step (LastCheckpoint). DCP's collectives for a save (its plans, the write's end,
after which rank 0 writes `.metadata`) run on a gloo group of their own: on the training's group they would
interleave with the steps' collectives. A save's plans are cached (DefaultSavePlanner's plan caching): the next saves
of the same shapes skip planning. At most one save is in flight: a save asked for while one is written waits for it.
A rank's save ends once DCP's write ends on every rank (rank 0 has written `.metadata`), so the save is complete on
every host when any rank sees it end: each host's committer (sharded_saves.committer) prunes its own directory then.

Measured with scripts/bench_checkpoint.py --only sharded (2 ranks on gloo, 151 MB a rank; 2 AMD EPYC cores, torch
2.14.1; docs/performance.md): a save stalls training 0.049 s (the shards' copy 0.034 s) against dcp.save's 0.31 s; a
writer process stalls 0.035 s but its first save took 6.7 s (the process's start), so a thread.

    python app/example/train.py --trainer.strategy fsdp --trainer.devices 2 --trainer.accelerator cpu \\
        --checkpoint.dirpath ckpts --last_checkpoint_every_n_steps 5
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.tensor import DTensor

from sagemaker_lightning import lines
from sagemaker_lightning.checkpoints.atomic import replacing
from sagemaker_lightning.checkpoints.layout import META, unlinked
from sagemaker_lightning.checkpoints.retention import Saves, prune
from sagemaker_lightning.checkpoints.sharded_saves import committer, first_failure, newest_complete, step


class ShardedWriter:
    """The sharded saves of one process (module docstring); `writer`: the process's writer.Writer, whose thread ends
    each save (its errors then raised as one line at the next save or wait, as a whole file's); timeout_s: its
    collectives' (dist_timeout): a peer lost during a save fails it then, as a step's collective would, not after
    gloo's 30 minutes (the wait for a write is no hang to the watchdog)."""

    def __init__(self, writer, timeout_s: float):
        self.writer, self.timeout_s = writer, timeout_s
        self._group = None  # DCP's collectives, made at the first save (every rank makes it then)
        self._stager = None  # host buffers for the shards, kept across saves
        self._saves = Saves()  # the newest save this run wrote or resumed from, and the one before it

    @staticmethod
    def takes(checkpoint: dict) -> bool:
        """Whether `checkpoint` holds shards (DTensors: fsdp's last.ckpt), written by every rank, not one file."""
        return any(isinstance(t, DTensor) for t in (checkpoint.get("state_dict") or {}).values())

    def _start(self, root: Path) -> None:
        """The group, the buffers, and the save this run resumed from (rank 0's newest complete: kept beside the
        first save; on another host .metadata is only on rank 0's)."""
        self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        self._stager = DefaultStager(StagingOptions(torch.cuda.is_available(), False, False, False))
        resumed = newest_complete(root)[0] if root.is_dir() and dist.get_rank() == 0 else None
        names = [resumed.name if resumed else None]
        dist.broadcast_object_list(names, src=0, group=self._group)
        self._saves = Saves(names[0])

    def save(self, checkpoint: dict, root: Path):
        """A new save in `root` (last.ckpt/), each rank its shards; rank 0 writes meta.pt (loops, callbacks) now.
        Returns the future of the save's end (the bench's)."""
        self.writer.wait()  # the save in flight, and its prune
        if self._group is None:
            self._start(root)
        target = root / self._name(checkpoint["global_step"])
        unlinked(str(root), str(root.parent))  # made since the start: DCP would write where it names
        keep = self._keep(target.name, checkpoint["global_step"])
        future = self._write_shards(self._split(checkpoint), target)
        if dist.get_rank() == 0:
            self._write_meta(checkpoint, target)
        said = lines.saved(checkpoint.get("epoch"), checkpoint["global_step"]) if dist.get_rank() == 0 else None
        return self.writer.queue(f"writing {target}", self._end, future, root, target, keep, said=said)

    def _name(self, global_step: int) -> str:
        """The new save's folder, rank 0's name on every rank: a new one each save, never reused."""
        names = [f"step-{global_step:09d}-{time.time_ns()}"]
        dist.broadcast_object_list(names, src=0, group=self._group)
        return names[0]

    def _keep(self, name: str, global_step: int) -> set[str]:
        """The saves to keep once the save `name` is complete (retention.Saves)."""
        newest = self._saves.newest
        again = newest is not None and step(newest) == global_step  # a second save at newest's step
        self._saves, keep = self._saves.add(name, again)
        return keep

    @staticmethod
    def _split(checkpoint: dict) -> dict:
        """The shards DCP saves (the weights, each optimizer's state), taken out of `checkpoint`: the rest is
        meta.pt's."""
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        return state

    def _write_shards(self, state: dict, target: Path):
        """DCP's async_save of this rank's shards: staged into the kept buffers now, written by DCP's thread; returns
        the future of its end."""
        return dcp.async_save(
            state,
            checkpoint_id=target,
            process_group=self._group,
            async_stager=self._stager,
            planner=DefaultSavePlanner(enable_plan_caching=True),
        )

    @staticmethod
    def _write_meta(checkpoint: dict, target: Path) -> None:
        """meta.pt (rank 0's): the checkpoint less its shards, and the world size it was saved at."""
        os.makedirs(target, exist_ok=True)
        with replacing(str(target / META)) as partial:
            torch.save({**checkpoint, "world_size": dist.get_world_size()}, partial)

    def _end(self, future, root: Path, target: Path, keep: set) -> None:
        try:
            future.result()
        except CheckpointException as e:  # a BaseException: as the rank's own error (a full disk, say)
            raise first_failure(e) from e
        if committer(os.listdir(target)) == dist.get_rank():  # in each directory, the first rank that wrote there
            prune(str(root), keep)

    def close(self) -> None:
        """Free the buffers (the trainer's teardown, after the last save's end)."""
        if self._stager is not None:
            self._stager.close()
        self._stager, self._group = None, None
