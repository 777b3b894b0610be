"""Experiment tracking in MLflow (tracking/): real jobs (the toolkit's `train` on a temporary
/opt/ml) against a real `mlflow server` (sqlite, local artifacts) on 127.0.0.1, MLFLOW_TRACKING_URI in the job's
environment as an Estimator's `environment` puts it there. One chain of restarts serves most assertions: a SIGKILL
mid-epoch after the run holds steps the checkpoint does not, a restart, a SIGTERM, a restart.

    .venv/bin/pytest tests/toolkit/test_tracking_toolkit.py
"""

import json
import os
import re

import pytest

from sagemaker_lightning.tracking.mlflow_client import connect

pytestmark = pytest.mark.toolkit

PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
# 2 epochs of 4 steps of a small network, a validation batch after each, last.ckpt every 2 steps, every step's
# metrics in the run
STEPS = {
    "model.arch": "mobilenet_v3_small",
    "trainer.max_epochs": 2,
    "trainer.limit_train_batches": 4,
    "trainer.log_every_n_steps": 1,
    "last_checkpoint_every_n_steps": 2,
}


def the_run(client, experiment: str):
    """The experiment's one run (it fails when there are more)."""
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def steps(client, run) -> dict[str, list[int]]:
    """Each metric's steps, in the order MLflow returns its history."""
    return {key: [m.step for m in client.get_metric_history(run.info.run_id, key)] for key in run.data.metrics}


def lines(output: str) -> list[str]:
    return re.findall(r"^mlflow: .*", output, re.M)


def test_one_run_per_job_across_a_sigkill_and_a_sigterm(run_hosts, archive_dir, tiny, tmp_path, mlflow_server):
    """SIGKILL at step 3's end, once the run holds it (last.ckpt is step 2's); the restart trains step 3 again and
    the run keeps one point of it; SIGTERM in epoch 1 (KILLED, last.ckpt there); the last restart finishes (FINISHED):
    one run for the job, named after it, restarted twice; every metric's steps unique and increasing, train/loss at
    each of the 8 steps; the parameters once, the fault callbacks each restart added kept as changed values; model.pt
    and config.yaml as artifacts; the run id in the checkpoint directory and in model_dir; the host's system metrics,
    continued across the restarts. The project's own
    MLFlowLogger (trainer.logger) logs into the same run by the same rules: its train/acc once a step, its end state
    (Lightning's would be FAILED on the stop) the runtime's."""
    job = "chain-2026-11-27-18-00-00-000"
    env = {"MLFLOW_TRACKING_URI": mlflow_server.url, "TRAINING_JOB_NAME": job, "PYTHONPATH": PLUGINS}
    # the host's metrics every 0.2 s, not every 10 s: several in each run, however fast the machine (each 1 s, a run
    # on an idle CI machine had none but its first)
    env["MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL"] = "0.2"
    data, client = {"training": archive_dir}, connect(mlflow_server.url)
    hps = {**tiny, **STEPS, "checkpoint.dirpath": str(tmp_path / "checkpoints"), "mlflow.log_model": True}
    hps["mlflow.system_metrics"] = True
    # the project's own MLFlowLogger too; after TensorBoard, whose directory Lightning's CLI saves its config to
    # (first, a remote MLFlowLogger has none: Lightning's SaveConfigCallback fails, with or without the runtime)
    tensorboard = {"class_path": "pytorch_lightning.loggers.TensorBoardLogger", "init_args": {"save_dir": "tb"}}
    hps["trainer.logger"] = [tensorboard, {"class_path": "pytorch_lightning.loggers.MLFlowLogger"}]
    kill = {"trainer.callbacks+": "faults.KillWhenTracked", "trainer.callbacks.step": 3}
    (killed,) = run_hosts(["localhost"], {**hps, **kill}, data, env=env)
    assert killed.returncode != 0 and "saved last.ckpt at epoch 0 step 2" in killed.output, killed.output[-3000:]
    assert "mlflow: trainer.logger's MLFlowLogger logs into the job's run" in killed.output
    run = the_run(client, "chain")  # the experiment: the job's name less the SDK's timestamp
    assert run.info.status == "RUNNING" and run.info.run_name == job
    assert steps(client, run)["train/loss"] == [1, 2, 3]

    stop = {"trainer.callbacks+": "faults.StopJob", "trainer.callbacks.step": 5}
    (stopped,) = run_hosts(["localhost"], {**hps, **stop}, data, env=env)
    assert stopped.returncode == 143, stopped.output[-3000:]
    assert "resuming at epoch 0 step 2 from last.ckpt" in stopped.output
    assert f"mlflow: run {run.info.run_id} continued (restart 1)" in stopped.output
    assert the_run(client, "chain").info.status == "KILLED"

    saved = re.findall(r"saved last\.ckpt at (epoch 1 step \d+)", stopped.output)[-1]  # the stop's save

    (finished,) = run_hosts(["localhost"], hps, data, env=env)
    assert finished.returncode == 0, finished.output[-3000:]
    assert f"resuming at {saved} from last.ckpt" in finished.output, finished.output[-3000:]
    run = the_run(client, "chain")
    assert run.info.status == "FINISHED" and run.data.tags["sagemaker.restarts"] == "2"
    assert run.data.tags["sagemaker.job_name"] == job and run.data.tags["sagemaker.hosts"] == "localhost"
    logged = steps(client, run)
    assert logged["train/loss"] == list(range(1, 9)), logged  # step 3, trained twice, once
    # the project's MLFlowLogger's, by the same rule; Lightning logs a step's metrics at the steps done before it
    assert logged["train/acc"] == list(range(0, 8)), logged
    assert logged["val/acc"] == logged["val/loss"] == [4, 8]
    assert all(s == sorted(set(s)) for s in logged.values()), logged  # the host's system metrics' too
    assert len(logged["system/localhost/cpu_utilization_percentage"]) > 1, logged
    assert run.data.params["trainer.max_epochs"] == "2" and run.data.params["mlflow.log_model"] == "true"
    # the first job's callbacks stay the run's; each restart's differ, recorded, and the job went on
    assert "KillWhenTracked" in run.data.params["trainer.callbacks"]
    assert "KillWhenTracked" in run.data.tags["changed.trainer.callbacks"]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["config.yaml", "model.pt"]
    for directory in (str(tmp_path / "checkpoints"), finished.path("model")):
        with open(os.path.join(directory, "mlflow-run.json")) as f:
            assert json.load(f)["run_id"] == run.info.run_id
    assert not [line for h in (killed, stopped, finished) for line in lines(h.output) if "answer" in line]


