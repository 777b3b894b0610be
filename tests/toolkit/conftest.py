"""A temporary /opt/ml tree and the image's entrypoint running the real `train` console script of
sagemaker-training on it, one process tree per host, as SageMaker starts each container.

SAGEMAKER_BASE_DIR moves /opt/ml for the toolkit and the entrypoint; the toolkit reads the same three JSON files
SageMaker writes. Every process of a job starts as in the image: image_start/ on PYTHONPATH runs the start-up hook
that the image's .pth file runs (the launch plan's variables; the hosts share this machine's cores as in local mode).
A job without code of its own runs the example (app/example), as the image does. For a line the runtime alone makes,
run_in_process runs the example's program in the test's process, as the toolkit would start it.
"""

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pytest
from proctree import kill_tree

import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "app", "example")
IMAGE_START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_start")  # the image's start-up hook
# the image's ENTRYPOINT and CMD: PID 1 runs the toolkit's console script
ENTRYPOINT = [
    sys.executable,
    "-m",
    "sagemaker_lightning.boot.entrypoint",
    os.path.join(os.path.dirname(sys.executable), "train"),
]


TINY = {  # hyperparameters small enough for 2 CPU cores: batch 16, two steps, one validation batch
    "trainer.max_epochs": "1",
    "trainer.limit_train_batches": "2",
    "trainer.limit_val_batches": "1",
    "trainer.enable_progress_bar": "False",
    "trainer.precision": "32-true",
    "data.batch_size": "16",
}


@pytest.fixture(scope="session")
def tiny() -> Mapping[str, str]:
    """TINY, read-only: a session's fixtures (one job, several tests' assertions) take it too."""
    return MappingProxyType(TINY)


@dataclass
class Host:
    base: str
    returncode: int
    output: str
    seconds: float

    def path(self, *parts) -> str:
        return os.path.join(self.base, *parts)

    @property
    def failure(self) -> str | None:
        path = self.path("output", "failure")
        return open(path).read() if os.path.exists(path) else None


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> str:
    """A channel with scikit-learn's real handwritten digits in the CIFAR-10 layout (scripts/make_dataset.py digits)."""
    out = str(tmp_path_factory.mktemp("digits"))
    make_dataset.digits(out)
    return out


@pytest.fixture(scope="session")
def corrupt_dir(tmp_path_factory) -> str:
    """A channel whose cifar-10-python.tar.gz is not a gzip file."""
    out = tmp_path_factory.mktemp("corrupt")
    (out / "cifar-10-python.tar.gz").write_bytes(b"<html>an error page saved under the archive's name</html>")
    return str(out)


def make_opt_ml(
    base, hosts, current, hyperparameters, channels, code=None, interface="lo", checkpoints=None, output=True
) -> None:
    """What SageMaker writes before it starts a container: config files, channels, and the job's code if any;
    checkpoints: the LocalPath of the job's CheckpointConfig (checkpointconfig.json), a folder SageMaker syncs;
    output=False: no output folder, as a bare `docker run` given the config has none (SageMaker mounts one)."""
    config = os.path.join(base, "input", "config")
    os.makedirs(config)
    for name, content in {
        "resourceconfig.json": {"current_host": current, "hosts": hosts, "network_interface_name": interface},
        "hyperparameters.json": {k: v if isinstance(v, str) else json.dumps(v) for k, v in hyperparameters.items()},
        "inputdataconfig.json": {c: {"TrainingInputMode": "File"} for c in channels},
        **({"checkpointconfig.json": {"LocalPath": checkpoints}} if checkpoints else {}),
    }.items():
        with open(os.path.join(config, name), "w") as f:
            json.dump(content, f)
    for channel, source in channels.items():
        target = os.path.join(base, "input", "data", channel)
        shutil.copytree(source, target) if source else os.makedirs(target)
    for d in ("model", "output/data") if output else ("model",):
        os.makedirs(os.path.join(base, d))
    if code:  # local mode's way: the job's source directory where the toolkit finds its code
        shutil.copytree(code, os.path.join(base, "code"), ignore=shutil.ignore_patterns("__pycache__"))


