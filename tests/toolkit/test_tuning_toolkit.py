"""A tuning job's children through the image's entrypoint and the real `train`: each with the hyperparameters SageMaker
gives a child of SDK 2.x's generic Estimator and of its PyTorch estimator, with source_dir and without: the
StaticHyperParameters of the tuner's own CreateHyperParameterTuningJob request (built by the SDK, printed and
answered by the launcher's dry run), a tuned value per range as text, and _tuning_objective_metric. Each trains and
exports, the README's load snippet reads its model, and the tuner reads one objective line per epoch across every
host's log, from global rank 0, on 2 hosts under each launcher this tier runs: one process per host (the toolkit's),
torchrun (LAUNCHER=torchrun) and SDK 3.x's driver (its command line; mpirun: tests/container/test_local_mode.py).
The runtime names the metric the tuner ranks once a job, says in one line when the job does not print it, never
passes _tuning_objective_metric to the project, and keeps each child's checkpoints apart. The generic Estimator's child
with source_dir, and SDK 3.x's driver's command line, each run once, on 2 hosts: what one host proves, their first
host (global rank 0) shows.

    .venv/bin/pytest -q tests/toolkit/test_tuning_toolkit.py
"""

import copy
import json
import os
import re
import subprocess
import sys

import boto3
import pytest
import torch
from proctree import kill_tree
from sagemaker.estimator import Estimator
from sagemaker.pytorch import PyTorch
from sagemaker.session import Session
from sagemaker.tuner import CategoricalParameter, ContinuousParameter, HyperparameterTuner
from test_user_project_toolkit import load_as_the_readme_shows

from jobs import dry_run
from sagemaker_lightning.lines import METRICS

pytestmark = pytest.mark.toolkit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SDK3 = os.path.join(ROOT, ".venv-sdk3", "bin", "python")
OBJECTIVE = "validation:accuracy"
# the runtime's line naming the metric the tuner ranks, once a job (global rank 0), and its line for an objective the
# job does not print (lines.objective, lines.unprinted)
RANKED = f"tuning objective: {OBJECTIVE}"
UNPRINTED = "tuning objective validation:f1 is not a metric this job prints"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-lightning:abc"
EPOCHS = 2
PROJECT = {"trainer.max_epochs": str(EPOCHS), "trainer.enable_progress_bar": "False", "model.lr": "0.2"}
EXAMPLE = {  # the image's example, tiny: batch 16, two steps, one validation batch, 2 epochs
    "trainer.max_epochs": str(EPOCHS),
    "trainer.limit_train_batches": "2",
    "trainer.limit_val_batches": "1",
    "trainer.enable_progress_bar": "False",
    "trainer.precision": "32-true",
}


def child_of(make, ranges: dict, tuned: dict, objective: str = OBJECTIVE) -> dict[str, str]:
    """The hyperparameters SageMaker gives a child of SDK 2.x's tuner around the estimator `make(session)` returns:
    the request's StaticHyperParameters (code uploads answered here, nothing sent), `tuned` and the objective."""
    boto_session = boto3.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    requests = []
    boto_session.events.register(
        "before-parameter-build.sagemaker.CreateHyperParameterTuningJob", lambda params, **_: requests.append(params)
    )
    dry_run.intercept(boto_session)
    tuner = HyperparameterTuner(
        make(Session(boto_session=boto_session)), objective, ranges, [{"Name": objective, "Regex": METRICS[OBJECTIVE]}],
        max_jobs=2,
    )  # fmt: skip
    tuner.fit("s3://b/in", job_name="tune-toolkit", wait=False)
    static = copy.deepcopy(requests[0]["TrainingJobDefinition"]["StaticHyperParameters"])
    return {**static, **tuned, "_tuning_objective_metric": objective}


