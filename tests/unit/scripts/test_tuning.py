"""scripts/jobs/tuning.py and children.py: `run_sagemaker.py tune` resolved and checked before any SDK import (tables
of its ranges and of its bad input, each failing in one line), and the hyperparameters of the children it runs
locally and the objective read from their logs."""

import json
import math
import os
import re
import shlex
import subprocess
import sys

import pytest

from jobs import children, options, outcome, spec, tuning

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "scripts", "run_sagemaker.py")
USER_PROJECT = os.path.join(ROOT, "examples", "user_project")
CLOUD = ["--image", "i", "--instance-type", "ml.g5.xlarge", "--role", "arn:aws:iam::1:role/r", "--input", "s3://b/in",
         "--output", "s3://b/out"]  # fmt: skip
LOCAL = ["--image", "i", "--input", "d", "--output", "o"]
TUNE = ["--objective", "validation:accuracy", "--maximize"]
LR = ["--range", "optimizer.lr=1e-4:1e-1:log"]


def tune(*words, installed="v2"):
    args = options.parse_args(["tune", *words])
    return tuning.make_tuning(args, spec.make_job(args, installed))


@pytest.mark.parametrize(
    "word, kind, request_",
    [
        ("optimizer.lr=1e-4:1e-1:log", "Continuous",
         {"Name": "optimizer.lr", "MinValue": "1e-4", "MaxValue": "1e-1", "ScalingType": "Logarithmic"}),
        ("data.batch_size=64,128,256", "Categorical", {"Name": "data.batch_size", "Values": ["64", "128", "256"]}),
        ("optimizer=SGD,Adam", "Categorical", {"Name": "optimizer", "Values": ["SGD", "Adam"]}),
        ("trainer.accumulate_grad_batches=1:4", "Integer",
         {"Name": "trainer.accumulate_grad_batches", "MinValue": "1", "MaxValue": "4", "ScalingType": "Auto"}),
        ("model.dropout=0:0.5:linear", "Continuous",
         {"Name": "model.dropout", "MinValue": "0", "MaxValue": "0.5", "ScalingType": "Linear"}),
        ("optimizer.momentum=0.9:0.999:reverse-log", "Continuous",
         {"Name": "optimizer.momentum", "MinValue": "0.9", "MaxValue": "0.999", "ScalingType": "ReverseLogarithmic"}),
        ("data.init_args.batch_size=16:256:log", "Integer",
         {"Name": "data.init_args.batch_size", "MinValue": "16", "MaxValue": "256", "ScalingType": "Logarithmic"}),
    ],
)  # fmt: skip
def test_a_range_is_what_the_request_holds_with_its_bounds_as_written(word, kind, request_):
    r = tuning.parse_range(word)
    assert (r.kind, r.request()) == (kind, request_)


