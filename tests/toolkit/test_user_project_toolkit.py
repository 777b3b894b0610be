"""A user's own project (examples/user_project: lightning.pytorch, a data module whose directory argument is `root`, a
requirements.txt installing a wheel from its source directory), brought as SDK 2.x brings code (the hyperparameter
sagemaker_program, the source directory where the toolkit finds it), through the image's entrypoint and the real
`train`: it trains, exports, resumes exactly after SIGKILL, and bad input fails in one line."""

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch
from job_lines import final

pytestmark = pytest.mark.toolkit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGINS = os.path.join(ROOT, "tests", "plugins")
# nested and dotted settings together; 2 epochs of 12 steps, last.ckpt every 5 steps
SETTINGS = {
    "sagemaker_program": "train.py",
    "trainer": {"max_epochs": 2, "enable_progress_bar": False},
    "last_checkpoint_every_n_steps": 5,
    "model.hidden": 8,
}


def load_as_the_readme_shows(model_dir: str, project: str, where) -> subprocess.CompletedProcess:
    """The README's block after <!-- load-model -->, run as it stands in a folder with the job's model.tar.gz (as
    SageMaker packs model_dir), the project's code importable."""
    with open(os.path.join(ROOT, "README.md")) as f:
        block = re.search(r"<!-- load-model -->\n```python\n(.*?)```", f.read(), re.S)[1]
    where.mkdir()
    with tarfile.open(where / "model.tar.gz", "w:gz") as archive:
        for name in os.listdir(model_dir):
            archive.add(os.path.join(model_dir, name), arcname=name)
    env = {**os.environ, "PYTHONPATH": project}
    return subprocess.run(
        [sys.executable, "-c", block], cwd=where, env=env, capture_output=True, text=True, timeout=120
    )


def test_one_line_project_trains_exports_and_resumes_exactly(run_hosts, user_project, points_dir, tmp_path):
    (whole,) = run_hosts(["localhost"], SETTINGS, {"training": points_dir}, code=user_project)
    assert whole.returncode == 0, whole.output[-3000:]
    assert "Successfully installed tinyhelper-0.1" in whole.output  # requirements.txt, from the source directory
    assert final(whole.output)[1] == 24
    state = torch.load(whole.path("model", "model.pt"), weights_only=True)
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "net.0.weight": (8, 2), "net.0.bias": (8,), "net.2.weight": (3, 8), "net.2.bias": (3,)
    }  # fmt: skip
    with open(whole.path("model", "config.yaml")) as f:
        assert "hidden: 8" in f.read()
    loaded = load_as_the_readme_shows(whole.path("model"), user_project, tmp_path / "loading")
    assert loaded.returncode == 0 and re.fullmatch(r"tensor\(\[[012]\]\)\n", loaded.stdout), loaded.stderr

    ckpts = {"checkpoint.dirpath": str(tmp_path / "checkpoints")}
    kill = {"trainer.callbacks+": "faults.KillRank", "trainer.callbacks.step": 7}  # last.ckpt at step 5, mid-epoch
    (killed,) = run_hosts(["localhost"], {**SETTINGS, **ckpts, **kill}, {"training": points_dir}, code=user_project,
                          env={"PYTHONPATH": PLUGINS})  # fmt: skip
    assert killed.returncode != 0 and "saved last.ckpt at epoch 0 step 5" in killed.output
    assert "killed with SIGKILL" in killed.failure and killed.failure.count("\n") == 1
    (resumed,) = run_hosts(["localhost"], {**SETTINGS, **ckpts}, {"training": points_dir}, code=user_project)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "resuming at epoch 0 step 5 from last.ckpt" in resumed.output
    assert final(resumed.output) == final(whole.output)  # the same step and the same weights


BAD = {  # case: (hyperparameters, requirements.txt or None, expected failure line)
    "entry point not in the source directory": ({"sagemaker_program": "trian.py"}, None,
                                                "the entry point 'trian.py' is not in the job's source directory"),
    "a class path that does not import": ({**SETTINGS, "trainer.callbacks+": "no_such_module.Callback"}, None,
                                          "bad hyperparameter: trainer.callbacks"),
    "requirements that fail": (SETTINGS, "--no-index\nno-such-package==9.9\n",
                               "installing the job's requirements.txt failed on host localhost: "),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_input_of_a_user_project_is_one_line(run_hosts, user_project, points_dir, tmp_path, tiny_job, case):
    hyperparameters, requirements, expected = BAD[case]
    code = user_project
    if requirements:
        code = str(tmp_path / "project")
        shutil.copytree(user_project, code)
        with open(os.path.join(code, "requirements.txt"), "w") as f:
            f.write(requirements)
    (host,) = run_hosts(["localhost"], hyperparameters, {"training": points_dir}, code=code)
    assert host.returncode != 0 and host.seconds < 2 * tiny_job.seconds  # tiny_job says why
    assert host.failure is not None and host.failure.count("\n") == 1 and expected in host.failure, host.failure
    assert f"ERROR: {host.failure.strip()}" in host.output
