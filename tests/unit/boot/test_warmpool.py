"""warmpool.py: where the warm pool's cache folder can hold them, PID 1 points the job's caches there, and installs
the job's requirements.txt from the wheels an earlier job kept there, asking no index; a missing or read-only folder
is one line and changes nothing. pip itself runs in tests/container/test_warm_pool_cache.py; here a stand-in records
what it is asked."""

import hashlib
import json
import os
import shutil
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
    """A stand-in for `python -m pip`: records each command; `install --report` writes the report it is given,
    `wheel` writes each URL's file into its --wheel-dir, holding `kept`."""

    def __init__(self, report: list[dict], fail: tuple[str, ...] = (), kept: bytes = b"a wheel"):
        self.report, self.fail, self.kept, self.commands = report, fail, kept, []

    def __call__(self, command, cwd, env):
        self.commands.append(command[4:])
        words = command[4:]
        if "--report" in words:
            with open(words[words.index("--report") + 1], "w") as f:
                json.dump({"install": [{"download_info": item} for item in self.report]}, f)
        failed = words[0] in self.fail or "--no-index" in self.fail and "--no-index" in words
        if words[0] == "wheel" and not failed:
            for url in words[words.index("--wheel-dir") + 2 :]:
                with open(os.path.join(words[words.index("--wheel-dir") + 1], url.rpartition("/")[2]), "wb") as f:
                    f.write(self.kept)
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


def offline(pip: Pip) -> bool:
    """Whether the last job installed from the kept wheels alone."""
    return [c[:2] for c in pip.commands] == [["install", "--no-index"]]


def test_the_key_covers_the_files_pulled_in_and_pip_s_index_settings(tmp_path, monkeypatch):
    """Issue 48, item 5: the key was the top file's bytes alone, so a changed constraints file (or index) kept the
    stale wheels. Now it covers every file pulled in with -r/-c, recursively, each relative to the file naming it
    (sub/constraints.txt's pins.txt is sub/pins.txt, not the decoy beside requirements.txt), in each spelling pip
    takes, with ${VARIABLES} expanded; and the index settings of the environment and of PIP_CONFIG_FILE's file."""
    code, cache = job(tmp_path, "-r base.txt\n--constraint sub/constraints.txt  # pins\n-rextra-${FLAVOR}.txt\n")
    files = {"base.txt": "tinyhelper\n", "sub/constraints.txt": "--requirement=pins.txt\n", "sub/pins.txt": "a==1\n",
             "pins.txt": "decoy\n", "extra-gpu.txt": "b\n", "pip.conf": "[global]\nindex-url = http://a/\n"}  # fmt: skip
    for name, text in files.items():
        (tmp_path / "code" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "code" / name).write_text(text)
    env = {"FLAVOR": "gpu", "PIP_CONFIG_FILE": str(tmp_path / "code" / "pip.conf")}
    pip = Pip([{"url": "https://index/a-1-py3-none-any.whl", "archive_info": {}}])
    warmpool.install_requirements(code, cache, dict(env), run=pip)
    pip.commands.clear()
    warmpool.install_requirements(code, cache, dict(env), run=pip)
    assert offline(pip)  # nothing changed: the kept wheels
    changes = [
        ("pins.txt", "decoy, changed\n", {}, True),  # not pulled in: the same key
        ("sub/pins.txt", "a==2\n", {}, False),
        ("extra-gpu.txt", "c\n", {}, False),
        ("sub/constraints.txt", "--requirement=pins.txt\n--extra-index-url http://b/\n", {}, False),
        (None, None, {"FLAVOR": "cpu"}, False),  # another file pulled in: extra-cpu.txt
        (None, None, {"PIP_INDEX_URL": "http://mirror/simple"}, False),
        (None, None, {"PIP_EXTRA_INDEX_URL": "http://b/"}, False),
        (None, None, {"PIP_FIND_LINKS": "/wheels"}, False),
        (None, None, {"PIP_TRUSTED_HOST": "b"}, False),
        (None, None, {"PIP_NO_INDEX": "1"}, False),
        ("pip.conf", "[global]\nindex-url = http://c/\n", {}, False),
    ]
    for name, text, variables, same in changes:
        if name:
            (tmp_path / "code" / name).write_text(text)
        env.update(variables)
        pip.commands.clear()
        warmpool.install_requirements(code, cache, dict(env), run=pip)
        assert offline(pip) == same, (name, variables)
        pip.commands.clear()
        warmpool.install_requirements(code, cache, dict(env), run=pip)
        assert offline(pip), (name, variables)  # the next job with the same sources: the kept wheels


