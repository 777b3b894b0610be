"""warmpool.py: where the warm pool's cache folder can hold them, PID 1 points the job's caches there, and installs
the job's requirements.txt from the wheels an earlier job kept there, asking no index; a missing or read-only folder
is one line and changes nothing. pip itself runs in tests/container/test_warm_pool_cache.py; here a stand-in records
what it is asked."""

import json
import os
import subprocess

import pytest

from sagemaker_lightning.boot import warmpool
from sagemaker_lightning.launch import paths

pytestmark = pytest.mark.unit


def test_the_caches_go_into_the_warm_pool_folder_and_the_jobs_own_settings_win(tmp_path):
    cache = tmp_path / "sagemaker" / "warmpoolcache"
    cache.mkdir(parents=True)
    env = {"SAGEMAKER_BASE_DIR": str(tmp_path), "TRITON_CACHE_DIR": "/mine"}
    where, line = warmpool.apply(env)
    assert where == str(cache) == paths.warm_pool_cache(env)
    assert env["PIP_CACHE_DIR"] == str(cache / "pip") and env["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "torchinductor")
    assert env["UV_CACHE_DIR"] == str(cache / "uv") and env["TRITON_CACHE_DIR"] == "/mine"
    assert env["LITDATA_CACHE_DIR"] == str(cache / "streaming")  # the launch plan passes it on to litdata
    assert os.path.isdir(cache / "streaming") and os.path.isdir(cache / "pip")
    assert line.startswith(f"warm-pool cache {cache}: pip's, uv's, torch.compile's and streaming data's caches")
    # SageMaker names the folder in a variable of its own, which wins
    assert paths.warm_pool_cache({"SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": "/w"}) == "/w"


def test_a_missing_or_unwritable_folder_is_one_line_and_changes_nothing(tmp_path):
    env = {"SAGEMAKER_BASE_DIR": str(tmp_path)}
    where, line = warmpool.apply(env)
    assert where is None and env == {"SAGEMAKER_BASE_DIR": str(tmp_path)}
    assert "is missing (SageMaker mounts it in jobs that ask for a warm pool" in line and "\n" not in line
    cache = tmp_path / "sagemaker" / "warmpoolcache"
    cache.mkdir(parents=True)
    cache.chmod(0o500)
    try:
        if os.access(cache, os.W_OK):  # root writes anyway: a file where a folder must go fails for root too
            cache.chmod(0o700)
            (cache / "pip").write_text("a file, not a folder")
        where, line = warmpool.apply(env)
    finally:
        cache.chmod(0o700)
    assert where is None and "PIP_CACHE_DIR" not in env
    assert line.startswith(f"warm-pool cache {cache} cannot be written (") and "\n" not in line


class Pip:
    """A stand-in for `python -m pip`: records each command; `install --report` writes the report it is given."""

    def __init__(self, report: list[dict], fail: tuple[str, ...] = ()):
        self.report, self.fail, self.commands = report, fail, []

    def __call__(self, command, cwd, env):
        self.commands.append(command[4:])
        words = command[4:]
        if "--report" in words:
            with open(words[words.index("--report") + 1], "w") as f:
                json.dump({"install": [{"download_info": item} for item in self.report]}, f)
        failed = words[0] in self.fail or "--no-index" in self.fail and "--no-index" in words
        return subprocess.CompletedProcess(command, int(failed))


def job(tmp_path, requirements="tinyhelper==0.1\n"):
    code, cache = tmp_path / "code", tmp_path / "cache"
    code.mkdir()
    cache.mkdir()
    (code / "requirements.txt").write_text(requirements)
    return str(code), str(cache)


def test_the_first_job_keeps_the_wheels_and_the_next_installs_them_asking_no_index(tmp_path):
    code, cache = job(tmp_path)
    pip = Pip([{"url": "https://index/tinyhelper-0.1-py3-none-any.whl", "archive_info": {}}])
    first = warmpool.install_requirements(code, cache, {}, run=pip)
    assert first == "requirements.txt installed, its 1 wheels kept in the warm-pool cache for the next job"
    (install, keep) = pip.commands
    assert install[:2] == ["install", "--report"] and install[-2:] == ["-r", "requirements.txt"]
    assert keep[:2] == ["wheel", "--quiet"] and keep[-1] == "https://index/tinyhelper-0.1-py3-none-any.whl"
    wheels = keep[keep.index("--wheel-dir") + 1]
    assert os.path.dirname(wheels) == os.path.join(cache, warmpool.WHEELS)
    assert os.path.exists(os.path.join(wheels, warmpool.COMPLETE))

    pip.commands.clear()
    second = warmpool.install_requirements(code, cache, {}, run=pip)
    assert second == f"requirements.txt installed from the warm-pool cache ({wheels}), no package index asked"
    assert pip.commands == [["install", "--no-index", "--find-links", wheels, "-r", "requirements.txt"]]


def test_other_requirements_or_another_image_fill_a_folder_of_their_own(tmp_path):
    key = warmpool.requirements_key(b"a==1\n", ["torch-2.14.1.dist-info"])
    assert key == warmpool.requirements_key(b"a==1\n", ["torch-2.14.1.dist-info"])
    assert key != warmpool.requirements_key(b"a==2\n", ["torch-2.14.1.dist-info"])
    assert key != warmpool.requirements_key(b"a==1\n", ["torch-2.13.0.dist-info"])


def test_an_offline_install_that_fails_installs_as_the_first_job_did(tmp_path):
    code, cache = job(tmp_path)
    pip = Pip([{"url": "https://index/a.whl", "archive_info": {}}])
    warmpool.install_requirements(code, cache, {}, run=pip)
    pip.fail, pip.commands = ("--no-index",), []
    line = warmpool.install_requirements(code, cache, {}, run=pip)
    assert [c[:2] for c in pip.commands] == [["install", "--no-index"], ["install", "--report"], ["wheel", "--quiet"]]
    assert line.startswith("requirements.txt installed, its 1 wheels kept")


@pytest.mark.parametrize(
    "report, fail, expected",
    [
        ([{"url": "file:///opt/ml/code", "dir_info": {"editable": True}}], (), "it names a local directory"),
        ([{"url": "https://index/a.whl", "archive_info": {}}], ("wheel",), "keeping its wheels failed (above)"),
        ([], ("install",), "installing requirements.txt failed (above); the toolkit tries once more"),
    ],
)
def test_what_cannot_be_kept_is_asked_of_the_index_next_time(tmp_path, report, fail, expected):
    code, cache = job(tmp_path)
    line = warmpool.install_requirements(code, cache, {}, run=Pip(report, fail))
    assert expected in line
    assert not any(files for _, _, files in os.walk(os.path.join(cache, warmpool.WHEELS)))  # nothing marked complete


def test_no_requirements_txt_installs_nothing(tmp_path):
    pip = Pip([])
    assert warmpool.install_requirements(str(tmp_path), str(tmp_path), {}, run=pip) is None and not pip.commands


def test_pid_1_installs_only_for_a_python_program_of_the_job(tmp_path, monkeypatch):
    code, _ = job(tmp_path)
    base = tmp_path / "ml"
    (base / "sagemaker" / "warmpoolcache").mkdir(parents=True)
    said, calls, env = [], [], {"SAGEMAKER_BASE_DIR": str(base)}
    monkeypatch.setattr(warmpool, "install_requirements", lambda *args: calls.append(args) or "installed")
    warmpool.prepare(dict(env), {"sagemaker_program": '"run.sh"'}, code, said.append)  # a command: the toolkit's way
    assert not calls
    warmpool.prepare(dict(env), {"sagemaker_program": '"train.py"'}, code, said.append)
    assert len(calls) == 1 and said[-1] == "installed"
    codeartifact = {**env, "CA_REPOSITORY_ARN": "arn:aws:codeartifact:us-east-1:1:repository/d/r"}
    warmpool.prepare(codeartifact, {"sagemaker_program": '"train.py"'}, code, said.append)  # not PyPI: the toolkit's
    assert len(calls) == 1 and "installs it from CodeArtifact" in said[-1]
    (tmp_path / "code" / "setup.py").write_text("")  # a package: the toolkit installs it and its requirements
    warmpool.prepare(dict(env), {"sagemaker_program": '"train.py"'}, code, said.append)
    assert len(calls) == 1