def estimator(hyperparameters: dict, **code):
    """The estimator a test's tuner is built around: PyTorch when a framework version is given, else generic."""
    kind = PyTorch if "framework_version" in code else Estimator
    role = "arn:aws:iam::123456789012:role/r"
    return lambda session: kind(
        **code, image_uri=IMAGE, role=role, instance_count=1, instance_type="ml.c5.xlarge",
        output_path="s3://b/out", sagemaker_session=session, hyperparameters=dict(hyperparameters),
    )  # fmt: skip


PYTORCH = {"framework_version": "2.5", "py_version": "py311"}
# name: (the estimator, its ranges, the tuned values a child gets, whether it runs the user's project)
CHILDREN = {
    "Estimator": (lambda p: estimator(EXAMPLE),
                  {"optimizer.lr": ContinuousParameter(0.01, 0.1), "data.batch_size": CategoricalParameter(["16", "32"])},
                  {"optimizer.lr": "0.05", "data.batch_size": "16"}, False),
    "Estimator, source_dir": (lambda p: estimator(PROJECT, entry_point="train.py", source_dir=p),
                              {"model.hidden": CategoricalParameter(["8", "16"])}, {"model.hidden": "8"}, True),
    "PyTorch, source_dir": (lambda p: estimator(PROJECT, entry_point="train.py", source_dir=p, **PYTORCH),
                            {"model.hidden": CategoricalParameter(["8", "16"])}, {"model.hidden": '"8"'}, True),
    "PyTorch, entry point alone": (lambda p: estimator(PROJECT, entry_point=os.path.join(p, "train.py"), **PYTORCH),
                                   {"model.hidden": CategoricalParameter(["8", "16"])}, {"model.hidden": '"8"'}, True),
}  # fmt: skip


def objective_lines(*outputs: str) -> list[list[float]]:
    """Each host's objective values, read with the metric definition the tuning request carries."""
    return [[float(m) for m in re.findall(METRICS[OBJECTIVE], output)] for output in outputs]


def objective_epochs(*outputs: str) -> list[int]:
    """The epoch of every line the objective's regex reads, across all the hosts' logs (the tuner reads them all)."""
    found = [line for output in outputs for line in output.splitlines() if re.search(METRICS[OBJECTIVE], line)]
    return sorted(int(re.search(r"epoch (\d+) step \d+: ", line)[1]) for line in found)


@pytest.mark.parametrize("name", CHILDREN)
def test_a_tuning_childs_hyperparameters_train_export_and_print_the_objective_once_an_epoch(
    name, run_hosts, user_project, points_dir, archive_dir, tmp_path, request
):
    make, ranges, tuned, project = CHILDREN[name]
    hps = child_of(make(user_project), ranges, tuned)
    if name.startswith("PyTorch"):  # what a framework estimator adds, and its categorical values as JSON
        assert json.loads(hps["sagemaker_estimator_class_name"]) == "PyTorch"
        assert json.loads(hps["sagemaker_estimator_module"]) == "sagemaker.pytorch.estimator"
    if name == TWO_HOSTS:  # this child's job runs once, on two hosts: its first host's, global rank 0's
        host = request.getfixturevalue("two_hosts")[0]
    else:
        channels = {"training": points_dir if project else archive_dir}
        (host,) = run_hosts(["localhost"], hps, channels, code=user_project if project else None)
    assert host.returncode == 0, host.output[-3000:]
    with open(host.path("model", "config.yaml")) as f:
        config = f.read()
    assert "_tuning_objective" not in config and "sagemaker_" not in config  # no option of the project's
    assert ("hidden: 8" if project else "batch_size: 16") in config  # the tuned value, as the child was given it
    assert len(objective_lines(host.output)[0]) == EPOCHS  # what the tuner reads: one value an epoch
    if project:
        loaded = load_as_the_readme_shows(host.path("model"), user_project, tmp_path / "loading")
        assert loaded.returncode == 0 and re.fullmatch(r"tensor\(\[[012]\]\)\n", loaded.stdout), loaded.stderr


TWO_HOSTS = "Estimator, source_dir"


