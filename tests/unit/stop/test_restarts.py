"""What a job needs to survive its platform's restarts (restarts.py): a checkpoint directory that outlives the
container, a first save that fits a stop's grace, the restart line under torchrun from torchrun's own error files
(which failure.report writes)."""

import json

import pytest

from sagemaker_lightning import failure
from sagemaker_lightning.launch.plan import make_plan
from sagemaker_lightning.stop import restarts

pytestmark = pytest.mark.unit

# /proc/self/mountinfo of a pod: the container's overlay root, a PersistentVolumeClaim, an emptyDir, a ConfigMap
MOUNTINFO = """\
1466 1238 0:312 / / rw,relatime master:403 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/A
1469 1466 259:1 /var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1/mount /mnt/shared rw - nfs4 fs:/ rw
1470 1466 259:1 /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/scratch /scratch rw - ext4 /dev/nvme0n1p1 rw
1471 1466 259:1 /var/lib/kubelet/pods/u1/volumes/kubernetes.io~configmap/c /etc/my\\040conf ro - ext4 /dev/x rw
"""


@pytest.mark.parametrize(
    "path, why",
    [
        ("/mnt/shared/ckpts", None),
        ("/mnt/shared", None),
        ("s3://bucket/ckpts", None),
        ("/mnt/sharedx/ckpts", "on this container's own filesystem (overlay)"),  # a prefix of a name is no mount
        ("/tmp/ckpts", "on this container's own filesystem (overlay)"),
        ("/scratch/ckpts", "on an emptyDir volume, which goes with its pod"),
        ("/etc/my conf/x", None),
    ],
)
def test_a_checkpoint_directory_that_goes_with_the_container_is_named(path, why):
    assert restarts.ephemeral(path, MOUNTINFO) == why


def test_the_directory_line():
    assert restarts.directory_line("/mnt/shared/c", MOUNTINFO) is None
    assert restarts.directory_line(None, MOUNTINFO).startswith("warning: no checkpoint.dirpath: a restarted pod")
    assert restarts.directory_line("/tmp/c", MOUNTINFO) == (
        "warning: checkpoint.dirpath=/tmp/c is on this container's own filesystem (overlay): a restarted pod or gang "
        "starts over; point checkpoint.dirpath at a shared volume (a PersistentVolumeClaim, NFS, FSx) or s3://"
    )


def test_a_first_save_that_does_not_fit_the_grace_is_said():
    assert restarts.grace_s(None, on_sagemaker=False) == 30 and restarts.grace_s(None, on_sagemaker=True) == 120
    assert restarts.grace_s(300, on_sagemaker=False) == 300
    assert restarts.grace_line(20.0, 30) is None
    assert restarts.grace_line(26.0, 30) == (
        "warning: saving last.ckpt took 26.0 s; with a stop's 5 s more it does not fit the 30 s between SIGTERM and "
        "SIGKILL (stop_grace_s): a stop would lose its checkpoint; raise the pod's terminationGracePeriodSeconds and "
        "stop_grace_s together"
    )


def test_a_restart_names_how_the_previous_attempt_ended(tmp_path, monkeypatch, capsys):
    """torchrun's layout: <log dir>/<run id>/attempt_<n>/<local rank>/error.json. The previous attempt's rank that
    failed in Python left its line there (failure.report writes it); one killed by a signal left nothing."""
    run = tmp_path / "run-1"
    for rank in (0, 1):
        (run / "attempt_0" / str(rank)).mkdir(parents=True)
        (run / "attempt_1" / str(rank)).mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(run / "attempt_0" / "0" / "error.json"))
    failure.report("lost the connection to host node-1 during training")
    written = json.loads((run / "attempt_0" / "0" / "error.json").read_text())["message"]  # torch's format
    assert (
        written["message"]
        == written["extraInfo"]["py_callstack"]
        == ("lost the connection to host node-1 during training")
    )
    assert "ERROR: lost the connection" in capsys.readouterr().err
    env = {"TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_ERROR_FILE": str(run / "attempt_1" / "0" / "error.json")}
    assert restarts.restart_line(env, "pt-worker-0") == (
        "restart 1 of torchrun's worker group on host pt-worker-0 (TORCHELASTIC_RESTART_COUNT=1): every rank resumes "
        "from last.ckpt; before it, local rank 0: lost the connection to host node-1 during training; local rank 1 "
        "ended without a line (a signal: SIGKILL, most often the out-of-memory killer, or a crash)"
    )
    assert restarts.restart_line({**env, "TORCHELASTIC_RESTART_COUNT": "0"}, "h") is None