@pytest.mark.parametrize(
    "word, message",
    [
        ("optimizer.lr", "--range optimizer.lr: give KEY=LOW:HIGH[:SCALE] or KEY=A,B,C with a LightningCLI key"),
        ("optimizer lr=1:2", "give KEY=LOW:HIGH[:SCALE] or KEY=A,B,C"),
        ("optimizer.lr=", "a categorical range needs two or more different, non-empty choices"),
        ("data.batch_size=64", "a categorical range needs two or more different, non-empty choices"),
        ("data.batch_size=64,64", "a categorical range needs two or more different, non-empty choices"),
        ("data.batch_size=64,,128", "a categorical range needs two or more different, non-empty choices"),
        ("optimizer.lr=0.1:0.1", "an empty range; give LOW < HIGH"),
        ("optimizer.lr=0.1:0.01:log", "an inverted range; give LOW < HIGH"),
        ("optimizer.lr=0:0.1:log", "a log scale needs values above 0; raise LOW above 0 or use :linear"),
        ("optimizer.lr=-1e-3:1e-1:log", "a log scale needs values above 0"),
        ("optimizer.lr=1e-4:1e-1:cubic", "the scale after LOW:HIGH is one of auto, linear, log, reverse-log"),
        ("optimizer.lr=1e-4:1e-1:log:x", "the scale after LOW:HIGH is one of"),
        ("optimizer.lr=small:large", "LOW and HIGH are numbers (LOW:HIGH), or give choices as A,B,C"),
        ("model.momentum=0.5:1.5:reverse-log", "a reverse-log scale is for continuous values with 0 <= LOW < HIGH < 1"),
        ("data.batch_size=1:8:reverse-log", "a reverse-log scale is for continuous values"),
        ("sagemaker_program=a.py,b.py", "sagemaker_program is SageMaker's own hyperparameter, not a setting"),
        ("_tuning_objective_metric=a,b", "_tuning_objective_metric is SageMaker's own hyperparameter"),
        ("model.arch=" + ",".join(f"a{i}" for i in range(31)), "31 choices; SageMaker takes 30 at most"),
    ],
)
def test_a_bad_range_is_one_line(word, message):
    with pytest.raises(SystemExit, match=f"^error: --range {word.split('=')[0] if '=' in word else word}"):
        tuning.parse_range(word)
    with pytest.raises(SystemExit) as e:
        tuning.parse_range(word)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_tuning_job_is_resolved_around_its_training_job():
    t = tune(*CLOUD, *TUNE, *LR, "--range", "data.batch_size=64,128", "--max-jobs", "8", "--max-parallel-jobs", "2",
             "--early-stopping", "auto", "--warm-start", "parent-1,parent-2", "--spot", "trainer.max_epochs=3")  # fmt: skip
    assert (t.name, t.objective, t.objective_type, t.strategy) == (
        t.job.name,
        "validation:accuracy",
        "Maximize",
        "Bayesian",
    )
    assert (t.max_jobs, t.max_parallel_jobs, t.early_stopping, t.warm_start) == (8, 2, "Auto", ("parent-1", "parent-2"))
    assert [r.key for r in t.ranges] == ["optimizer.lr", "data.batch_size"] and t.hyperband is None
    assert t.job.hyperparameters == {"trainer.max_epochs": "3"} and t.job.spot
    assert t.job.checkpoints == f"s3://b/out/{t.name}/checkpoints/"  # one prefix for every child (docs/cloud.md)


def test_hyperband_spends_the_epochs_of_trainer_max_epochs():
    t = tune(*CLOUD, *TUNE, *LR, "--strategy", "Hyperband", "--max-jobs", "20", "trainer.max_epochs=30")
    assert t.hyperband == (1, 30) and t.early_stopping == "Off"


def test_grid_leaves_its_size_to_sagemaker_and_local_mode_runs_its_first_settings():
    grid = ["--strategy", "Grid", "--range", "data.batch_size=16,32", "--range", "optimizer=SGD,Adam"]
    assert tune(*CLOUD, *TUNE, *grid).max_jobs is None
    local = tune(*LOCAL, *TUNE, *grid, "--max-jobs", "3")
    assert children.settings(local) == [
        {"data.batch_size": "16", "optimizer": "SGD"},
        {"data.batch_size": "16", "optimizer": "Adam"},
        {"data.batch_size": "32", "optimizer": "SGD"},
    ]


def test_local_children_span_each_range_from_its_low_to_its_high_end():
    t = tune(*LOCAL, *TUNE, *LR, "--range", "data.batch_size=16,32", "--range", "trainer.accumulate_grad_batches=1:4",
             "--max-jobs", "3")  # fmt: skip
    first, middle, last = children.settings(t)
    assert [float(s["optimizer.lr"]) for s in (first, last)] == [pytest.approx(1e-4), pytest.approx(1e-1)]
    assert float(middle["optimizer.lr"]) == pytest.approx(math.sqrt(1e-4 * 1e-1))  # the log scale's midpoint
    assert [s["data.batch_size"] for s in (first, middle, last)] == ["16", "32", "16"]
    assert [s["trainer.accumulate_grad_batches"] for s in (first, middle, last)] == ["1", "2", "4"]  # whole numbers
    momentum = tuning.parse_range("optimizer.momentum=0.9:0.999:reverse-log")
    assert [float(momentum.point(f)) for f in (0, 0.5, 1)] == pytest.approx([0.9, 1 - math.sqrt(0.1 * 0.001), 0.999])