def test_two_hosts_one_run_from_rank_zero_and_a_server_gone_mid_run(run_hosts, archive_dir, tiny, mlflow_server):
    """Two hosts, tracking to a managed tracking server's ARN as a job gives it, with no code of the project's: the
    image's sagemaker-mlflow plugin takes the ARN, signs each request with the job's credentials (here dummy ones)
    and sends it to the server (here the local one: the plugin's SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT). Global rank 0
    alone tracks, into one run. The server is killed at step 3 (once the run is open): the job trains on, exports its
    model and succeeds; rank 0 says once that the server does not answer (retried), and at the end that tracking was
    dropped; the other host says nothing of MLflow. The server, started again, holds one run for the job, its steps
    unique (two ranks logging would have doubled them)."""
    job, arn = "pair-2026-11-27-18-00-00-000", "arn:aws:sagemaker:us-east-1:111122223333:mlflow-tracking-server/t"
    env = {"MLFLOW_TRACKING_URI": arn, "TRAINING_JOB_NAME": job, "PYTHONPATH": PLUGINS}
    env |= {
        "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT": mlflow_server.url,
        "AWS_ACCESS_KEY_ID": "a",
        "AWS_SECRET_ACCESS_KEY": "b",
    }
    kill = {"trainer.callbacks+": "faults.KillProcess", "trainer.callbacks.pid": mlflow_server.process.pid}
    hps = {**tiny, **STEPS, "trainer.max_epochs": 1, **kill, "trainer.callbacks.step": 3, "dist_timeout": 60}
    try:
        hosts = run_hosts(["localhost", "127.0.0.1"], hps, {"training": archive_dir}, env=env)
    finally:
        mlflow_server.start()
    assert [h.returncode for h in hosts] == [0, 0], hosts[0].output[-3000:]
    assert os.path.isfile(hosts[0].path("model", "model.pt"))
    said = lines(hosts[0].output)
    assert said[0].startswith("mlflow: run ") and said[0].endswith(f"created in experiment 'pair' on {arn}"), said
    # once it is gone: retried (unless the job ended before its thread's next request), then dropped at the end
    warnings = said[1:]
    assert len(warnings) in (1, 2) and "tracking dropped for this job; training goes on" in warnings[-1], said
    assert all("does not answer" in line and "tracking retried" in line for line in warnings[:-1]), said
    assert lines(hosts[1].output) == []
    client = connect(mlflow_server.url)
    run = the_run(client, "pair")
    assert run.data.tags["sagemaker.hosts"] == "localhost,127.0.0.1" and run.info.status == "RUNNING"
    logged = steps(client, run)
    assert all(s == sorted(set(s)) and set(s) <= {1, 2, 3, 4} for s in logged.values()), logged