@pytest.fixture(scope="module")
def two_hosts(run_hosts_once, user_project, points_dir):
    """A child of the generic Estimator with source_dir, on two hosts (one toolkit process tree each)."""
    make, ranges, tuned, _ = CHILDREN[TWO_HOSTS]
    hps = child_of(make(user_project), ranges, tuned)
    hosts = run_hosts_once(["localhost", "127.0.0.1"], hps, {"training": points_dir}, code=user_project)
    for host in hosts:
        assert host.returncode == 0, host.output[-3000:]
    return hosts


def test_the_tuner_reads_one_objective_value_an_epoch_across_both_hosts_logs(two_hosts):
    first, second = objective_lines(*(host.output for host in two_hosts))
    assert (len(first), second) == (EPOCHS, [])  # global rank 0 prints the validation line; the other host none
    assert objective_epochs(*(host.output for host in two_hosts)) == list(range(EPOCHS))


def test_the_log_names_the_metric_the_tuner_ranks_once(two_hosts):
    assert sum(host.output.count(RANKED) for host in two_hosts) == 1


def test_under_torchrun_the_tuner_reads_one_objective_line_an_epoch(run_hosts, user_project, points_dir):
    """LAUNCHER=torchrun on 2 hosts: the runtime runs torchrun in each host's process (c10d, ranks by join order),
    whose processes each read the plan again; global rank 0, on either host, prints the objective's line."""
    make, ranges, tuned, _ = CHILDREN[TWO_HOSTS]
    hps = child_of(make(user_project), ranges, tuned)
    hosts = run_hosts(["localhost", "127.0.0.1"], hps, {"training": points_dir}, code=user_project,
                      env={"LAUNCHER": "torchrun"})  # fmt: skip
    for host in hosts:
        assert host.returncode == 0, host.output[-3000:]
    assert "launch: torchrun on localhost,127.0.0.1" in hosts[0].output + hosts[1].output  # started by torchrun
    assert objective_epochs(*(host.output for host in hosts)) == list(range(EPOCHS))
    assert sum(host.output.count(RANKED) for host in hosts) == 1


def test_an_objective_the_job_does_not_print_is_one_line(run_hosts, user_project, points_dir):
    make, ranges, tuned, _ = CHILDREN["Estimator, source_dir"]
    hps = child_of(make(user_project), ranges, tuned, objective="validation:f1")
    (host,) = run_hosts(["localhost"], hps, {"training": points_dir}, code=user_project)
    assert host.returncode == 0, host.output[-3000:]  # it trains: a definition of the user's may read it
    assert sum(UNPRINTED in line for line in host.output.splitlines()) == 1


