"""torch.compile's cache beside the checkpoints (checkpoints/compile_cache.py), in a job through the image's
entrypoint and the real `train`: the user project (examples/user_project) with model.compile on, stopped by SIGTERM
(as SageMaker stops a spot job), saves it with last.ckpt; restarted on the same checkpoint directory with an empty
Inductor cache (a new instance's), it loads it before its first step and says so. What that saves in time is a
benchmark's figure (scripts/bench_compile_cache.py), not asserted here. The project's tiny network keeps the compile
short (the example's ResNet-18 compiles for minutes on 2 CPU cores)."""

import os
import re

import pytest

pytestmark = pytest.mark.toolkit

PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plugins")


def test_a_restarted_job_loads_the_compile_cache_its_first_run_saved(run_hosts, user_project, points_dir, tmp_path):
    ckpts = tmp_path / "checkpoints"
    job = {
        "sagemaker_program": "train.py",
        "trainer": {"max_epochs": 1, "limit_train_batches": 6, "limit_val_batches": 0, "enable_progress_bar": False},
        "model.compile": True,
        "compile_cache": True,  # off by default: the file holds code torch runs
        "model.step_seconds": 0.3,  # the stop comes mid-epoch
        "checkpoint.dirpath": str(ckpts),
    }
    stop = {"trainer.callbacks+": "faults.StopJob", "trainer.callbacks.step": 2}

    def run(hyperparameters, inductor, **env):  # each run on an empty Inductor cache, compiling in its own process
        env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / inductor), "TORCHINDUCTOR_COMPILE_THREADS": "1", **env}
        return run_hosts(["localhost"], hyperparameters, {"training": points_dir}, code=user_project, env=env)[0]

    stopped = run({**job, **stop}, "inductor-1", PYTHONPATH=PLUGINS)
    saved = re.search(r"saved last\.ckpt at epoch 0 step (\d)\n", stopped.output)
    assert stopped.returncode == 143 and saved and int(saved[1]) < 6, stopped.output[-3000:]
    assert re.search(r"compile cache: saved compile_cache\.bin \([\d.]+ MiB\) beside the checkpoints", stopped.output)
    assert (ckpts / "compile_cache.bin").read_bytes().startswith(b"torch ")

    resumed = run(job, "inductor-2")  # a new instance: nothing compiled there
    assert resumed.returncode == 0, resumed.output[-3000:]
    loaded = re.search(r"compile cache: loaded (\d+) artifacts \([\d.]+ MiB\) from compile_cache\.bin", resumed.output)
    assert loaded and int(loaded[1]) > 0, resumed.output[-3000:]
    first_step = resumed.output.index(f" step {int(saved[1]) + 1}/6")
    assert f"resuming at epoch 0 step {saved[1]} from last.ckpt" in resumed.output
    assert resumed.output.index(loaded[0]) < first_step  # loaded before the restart's first step