def pinned_report(content: bytes) -> list[dict]:
    return [{"url": "https://index/a-1-py3-none-any.whl", "archive_info": {"hashes": {"sha256": sha256(content)}}}]


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def test_a_file_that_pins_hashes_keeps_only_the_wheels_pip_checked(tmp_path):
    """Issue 48, item 5: where the file pins hashes, a kept wheel must be the very file whose hash pip recorded when it
    installed it; one built from a pinned source archive (another file) is not kept, and nothing is marked complete:
    pip's hash-checking mode would refuse it in every later job."""
    genuine = b"the wheel pip checked"
    code, cache = job(tmp_path, f"a==1 --hash=sha256:{sha256(genuine)}\n")
    line = warmpool.install_requirements(code, cache, {}, run=Pip(pinned_report(genuine), kept=b"a wheel built anew"))
    assert line.endswith("a-1-py3-none-any.whl kept would not be the file pip checked (a wheel built from a source "
                         "archive), so the next job asks the index again")  # fmt: skip
    assert not any(warmpool.COMPLETE in files for _, _, files in os.walk(cache))
    pip = Pip(pinned_report(genuine), kept=genuine)
    assert warmpool.install_requirements(code, cache, {}, run=pip).endswith("its 1 wheels kept in the warm-pool cache "
                                                                             "for the next job")  # fmt: skip
    (tmp_path / "unpinned").mkdir()
    code, cache = job(tmp_path / "unpinned")  # a file without hashes keeps what pip wheel gives
    line = warmpool.install_requirements(code, cache, {}, run=Pip(pinned_report(genuine), kept=b"a wheel built anew"))
    assert line.endswith("its 1 wheels kept in the warm-pool cache for the next job")


def test_a_kept_wheel_that_is_not_the_pinned_file_is_refused_by_pip_and_the_job_installs_from_the_index(tmp_path):
    """Issue 48, item 5, with pip itself: a later job on the warm pool replaced the kept wheel with its own. The
    offline install of a file that pins hashes refuses it (pip checks the file's hashes), the folder is emptied and
    the job installs the genuine wheel from the index (a local one here) and keeps that."""
    from wheels import write_wheel  # tests/plugins/wheels.py: a wheel of one module

    index = tmp_path / "index"
    genuine = write_wheel(str(index), "tinyhelper", "0.1", "WHO = 'genuine'\n")
    with open(genuine, "rb") as f:
        pin = sha256(f.read())
    code, cache = job(tmp_path, f"tinyhelper==0.1 --hash=sha256:{pin}\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(index), "PIP_TARGET": str(tmp_path / "site"), "PIP_CACHE_DIR": str(tmp_path / "pip")}  # fmt: skip
    first = warmpool.install_requirements(code, cache, dict(env))
    assert first == "requirements.txt installed, its 1 wheels kept in the warm-pool cache for the next job"
    (kept,) = [os.path.join(d, n) for d, _, names in os.walk(cache) for n in names if n.endswith(".whl")]
    os.remove(kept)
    write_wheel(os.path.dirname(kept), "tinyhelper", "0.1", "WHO = 'planted'\n")
    shutil.rmtree(tmp_path / "site")
    second = warmpool.install_requirements(code, cache, dict(env))
    assert second == first  # the offline install failed; installed and kept anew from the index
    assert (tmp_path / "site" / "tinyhelper.py").read_text() == "WHO = 'genuine'\n"
    with open(kept, "rb") as f:
        assert sha256(f.read()) == pin
