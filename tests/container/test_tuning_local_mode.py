"""`run_sagemaker.py tune --instance-type local`: a tuning job's first children as local-mode jobs of the image (real
SDK, real docker compose), each with the hyperparameters SageMaker gives a child (static, tuned as text,
_tuning_objective_metric), and what the tuner would read from their logs: one objective value an epoch across every
host's log, all from the first host (the runtime prints the validation line on global rank 0 only). A child's
model.tar.gz loads with the README's snippet, as `best` points a user to one."""

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from sagemaker_lightning.lines import METRICS

pytestmark = pytest.mark.container

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUNE = ["--objective", "validation:accuracy", "--maximize", "--range", "model.hidden=8,16"]
TINY = ["trainer.max_epochs=2", "trainer.enable_progress_bar=False", "data.batch_size=32"]
SUMMARY = re.compile(r"^child (\S+): validation:accuracy per epoch, as the tuner reads it: ([\d. ]+) \(printed by (.+)\)$", re.M)  # fmt: skip
OBJECTIVE = re.compile(r"^\S*?(algo-\d+)\S*\s+\|.*?" + METRICS["validation:accuracy"], re.M)  # a host's line


def readme_loads(model_tar: str, project: str, where) -> subprocess.CompletedProcess:
    """The README's block after <!-- load-model -->, as it stands, in a folder holding the child's model.tar.gz."""
    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"<!-- load-model -->\n```python\n(.*?)```", f.read(), re.S)[1]
    where.mkdir()
    shutil.copy(model_tar, where / "model.tar.gz")
    env = {**os.environ, "PYTHONPATH": project}
    return subprocess.run(
        [sys.executable, "-c", block], cwd=where, env=env, capture_output=True, text=True, timeout=120
    )


def test_two_children_on_two_hosts_each_print_the_objective_once_an_epoch(
    local_job, user_project, points_dir, tmp_path
):
    """SDK 2.x: --max-jobs 2 children of a search over model.hidden and model.lr, each a 2-host job."""
    code, output, runs = local_job(
        2, points_dir, "--source-dir", user_project, *TUNE, "--range", "model.lr=0.05:0.2:log", "--max-jobs", "2",
        *TINY, command=["tune"],
    )  # fmt: skip
    assert code == 0, output[-5000:]
    names = re.findall(r"^child (\S+): model\.hidden=(\d+) model\.lr=(\S+)$", output, re.M)
    assert [(hidden, lr) for _, hidden, lr in names] == [("8", "0.05"), ("16", "0.2")], output[-5000:]
    summaries = SUMMARY.findall(output)
    assert [name for name, _, _ in summaries] == [name for name, _, _ in names]
    for _, values, hosts in summaries:
        assert len(values.split()) == 2 and hosts == "algo-1"  # 2 epochs, 1 host: the first
    printed = [host for host, _ in OBJECTIVE.findall(output)]  # every host's lines of both children, counted again
    assert printed == ["algo-1"] * 4, printed
    assert re.search(r"^Maximize validation:accuracy, each child's last value: ", output, re.M)
    for (name, hidden, _), folder in zip(names, ("first", "second"), strict=True):
        model_tar = runs / name / "model.tar.gz"
        with tarfile.open(model_tar) as tar:
            config = tar.extractfile("config.yaml").read().decode()
        assert f"hidden: {hidden}" in config and "_tuning" not in config and "sagemaker_" not in config
        loaded = readme_loads(str(model_tar), user_project, tmp_path / folder)
        assert loaded.returncode == 0 and re.fullmatch(r"tensor\(\[[012]\]\)\n", loaded.stdout), loaded.stderr


def test_sdk3s_child_gets_its_code_as_the_toolkit_does_in_a_tuning_job(local_job, user_project, points_dir):
    """SDK 3.x: one child of a Grid, its --source-dir a channel that sagemaker_submit_directory names (a tuning job's
    children run the image's toolkit, never SDK 3.x's driver)."""
    code, output, _ = local_job(
        1, points_dir, "--source-dir", user_project, *TUNE, "--strategy", "Grid", "--max-jobs", "1", *TINY,
        sdk="v3", command=["tune"],
    )  # fmt: skip
    assert code == 0, output[-5000:]
    ((name, values, hosts),) = SUMMARY.findall(output)
    assert len(values.split()) == 2 and hosts == "algo-1", output[-3000:]
    assert "Successfully installed tinyhelper-0.1" in output  # the project's requirements.txt, from the code channel
