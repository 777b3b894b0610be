"""Interruptions and isolation, in the real image: SIGKILL and resume, SIGTERM and its checkpoint, a host that
never comes up, no network (what the image holds: test_image_secrets.py).

    TEST_IMAGE=sagemaker-lightning:mine .venv/bin/pytest tests/container/test_reliability.py
"""

import json
import os
import re
import subprocess
import time
import uuid
from datetime import datetime

import pytest
import torch
from compose_jobs import containers, job_code, start_job
from job_lines import final

from sagemaker_lightning import failure
from sagemaker_lightning.boot import entrypoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.container

# 2 epochs of 6 steps, last.ckpt every 2 steps: kills land mid-epoch. MobileNet-V3-Small (1.5 M parameters, not the
# example's ResNet-18 of 11 M): these tests prove kills, stops and resumes, which no model size changes
RESUMABLE = [
    "model.arch=mobilenet_v3_small",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=6",
    "trainer.limit_val_batches=1",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=False",
    "data.batch_size=16",
    "last_checkpoint_every_n_steps=2",
]


def clean(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", line).replace("\r", "")


def read_until(proc: subprocess.Popen, pattern: str, timeout: float = 300) -> list[str]:
    """Lines of the job's output up to and including the first that matches."""
    lines, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        lines.append(clean(line))
        if re.search(pattern, lines[-1]):
            return lines
        assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n" + "".join(lines[-50:])
    raise AssertionError(f"the job ended without {pattern!r}:\n" + "".join(lines[-50:]))


def finish(proc: subprocess.Popen, lines: list[str]) -> str:
    lines += [clean(line) for line in proc.stdout]
    proc.wait(timeout=300)
    return "".join(lines)


def paced(tmp_path, step: int) -> tuple[list[str], list[str]]:
    """run_sagemaker.py's options and hyperparameters (the last words) for a job whose steps from `step` on last a
    second at least (faults.Pace), so that a test's kill or stop at a step before it lands while the job trains."""
    code = ["--source-dir", job_code(tmp_path), "--entry-point", "train.py"]
    return code, ["trainer.callbacks+=faults.Pace", f"trainer.callbacks.step={step}"]


def partial_files(directory) -> list[str]:
    """Temporary files of checkpoint writes (checkpoints/atomic.py names them .<name>.partial)."""
    return [p for p in os.listdir(directory) if p.endswith(".partial")]


def stopped_with_checkpoint(output: str, ckpts, container: str) -> int:
    """The step a docker-stopped job saved at: its line says so, last.ckpt holds that step, the container exited 143
    (128 + SIGTERM: stopped, not failed silently)."""
    assert "stopped by SIGTERM (StopTrainingJob or a spot interruption) after saving last.ckpt" in output, output[
        -5000:
    ]
    stopped_at = int(re.findall(r"saved last\.ckpt at epoch 0 step (\d+)", output)[-1])  # the save SIGTERM made
    assert torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["global_step"] == stopped_at
    exit_code = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.ExitCode}}", container], capture_output=True, text=True
    )
    assert exit_code.stdout.strip() == "143"
    return stopped_at


def test_a_killed_job_resumes_where_its_last_checkpoint_left_it(image, archive_dir, tmp_path):
    """SIGKILL every container mid-epoch (as a lost spot instance), start the job again with the same checkpoint
    directory: it resumes at the last checkpoint and ends where an uninterrupted run ends, with the same weights."""
    uninterrupted = start_job(image, archive_dir, tmp_path / "a", *RESUMABLE)
    expected = final(finish(uninterrupted, []))
    assert expected[1] == 12

    ckpts = tmp_path / "ckpts"
    code, pace = paced(tmp_path, 4)
    first = start_job(image, archive_dir, tmp_path / "b", "--checkpoints", str(ckpts), *code, *RESUMABLE, *pace)
    lines = read_until(first, r"saved last\.ckpt at epoch 0 step 4")
    subprocess.run(["docker", "kill", *containers(first.folder)], check=True, capture_output=True)
    finish(first, lines)
    assert first.returncode != 0
    saved = sorted(p for p in os.listdir(ckpts) if p.endswith(".ckpt") and not p.startswith("."))
    steps = {
        p: torch.load(ckpts / p, map_location="cpu", weights_only=False)["global_step"] for p in saved
    }  # every checkpoint under its real name is whole
    assert 4 <= steps["last.ckpt"] < 12

    again = start_job(image, archive_dir, tmp_path / "c", "--checkpoints", str(ckpts), *RESUMABLE)
    output = finish(again, [])
    assert again.returncode == 0, output[-5000:]
    assert f"resuming at epoch 0 step {steps['last.ckpt']} from last.ckpt" in output
    assert final(output) == expected  # same final step, same weights: model, optimizer, data order and RNG resumed
    # a write the kill cut short left its temporary file (".last.ckpt.partial"); the resumed run wrote it again whole
    assert partial_files(ckpts) == []