@pytest.mark.parametrize("sdk", ["v2", "v3"])
def test_a_local_child_gets_the_static_hyperparameters_its_tuned_values_and_the_objective(sdk):
    t = tune(*LOCAL, *TUNE, *LR, "--max-jobs", "2", "trainer.max_epochs=2", installed=sdk)
    first, second = children.child_jobs(t, "us-east-1")
    assert first.hyperparameters == {
        "trainer.max_epochs": "2",
        "optimizer.lr": "0.0001",
        "_tuning_objective_metric": "validation:accuracy",
    }
    assert (first.name, second.name) == (f"{t.name}-001", f"{t.name}-002") and first.inputs == t.job.inputs
    assert second.hyperparameters["optimizer.lr"] == "0.1" and first.wait and first.sdk == sdk


@pytest.mark.parametrize(
    "sdk, code",
    [
        ("v2", {"trainer.max_epochs": '"2"', "sagemaker_program": '"train.py"',
                "sagemaker_submit_directory": json.dumps(children.CODE_DIR), "sagemaker_region": '"us-east-1"',
                "sagemaker_container_log_level": "20"}),
        ("v3", {"trainer.max_epochs": "2", "sagemaker_program": "train.py", "sagemaker_submit_directory": children.CODE_DIR}),
    ],
)  # fmt: skip
def test_a_local_childs_code_is_a_channel_its_hyperparameters_name_as_each_sdk_encodes_them(sdk, code):
    """SDK 2.x's Estimator JSON-encodes a source_dir job's values, SDK 3.x's tuner sends them as text (both held to
    the SDKs' own requests in tests/cloud/test_tuning_cloud.py)."""
    t = tune(*LOCAL, *TUNE, "--source-dir", USER_PROJECT, "--range", "model.hidden=8,16", "--max-jobs", "1",
             "trainer.max_epochs=2", installed=sdk)  # fmt: skip
    (child,) = children.child_jobs(t, "us-east-1")
    assert child.source_dir is None and child.inputs[children.CODE_CHANNEL] == f"file://{USER_PROJECT}"
    expected = {**code, "model.hidden": "8", "_tuning_objective_metric": "validation:accuracy"}
    if sdk == "v2":
        expected["sagemaker_job_name"] = json.dumps(t.name)
    assert child.hyperparameters == expected


