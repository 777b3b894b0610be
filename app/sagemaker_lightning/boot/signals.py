"""How a stop reaches the training processes. SageMaker signals only PID 1 on StopTrainingJob and spot interruption
(SIGTERM, then SIGKILL 120 s later). The image's entrypoint (PID 1) passes SIGTERM on to every training process that
registered here — not to launchers (mpirun, torchrun, the toolkit), which could end the ranks before their checkpoint
is written, and not to DataLoader workers, which die of it. A registration names its process by PID and start, and
goes when the process exits; one whose process is gone (SIGKILLed) is dropped when read: a reused PID is never
signalled, nor waited for. Where PID 1 is something else (SDK 3.x's driver runs `bash sm_train.sh` as PID 1,
which ignores SIGTERM), no stop ever arrives: the runtime says so and checkpoints by steps instead
(checkpoints/last.py). How the ranks then stop at one step together: stop/agreement.py. No torch: PID 1 imports this
module.

    python -c "from sagemaker_lightning.boot import signals; print(signals.registered(), signals.pid1())"
"""

import atexit
import os

RUN_DIR = os.environ.get("SAGEMAKER_LIGHTNING_RUN_DIR", "/tmp/sagemaker-lightning")  # shared by PID 1 and the trainers
ENTRYPOINT = "sagemaker_lightning.boot.entrypoint"  # how PID 1 shows in /proc/1/cmdline when it is the image's


def started(pid: int) -> str | None:
    """When process `pid` started (/proc/<pid>/stat's field 22, in clock ticks after boot): with the PID, it names one
    process, as PIDs are reused. None when no such process runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces and ")"
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]  # fields[0] is field 3, the state


def register(pid: int) -> None:
    """Ask PID 1 for SIGTERM: `pid` (this process) trains and checkpoints on it. The registration names the process
    by its start too, and goes when it exits: a PID reused later is never signalled, nor waited for."""
    folder = os.path.join(RUN_DIR, "trainers")
    os.makedirs(folder, exist_ok=True)
    draft, path = os.path.join(folder, f".{pid}"), os.path.join(folder, str(pid))
    with open(draft, "w") as f:
        f.write(started(pid) or "")
    os.replace(draft, path)  # whole or not at all: PID 1 may read it meanwhile
    atexit.register(_unregister, pid, path)


def _unregister(pid: int, path: str) -> None:
    if os.getpid() == pid:  # not in a forked child (a DataLoader worker), which inherits the exit handlers
        _remove(path)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:  # gone already (PID 1 dropped it, its folder was removed): nothing to undo
        pass


def registered() -> list[int]:
    """The registered training processes that still run; registrations of processes that ended are dropped."""
    try:
        names = os.listdir(os.path.join(RUN_DIR, "trainers"))
    except FileNotFoundError:
        return []
    running = []
    for pid in sorted(int(n) for n in names if n.isdigit()):
        path = os.path.join(RUN_DIR, "trainers", str(pid))
        try:
            with open(path) as f:
                recorded = f.read()
        except OSError:  # it ended meanwhile
            continue
        if recorded and recorded == started(pid):
            running.append(pid)
        else:
            _remove(path)
    return running


def pid1() -> str:
    """PID 1's command line, as /proc shows it ('' when it cannot be read)."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def forwarded() -> bool:
    """Whether a SIGTERM sent to the container reaches this process: PID 1 is the image's entrypoint."""
    return ENTRYPOINT in pid1()


def why_unreached() -> str:
    """Why a SIGTERM sent to the container does not reach the training processes, in a few words."""
    command = pid1()
    if "sm_train.sh" in command:
        return "PID 1 is SDK 3.x's driver sm_train.sh, which ignores it"
    return (
        f"PID 1 is {command[:60]!r}, not the image's entrypoint" if command else "PID 1 is not the image's entrypoint"
    )
