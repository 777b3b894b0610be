"""last.ckpt saved at a job's cadence through the runtime's CheckpointIO (checkpoints/writer.py), to a local folder
and to S3, with a GPU's training loop between the saves (`DeviceBound`: the host thread waits for the device, the
cores are the writer's, the steps keep their pace): what each save holds the training thread for (its stall: the
snapshot, and the wait for the write before it while that one is still going: a write slower than the interval shows
there), the writes' time, and the loop's time against the same steps without saves. A CPU's steps compete with the
write for the cores, and their interval then stretches with the load (the local section shows that contention).

The issue's case (issue 58): last.ckpt every 25 steps, about 3.7 s apart; locally a save stalled 0.05 s, to S3 2.55 s.

    python scripts/bench_checkpoint.py --only cadence
"""

import contextlib
import io
import time

import lightning.pytorch

from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO
from sagemaker_lightning.toolbox.lightning_package import made

EVERY = 25  # steps between two saves: the issue's
STEP_S = 3.7 / EVERY  # a step's seconds: the 25 steps in 3.7 s
SAVES = 5  # timed saves per place, after an untimed first (the buffers' first fill, the client's connections)


class DeviceBound:
    """A GPU's training as its host thread sees it: each step waits for the device (a sleep), the cores left free."""

    def step(self) -> None:
        time.sleep(STEP_S)


def saves(tree, trainer, url: str, every: int, count: int) -> dict:
    """`count` saves of `tree` to `url`, one each `every` steps, after an untimed one; each save a new state (its
    global_step moves on: the runtime writes a state it wrote last only once); the runtime's lines but its "saved
    last.ckpt" ones are kept in the figures."""
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        figures = timed(tree, trainer, url, every, count)
    figures["said"] = [line for line in said.getvalue().splitlines() if not line.startswith("saved ")]
    return figures


def timed(tree, trainer, url: str, every: int, count: int) -> dict:
    checkpoints = made(BackgroundCheckpointIO, lightning.pytorch)()
    checkpoints.save_checkpoint(tree, url)
    checkpoints.wait()
    stalls, writes = [], []
    start = time.perf_counter()
    for step in range(1, every * count + 1):
        trainer.step()
        if step % every == 0:
            tree["global_step"] += every
            asked = time.perf_counter()
            checkpoints.save_checkpoint(tree, url)
            stalls.append(time.perf_counter() - asked)
            writes.append(checkpoints.writer.write_s)  # the write before it: done, where the save waited for it
    loop_s = time.perf_counter() - start
    checkpoints.teardown()
    writes = [*writes[1:], checkpoints.writer.write_s]  # each timed save's own write (the first: the untimed one's)
    return {"stall_s": stalls, "write_s": writes, "loop_s": loop_s}


def alone(trainer, steps: int) -> float:
    """Seconds of `steps` steps with no save."""
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    return time.perf_counter() - start