def test_a_continued_run_skips_the_steps_it_holds_and_keeps_its_parameters(mlflow_server, capsys):
    """The run's thread alone, in this process: a run that failed (FAILED) after steps 1-5, continued by a job that
    resumed from step 2 with one setting changed: it is RUNNING again, then FINISHED; steps 3-5 are not sent twice;
    the changed setting keeps the run's value and its tag says both; a repeated step within one job is sent once."""
    from sagemaker_lightning.tracking import mlflow_run

    client, recorded = connect(mlflow_server.url), []
    first = mlflow_run.Run(
        uri=mlflow_server.url,
        experiment="direct",
        name="job-1",
        tags={},
        continues=None,
        opened=lambda *ids: recorded.append(ids),
        job="job-1",
    )
    first.params({"lr": "0.1", "epochs": "3"})
    for step in range(1, 6):
        first.log({"train/loss": 1.0 / step}, step)
    first.log({"train/loss": 9.0}, 5)  # the same step again: dropped
    first.finish("FAILED", wait_s=30)
    ((run_id, _),) = recorded
    assert client.get_run(run_id).info.status == "FAILED"

    second = mlflow_run.Run(
        uri=mlflow_server.url,
        experiment="direct",
        name="job-1",
        tags={},
        continues=run_id,
        opened=lambda *ids: recorded.append(ids),
        job="job-1",
    )
    assert second.is_open.wait(30) and client.get_run(run_id).info.status == "RUNNING"
    second.params({"lr": "0.2", "epochs": "3", "new": "x"})
    for step in range(3, 8):
        second.log({"train/loss": 2.0 / step}, step)
    second.finish("FINISHED", wait_s=30)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags[mlflow_run.RESTARTS] == "1"
    history = client.get_metric_history(run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / s) for s in range(1, 6)] + [(6, 2.0 / 6), (7, 2.0 / 7)]
    assert run.data.params == {"lr": "0.1", "epochs": "3", "new": "x"}
    assert run.data.tags["changed.lr"] == "0.1 -> 0.2"
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("mlflow: ")]
    assert f"mlflow: run {run_id} continued (restart 1) in experiment 'direct' on {mlflow_server.url}" in said
    assert "mlflow: 1 parameter(s) differ from the run's (lr): the run keeps its values" in " ".join(said)


def tracked(url: str, experiment: str, job: str | None, dirpath: str, step: int = 1) -> str:
    """A fit's tracking in this process, as global rank 0 runs it (tracker.Tracker): the run opened from what the
    checkpoint directory `dirpath` records, one point logged, FINISHED. Returns the run's id."""
    from types import SimpleNamespace

    from sagemaker_lightning.tracking.tracker import Tracker

    tracker = Tracker(
        uri=url,
        experiment=experiment,
        job=job,
        tags={},
        host="localhost",
        model_dir=None,
        log_model=False,
        system_metrics=False,
        config_yaml=lambda: "seed: 1",
    )
    checkpoint = SimpleNamespace(dirpath=dirpath)
    trainer = SimpleNamespace(is_global_zero=True, global_step=step, checkpoint_callback=checkpoint)
    tracker.on_fit_start(trainer, None)
    assert tracker.run.is_open.wait(30)
    run_id = tracker.run.run_id
    tracker.run.log({"train/loss": 1.0}, step)
    tracker.on_fit_end(trainer, None)
    return run_id


