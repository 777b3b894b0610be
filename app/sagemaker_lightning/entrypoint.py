"""The image's entrypoint, PID 1: prepares a SageMaker job, runs its command (`train`, the training toolkit), passes
SIGTERM on to the training processes and waits for every process, so training can checkpoint and exit inside
SageMaker's grace period; every way it fails ends in one line in the failure file.

SageMaker signals only PID 1 on StopTrainingJob and spot interruption (and kills the container 120 s later); the
training toolkit does not pass the signal on (sagemaker-training-toolkit #125, #173). Kubernetes does the same (30 s
later by default); HyperPod's graceful stop sends SIGUSR1, passed on as SIGTERM. Once the stopped trainers have
ended, the command is signalled too: a launcher (torchrun with --max-restarts) would restart them. The signal goes to
each training process that registered (signals.py); without any (a plain `docker run ... python script.py`), to the
command itself. In a job the command's output passes through here as it comes (a \\r progress bar too), its last
lines kept, each cut short, for the failure line. Before the command starts, inside a SageMaker job
(resourceconfig.json present):
  - the code: the job's own (SDK 2.x `entry_point`/`source_dir`: the hyperparameter sagemaker_program, or code
    mounted over /opt/ml/code in local mode), else the image's example (copied into /opt/ml/code, run as train.py);
  - every host name must resolve within dist_timeout (a hyperparameter, default 600 s), or the job fails naming the
    host: the toolkit alone would wait 15 minutes for a host whose container never started;
  - an MPI job's SSH keys, made now and exchanged with the job's other hosts (ssh.py): the image holds none;
  - a network interface the job names but the container lacks (SDK 3.x local mode writes "ethwe") is replaced in
    resourceconfig.json by the default route's, before the toolkit passes it to mpirun and NCCL;
  - the job's caches in the warm pool's cache folder, and the job's requirements.txt installed from it where an
    earlier job on the instance kept its wheels there (warmpool.py);
  - processes see the SageMaker host name (algo-N) in gethostname(), as MPI and NCCL name hosts by it (the
    toolkit's own preload library, which its mpirun commands use too).
SDK 3.x with SourceCode replaces this entrypoint with its own driver: none of this runs then (signals.py).

    docker run --rm sagemaker-lightning train          # what SageMaker runs
"""

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from sagemaker_lightning import failure, hyperparameters, paths, signals, ssh, warmpool
from sagemaker_lightning.plan import DEFAULT_TIMEOUT_S, check_timeout

RESOURCE_CONFIG = paths.resource_config(os.environ)
CODE = paths.code_dir(os.environ)
OUTPUT = paths.output_dir(os.environ)
EXAMPLE = os.environ.get("SAGEMAKER_LIGHTNING_EXAMPLE", "/opt/sagemaker-lightning/example")  # the image's example
STOP_GRACE_S = 110  # after SIGTERM: SageMaker kills the container 120 s after signalling it
LOG_TAIL_LINES = 300  # of the command's output, kept for the failure line: launchers print their summaries there
LOG_LINE_BYTES = 4096  # of each line in that tail, from its start: a line of any length (a tensor printed) is cut
LOG_CHUNK_BYTES = 65536  # read from the command's pipes at a time, and passed on at once, newline or not
LEFTOVER_GRACE_S = 10  # after the command ends: daemons it left (sshd for MPI) get this long to exit
STOPS = {signal.SIGUSR1: signal.SIGTERM}  # other stops, passed on as SIGTERM: HyperPod's graceful operator stop


def default_interface(route_table: str) -> str | None:
    """The interface of the default route, from /proc/net/route's text."""
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1 and fields[1] == "00000000":
            return fields[0]
    return None


def repaired(config: dict, interfaces: set[str], fallback: str | None) -> dict | None:
    """resourceconfig with a network interface that exists here, or None when it needs no change."""
    named = config.get("network_interface_name")
    if named is None or named in interfaces or fallback is None:
        return None
    return {**config, "network_interface_name": fallback}


def dist_timeout(given: dict) -> int:
    """dist_timeout from the job's hyperparameters, whichever form the SDK sent it in (3, "3", "600")."""
    value = hyperparameters.typed(given.get("dist_timeout", DEFAULT_TIMEOUT_S))
    if isinstance(value, str) and value.strip().isdigit():  # SDK 2.x with source_dir JSON-encodes a string: '"60"'
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise failure.UserError(f"dist_timeout={value!r} is not a positive whole number of seconds; e.g. 600")
    return check_timeout(value)


def unresolved(hosts: list[str], timeout_s: float) -> str | None:
    """The first host name that does not resolve within the timeout, or None when all do."""
    deadline = time.monotonic() + timeout_s
    for host in hosts:
        while True:
            try:
                socket.gethostbyname(host)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return host
                time.sleep(1)
    return None


