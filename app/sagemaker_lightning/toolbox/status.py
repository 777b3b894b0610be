"""What the watchdog shares with the rest of a training process, in one object the hub makes and hands to each concern
that needs it (toolbox/concern.py's Context), never through module state:
  - what the training thread is doing that takes long and is no hang (a checkpoint's write: busy()), which the
    watchdog publishes to its peers;
  - whether the watchdog is ending the process: a failure the training thread meets since is its consequence;
  - the hosts' spread (stragglers.py, lines.spread), written by the watchdog's thread for the progress line.
No torch.

    python -c "from sagemaker_lightning.toolbox.status import Status; s = Status(); print(s.doing)"
"""

import contextlib
import threading


class Status:
    def __init__(self):
        self.doing: str | None = None  # what the training thread is busy with (busy()), or the first step's mark
        self.ending = threading.Event()  # set by the watchdog's thread when it ends the process
        self.spread = ""  # rank 0: the progress line's words on the hosts' spread (lines.spread)

    def __getstate__(self) -> dict:
        """Pickled without its event (strategy="ddp_spawn" pickles the trainer's callbacks into each new process):
        each process gets one of its own."""
        return {**vars(self), "ending": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, ending=threading.Event())

    @contextlib.contextmanager
    def busy(self, what: str):
        """Mark a long operation of this process (a checkpoint's write) that peers may wait for: not a hang."""
        self.doing = what
        try:
            yield
        finally:
            self.doing = None