def test_sigterm_saves_a_checkpoint_at_the_step_reached(image, archive_dir, tmp_path):
    """docker stop (SIGTERM to PID 1, as StopTrainingJob and spot interruptions do): last.ckpt at the step the
    training processes reached, written before the container exits, inside SageMaker's 120 s."""
    ckpts = tmp_path / "ckpts"
    words = [w for w in RESUMABLE if not w.startswith(("last_checkpoint", "trainer.limit_train"))]
    code, pace = paced(tmp_path, 3)
    job = start_job(image, archive_dir, tmp_path / "out", "--checkpoints", str(ckpts), *code, *words, *pace,
                    "trainer.limit_train_batches=100", "last_checkpoint_every_n_steps=3")  # fmt: skip
    lines = read_until(job, r"saved last\.ckpt at epoch 0 step 3")
    (container,) = containers(job.folder)
    # SageMaker's grace: a container still running after it is SIGKILLed (137), so 143 says it ended within it
    subprocess.run(["docker", "stop", "--time", "120", container], check=True, capture_output=True)
    output = finish(job, lines)
    assert stopped_with_checkpoint(output, ckpts, container) > 3


def test_docker_stop_of_an_mpi_job_leaves_a_complete_checkpoint(image, archive_dir, tmp_path):
    """mpirun with 2 processes: SIGTERM reaches the two ranks (not mpirun, which would end them first), they stop at
    the same step and last.ckpt is written whole before the container exits. Once the ranks are done, the container
    exits within LEFTOVER_GRACE_S: the sshd mpirun needs is no reason to wait out the entrypoint's 110 s grace, as it
    did (docker's 60 s here then SIGKILLed it: 137)."""
    ckpts = tmp_path / "ckpts"
    words = [w for w in RESUMABLE if not w.startswith(("last_checkpoint", "trainer.limit_train"))]
    mpi = ["--distribution", "mpi", "--processes-per-host", "2"]
    code, pace = paced(tmp_path, 3)
    job = start_job(image, archive_dir, tmp_path / "out", "--checkpoints", str(ckpts), *mpi, *code, *words, *pace,
                    "trainer.limit_train_batches=100", "last_checkpoint_every_n_steps=3")  # fmt: skip
    lines = read_until(job, r"saved last\.ckpt at epoch 0 step 3")
    (container,) = containers(job.folder)
    subprocess.run(["docker", "stop", "--time", "60", container], check=True, capture_output=True)  # then SIGKILL: 137
    output = finish(job, lines)
    assert stopped_with_checkpoint(output, ckpts, container) > 3
    assert partial_files(ckpts) == []
    assert "pre-flight: 1 host × 2 processes; all-reduce busbw" in output  # pre-flight under mpirun too
    # When, on docker's clock (its log's timestamps, the container's end): PID 1 passed SIGTERM on, the last rank
    # printed its stop line (then exits), the container ended. The ranks' own exit after their line is allowed as long
    # as their stop took (a slow machine is slow at both); a longer wait for what the ranks left fails
    logs = subprocess.run(["docker", "logs", "--timestamps", container], capture_output=True, text=True, check=True)
    stamped = [line.partition(" ") for line in (logs.stdout + logs.stderr).splitlines()]

    def when(text: str) -> list[float]:
        return [datetime.fromisoformat(stamp).timestamp() for stamp, _, line in stamped if text in line]

    signalled, ended = when("entrypoint: SIGTERM: passed on to"), when(f"ERROR: {failure.STOPPED}")
    finished = subprocess.run(["docker", "inspect", "-f", "{{.State.FinishedAt}}", container], capture_output=True,
                              text=True, check=True)  # fmt: skip
    exited = datetime.fromisoformat(finished.stdout.strip()).timestamp()
    assert len(signalled) == 1 and ended, logs.stdout[-3000:] + logs.stderr[-3000:]
    stop_s, after_s = max(ended) - signalled[0], exited - max(ended)
    assert stop_s > 0 and after_s < entrypoint.LEFTOVER_GRACE_S + stop_s, (stop_s, after_s)