@pytest.mark.parametrize(
    "words, message",
    [
        ([*CLOUD, *TUNE, "--max-jobs", "2"], "tune needs at least one --range KEY=LOW:HIGH or KEY=A,B,C"),
        ([*CLOUD, *TUNE, *LR, *LR, "--max-jobs", "2"], "--range optimizer.lr is given twice; one range a key"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "optimizer.lr=0.1"],
         "optimizer.lr is both a hyperparameter (optimizer.lr=0.1) and a --range; drop one"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--job-name", "cifar10-resnet18-sweep"],
         "the tuning job's name cifar10-resnet18-sweep-"),
        ([*CLOUD, "--objective", "validation:f1", "--maximize", *LR, "--max-jobs", "2"],
         "--objective validation:f1 is not a metric the job prints; give one of train:loss, "),
        ([*CLOUD, "--objective", "train:loss", "--minimize", *LR, "--max-jobs", "2", "--early-stopping", "auto"],
         "--objective train:loss is printed every few steps, not once per epoch"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--strategy", "Hyperband", "--early-stopping", "auto",
          "trainer.max_epochs=5"], "Hyperband stops children itself: leave out --early-stopping auto"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--strategy", "Hyperband"],
         "Hyperband needs trainer.max_epochs=N (1 to 20000): the most epochs a child trains, its MaxResource"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--strategy", "Hyperband", "trainer.max_epochs=0"],
         "Hyperband needs trainer.max_epochs=N (1 to 20000)"),
        ([*CLOUD, *TUNE, "--range", "trainer.max_epochs=5:20", "--max-jobs", "2", "--strategy", "Hyperband"],
         "Hyperband spends trainer.max_epochs itself (its MaxResource)"),
        ([*CLOUD, "--objective", "train:loss", "--minimize", *LR, "--max-jobs", "2", "--strategy", "Hyperband",
          "trainer.max_epochs=5"], "--objective train:loss is printed every few steps"),
        ([*CLOUD, *TUNE, *LR, "--strategy", "Grid"], "Grid runs every combination of categorical ranges (A,B,C); a "
         "continuous range has none"),
        ([*CLOUD, *TUNE, "--range", "optimizer=SGD,Adam", "--strategy", "Grid", "--max-jobs", "2"],
         "Grid runs every combination of its ranges: leave out --max-jobs"),
        ([*CLOUD, *TUNE, *LR], "give --max-jobs N: how many children the tuning job starts"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "0"], "--max-jobs and --max-parallel-jobs count children: 1 or more"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--max-parallel-jobs", "3"],
         "--max-parallel-jobs 3 is above --max-jobs 2"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--warm-start", "a,b,c,d,e,f"],
         "--warm-start names 6 parent tuning jobs; SageMaker takes 5 at most"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--warm-start", "my_tuning"],
         "--warm-start my_tuning is not a tuning job's name"),
        ([*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--keep-alive", "600"],
         "--keep-alive is for training jobs: neither SDK's tuner sends KeepAlivePeriodInSeconds"),
        ([*LOCAL, *TUNE, *LR, "--max-jobs", "2", "--warm-start", "p"], "--warm-start is for tuning jobs in the cloud"),
        ([*CLOUD, *TUNE, "--range", "optimizer.lr=0:1e-1:log", "--max-jobs", "2"],
         "--range optimizer.lr=0:1e-1:log: a log scale needs values above 0"),
    ],
)  # fmt: skip
def test_a_bad_tuning_job_is_one_line(words, message):
    with pytest.raises(SystemExit) as e:
        tune(*words)
    assert str(e.value).startswith(f"error: {message}") and "\n" not in str(e.value), str(e.value)


def test_an_objective_the_project_adds_with_metric_is_one_it_prints():
    t = tune(*CLOUD, "--objective", "validation:f1", "--maximize", "--metric", "val/f1", *LR, "--max-jobs", "2")
    assert t.job.metrics[t.objective] == r"val/f1=(-?[0-9.]+)"


