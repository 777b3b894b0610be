"""The image's entrypoint, PID 1: prepares a SageMaker job (prepare.py), runs its command (`train`, the training
toolkit), passes a stop on to the training processes and waits for every process, so training can checkpoint and exit
inside the platform's grace period; every way it fails ends in one line in the failure file.

SageMaker signals only PID 1 on StopTrainingJob and spot interruption (and kills the container 120 s later); the
training toolkit does not pass the signal on (sagemaker-training-toolkit #125, #173). Kubernetes does the same (30 s
later by default); HyperPod's graceful stop sends SIGUSR1, passed on as SIGTERM. Once the stopped trainers have
ended, the command is signalled too: a launcher (torchrun with --max-restarts) would restart them. The signal goes to
each training process that registered (signals.py); without any (a plain `docker run ... python script.py`), to the
command itself. In a job the command's output passes through here as it comes, its last lines kept for the failure
line (command_output.py, toolkit_failure.py). SDK 3.x with SourceCode replaces this entrypoint with its own driver:
none of this runs then (signals.py).

    docker run --rm sagemaker-lightning train          # what SageMaker runs
"""

import collections
import json
import os
import signal
import subprocess
import sys
import time

from sagemaker_lightning import failure
from sagemaker_lightning.boot import signals
from sagemaker_lightning.boot.command_output import LOG_TAIL_LINES, copy, note
from sagemaker_lightning.boot.prepare import prepare_job
from sagemaker_lightning.boot.toolkit_failure import toolkit
from sagemaker_lightning.launch import paths
from sagemaker_lightning.launch.platforms.sagemaker import GRACE_S
from sagemaker_lightning.launch.started import STARTED_AT

RESOURCE_CONFIG = paths.resource_config(os.environ)
CODE = paths.code_dir(os.environ)
OUTPUT = paths.output_dir(os.environ)
EXIT_MARGIN_S = 10  # of SageMaker's grace: PID 1 gives the stopped processes the rest, then ends before its SIGKILL
LEFTOVER_GRACE_S = 10  # after the command ends: daemons it left (sshd for MPI) get this long to exit
STOPS = {signal.SIGUSR1: signal.SIGTERM}  # other stops, passed on as SIGTERM: HyperPod's graceful operator stop


def one_line_failure(code: int, log: str = "") -> None:
    """After a failed command: the failure file holds one line. The toolkit leaves its traceback there (or, when
    it died first, nothing); toolkit_failure.toolkit turns that, and the end of the command's output `log`, into the line."""
    path = os.path.join(OUTPUT, failure.FILE)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = f"exit code {code}"
    with open(RESOURCE_CONFIG) as f:
        host = json.load(f).get("current_host", "?")
    if (line := toolkit(text, host, CODE, log)) is not None:
        if os.path.exists(path):
            os.remove(path)
        failure.report(line, output_dir=OUTPUT)


def make_output_dir() -> None:
    """The job's output folder, where the container has none: SageMaker mounts one, a bare `docker run` given the
    job's config does not. The failure file goes there; without it sagemaker-training's `train` exited 0 after a
    failed training (writing its failure file raises in its except clause, before the exit code its finally uses)."""
    try:
        os.makedirs(OUTPUT, exist_ok=True)
    except OSError:  # a read-only file system: the failure is the line on stderr only
        pass


class Stopped(Exception):
    """A stop (SIGTERM, SIGINT) while the job was being prepared."""