def run_job(
    root, port: int, hosts, hyperparameters, channels, current_hosts=None, env=None, code=None, timeout=300,
    checkpoints=None, output=True,
):  # fmt: skip
    """Run the entrypoint and `train` for each host of one job (under `root`) at the same time; return what each did."""
    procs = []
    for i, current in enumerate(current_hosts or hosts):
        base = os.path.join(root, f"host{i}")
        make_opt_ml(base, hosts, current, hyperparameters, channels, code, checkpoints=checkpoints, output=output)
        # a job's requirements.txt installs into the host's own folder, as into its container: not this venv
        site = os.path.join(base, "site-packages")
        paths = [site, (env or {}).get("PYTHONPATH"), IMAGE_START, os.environ.get("PYTHONPATH")]
        proc_env = {
            **os.environ,
            "SAGEMAKER_BASE_DIR": base,
            "SAGEMAKER_LIGHTNING_EXAMPLE": EXAMPLE,
            "SAGEMAKER_LIGHTNING_RUN_DIR": os.path.join(base, "run"),
            "MASTER_PORT": str(port),
            **(env or {}),
            "PIP_TARGET": site,
            "PYTHONPATH": os.pathsep.join(filter(None, paths)),
        }
        popen = subprocess.Popen(ENTRYPOINT, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append((base, time.monotonic(), popen))
    results = []
    try:
        for base, start, proc in procs:
            output, _ = proc.communicate(timeout=timeout)
            results.append(Host(base, proc.returncode, output, time.monotonic() - start))
    finally:  # a timeout (or any error here) leaves no host running into the next test
        for _, _, proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.communicate()
    return results


@pytest.fixture
def run_hosts(tmp_path, free_port):
    """run_job for a test: each job under a folder of its own in the test's temporary folder."""
    jobs = itertools.count()
    return lambda *args, **kwargs: run_job(tmp_path / f"job{next(jobs)}", free_port(), *args, **kwargs)


@pytest.fixture(scope="session")
def run_hosts_once(tmp_path_factory, free_port):
    """run_job for a fixture wider than a test (one job, several tests' assertions): each job in a folder of its own."""
    return lambda *args, **kwargs: run_job(tmp_path_factory.mktemp("job"), free_port(), *args, **kwargs)


# the environment and arguments sagemaker-training's `train` gives the job's program, computed by its own code in a
# process of its own (its paths are read from SAGEMAKER_BASE_DIR when it is imported; no torch: 0.2 s)
TOOLKIT_VIEW = """
import json
from sagemaker_training import environment
job = environment.Environment()
print(json.dumps({"env": job.to_env_vars(), "argv": job.to_cmd_args()}))
"""


@pytest.fixture
def run_in_process(tmp_path, monkeypatch, capfd, as_script):
    """run_job for one host, its program, the example's train.py, in this process: the runtime's LightningCLI with
    the environment and arguments the real toolkit gives it, less a process's start and imports (5 s and more each).
    For a line the runtime alone makes; a failure ends the program as in a job (as_script: one line, an exit code)."""
    import train  # app/example's
    from sagemaker_lightning.boot import signals

    runs = itertools.count()

    def run(hosts, hyperparameters, channels, current_hosts=None, env=None) -> list[Host]:
        base = str(tmp_path / f"in-process{next(runs)}")
        (current,) = current_hosts or hosts[:1]
        make_opt_ml(base, hosts, current, hyperparameters, channels, code=EXAMPLE)  # the example, as PID 1 copies it
        view = subprocess.run(
            [sys.executable, "-c", TOOLKIT_VIEW], env={**os.environ, "SAGEMAKER_BASE_DIR": base},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        given = json.loads(view.stdout.splitlines()[-1])
        for key in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE"):  # a process of the job starts without them
            monkeypatch.delenv(key, raising=False)
        for key, value in {**given["env"], "SAGEMAKER_BASE_DIR": base, **(env or {})}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(signals, "RUN_DIR", os.path.join(base, "run"))
        monkeypatch.chdir(os.path.join(base, "code"))  # where the toolkit runs the program
        capfd.readouterr()
        start, code = time.monotonic(), 0
        try:
            as_script(train.main, given["argv"])
        except SystemExit as e:
            code = e.code
        out, err = capfd.readouterr()
        return [Host(base, code, out + err, time.monotonic() - start)]

    return run


@pytest.fixture(scope="session")
def opt_ml():
    """make_opt_ml, for a test that starts a job's process itself (as SDK 3.x's driver starts the script)."""
    return make_opt_ml


@pytest.fixture(scope="session")
def tiny_job(tmp_path_factory, free_port, archive_dir) -> Host:
    """The tiny one-host job, run once a session, a progress line at every step. test_one_host_trains_and_exports
    and test_metric_definitions_match_the_lines_of_a_real_run check what it did; its seconds are what the "fails
    fast" bounds are relative to, measured under the same load: a job that fails before it trains ends within twice
    the time of one that trains and exports (a fixed bound would not hold on a slower or busier machine, nor be tight
    on a fast one)."""
    hyperparameters = {**TINY, "trainer.log_every_n_steps": 1}
    (host,) = run_job(
        tmp_path_factory.mktemp("tiny"), free_port(), ["localhost"], hyperparameters, {"training": archive_dir}
    )
    return host