def brings_code(given: dict, env: dict, code_dir: str) -> bool:
    """Whether the job brings its own code: an entry point (SDK 2.x), a program chosen in its environment, or a
    directory mounted over the code directory (local mode)."""
    return "sagemaker_program" in given or "SAGEMAKER_PROGRAM" in env or bool(os.listdir(code_dir))


def prepare_job(env: dict) -> None:
    """Inside a SageMaker job: code, host wait, interface repair and host-name preload (module docstring)."""
    with open(RESOURCE_CONFIG) as f:
        config = json.load(f)
    try:
        with open(paths.hyperparameters_file(os.environ)) as f:
            given = json.load(f)
    except FileNotFoundError:
        given = {}
    timeout = dist_timeout(given)
    os.makedirs(CODE, exist_ok=True)
    if not brings_code(given, env, CODE):
        shutil.copytree(EXAMPLE, CODE, dirs_exist_ok=True)
        env["SAGEMAKER_PROGRAM"] = "train.py"
    if missing := unresolved(config["hosts"], timeout):
        raise failure.UserError(
            f"host {missing} did not come up within dist_timeout={timeout} s (its name does not resolve): "
            "its container did not start; see its log"
        )
    if ssh.needed(given):  # before the toolkit starts sshd: this job's keys, exchanged with its other hosts
        ssh.prepare(config["hosts"], config["current_host"], timeout, os.path.expanduser("~/.ssh"))
    with open("/proc/net/route") as f:
        fallback = default_interface(f.read())
    fixed = repaired(config, {name for _, name in socket.if_nameindex()}, fallback)
    if fixed:
        with open(RESOURCE_CONFIG, "w") as f:
            json.dump(fixed, f)
        print(
            f"entrypoint: the job names network interface {config['network_interface_name']!r}, "
            f"which this container lacks; using {fallback!r}",
            flush=True,
        )
    warmpool.prepare(env, given, CODE, lambda line: print(f"entrypoint: {line}", flush=True))
    if RESOURCE_CONFIG != paths.HOSTNAME_LIBRARY_READS:
        return  # a moved /opt/ml (SAGEMAKER_BASE_DIR, as in tests): the library would not find the file
    try:
        import gethostname  # sagemaker-training's preload library: gethostname() reads resourceconfig.json
    except ImportError:
        return
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), gethostname.__file__]))


def one_line_failure(code: int, log: str = "") -> None:
    """After a failed command: the failure file holds one line. The toolkit leaves its traceback there (or, when
    it died first, nothing); failure.toolkit turns that, and the end of the command's output `log`, into the line."""
    path = os.path.join(OUTPUT, "failure")
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = f"exit code {code}"
    with open(RESOURCE_CONFIG) as f:
        host = json.load(f).get("current_host", "?")
    if (line := failure.toolkit(text, host, CODE, log)) is not None:
        if os.path.exists(path):
            os.remove(path)
        failure.report(line, output_dir=OUTPUT)


def note(line: str) -> None:
    """One line of PID 1's own on stderr, in one write: safe in a signal handler, and where sys.stderr is broken."""
    try:
        os.write(2, f"entrypoint: {' '.join(line.split())}\n".encode())
    except OSError:
        pass


def kept(tail: collections.deque, partial: bytes, chunk: bytes) -> bytes:
    """Adds the lines that `chunk` completes to `tail`, each cut to LOG_LINE_BYTES; returns the line still open."""
    *ended, partial = (partial + chunk).split(b"\n")
    tail.extend(line[:LOG_LINE_BYTES] + b"\n" for line in ended)
    return partial[:LOG_LINE_BYTES]


def copy(stream, to, tail: collections.deque) -> threading.Thread:
    """A thread that copies `stream` to `to` as it comes (a \\r progress bar too: no wait for a newline), keeping its
    last lines in `tail`. Should that fail, it says so in one line and drains `stream` from then on: a command whose
    output pipe is full blocks, a hang with no line."""

    def run() -> None:
        fd, partial, failed = stream.fileno(), b"", False
        while chunk := os.read(fd, LOG_CHUNK_BYTES):
            if failed:
                continue
            try:
                to.buffer.write(chunk)
                to.flush()
                partial = kept(tail, partial, chunk)
            except Exception as e:  # whatever it is: the command must not block on its pipe
                failed = True
                note(
                    f"the command's output is no longer copied to {getattr(to, 'name', to)} ({type(e).__name__}: "
                    f"{e}); it is read and dropped from here on, so that the command does not block"
                )
        if partial:
            tail.append(partial)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


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
    env = dict(os.environ)
    in_job = os.path.exists(RESOURCE_CONFIG)
    if why := signals.clear():  # a restarted container's leftovers; a registry that is a link or another user's
        note(f"{why}; a stop goes to the command instead of the training processes")
    if in_job:
        try:
            prepare_job(env)
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
        deadline, stopped_by = time.monotonic() + STOP_GRACE_S, signum
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
