"""How a stop reaches the training processes. SageMaker signals only PID 1 on StopTrainingJob and spot interruption
(SIGTERM, then SIGKILL 120 s later). The image's entrypoint (PID 1) passes SIGTERM on to every training process that
registered here — not to launchers (mpirun, torchrun, the toolkit), which could end the ranks before their checkpoint
is written, and not to DataLoader workers, which die of it. Where PID 1 is something else (SDK 3.x's driver runs
`bash sm_train.sh` as PID 1, which ignores SIGTERM), no stop ever arrives: the runtime says so and checkpoints by
steps instead (checkpoints.LastCheckpoint). How the ranks then stop at one step together: stop.py. No torch: PID 1
imports this module.

    python -c "from sagemaker_lightning import signals; print(signals.registered(), signals.pid1())"
"""

import os

RUN_DIR = os.environ.get("SAGEMAKER_LIGHTNING_RUN_DIR", "/tmp/sagemaker-lightning")  # shared by PID 1 and the trainers
ENTRYPOINT = "sagemaker_lightning.entrypoint"  # how PID 1 shows in /proc/1/cmdline when it is the image's


def register(pid: int) -> None:
    """Ask PID 1 for SIGTERM: `pid` trains and checkpoints on it."""
    os.makedirs(os.path.join(RUN_DIR, "trainers"), exist_ok=True)
    open(os.path.join(RUN_DIR, "trainers", str(pid)), "w").close()


def registered() -> list[int]:
    """The registered training processes that still run."""
    try:
        names = os.listdir(os.path.join(RUN_DIR, "trainers"))
    except FileNotFoundError:
        return []
    return [int(n) for n in names if n.isdigit() and os.path.exists(f"/proc/{n}")]


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
