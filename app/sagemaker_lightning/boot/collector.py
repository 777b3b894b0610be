"""Python's cyclic garbage collector while a training program starts: its collections scan every object that torch's,
Lightning's and the project's imports made, again and again as they grow (importing the example's train.py took
3.85 s with Python's thresholds and 3.0 s without collections: 2 Intel Xeon cores, Python 3.11.7, torch 2.14.1).
The start-up hook (autoenv.py) makes them rare in the program SageMaker starts; the runtime's LightningCLI, its classes
built, freezes what start-up made out of the collector (it stays, and a DataLoader worker forked then copies no page
a collection would touch) and gives Python its thresholds back for the steps. A program that never reaches the
runtime's CLI keeps the rare collections: cyclic garbage waits longer, never forever, as it would with gc.disable().

    python -c "from sagemaker_lightning.boot import collector; collector.pause(); collector.settle()"
"""

import gc
import os
from collections.abc import Mapping, Sequence

STARTING = 100_000  # allocations between the youngest generation's collections while starting: as fast as none
PYTHONS = gc.get_threshold()  # Python's own thresholds (read at the first import, before any pause), for the steps


def training_program(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this process runs SAGEMAKER_PROGRAM (the toolkit's `python train.py`, torchrun's and mpirun's ranks),
    not a launcher, pip or the toolkit itself."""
    program = env.get("SAGEMAKER_PROGRAM")
    return bool(program and argv) and os.path.basename(argv[0]) == os.path.basename(program)


def pause() -> None:
    gc.set_threshold(STARTING, *PYTHONS[1:])


def settle() -> None:
    """Start-up's objects frozen and Python's thresholds back, where pause() made collections rare; else nothing (a
    program started elsewhere keeps its collector as it was)."""
    if gc.get_threshold()[0] == STARTING:
        gc.freeze()
        gc.set_threshold(*PYTHONS)
