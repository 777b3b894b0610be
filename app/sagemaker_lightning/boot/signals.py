"""How a stop reaches the training processes. SageMaker signals only PID 1 on StopTrainingJob and spot interruption
(SIGTERM, then SIGKILL 120 s later). The image's entrypoint (PID 1) passes SIGTERM on to every training process that
registered here — not to launchers (mpirun, torchrun, the toolkit), which could end the ranks before their checkpoint
is written, and not to DataLoader workers, which die of it. A registration names its process by PID and start, and
goes when the process exits; one whose process is gone (SIGKILLed) is dropped when read: a reused PID is never
signalled, nor waited for. Where PID 1 is something else (SDK 3.x's driver runs `bash sm_train.sh` as PID 1,
which ignores SIGTERM), no stop ever arrives: the runtime says so and checkpoints by steps instead
(checkpoints/last.py). How the ranks then stop at one step together: stop/agreement.py. No torch: PID 1 imports this
module.

The registry is a folder of this process's user (RUN_DIR/trainers), which nobody else can write: on a shared host
without containers (Slurm, torchrun) another user could plant links in a folder of /tmp they made. RUN_DIR is under
XDG_RUNTIME_DIR where that folder exists (the user's own, made by the login), else /tmp/sagemaker-lightning-<uid>;
both levels are made with mode 0700, opened without following a link and checked for their owner, and every file is
created O_EXCL | O_NOFOLLOW inside them, renamed and removed through the folder's descriptor: a write never follows a
link. A folder that is a link, or another user's, is one line (UserError; PID 1 says it and goes on without it).

    python -c "from sagemaker_lightning.boot import signals; print(signals.registered(), signals.pid1())"
"""

import atexit
import os
import shutil
import stat

from sagemaker_lightning.failure import UserError


def default_run_dir(env=os.environ) -> str:
    """Where PID 1 and the trainers meet: the user's runtime folder where it exists, else a folder of /tmp named for
    the user (another user's folder of the same name is refused, never used)."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and os.path.isdir(runtime):
        return os.path.join(runtime, "sagemaker-lightning")
    return f"/tmp/sagemaker-lightning-{os.geteuid()}"


RUN_DIR = os.environ.get("SAGEMAKER_LIGHTNING_RUN_DIR") or default_run_dir()  # shared by PID 1 and the trainers
TRAINERS = "trainers"  # RUN_DIR's folder of registrations, a file per trainer named by its PID
ENTRYPOINT = "sagemaker_lightning.boot.entrypoint"  # how PID 1 shows in /proc/1/cmdline when it is the image's
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW  # a folder opened only where it is one, not a link to one


def started(pid: int) -> str | None:
    """When process `pid` started (/proc/<pid>/stat's field 22, in clock ticks after boot): with the PID, it names one
    process, as PIDs are reused. None when no such process runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces and ")"
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]  # fields[0] is field 3, the state


def own(path: str, name: str | None = None, parent: int | None = None, make: bool = True) -> int:
    """An open descriptor of the folder `path` (`name` in the folder open as `parent`, if given), made with mode 0700
    where missing and `make`; FileNotFoundError where missing otherwise; UserError where it is a link or not a folder,
    or another user's. One of this user's that others may read (an older run's) is made 0700."""
    name = path if name is None else name
    if make:
        if parent is None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)  # SAGEMAKER_LIGHTNING_RUN_DIR's, as given
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, FOLDER, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a link; ENOTDIR: a file
        raise UserError(
            f"{path} is a symbolic link or not a folder ({e.strerror}); the stop registry writes only into a folder of "
            "this process's own: remove it, or set SAGEMAKER_LIGHTNING_RUN_DIR to a folder of your own"
        ) from None
    found = os.fstat(fd)
    if found.st_uid != os.geteuid():
        os.close(fd)
        raise UserError(
            f"{path} belongs to uid {found.st_uid}, not to this process's user (uid {os.geteuid()}); the stop registry "
            "writes only into a folder of its own: remove it, or set SAGEMAKER_LIGHTNING_RUN_DIR to a folder of your own"
        )
    if stat.S_IMODE(found.st_mode) & 0o077:
        os.fchmod(fd, 0o700)
    return fd


def trainers(make: bool = True) -> int:
    """RUN_DIR/trainers, open (own)."""
    top = own(RUN_DIR, make=make)
    try:
        return own(os.path.join(RUN_DIR, TRAINERS), TRAINERS, top, make)
    finally:
        os.close(top)


def clear() -> str | None:
    """PID 1 at start: a restarted container's registrations removed, never following a link (RUN_DIR a link: nothing
    is removed; a link in the trainers folder's place: the link goes, not its target). Why RUN_DIR cannot serve (one
    line), or None."""
    try:
        top = own(RUN_DIR)
    except UserError as e:
        return str(e)
    try:
        if stat.S_ISDIR(os.stat(TRAINERS, dir_fd=top, follow_symlinks=False).st_mode):
            shutil.rmtree(TRAINERS, dir_fd=top, ignore_errors=True)  # by descriptors: it follows no link inside
        else:
            os.unlink(TRAINERS, dir_fd=top)
    except FileNotFoundError:
        pass
    finally:
        os.close(top)
    return None


def register(pid: int) -> None:
    """Ask PID 1 for SIGTERM: `pid` (this process) trains and checkpoints on it. The registration names the process
    by its start too, and goes when it exits: a PID reused later is never signalled, nor waited for. UserError where
    RUN_DIR or its folder is a link or another user's."""
    folder = trainers()
    draft = f".{pid}"
    try:
        try:
            os.unlink(draft, dir_fd=folder)  # a draft an earlier process of this PID left
        except FileNotFoundError:
            pass
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        with os.fdopen(fd, "w") as f:
            f.write(started(pid) or "")
        os.replace(draft, str(pid), src_dir_fd=folder, dst_dir_fd=folder)  # whole or not at all: PID 1 may read it
    finally:
        os.close(folder)
    atexit.register(_unregister, pid, os.path.join(RUN_DIR, TRAINERS, str(pid)))


def _unregister(pid: int, path: str) -> None:
    if os.getpid() == pid:  # not in a forked child (a DataLoader worker), which inherits the exit handlers
        _remove(path)


def _remove(path: str, folder: int | None = None) -> None:
    try:
        os.remove(path, dir_fd=folder)  # a link itself, never its target
    except OSError:  # gone already (PID 1 dropped it, its folder was removed): nothing to undo
        pass


def _read(name: str, folder: int) -> str | None:
    """A registration's content, read without following a link or waiting on a pipe; None where it cannot be."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:  # it ended meanwhile; a link
        return None
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read(64).decode(errors="replace")
        except OSError:  # a folder, a pipe: no registration
            return None


def registered() -> list[int]:
    """The registered training processes that still run; registrations of processes that ended are dropped. Nobody
    where the registry is missing, a link or another user's (PID 1 said so at its start)."""
    try:
        folder = trainers(make=False)
    except (FileNotFoundError, UserError):
        return []
    try:
        running = []
        for pid in sorted(int(n) for n in os.listdir(folder) if n.isdigit()):
            recorded = _read(str(pid), folder)
            if recorded is None:
                continue
            if recorded and recorded == started(pid):
                running.append(pid)
            else:
                _remove(str(pid), folder)
        return running
    finally:
        os.close(folder)


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
