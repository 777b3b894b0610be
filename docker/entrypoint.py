#!/usr/bin/env python3
"""The image's entrypoint, PID 1: runs the command (`train`), passes SIGTERM on to the training processes and
waits for every process, so the training can checkpoint and exit inside SageMaker's grace period.

SageMaker signals only PID 1 on StopTrainingJob and spot interruption (and kills the container 120 s later);
the training toolkit does not pass the signal on (sagemaker-training-toolkit #125, #173). The signal goes to each
wrapper ($SAGEMAKER_PROGRAM, app/launch.py), which passes it to the trainer it started; without a wrapper (a
plain `docker run ... python train.py`) to the command itself. Never to everyone: DataLoader workers die of it,
and their trainer with them, before it can checkpoint. Before the command
starts, inside a SageMaker job (resourceconfig.json present):
  - processes see the SageMaker host name (algo-N) in gethostname(): MPI and NCCL name hosts by it; the
    toolkit's own preload library provides it, as its mpirun commands use it;
  - a network interface that the job names but the container lacks (SDK 3.x local mode writes "ethwe") is
    replaced in resourceconfig.json by the default route's, before the toolkit passes it to mpirun and NCCL;
  - every host name must resolve within dist_timeout (the hyperparameter, else trainer.yaml's), or the job
    fails naming the host: the toolkit alone would wait 15 minutes for a host whose container never started.

    docker run --rm sagemaker-lightning train          # what SageMaker runs
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import yaml

CODE = "/opt/ml/code"  # the app: trainer.yaml, and failure.py for the one-line failure contract
RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"
HYPERPARAMETERS = "/opt/ml/input/config/hyperparameters.json"
STOP_GRACE_S = 110  # after SIGTERM: SageMaker kills the container 120 s after signalling it
LEFTOVER_GRACE_S = 10  # after the command ends: daemons it left (sshd for MPI) get this long to exit


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


def dist_timeout() -> int:
    with open(HYPERPARAMETERS) as f:
        given = json.load(f).get("dist_timeout")
    if given is not None:
        return int(json.loads(given) if isinstance(given, str) else given)
    with open(os.path.join(CODE, "trainer.yaml")) as f:
        return int(yaml.safe_load(f)["dist_timeout"])


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


def prepare_job(env: dict) -> str | None:
    """Inside a SageMaker job: the interface repair, the host wait and the host-name preload. Returns why the
    job cannot run, or None."""
    with open(RESOURCE_CONFIG) as f:
        config = json.load(f)
    timeout = dist_timeout()
    if missing := unresolved(config["hosts"], timeout):
        return (
            f"host {missing} did not come up within dist_timeout={timeout} s (its name does not resolve): "
            "its container did not start; see its log"
        )
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
    try:
        import gethostname  # sagemaker-training's preload library: gethostname() reads resourceconfig.json
    except ImportError:
        return None
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), gethostname.__file__]))
    return None


def wrappers(program: str) -> list[int]:
    """The processes running the SageMaker program (launch.py): one per host, or one per device under a launcher."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue  # gone meanwhile
        if any(os.path.basename(arg) == program for arg in argv[1:]):
            found.append(int(pid))
    return found


def main() -> int:
    command = sys.argv[1:] or ["train"]
    env = dict(os.environ)
    if os.path.exists(RESOURCE_CONFIG) and (problem := prepare_job(env)):
        sys.path.insert(0, CODE)
        from failure import report

        return report(problem, env={"SM_OUTPUT_DIR": "/opt/ml/output"})
    child = subprocess.Popen(command, env=env, start_new_session=os.getpid() != 1)
    deadline, stopped_by = None, None

    def leftovers() -> None:  # after the command: daemons it started (sshd for MPI)
        try:
            os.kill(-1, signal.SIGTERM) if os.getpid() == 1 else os.killpg(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def on_signal(signum, frame):
        nonlocal deadline, stopped_by
        deadline, stopped_by = time.monotonic() + STOP_GRACE_S, signum
        for pid in wrappers(os.path.basename(env.get("SAGEMAKER_PROGRAM", "launch.py"))) or [child.pid]:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = None
    while True:  # reap every child, orphans included, until none is left or time is up
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            if deadline is None:
                deadline = time.monotonic() + LEFTOVER_GRACE_S
                leftovers()
        elif pid == 0:
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.1)
    if stopped_by:
        return 128 + stopped_by  # stopped: whatever the command made of it
    if code is None:
        return 128 + signal.SIGKILL  # the command outlived the grace period
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
