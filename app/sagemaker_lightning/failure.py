"""How a job fails: one line naming the problem and the fix, on stderr and in SageMaker's failure file.

SageMaker shows the first 1024 characters of `/opt/ml/output/failure` as the job's FailureReason. The training
toolkit and SDK 3.x's driver write that file only when it does not exist yet, so the line written here stays. Under
torchrun the line also goes to torchrun's error file (TORCHELASTIC_ERROR_FILE): its error summary shows it, and a
restarted attempt names it (restarts.py) and takes it out of the failure file (forget). In a Kubernetes pod it is the
container's termination message too.

A failure becomes that line through one of two tables a reader can scan, each first match wins:
  EXCEPTIONS  here: an exception raised in the training process → its line (and whether its traceback helps); the
              runtime's LightningCLI asks it (cli/hub.py), and PID 1 for its own (boot/entrypoint.py)
  TOOLKIT     boot/toolkit_failure.py: the text the training toolkit or a launcher (torchrun, mpirun) left when a
              process failed → its line; PID 1 asks it
The runtime raises what it finds (UserError for what the user can fix). Three places report a line themselves, each
where no exception could carry it: the watchdog, whose thread ends a process stuck in a collective (health/judge.py);
Lightning's process launcher's log record of an ended local rank, before it kills the others (stop/process.py); PID 1.

    SM_OUTPUT_DIR=/tmp python -c "from sagemaker_lightning import failure; failure.report('data.batch_size must be positive')"
"""

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping

from sagemaker_lightning.launch import paths

FILE = "failure"  # SageMaker's failure file, in the output directory (SM_OUTPUT_DIR)
SIGTERM_EXIT = 128 + signal.SIGTERM  # stopped, checkpoint saved: not a failure of the code
TERMINATION_LOG = "/dev/termination-log"  # a Kubernetes container's terminationMessagePath, where the kubelet made it


class UserError(Exception):
    """A problem the user can fix: bad input, bad environment, missing data. Reported without a traceback."""