def main() -> int:
    # From the first instruction: a stop during the host wait or the SSH exchange (up to dist_timeout) ends the
    # container at once; a PID 1 without a handler never receives SIGTERM, and would wait for SageMaker's SIGKILL
    preparing, pending = True, []

    def on_early_signal(signum, frame):
        pending.append(signum)
        if preparing:
            raise Stopped(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, *STOPS):
        signal.signal(signum, on_early_signal)
    command = sys.argv[1:] or ["train"]
    env = {**os.environ, STARTED_AT: repr(time.time())}  # the container's start: the job's goodput counts from here
    in_job = os.path.exists(RESOURCE_CONFIG)
    if why := signals.clear():  # a restarted container's leftovers; a registry that is a link or another user's
        note(f"{why}; a stop goes to the command instead of the training processes")
    if in_job:
        make_output_dir()
        try:
            prepare_job(env, RESOURCE_CONFIG, CODE)
        except Stopped as e:
            failure.report(
                f"stopped by {signal.Signals(e.args[0]).name} while the job was starting (waiting for its hosts, "
                "exchanging SSH keys): nothing was trained; a job restarted with the same checkpoint location resumes "
                "from its checkpoints, if any",
                output_dir=OUTPUT,
            )
            return 128 + e.args[0]
        except failure.UserError as e:
            return failure.report(str(e), output_dir=OUTPUT)
        except (OSError, ValueError, KeyError) as e:  # SageMaker's own files unreadable: say which, in one line
            return failure.report(
                f"the image's entrypoint cannot prepare the job: {type(e).__name__}: {e}", output_dir=OUTPUT
            )
    preparing = False  # a stop from here on is passed on to the command (below), one that comes meanwhile too
    # in a job the command's output passes through here, its end kept for the failure line
    pipe = subprocess.PIPE if in_job else None
    child = subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe, start_new_session=os.getpid() != 1)
    tail: collections.deque[bytes] = collections.deque(maxlen=LOG_TAIL_LINES)
    copies = [
        copy(stream, to, tail) for stream, to in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)) if stream
    ]
    deadline, stopped_by, signalled = None, None, []

    def leftovers() -> None:  # after the command: daemons it started (sshd for MPI)
        try:
            os.kill(-1, signal.SIGTERM) if os.getpid() == 1 else os.killpg(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def on_signal(signum, frame):
        nonlocal deadline, stopped_by
        received, signum = signum, STOPS.get(signum, signum)
        deadline, stopped_by = time.monotonic() + GRACE_S - EXIT_MARGIN_S, signum
        trainers = signals.registered()
        signalled[:] = trainers
        whom = f"training processes {', '.join(map(str, trainers))}" if trainers else f"the command ({child.pid})"
        as_what = "" if received == signum else f" as {signal.Signals(signum).name}"
        note(f"{signal.Signals(received).name}: passed on to {whom}{as_what}")  # in the log: when, and to whom
        for pid in trainers or [child.pid]:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    for signum in (signal.SIGTERM, signal.SIGINT, *STOPS):
        signal.signal(signum, on_signal)
    for signum in pending[:1]:
        on_signal(signum, None)
    code, cleared = None, False
    while True:  # reap every child, orphans included, until none is left or time is up
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
        # the command ended (and, after a stop, every trainer with its checkpoint): what it left gets a short grace.
        # Waiting out the stop's instead held a stopped MPI job's container 110 s for its sshd
        if code is not None and not cleared and not (stopped_by and signals.registered()):
            cleared, deadline = True, min(deadline or float("inf"), time.monotonic() + LEFTOVER_GRACE_S)
            leftovers()
        # after a stop, once the trainers it reached have ended: a launcher that would restart them (torchrun with
        # --max-restarts) is stopped too, and stops whatever it started since
        if signalled and code is None and not set(signalled) & set(signals.registered()):
            signalled.clear()
            try:
                os.kill(child.pid, stopped_by)
            except ProcessLookupError:
                pass
        if pid == 0:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.1)
    for thread in copies:  # the last lines (daemons the command left, such as sshd, may hold the pipes open)
        thread.join(timeout=2)
    if stopped_by:
        return 128 + stopped_by  # stopped: whatever the command made of it
    if code is None:
        return 128 + signal.SIGKILL  # the command outlived the grace period
    code = code if code >= 0 else 128 - code
    if code and in_job:
        one_line_failure(code, b"".join(tail).decode(errors="replace"))
    return code


if __name__ == "__main__":
    sys.exit(main())