def test_a_frozen_host_is_named_and_every_host_ends(image, archive_dir, tmp_path):
    """The trainer on algo-2 SIGSTOPped at step 2 (a frozen host: none of its threads run): algo-1 ends after the
    training timeout in one line naming the collective, rank 1 and algo-2, and local mode (docker compose) then ends
    algo-2, well before dist_timeout."""
    words = [w for w in RESUMABLE if not w.startswith("last_checkpoint")] + ["dist_timeout=300", "training_timeout=10"]
    code = ["--source-dir", job_code(tmp_path), "--entry-point", "train.py", "--instance-count", "2"]
    hang = ["trainer.callbacks+=faults.Hang", "trainer.callbacks.stop=true"]
    job = start_job(image, archive_dir, tmp_path / "out", *code, *words, *hang)
    lines = read_until(job, r"epoch 0 step 1/")  # training runs; rank 1 stops at the start of step 2
    started = time.monotonic()
    output = finish(job, lines)
    # the timeout, a heartbeat, then compose stops algo-2 (SIGKILL after 10 s): 29 s here on 2 cores
    ended_s = time.monotonic() - started
    assert re.search(
        r"ERROR: gloo:\w+ #\d+ of process group default_pg did not finish within the training timeout of 10 s "
        r"\(training_timeout\) on rank 0 \(algo-1[-\w]*, step 2\); rank 1 on algo-2[-\w]* did not arrive: no "
        r"heartbeat for \d+ s at step \d+, last entered #\d+: its process is stopped",
        output,
    ), output[-5000:]
    assert ended_s < 10 + 30 and containers(job.folder) == [], ended_s  # the bound; dist_timeout: 300 s


def test_an_mpi_rank_killed_for_memory_is_named(image, archive_dir, tmp_path):
    """mpirun with 2 processes, rank 1 SIGKILLed (the job's own code: the example plus the tests' faults): the
    failure line names rank 1, its host and the fix, from mpirun's own report. Before: the job's framework
    hyperparameters were encoded twice with --source-dir, and mpirun took '""' for the program. The client ends with
    one line, not the SDK's traceback, and leaves nothing in the temp dir."""
    code = job_code(tmp_path)
    job = start_job(image, archive_dir, tmp_path / "out", "--source-dir", code, "--entry-point", "train.py",
                    "--distribution", "mpi", "--processes-per-host", "2", *RESUMABLE,
                    "trainer.callbacks+=faults.KillRank", "dist_timeout=60")  # fmt: skip
    output = finish(job, [])
    # the client's last line: one of ours
    assert job.returncode == 1, f"the client exited {job.returncode}:\n{output[-3000:]}"
    assert "Traceback" not in output, output[max(0, output.find("Traceback") - 1000) :][:6000]
    assert os.listdir(os.path.join(job.folder, "tmp")) == []  # its TMPDIR: a failed job's container root is removed too
    assert re.search(r"\nerror: job lightning-\S+ failed \(.*\); the job's ERROR line above says why\n$", output)
    failures = re.findall(r"ERROR: (.*)", output)
    assert failures and re.match(
        r"training process rank 1 on host algo-1\S* was killed with SIGKILL, most often by the kernel's "
        r"out-of-memory killer; lower data\.batch_size",
        failures[-1],
    ), output[-8000:]


def opt_ml(tmp_path, hosts, current, hyperparameters) -> dict:
    """A hand-made /opt/ml for `docker run`: config, an empty model directory and output directory."""
    config, model, output = (tmp_path / d for d in ("config", "model", "output"))
    for d in (config, model, output):
        d.mkdir()
    (config / "resourceconfig.json").write_text(
        json.dumps({"current_host": current, "hosts": hosts, "network_interface_name": "eth0"})
    )
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "inputdataconfig.json").write_text("{}")
    return {"/opt/ml/input/config": config, "/opt/ml/model": model, "/opt/ml/output": output}


def docker_run(image, mounts: dict, *args, network="bridge", alias=None) -> tuple[subprocess.CompletedProcess, float]:
    cmd = ["docker", "run", "--rm", "--network", network, *(["--network-alias", alias] if alias else [])]
    for target, source in mounts.items():
        cmd += ["-v", f"{source}:{target}"]
    started = time.monotonic()
    result = subprocess.run([*cmd, image, *args], capture_output=True, text=True, timeout=300)
    return result, time.monotonic() - started


TINY_ARGS = [
    "--trainer.max_epochs",
    "1",
    "--trainer.limit_train_batches",
    "2",
    "--trainer.limit_val_batches",
    "1",
    "--trainer.accelerator",
    "cpu",
    "--trainer.enable_progress_bar",
    "false",
]


