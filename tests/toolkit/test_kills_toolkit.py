"""Real SIGKILLs and SIGTERMs under the real `train` entry point (sagemaker-training) on two hosts of a temporary
/opt/ml, where the interruption oracle (test_resume_oracle.py) does not reach: inside last.ckpt's write before its
rename, between the export's two renames, at the start of an upload to S3, SageMaker's SIGKILL after a grace period,
a checkpoint read that fails once. One run after another on the same checkpoints, each resumes exactly where the one
before left, to the weights of one uninterrupted run (both tests'). The oracle sweeps the other kills (an epoch's
edges, a write cut halfway, DataLoader workers, one host) with real processes.

    .venv/bin/pytest tests/toolkit/test_kills_toolkit.py
"""

import os
import re

import pytest
import s3fs
import torch
from job_lines import final, resumed

pytestmark = pytest.mark.toolkit

PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")
HOSTS = ["localhost", "127.0.0.1"]
# 2 epochs of 3 steps (of the 5 a rank's 80 training images make), a validation of 2 batches after each (the 40 test
# images, 20 a rank); last.ckpt on each epoch's last batch
EPOCHS = {
    "trainer.max_epochs": 2,
    "trainer.limit_train_batches": 3,
    "trainer.limit_val_batches": 2,
    "data.val_split": 0,
    "last_checkpoint_every_n_steps": 3,
    "dist_timeout": 60,
}


@pytest.fixture(scope="module")
def uninterrupted(run_hosts_once, archive_dir, tiny):
    """The uninterrupted run both tests' chains end as, with preflight=off (the chains run pre-flight)."""
    hosts = run_hosts_once(HOSTS, {**tiny, **EPOCHS, "preflight": "off"}, {"training": archive_dir})
    assert all(h.returncode == 0 for h in hosts), hosts[0].output[-3000:]
    assert final(hosts[0].output)[1] == 6
    return hosts


def top_k(folder: str) -> list[str]:
    """ModelCheckpoint's files in `folder` (epoch=E-step=S.ckpt)."""
    return sorted(n for n in os.listdir(folder) if n.startswith("epoch="))


# SIGKILLs of rank 0 (the other host fails), one run after another on the same checkpoint directory, each run resuming
# from what the one before left: (the save it resumes from, where it is killed: KillRank's arguments)
KILLS = [
    (None, {"rank": 0, "step": 6, "at": "last.ckpt"}),  # inside the write of step 6's last.ckpt, before its rename
    ("epoch 0 step 3", {"rank": 0, "step": 6, "at": "model.pt"}),  # between the export's renames
]


def test_real_sigkills_inside_a_checkpoints_write_and_between_the_exports_renames(
    run_hosts, archive_dir, tiny, tmp_path, uninterrupted
):
    """SIGKILL of a real training process inside last.ckpt's background write, its content whole under its temporary
    name, before its rename, and between the export's two renames. Each rerun resumes from the newest complete save
    (the cut write leaves the one before it, and its hidden partial file, which a later save replaces); the export cut
    short leaves config.yaml but no model.pt; the last rerun ends at the uninterrupted run's step with the same
    weights, its model.pt holds the uninterrupted run's, tensor for tensor, from the same best checkpoint, and nothing
    partial is left. The uninterrupted run has preflight=off: no pre-flight line on any host, and it trains and
    exports all the same, to the weights of the chain, which runs pre-flight."""
    assert not [h for h in uninterrupted if "pre-flight" in h.output], uninterrupted[0].output[-3000:]
    expected = final(uninterrupted[0].output)
    data, hps = {"training": archive_dir}, {**tiny, **EPOCHS}
    hps["checkpoint.dirpath"] = checkpoints = str(tmp_path / "checkpoints")  # every host's, as S3 syncs it
    for start, kill in KILLS:
        fault = {"trainer.callbacks+": "faults.KillRank", **{f"trainer.callbacks.{k}": v for k, v in kill.items()}}
        killed = run_hosts(HOSTS, {**hps, **fault}, data, env={"PYTHONPATH": PLUGINS})
        assert all(h.returncode != 0 for h in killed), killed[0].output[-3000:]
        assert resumed(killed[0].output) == start, (kill, killed[0].output[-3000:])
    model = killed[0].path("model")
    assert sorted(os.listdir(model)) == [".model.pt.partial", "config.yaml"]  # no model.pt: the export is not done

    rerun = run_hosts(HOSTS, hps, data)
    assert all(h.returncode == 0 for h in rerun), rerun[0].output[-3000:]
    assert resumed(rerun[0].output) == "epoch 1 step 6"
    assert final(rerun[0].output) == expected and all(final(h.output) == expected for h in rerun)
    assert sorted(os.listdir(rerun[0].path("model"))) == ["config.yaml", "model.pt"]
    exported, reference = (
        torch.load(h.path("model", "model.pt"), weights_only=True) for h in (rerun[0], uninterrupted[0])
    )
    sources = re.findall(r"^model: \S+ from .*", uninterrupted[0].output + rerun[0].output, re.M)  # for a failure
    assert exported.keys() == reference.keys(), sources
    assert all(torch.equal(exported[k], reference[k]) for k in reference), sources
    # the same best checkpoint (save_top_k=1), and none a resumed run forgot it had to replace
    assert top_k(checkpoints) == top_k(uninterrupted[0].path("checkpoints"))
    assert "pre-flight: " in rerun[0].output  # the chain ran it
    assert not [n for n in os.listdir(checkpoints) if n.endswith(".partial")]


