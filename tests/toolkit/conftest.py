"""A temporary /opt/ml tree and the real `train` console script of sagemaker-training, run on it.

SAGEMAKER_BASE_DIR moves the toolkit's /opt/ml; the toolkit reads the same three JSON files SageMaker writes.
"""

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

APP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "app")
TRAIN = os.path.join(os.path.dirname(sys.executable), "train")  # the toolkit's console script


@pytest.fixture
def tiny() -> dict[str, str]:
    """Hyperparameters small enough for 2 CPU cores: batch 16, two steps, one validation batch."""
    return {
        "trainer.max_epochs": "1",
        "trainer.limit_train_batches": "2",
        "trainer.limit_val_batches": "1",
        "trainer.enable_progress_bar": "False",
        "data.batch_size": "16",
    }


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
def corrupt_dir(tmp_path_factory) -> str:
    """A channel whose cifar-10-python.tar.gz is not a gzip file."""
    out = tmp_path_factory.mktemp("corrupt")
    (out / "cifar-10-python.tar.gz").write_bytes(b"<html>an error page saved under the archive's name</html>")
    return str(out)


def make_opt_ml(base, hosts, current, hyperparameters, channels, interface="lo") -> None:
    """What SageMaker writes before it starts a container: config files, channels, and the code."""
    config = os.path.join(base, "input", "config")
    os.makedirs(config)
    for name, content in {
        "resourceconfig.json": {"current_host": current, "hosts": hosts, "network_interface_name": interface},
        "hyperparameters.json": {k: v if isinstance(v, str) else json.dumps(v) for k, v in hyperparameters.items()},
        "inputdataconfig.json": {c: {"TrainingInputMode": "File"} for c in channels},
    }.items():
        with open(os.path.join(config, name), "w") as f:
            json.dump(content, f)
    for channel, source in channels.items():
        target = os.path.join(base, "input", "data", channel)
        shutil.copytree(source, target) if source else os.makedirs(target)
    for d in ("model", "output/data"):
        os.makedirs(os.path.join(base, d))
    shutil.copytree(APP, os.path.join(base, "code"), ignore=shutil.ignore_patterns("__pycache__"))


@pytest.fixture
def run_hosts(tmp_path, free_port):
    """Run `train` for each host of one job at the same time; return what each did."""

    jobs = itertools.count()

    def run(hosts, hyperparameters, channels, current_hosts=None, env=None, timeout=300) -> list[Host]:
        port, procs, job = str(free_port()), [], next(jobs)
        for i, current in enumerate(current_hosts or hosts):
            base = str(tmp_path / f"job{job}" / f"host{i}")
            make_opt_ml(base, hosts, current, hyperparameters, channels)
            proc_env = {
                **os.environ,
                "SAGEMAKER_BASE_DIR": base,
                "SAGEMAKER_PROGRAM": "launch.py",
                "MASTER_PORT": port,
                **(env or {}),
            }
            procs.append(
                (
                    base,
                    time.monotonic(),
                    subprocess.Popen(
                        [TRAIN], env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                    ),
                )
            )
        results = []
        for base, start, proc in procs:
            output, _ = proc.communicate(timeout=timeout)
            results.append(Host(base, proc.returncode, output, time.monotonic() - start))
        return results

    return run