def test_a_restart_takes_the_previous_attempts_line_out_of_the_failure_file(tmp_path, capsys):
    """The restarted attempt's own failure is the job's FailureReason, not the first attempt's ("x": first wins)."""
    torchrun = {"TORCHELASTIC_RUN_ID": "j", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    env = {
        "SM_HOSTS": '["algo-1"]',
        "SM_CURRENT_HOST": "algo-1",
        "LAUNCHER": "torchrun",
        "SM_OUTPUT_DIR": str(tmp_path),
    }
    failure.report("lost the connection to host algo-1 during training", env)  # the first attempt's rank 1
    local_rank_1 = make_plan({**env, **torchrun, "LOCAL_RANK": "1", "TORCHELASTIC_RESTART_COUNT": "1"}, ())
    restarts.announce(local_rank_1, None)  # the host's first process only
    assert (tmp_path / "failure").read_text() == "lost the connection to host algo-1 during training\n"
    restarted = make_plan({**env, **torchrun, "LOCAL_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "1"}, ())
    restarts.announce(restarted, None)
    assert "restart 1 of torchrun's worker group on host algo-1" in capsys.readouterr().out
    assert not (tmp_path / "failure").exists()
    restarts.announce(restarted, None)  # again, the attempt before it killed without a line (SIGKILL): none to take out
    assert not (tmp_path / "failure").exists()
    failure.report("data.batch_size must be positive", env)  # the restarted attempt's own failure
    assert (tmp_path / "failure").read_text() == "data.batch_size must be positive\n"
    first = make_plan({**env, **torchrun, "LOCAL_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}, ())
    restarts.announce(first, None)  # no restart: the line stays
    assert (tmp_path / "failure").exists()


@pytest.mark.parametrize(("given", "expected"), [(None, 0), ("", 0), ("0", 0), ("-1", 0), ("x", 0), ("3", 3)])
def test_torchruns_restarts_are_a_whole_number_or_none(given, expected):
    env = {} if given is None else {"TORCHELASTIC_MAX_RESTARTS": given}
    assert restarts.max_restarts(env) == expected


def test_torchrun_that_restarts_over_a_shared_store_is_warned_of():
    shared = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "1"}
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restarts.shared_store_line(shared)
    assert restarts.shared_store_line({**shared, "TORCHELASTIC_MAX_RESTARTS": "0"}) is None
    assert restarts.shared_store_line({**shared, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None


def test_in_a_kubernetes_pod_the_line_is_its_termination_message(tmp_path, monkeypatch, capsys):
    """/dev/termination-log, where the kubelet mounted it (kubectl describe pod shows it); never made elsewhere."""
    log = tmp_path / "termination-log"
    monkeypatch.setattr(failure, "TERMINATION_LOG", str(log))
    failure.report("WORLD_SIZE=3 disagrees")
    assert not log.exists()
    log.write_text("")
    failure.report("WORLD_SIZE=3 disagrees")
    assert log.read_text() == "WORLD_SIZE=3 disagrees\n"


def test_in_job_recovery_across_sagemaker_hosts_needs_a_shared_checkpoint_directory():
    restarting = {"TORCHELASTIC_MAX_RESTARTS": "1"}
    torchrun = {"TORCHELASTIC_RUN_ID": "j", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    two = make_plan({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1", **torchrun}, ())
    one = make_plan({"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", **torchrun, "WORLD_SIZE": "1"}, ())
    assert "is each host's own" in restarts.unshared_line(two, "/opt/ml/checkpoints", restarting)
    assert restarts.unshared_line(two, "s3://bucket/ckpt", restarting) is None
    assert restarts.unshared_line(two, "/opt/ml/checkpoints", {}) is None  # no restarts
    assert restarts.unshared_line(one, "/opt/ml/checkpoints", restarting) is None  # one host: its own is every host's


def test_a_tuning_child_says_where_its_own_checkpoints_are():
    env = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "TRAINING_JOB_NAME": "tune-001-abc"}
    child = make_plan(env, {"lo"}, objective="validation:accuracy")
    said = restarts.child_line(child, "/opt/ml/checkpoints/tune-001-abc")
    assert said.startswith("tuning job's child tune-001-abc: its checkpoints in /opt/ml/checkpoints/tune-001-abc, ")
    assert restarts.child_line(child, "s3://bucket/mine") is None  # the project's own checkpoint.dirpath
    assert restarts.child_line(make_plan(env, {"lo"}), "/opt/ml/checkpoints") is None  # a training job