@pytest.mark.parametrize(
    "sdk, words, message",
    [
        ("v2", [*CLOUD, *TUNE, "--range", "optimizer.lr=0.1:0.1", "--max-jobs", "2"], "--range optimizer.lr=0.1:0.1: "
         "an empty range"),
        ("v3", [*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--warm-start", "a,b,c,d,e,f"], "--warm-start names 6 parent"),
        ("v2", [*CLOUD, *TUNE, *LR, "--max-jobs", "2", "--strategy", "Hyperband", "--early-stopping", "auto",
                "trainer.max_epochs=5"], "Hyperband stops children itself"),
        ("v3", [*CLOUD, "--objective", "validation:f1", "--maximize", *LR, "--max-jobs", "2"], "--objective "
         "validation:f1 is not a metric the job prints"),
    ],
)  # fmt: skip
def test_bad_tuning_input_fails_before_the_sdk_is_imported(sdk, words, message, tmp_path):
    from test_job_spec import PYTHON, RUN

    run = subprocess.run(
        [PYTHON[sdk], "-c", RUN, SCRIPT, "tune", *words], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 1 and run.stdout == "sagemaker not imported\n", run.stdout + run.stderr
    assert run.stderr.startswith(f"error: {message}") and run.stderr.count("\n") == 1, run.stderr


def shown_tune_commands() -> list[list[str]]:
    """The words after `run_sagemaker.py tune` of every such command the README and docs/cloud.md show, their
    placeholders (<URI>, $BUCKET, ...) filled in."""
    commands = []
    for doc in ("README.md", os.path.join("docs", "cloud.md")):
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read().replace("\\\n", " ")
        for line in re.findall(r"run_sagemaker\.py tune (.*)", text):
            line = re.sub(r"<[^>]+>", "x", line.split("#")[0]).replace("$BUCKET", "bucket").replace("$IMAGE_URI", "i")
            commands.append(shlex.split(line))
    return commands


def test_every_tune_command_the_docs_show_passes_the_checks():
    """What can be checked here of each: its options and the tuning job they describe (the container and cloud tiers
    run the local one and the requests)."""
    shown = shown_tune_commands()
    assert len(shown) >= 3
    for words in shown:
        t = tune(*words)
        assert t.ranges and (t.max_jobs or t.strategy == "Grid")


def test_the_objective_is_read_from_every_hosts_line_as_compose_colours_it():
    log = (  # as seen here: SDK 2.x's container names, SDK 3.x's under docker-compose v1
        "\x1b[36mdj9xybuope-algo-1-q3jpu |\x1b[0m epoch 0 step 3: val/acc=0.5000 val/loss=1.2000\n"
        "\x1b[33mdj9xybuope-algo-2-fghij |\x1b[0m rank 1/2 host algo-2: weights 0123 at step 3\n"
        "algo-2_1  | epoch 1 step 6: val/acc=0.7500 val/loss=0.9000\n"
        "epoch 1 step 6: train/loss=0.5 images/s=12.0 eta=0:00:01\n"
        "epoch 2 step 9: val/acc=0.8000\n"  # no host: a log not from compose
    )
    found = children.objective_values(log, spec.METRICS["validation:accuracy"])
    assert found == [("algo-1", 0.5), ("algo-2", 0.75), ("?", 0.8)]


def test_local_children_keep_their_checkpoints_apart(tmp_path):
    t = tune(*LOCAL, *TUNE, *LR, "--max-jobs", "2", "--checkpoints", str(tmp_path / "ck"))
    first, second = children.child_jobs(t, "us-east-1")
    assert first.inputs["checkpoints"] == f"file://{tmp_path}/ck/{first.name}"
    assert second.inputs["checkpoints"] == f"file://{tmp_path}/ck/{second.name}"
    assert first.hyperparameters["checkpoint.dirpath"] == spec.LOCAL_CHECKPOINTS  # where each child's folder mounts


def test_the_children_read_the_objective_from_the_log_outcome_run_kept(monkeypatch, capsys):
    """One copy of each child's log: outcome.run's. The children put no stream of their own around it."""
    t = tune(*LOCAL, *TUNE, *LR, "--max-jobs", "2")
    stdout, kept = sys.stdout, iter(["algo-1 | val/acc=0.5000\n", "algo-1 | val/acc=0.7500\n"])

    def run(child):  # outcome.run of a local child: its model and the log it kept (printed as it passed, not here)
        assert sys.stdout is stdout
        return outcome.Result(f"file:///o/{child.name}/model.tar.gz", next(kept))

    monkeypatch.setattr(outcome, "run", run)
    assert children.run(t) == 0
    out = capsys.readouterr().out
    assert "validation:accuracy per epoch, as the tuner reads it: 0.5000 (printed by algo-1)" in out
    assert re.search(r"Maximize validation:accuracy, each child's last value: \S+-002 0\.7500", out)