@pytest.fixture(scope="module")
def offline_training(image, archive_dir) -> tuple[subprocess.CompletedProcess, float]:
    """A tiny training in the image with no network (`docker run --network none`, as SageMaker's network isolation),
    the data mounted, download allowed: test_without_network_nothing_downloads checks it; its seconds are what the
    "fails fast" bounds here are relative to, measured under the same load (a fixed bound would not hold on a slower
    or busier machine): a container that fails before it trains ends within twice the time of one that trains."""
    args = ["python", "train.py", "--data.data_dir", "/data", "--data.download", "true", *TINY_ARGS]
    return docker_run(image, {"/data": archive_dir}, *args, network="none")


def test_a_host_that_never_comes_up_is_named(image, tmp_path, offline_training):
    """A 2-host job whose second container never starts: the first fails within dist_timeout, naming it."""
    mounts = opt_ml(tmp_path, ["algo-1", "algo-2"], "algo-1", {"dist_timeout": "10"})
    network = f"never-up-{uuid.uuid4().hex[:8]}"  # this run's own: another run's network is not removed under it
    subprocess.run(["docker", "network", "create", network], capture_output=True)
    try:
        result, seconds = docker_run(image, mounts, "train", network=network, alias="algo-1")
    finally:
        subprocess.run(["docker", "network", "rm", network], capture_output=True)
    assert result.returncode == 1 and seconds < 10 + 2 * offline_training[1]  # dist_timeout, and a start's headroom
    failure = (mounts["/opt/ml/output"] / "failure").read_text()
    assert failure.startswith("host algo-2 did not come up within dist_timeout=10 s") and failure.count("\n") == 1
    assert f"ERROR: {failure.strip()}" in result.stderr
    assert os.listdir(mounts["/opt/ml/model"]) == []


def test_without_network_nothing_downloads(image, tmp_path, offline_training):
    """--network none, as SageMaker's network isolation: data in a channel trains, even with download allowed;
    no data is the missing-data error, fast."""
    trained, trained_s = offline_training
    assert trained.returncode == 0, trained.stderr[-3000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    for download, message in (
        ("false", "no CIFAR-10 data in /data: expected"),
        ("true", "cannot download CIFAR-10 into /data"),
    ):
        failed, seconds = docker_run(
            image,
            {"/data": empty},
            "python",
            "train.py",
            "--data.data_dir",
            "/data",
            "--data.download",
            download,
            *TINY_ARGS,
            network="none",
        )
        assert failed.returncode == 1 and seconds < 2 * trained_s  # offline_training says why
        assert [line for line in failed.stderr.splitlines() if line.startswith("ERROR: ")][0].startswith(
            f"ERROR: {message}"
        )


def test_an_sdk3_source_code_job_stopped_as_spot_stops_it_resumes_exactly(image, user_project, points_dir, tmp_path):
    """SDK 3.x's driver (SourceCode) is PID 1 and ignores SIGTERM: `docker stop` of both hosts mid-epoch kills the
    trainers after the grace period. The log named what bounds the loss (last.ckpt every 4 steps); the same job
    again resumes from that checkpoint and ends at the planned step with the weights of an uninterrupted run."""
    settings = ["--source-dir", user_project, "--instance-count", "2", "trainer.max_epochs=2", "data.batch_size=16",
                "last_checkpoint_every_n_steps=4", "trainer.enable_progress_bar=False"]  # fmt: skip
    uninterrupted = start_job(image, points_dir, tmp_path / "a", *settings, sdk="v3")
    whole = finish(uninterrupted, [])
    assert uninterrupted.returncode == 0, whole[-5000:]
    expected = final(whole)
    assert expected[1] == 24  # 2 epochs of 12 steps (192 points a rank, batch 16)

    ckpts = tmp_path / "ckpts"
    # a pause in each step (a sleep: the weights are the same) so that the stop lands mid-epoch; only here, where the
    # job is stopped: the other two wait for nothing
    first = start_job(image, points_dir, tmp_path / "b", "--checkpoints", str(ckpts), *settings,
                      "model.step_seconds=0.5", sdk="v3")  # fmt: skip
    lines = read_until(first, r"saved last\.ckpt at epoch 0 step 4")
    assert any("no SIGTERM reaches the training processes (PID 1 is SDK 3.x's driver" in line and
               "last.ckpt every 4 steps bounds it" in line for line in lines), "".join(lines[-30:])  # fmt: skip
    subprocess.run(["docker", "stop", "--time", "1", *containers(first.folder)], check=True, capture_output=True)
    finish(first, lines)
    saved = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert 4 <= saved < 24

    again = start_job(image, points_dir, tmp_path / "c", "--checkpoints", str(ckpts), *settings, sdk="v3")
    output = finish(again, [])
    assert again.returncode == 0, output[-5000:]
    assert f"resuming at epoch {saved // 12} step {saved} from last.ckpt" in output
    assert final(output) == expected
