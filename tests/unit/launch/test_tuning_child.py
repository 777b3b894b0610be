"""A SageMaker tuning job's child as the launch plan reads it: the objective's name (_tuning_objective_metric, read once
into the plan, never the project's option: test_hyperparameters.py) and the checkpoint directory, a folder of the
child's own inside the one CheckpointConfig all the tuning job's children share (paths.child_checkpoint_dir).

    .venv/bin/pytest tests/unit/launch/test_tuning_child.py
"""

import re

import pytest

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch import paths
from sagemaker_lightning.launch.plan import make_plan

pytestmark = pytest.mark.unit

OBJECTIVE = "validation:accuracy"
CHILD = "tune-abc-001-1a2b3c4d"  # a child's TRAINING_JOB_NAME, as SageMaker names it (and keeps on a spot restart)
SAGEMAKER = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SAGEMAKER_BASE_DIR": "/sm"}


@pytest.mark.parametrize(
    "checkpoint_dir, job_name, objective, expected",
    [
        ("/opt/ml/checkpoints", CHILD, OBJECTIVE, f"/opt/ml/checkpoints/{CHILD}"),  # a tuning job's child
        ("/ckpt/", CHILD, "mine:x", f"/ckpt/{CHILD}"),  # whatever the objective
        ("/opt/ml/checkpoints", "train-1", None, "/opt/ml/checkpoints"),  # a training job: its directory itself
        ("/opt/ml/checkpoints", None, OBJECTIVE, "/opt/ml/checkpoints"),  # no name to keep apart by
        ("/opt/ml/checkpoints", CHILD, "", "/opt/ml/checkpoints"),
    ],
)
def test_a_tuning_childs_files_go_to_a_folder_of_its_own(checkpoint_dir, job_name, objective, expected):
    assert paths.child_checkpoint_dir(checkpoint_dir, job_name, objective) == expected


@pytest.mark.parametrize(
    "env, given, objective, expected_dir, expected_objective",
    [
        ({**SAGEMAKER, "TRAINING_JOB_NAME": CHILD}, None, OBJECTIVE, f"/sm/checkpoints/{CHILD}", OBJECTIVE),
        ({**SAGEMAKER, "TRAINING_JOB_NAME": CHILD}, "/local/ckpt", OBJECTIVE, f"/local/ckpt/{CHILD}", OBJECTIVE),
        ({**SAGEMAKER, "TRAINING_JOB_NAME": "train-1"}, None, None, "/sm/checkpoints", None),  # a training job
        ({**SAGEMAKER, "TRAINING_JOB_NAME": "train-1"}, "/local/ckpt", None, "/local/ckpt", None),
        (
            {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"},
            None,
            OBJECTIVE,
            None,
            None,
        ),  # no SageMaker
    ],
    ids=["child", "child, checkpoint_local_path", "training job", "training job, checkpoint_local_path", "torchrun"],
)
def test_the_plan_keeps_a_childs_checkpoints_apart(env, given, objective, expected_dir, expected_objective):
    plan = make_plan(env, {"lo"}, checkpoint_dir=given, objective=objective)
    assert (plan.checkpoint_dir, plan.objective) == (expected_dir, expected_objective)
    completed = plan.completed(devices=1)  # from the same reading: the objective is not read again
    assert (completed.checkpoint_dir, completed.objective) == (expected_dir, expected_objective)
    assert plan.settings().get("checkpoint.dirpath") == expected_dir  # before the project's arguments: theirs win


@pytest.mark.parametrize("name", ["..", ".", "/etc", "a/../..", "child/"])
def test_a_childs_job_name_that_is_not_one_folder_is_refused_in_one_line(name):
    """Joined to the checkpoint directory, `..` gave /opt/ml and `/etc` gave /etc, outside what SageMaker syncs (its
    own names cannot hold these; a hand-made environment or local mode can)."""
    env = {**SAGEMAKER, "TRAINING_JOB_NAME": name}
    with pytest.raises(UserError, match=rf"^TRAINING_JOB_NAME={re.escape(repr(name))} is not one folder's name"):
        make_plan(env, {"lo"}, objective=OBJECTIVE)
    assert make_plan(env, {"lo"}).checkpoint_dir == "/sm/checkpoints"  # a training job's is the directory itself
