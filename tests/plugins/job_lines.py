"""The runtime's lines that tests read back from a job's output (the toolkit tier's hosts, the container tier's
compose and docker logs): each rank's closing line, the save a run resumed from, the job's goodput line.

    from job_lines import final, goodputs, ranks, resumed
"""

import re
from typing import NamedTuple

# progress.py's closing line of each rank, anywhere in a line: compose prefixes it with the container's name, mpirun
# with the MPI rank
CLOSING = re.compile(r"\brank (\d+)/(\d+) host (\S+): weights (\w+) at step (\d+)")
RESUMED = re.compile(r"resuming at (epoch \d+ step \d+) from last\.ckpt")  # checkpoints' line on a resume
GOODPUT = re.compile(r"\bgoodput ([0-9.]+) %: training .*")  # goodput.py's line at a job's end


class Closing(NamedTuple):
    host: str
    world: int  # the job's world size
    digest: str  # of the rank's final weights
    step: int  # the global step it ended at


def ranks(*outputs: str) -> dict[int, Closing]:
    """{global rank: its closing line} over the outputs of a job's hosts."""
    found = (m.groups() for output in outputs for m in CLOSING.finditer(output))
    return {int(rank): Closing(host, int(world), digest, int(step)) for rank, world, host, digest, step in found}


def final(output: str) -> tuple[str, int]:
    """(digest, step) of the lowest rank that closed in `output`: in a data-parallel job every rank's are the same."""
    closed = ranks(output)
    assert closed, f"no rank's closing line in the output:\n{output[-3000:]}"
    return closed[min(closed)].digest, closed[min(closed)].step


def resumed(output: str) -> str | None:
    """The save a run resumed from, as `epoch E step S`, or None for a run that started afresh."""
    found = RESUMED.search(output)
    return found and found[1]


def goodputs(*outputs: str) -> list[str]:
    """The goodput lines in a job's outputs: one at its end, from global rank 0."""
    return [m[0] for output in outputs for m in GOODPUT.finditer(output)]