def test_two_hosts_resume_exactly_after_sigterm_and_sigkill(run_hosts, archive_dir, tiny, tmp_path, aws, uninterrupted):
    """Checkpoints in S3 (moto): SIGKILL in the background upload of last.ckpt to S3: the rerun resumes from the save
    before, to the uninterrupted run's weights, and both hosts succeed, model.pt holding the best checkpoint's weights,
    read from there (the export used to open the URL as a local file and fail, the other rank waiting out
    dist_timeout). SIGTERM to the second host's entrypoint at the first batch of epoch 0's validation, the first
    host's not yet (as SageMaker signals each host on its own; its first batch ends after the second host decided the
    stop), the validation's later batches each longer than the grace period, shortened to 20 s, after which the host
    is SIGKILLed as SageMaker does: both stop after that batch, with step 3's last.ckpt, and exit 143 within the grace
    (they used to finish the validation first, and were killed); run again, the second host's first read of last.ckpt
    failing once (as S3 throttling does): it is read again, not skipped, and both resume from the checkpoint rank 0
    chose, ending at the uninterrupted run's step with the same weights."""
    data, hps, expected = {"training": archive_dir}, {**tiny, **EPOCHS}, final(uninterrupted[0].output)
    s3 = s3fs.S3FileSystem()
    s3.mkdir("checkpoints")
    # SIGKILL at the start of step 6's last.ckpt upload (in the writer thread): the rerun resumes from step 3's save
    in_s3 = {**hps, "checkpoint.dirpath": "s3://checkpoints/job"}
    kill = {"trainer.callbacks+": "faults.KillRank", "trainer.callbacks.rank": 0, "trainer.callbacks.step": 6}
    kill |= {"trainer.callbacks.at": "last.ckpt", "trainer.callbacks.during": "upload"}
    killed = run_hosts(HOSTS, {**in_s3, **kill}, data, env={"PYTHONPATH": PLUGINS})
    assert killed[0].returncode != 0 and resumed(killed[0].output) is None, killed[0].output[-3000:]
    assert {"job/last.ckpt", "job/last-previous.ckpt"} <= {p.split("/", 1)[1] for p in s3.find("checkpoints")}
    rerun = run_hosts(HOSTS, in_s3, data)
    assert [h.returncode for h in rerun] == [0, 0], rerun[0].output[-3000:]
    assert resumed(rerun[0].output) == "epoch 0 step 3" and final(rerun[0].output) == expected
    best = re.search(r"model: \S+ from (s3://\S+)", rerun[0].output)[1]
    s3.invalidate_cache()  # its listing above is from before the rerun wrote its checkpoints
    with s3.open(best) as f:
        written = torch.load(f, weights_only=True)["state_dict"]
    exported = torch.load(rerun[0].path("model", "model.pt"), weights_only=True)
    assert exported.keys() == written.keys() and all(torch.equal(exported[k], written[k]) for k in written)

    hps["checkpoint.dirpath"] = str(tmp_path / "checkpoints-1")  # both hosts', as S3 syncs it
    stop = {"trainer.callbacks+": "faults.StopJob", "trainer.callbacks.step": 3, "trainer.callbacks.validation": True}
    stop |= {"trainer.callbacks.node_rank": 1, "trainer.callbacks.grace_s": 20, "trainer.callbacks.batch_s": 60}
    stopped = run_hosts(HOSTS, {**hps, **stop}, data, env={"PYTHONPATH": PLUGINS})
    # the first host's PID 1 got no SIGTERM here, so it exits with the toolkit's code; its trainer stopped all the same
    assert stopped[1].returncode == 143, stopped[0].output[-3000:] + stopped[1].output[-3000:]
    assert all(h.failure and h.failure.startswith("stopped by SIGTERM") for h in stopped), stopped[0].output[-3000:]
    assert re.findall(r"saved last\.ckpt at (epoch \d+ step \d+)", stopped[0].output)[-1] == "epoch 0 step 3"
    fail_read = {"trainer.callbacks+": "faults.FailCheckpointRead"}
    restarted = run_hosts(HOSTS, {**hps, **fail_read}, data, env={"PYTHONPATH": PLUGINS})
    assert [h.returncode for h in restarted] == [0, 0], restarted[0].output[-3000:] + restarted[1].output[-3000:]
    assert "checkpoints-1/last.ckpt failed (OSError: [Errno 5] injected" in restarted[1].output
    assert resumed(restarted[0].output) == "epoch 0 step 3"  # the stop's save, in the validation
    assert final(restarted[0].output) == final(restarted[1].output) == expected