def unchanged(client, run_id: str):
    """What a job that does not continue a run must leave as it is: its status, tags, parameters and metrics."""
    run = client.get_run(run_id)
    metrics = {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}
    return run.info.status, run.data.tags, run.data.params, metrics


def test_a_planted_record_naming_another_experiments_run_starts_a_new_run(mlflow_server, tmp_path, capsys):
    """A SageMaker job whose checkpoint location holds a planted mlflow-run.json naming another team's run (its job
    field forged to this job's public name): the run is in another experiment, so this job makes a run of its own and
    the other run keeps its status, tags, parameters and metrics."""
    client = connect(mlflow_server.url)
    theirs = tracked(mlflow_server.url, "team-a", "job-a", str(tmp_path / "a"))
    before = unchanged(client, theirs)
    planted = tmp_path / "b"
    planted.mkdir()
    (planted / "mlflow-run.json").write_text(json.dumps({"run_id": theirs, "job": "job-b"}))
    capsys.readouterr()
    mine = tracked(mlflow_server.url, "team-b", "job-b", str(planted), step=9)
    said = lines(capsys.readouterr().out)
    assert mine != theirs and unchanged(client, theirs) == before, said
    assert said[0] == (
        f"mlflow: run {theirs}, which the checkpoints name, is not continued: it is in another experiment (id "
        f"{client.get_run(theirs).info.experiment_id}); this job starts a run of its own and leaves that one as it is"
    )
    assert said[1].startswith(f"mlflow: run {mine} created in experiment 'team-b'"), said
    assert json.loads((planted / "mlflow-run.json").read_text())["run_id"] == mine


def test_elsewhere_a_copied_checkpoint_directory_is_another_job_and_a_restart_the_same(
    mlflow_server, tmp_path, capsys, monkeypatch
):
    """Off SageMaker (no job name: Kubeflow, Slurm, torchrun) a job is its checkpoint directory. A job on a copy of
    another's directory makes a run of its own, also where its record is forged to name the copy; a restart on the
    same directory continues its run; MLFLOW_RUN_ID attaches a job to a run of another experiment, which the line
    names."""
    import shutil

    client = connect(mlflow_server.url)
    first = tracked(mlflow_server.url, "shared", None, str(tmp_path / "a"))
    before = unchanged(client, first)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    capsys.readouterr()
    copied = tracked(mlflow_server.url, "shared", None, str(tmp_path / "b"))
    assert copied != first and unchanged(client, first) == before
    assert f"mlflow: the checkpoints are job {tmp_path / 'a'}'s (run {first}), not this job's ({tmp_path / 'b'})" in (
        capsys.readouterr().out
    )
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    (tmp_path / "c" / "mlflow-run.json").write_text(json.dumps({"run_id": first, "job": str(tmp_path / "c")}))
    forged = tracked(mlflow_server.url, "shared", None, str(tmp_path / "c"))
    assert forged not in (first, copied) and unchanged(client, first) == before
    assert f"is not continued: its tag sagemaker_lightning.job names {tmp_path / 'a'}, not this job" in (
        capsys.readouterr().out
    )
    assert tracked(mlflow_server.url, "shared", None, str(tmp_path / "b"), step=2) == copied  # a restart
    assert f"mlflow: run {copied} continued (restart 1) in experiment 'shared'" in capsys.readouterr().out
    monkeypatch.setenv("MLFLOW_RUN_ID", first)
    assert tracked(mlflow_server.url, "mine", None, str(tmp_path / "d"), step=2) == first
    assert f"mlflow: run {first} continued (restart 1) in experiment 'shared'" in capsys.readouterr().out
