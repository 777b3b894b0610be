"""PID 1 prepares a SageMaker job before the toolkit runs its command (entrypoint.py), inside a job only
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
No torch.

    SAGEMAKER_BASE_DIR=/tmp/ml python -c "from sagemaker_lightning.boot import prepare; print(prepare.default_interface(open('/proc/net/route').read()))"
"""

import json
import os
import shutil
import socket

from sagemaker_lightning.boot import ssh, warmpool
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch import paths
from sagemaker_lightning.launch.hosts import unresolved
from sagemaker_lightning.launch.platforms.sagemaker import resource_hosts
from sagemaker_lightning.launch.timeout import dist_timeout

EXAMPLE = os.environ.get("SAGEMAKER_LIGHTNING_EXAMPLE", "/opt/sagemaker-lightning/example")  # the image's example


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


def brings_code(given: dict, env: dict, code_dir: str) -> bool:
    """Whether the job brings its own code: an entry point (SDK 2.x), a program chosen in its environment, or a
    directory mounted over the code directory (local mode)."""
    return "sagemaker_program" in given or "SAGEMAKER_PROGRAM" in env or bool(os.listdir(code_dir))


def prepare_job(env: dict, resource_config: str, code: str) -> None:
    """Inside a SageMaker job (module docstring): `env`, the environment the command gets; `resource_config`, the
    path of resourceconfig.json; `code`, the job's code directory."""
    with open(resource_config) as f:
        config = json.load(f)
    hosts, current = resource_hosts(config)
    try:
        with open(paths.hyperparameters_file(os.environ)) as f:
            given = json.load(f)
    except FileNotFoundError:
        given = {}
    timeout = dist_timeout(given)
    os.makedirs(code, exist_ok=True)
    if not brings_code(given, env, code):
        shutil.copytree(EXAMPLE, code, dirs_exist_ok=True)
        env["SAGEMAKER_PROGRAM"] = "train.py"
    if missing := unresolved(hosts, timeout):
        raise UserError(
            f"host {missing} did not come up within dist_timeout={timeout} s (its name does not resolve): "
            "its container did not start; see its log"
        )
    if ssh.needed(given):  # before the toolkit starts sshd: this job's keys, exchanged with its other hosts
        ssh.prepare(hosts, hosts[current], timeout, os.path.expanduser("~/.ssh"))
    with open("/proc/net/route") as f:
        fallback = default_interface(f.read())
    fixed = repaired(config, {name for _, name in socket.if_nameindex()}, fallback)
    if fixed:
        with open(resource_config, "w") as f:
            json.dump(fixed, f)
        print(
            f"entrypoint: the job names network interface {config['network_interface_name']!r}, "
            f"which this container lacks; using {fallback!r}",
            flush=True,
        )
    warmpool.prepare(env, given, code, lambda line: print(f"entrypoint: {line}", flush=True))
    if resource_config != paths.HOSTNAME_LIBRARY_READS:
        return  # a moved /opt/ml (SAGEMAKER_BASE_DIR, as in tests): the library would not find the file
    try:
        import gethostname  # sagemaker-training's preload library: gethostname() reads resourceconfig.json
    except ImportError:
        return
    env["LD_PRELOAD"] = " ".join(filter(None, [env.get("LD_PRELOAD"), gethostname.__file__]))
