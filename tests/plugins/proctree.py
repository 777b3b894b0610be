"""A process and every process below it, read from /proc: what SageMaker's SIGKILL reaches in a container (the
entrypoint starts the toolkit in a session of its own, so a process group would not do).

    python tests/plugins/proctree.py ROOT GRACE   # SIGKILL ROOT's tree GRACE seconds from now, sparing itself
"""

import os
import signal
import sys
import time


def descendants(root: int) -> set[int]:
    """`root` and every process below it that is running now."""
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            pass  # ended meanwhile
    tree = {root} & parents.keys()
    while more := {pid for pid, parent in parents.items() if parent in tree} - tree:
        tree |= more
    return tree


def kill_tree(root: int) -> None:
    """SIGKILL `root` and every process below it, except this one."""
    for pid in descendants(root) - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":  # SageMaker's SIGKILL, the grace period after its SIGTERM
    time.sleep(float(sys.argv[2]))
    kill_tree(int(sys.argv[1]))