def report(message: str, env: Mapping[str, str] = os.environ, output_dir: str | None = None) -> int:
    """Print `message` as one line on stderr and keep it as the job's failure reason; return the exit code 1.
    The failure file goes to `output_dir`, else SM_OUTPUT_DIR (the toolkit's and SDK 3.x's), else nowhere."""
    line = " ".join(str(message).split())
    sys.stderr.write(f"ERROR: {line}\n")  # one write: several ranks may fail at once into one stream
    sys.stderr.flush()
    if error_file := env.get("TORCHELASTIC_ERROR_FILE"):  # torchrun's: its summary and the next attempt show the line
        try:  # torch's ErrorHandler's format; its summary shows py_callstack, here the line itself
            with open(error_file, "w") as f:
                info = {"py_callstack": line, "timestamp": str(int(time.time()))}
                json.dump({"message": {"message": line, "extraInfo": info}}, f)
        except OSError:
            pass
    if os.path.exists(TERMINATION_LOG):  # Kubernetes' termination message (kubectl describe pod): never made here
        try:
            with open(TERMINATION_LOG, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass
    output_dir = output_dir or paths.failure_dir(env)
    if output_dir:
        try:  # "x": the first process to fail names the cause; ranks failing after it are consequences
            with open(os.path.join(output_dir, FILE), "x") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return 1


def forget(env: Mapping[str, str] = os.environ) -> None:
    """The failure file's line removed, where a torchrun attempt that failed left it and the worker group's restart
    outlived it (its restart line says how it ended: stop/restarts.py): the line kept is then the failure of an
    attempt the job did not outlive, the one SageMaker names, not the first attempt's."""
    if output_dir := paths.failure_dir(env):
        try:
            os.remove(os.path.join(output_dir, FILE))
        except OSError:
            pass


# ---- exceptions in the training process ---------------------------------------------------------------------------


def argument_problem(message: str) -> str:
    """jsonargparse's nested errors boiled down to `key=value is not valid (expected type)` or `key.option is not
    accepted by class`."""
    keys = ""  # the nested keys as one dotted key: a group's error names the group, then its full key or the rest
    for key in re.findall(r'Parser key "([^"]+)"', message):
        keys = key if not keys or key.startswith(keys + ".") else f"{keys}.{key}"
    option = re.search(r"class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    if keys and option:  # e.g. --data.num_workers, an option of CIFAR10DataModule, given to DeviceCIFAR10DataModule
        return f"{keys}.{option.group(2)} is not accepted by {option.group(1)}"
    if unknown := re.search(r"(Group|Subcommand) '([\w.]+)' does not accept option '([\w.]+)'", message):
        return f"{unknown[2] + '.' if unknown[1] == 'Group' else ''}{unknown[3]} is not an option"
    value = re.search(r"(?:Got|Given) value: (.*?)(?: - |$)", message, re.M)
    if not keys or not value:
        return message.splitlines()[0]  # e.g. "Unrecognized arguments: --trainer.max_epochz 1" says it already
    expected = [  # each type of a Union, a Literal's values as they are: `(expected bool or one of 'a', 'b')`
        t.rsplit(".", 1)[-1] if t else f"one of {values}"
        for t, values in re.findall(
            r"Expected an? (?:<class '([\w.]+)'>|typing\.Literal\[(.*?)\](?:\.|$))", message, re.M
        )
        if t != "NoneType"
    ]
    return f"{keys}={value.group(1)} is not valid" + (f" (expected {' or '.join(expected)})" if expected else "")


def peer_failure(plan, message: str, resolve: Callable[[str], str]) -> str | None:
    """What a torch.distributed error means for this job, naming the host to look at; None when it is not one."""
    others = ", ".join(h for i, h in enumerate(plan.hosts) if i != plan.node_rank) or "none"
    master = f"{plan.master_addr}:{plan.master_port}"
    if joined := re.search(r"Timed out after (\d+) seconds waiting for clients\. (\d+)/(\d+) clients joined", message):
        return (
            f"only {joined[2]} of {joined[3]} processes joined within {joined[1]} s: the other hosts ({others}) did "
            f"not start training or cannot reach {master}; see their logs (dist_timeout sets the wait)"
        )
    if re.search(r"connect\(\) timed out|Connection refused|failed to connect|Socket Timeout", message, re.I):
        return (
            f"could not reach the first host {plan.hosts[0]} at {master} within dist_timeout: it did not start "
            "training or failed first; see its failure reason"
        )
    lost = re.search(
        r"(?:Connection closed by peer|Connection reset by peer|Read error|Write error)\D*(\d+\.\d+\.\d+\.\d+)", message
    )
    if lost:
        candidates = [h for i, h in enumerate(plan.hosts) if i != plan.node_rank] + [plan.host]  # a local rank last
        named = [h for h in candidates if _address(resolve, h) == lost[1]]
        return (
            f"lost the connection to host {named[0] if named else lost[1]} during training: a process there stopped; "
            "its failure reason names the cause"
        )
    if re.search(r"timed out|timeout", message, re.I) and re.search(
        r"gloo|nccl|collective|barrier|broadcast|allreduce", message, re.I
    ):
        return f"a collective operation did not finish within dist_timeout: a process on another host ({others}) stopped or hangs"
    return None


def _address(resolve: Callable[[str], str], host: str) -> str | None:
    try:
        return resolve(host)
    except OSError:
        return None


def _named(*names: str) -> Callable[[BaseException], bool]:
    """Matches an exception whose class (or a base class) has one of these names: the Lightning package that raised
    it (lightning or pytorch_lightning) need not be imported here."""
    return lambda e: any(c.__name__ in names for c in type(e).__mro__)


def _user_error(e: BaseException | None) -> BaseException | None:
    """`e` when it is a UserError, else the UserError it was raised from, if any: jsonargparse raises its own
    ValueError from a class's error when it builds a class chosen by name (a data module in subclass mode)."""
    while e is not None and not _named("UserError")(e):
        e = e.__cause__
    return e


def _user_line(e: BaseException) -> str:
    """A UserError's line; of one raised in a DataLoader worker (streamed data refused there: data/decoders.py), which
    torch raises again in the loader's process with the worker's traceback in its text, the error's own last line."""
    text = str(_user_error(e))
    if text.startswith("Caught UserError in DataLoader worker"):
        return text.rstrip().splitlines()[-1].split("UserError: ", 1)[-1]
    return text


def _configuration(e: BaseException, ctx: dict) -> str:
    """A class built from the configuration refused its arguments."""
    asked = str(ctx.get("accelerator", "")).lower()
    if asked in ("gpu", "cuda") and not ctx.get("cuda_available"):
        return f"trainer.accelerator={asked} asks for a GPU but this instance has none; use a GPU instance type or trainer.accelerator=cpu"
    return f"bad configuration: {str(e).splitlines()[0] if str(e) else type(e).__name__}"


def _out_of_memory(e: BaseException, ctx: dict) -> str:
    return (
        f"out of GPU memory on host {ctx.get('host', '?')} rank {ctx.get('rank', '?')} ({str(e).splitlines()[0]}); "
        "lower data.batch_size, the batch of each process, or use an instance with more GPU memory"
    )


KILLED = (
    "was killed with SIGKILL, most often by the kernel's out-of-memory killer; lower data.batch_size or "
    "data.num_workers, or use an instance with more memory"
)


def process_ended(host: str, rank: int, local_rank: int, code: int) -> str:
    """The line for training process `rank` that ended with `code` (as subprocess reports it: -9 for SIGKILL)."""
    what = KILLED if code in (-9, 137) else f"exited with code {code}; its log shows why"
    return f"training process rank {rank} (local rank {local_rank}) on host {host} {what}"


def _ended_child(e: BaseException, ctx: dict) -> str | None:
    """Under Lightning's process launcher a peer lost on this host is one of its own processes (local ranks 1..)."""
    plan, ended = ctx.get("plan"), ctx.get("ended")
    if not ended or plan is None:
        return None
    local_rank, code = ended[0]
    return process_ended(plan.host, plan.node_rank * plan.processes_per_host + local_rank, local_rank, code)


def _lost_local_peer(e: BaseException, ctx: dict) -> str | None:
    """Under torchrun or mpirun, a lost peer on this very host: one of the launcher's processes, which it names."""
    plan = ctx.get("plan")
    if plan is None or plan.launcher not in ("torchrun", "mpirun"):
        return None
    line = _lost_peer(e, ctx)
    return line if line and f"host {plan.host} during training" in line else None


def _lost_peer(e: BaseException, ctx: dict) -> str | None:
    plan = ctx.get("plan")
    if plan is None or not plan.in_job:
        return None
    return peer_failure(plan, str(e), ctx.get("resolve") or (lambda host: host))


def _streamed_read(e: BaseException, ctx: dict) -> str | None:
    """litdata could not read a streamed dataset from S3: it gives a bare S3 error, the same 404 for a prefix with no
    index.json and for a missing bucket (streaming.check_source, which the example calls, tells them apart)."""
    frames, tb = [], e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    if not any(f"{os.sep}litdata{os.sep}" in f for f in frames):
        return None
    error = getattr(e, "response", {}).get("Error", {})
    return (
        f"a streamed dataset could not be read from S3 ({getattr(e, 'operation_name', '?')}: "
        f"{error.get('Code', '?')} {error.get('Message', '')}".rstrip()
        + "): its s3:// prefix holds no dataset litdata optimized (index.json), its bucket does not exist, or the "
        "job's role cannot read it; sagemaker_lightning.data.streaming.check_source(url) in the data module says which"
    )


DISTRIBUTED = ("DistError", "DistBackendError", "DistNetworkError", "RuntimeError")  # what a lost peer raises
STOPPED = (
    "stopped by SIGTERM (StopTrainingJob or a spot interruption) after saving last.ckpt; "
    "a job restarted with the same checkpoint location resumes from it"
)

# (matches the exception, its line (None: not this row), exit code, print the traceback too, the line goes to the
# failure file too) — first match wins
EXCEPTIONS: list[
    tuple[Callable[[BaseException], bool], Callable[[BaseException, dict], str | None], int, bool, bool]
] = [
    (lambda e: _user_error(e) is not None, lambda e, ctx: _user_line(e), 1, False, True),
    (
        _named("ArgumentError"),
        lambda e, ctx: f"bad hyperparameter: {argument_problem(str(e))}; {ctx.get('help', '--help')} lists them",
        1,
        False,
        True,
    ),
    (_named("SIGTERMException"), lambda e, ctx: STOPPED, SIGTERM_EXIT, False, True),
    (_named("OutOfMemoryError"), _out_of_memory, 1, False, True),
    # while the classes are built from the configuration, these mean a value the class refused
    (
        lambda e: _named("MisconfigurationException", "ValueError", "TypeError")(e),
        lambda e, ctx: _configuration(e, ctx) if ctx.get("stage") == "configure" else None,
        1,
        False,
        True,
    ),
    (_named("ClientError"), _streamed_read, 1, False, True),  # botocore's, raised inside litdata
    (_named(*DISTRIBUTED), _ended_child, 1, False, True),
    # torchrun and mpirun name a process of theirs that died (TOOLKIT below): the file is theirs
    (_named(*DISTRIBUTED), _lost_local_peer, 1, False, False),
    (_named(*DISTRIBUTED), _lost_peer, 1, False, True),
    (lambda e: True, lambda e, ctx: f"{type(e).__name__}: {e}", 1, True, True),  # unforeseen: its traceback, the line
]


def explain(e: BaseException, **ctx) -> tuple[str, int, bool, bool]:
    """The failure line for `e`, the exit code, whether its traceback belongs in the log and whether the line goes
    to the failure file too. ctx: stage ("configure" or "train"), plan, resolve (host → address), host, rank,
    accelerator, cuda_available, help, ended ((local rank, exit code) of the process launcher's processes that
    ended with an error)."""
    for matches, line, code, traceback, file in EXCEPTIONS:
        if matches(e) and (text := line(e, ctx)) is not None:
            return text, code, traceback, file
    raise AssertionError("the last row matches everything")