def sdk3_driver(opt_ml, hosts: list[str], root, port: int, code: str, channels: dict) -> list[tuple[str, str]]:
    """The project's script on each of `hosts` at once, started as SDK 3.x's driver (sm_train.sh, SourceCode) starts
    it: every hyperparameter as `--key <JSON>` (its own hyperparameters_to_cli_args, run here from .venv-sdk3),
    _tuning_objective_metric too, and the SM_* variables its environment.py exports, under each host's /opt/ml (its
    own are fixed to /opt/ml). Settings nested, as the driver takes them (a dotted key stops its shell: sdk3.nested).
    Each host's (base, exit code, output)."""
    nested = {"trainer": {"max_epochs": EPOCHS, "enable_progress_bar": False}, "model": {"hidden": 8, "lr": 0.2}}
    hps = {**{k: json.dumps(v) for k, v in nested.items()}, "_tuning_objective_metric": OBJECTIVE}
    render = "import json, sys; from sagemaker.train.container_drivers.common.utils import hyperparameters_to_cli_args"
    argv = subprocess.run(
        [SDK3, "-c", f"{render}; print(json.dumps(hyperparameters_to_cli_args(json.loads(sys.argv[1]))))",
         json.dumps(hps)], capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "--_tuning_objective_metric" in argv.stdout  # the driver does pass it
    procs = []
    for i, current in enumerate(hosts):
        base = str(root / f"host{i}")
        opt_ml(base, hosts, current, hps, channels)
        env = {**os.environ, "SAGEMAKER_BASE_DIR": base, "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": current,
               "SM_MASTER_ADDR": hosts[0], "SM_MASTER_PORT": str(port), "SM_MODEL_DIR": f"{base}/model",
               "SM_OUTPUT_DIR": f"{base}/output", "SM_OUTPUT_DATA_DIR": f"{base}/output/data",
               "SM_CHANNELS": json.dumps(list(channels)),
               **{f"SM_CHANNEL_{c.upper()}": f"{base}/input/data/{c}" for c in channels}}  # fmt: skip
        procs.append((base, subprocess.Popen([sys.executable, "train.py", *json.loads(argv.stdout)], cwd=code, env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))  # fmt: skip
    try:
        ended = []
        for base, proc in procs:
            output = proc.communicate(timeout=300)[0]
            ended.append((base, proc.returncode, output))
        return ended
    finally:  # a timeout leaves no host running into the next test
        for _, proc in procs:
            if proc.poll() is None:
                kill_tree(proc.pid)
                proc.communicate()


@pytest.fixture(scope="module")
def sdk3_two_hosts(opt_ml, user_project, points_dir, tmp_path_factory, free_port) -> list[tuple[str, int, str]]:
    """Two hosts, each its own process as SDK 3.x's driver starts it (one process per host, Lightning's DDP)."""
    return sdk3_driver(opt_ml, ["localhost", "127.0.0.1"], tmp_path_factory.mktemp("sdk3"), free_port(), user_project,
                       {"training": points_dir})  # fmt: skip


def test_sdk3_drivers_command_line_with_the_objective_trains(sdk3_two_hosts):
    """The first host's process, global rank 0's: it trains, exports and prints the objective."""
    ((base, code, output), _) = sdk3_two_hosts
    assert code == 0, output[-3000:]
    assert torch.load(os.path.join(base, "model", "model.pt"), weights_only=True)
    assert output.count(RANKED) == 1 and len(objective_lines(output)[0]) == EPOCHS


def test_under_sdk3s_driver_the_tuner_reads_one_objective_line_an_epoch(sdk3_two_hosts):
    hosts = sdk3_two_hosts
    for _, code, output in hosts:
        assert code == 0, output[-3000:]
    outputs = [output for _, _, output in hosts]
    assert "world size 2" in outputs[0], outputs[0][-3000:]
    assert objective_epochs(*outputs) == list(range(EPOCHS))
    assert sum(output.count(RANKED) for output in outputs) == 1


def test_a_child_never_resumes_from_a_siblings_checkpoint(run_hosts, user_project, points_dir, tmp_path):
    """A tuning job has one CheckpointConfig for all its children (the launcher's <output>/<tuning job>/checkpoints/),
    and SageMaker restores what is under it into every child that starts (no AWS document found says it adds the
    child's name): here the second child starts with the first's files, as it would. It must start afresh, with its
    own settings, and keep its own files apart (a spot restart of the same child, same name, resumes its own)."""
    make, ranges, _, _ = CHILDREN["Estimator, source_dir"]
    shared = str(tmp_path / "checkpoints")
    names = ("tune-toolkit-001-aaaaaaaa", "tune-toolkit-002-bbbbbbbb")
    first, second = (
        run_hosts(["localhost"], child_of(make(user_project), ranges, {"model.hidden": hidden}),
                  {"training": points_dir}, code=user_project, checkpoints=shared, env={"TRAINING_JOB_NAME": name})[0]
        for hidden, name in zip(("8", "16"), names, strict=True)
    )  # fmt: skip
    assert first.returncode == 0, first.output[-3000:]
    assert second.returncode == 0 and "resuming at" not in second.output, second.output[-3000:]
    assert sorted(os.listdir(shared)) == sorted(names)  # each child's last.ckpt in a folder of its own
