"""Fixtures shared by every tier: generated CIFAR-10-format data, the user project, local servers (moto: a local AWS
API server whose clients find it through AWS_ENDPOINT_URL; every test starts from an empty server).

The tiers' rules: every test carries the marker of its tier, the folder it is in (`-m toolkit` selects one), and with
REQUIRE_ALL_TIERS=1 (CI) a test that skips fails instead, wherever the skip comes from."""

import gc
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from wheels import write_wheel

import make_dataset

pytest_plugins = ("budget",)  # each tier's limit a test, the run's time against its budget (tests/plugins/budget.py)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_PROJECT = os.path.join(ROOT, "examples", "user_project")  # the sample a user starts from
TIERS = ("unit", "toolkit", "cloud", "container")  # the folders under tests/, and their markers (pyproject.toml)
# the unit tests whose ranks fork from the preloaded server (tests/plugins/preloaded.py): one worker runs them all and
# starts that server once (3.7 s of CPU), not each worker
FORKED = ("tests/unit/checkpoints/test_two_ranks.py", "tests/unit/stop/test_per_step.py")
FORKED += ("tests/unit/health/test_preflight.py", "tests/unit/health/test_watchdog_store.py")


def pytest_collection_modifyitems(config, items):
    """A test whose tier markers are not exactly its folder's stops the run before anything runs."""
    wrong = []
    for item in items:
        tier = os.path.relpath(str(item.path), os.path.join(ROOT, "tests")).split(os.sep)[0]
        if [t for t in TIERS if item.get_closest_marker(t)] != [tier]:
            wrong.append(item.nodeid)
    if wrong:
        raise pytest.UsageError(f"{len(wrong)} tests lack their folder's tier marker (pytestmark), e.g. {wrong[0]}")


def pytest_collection(session):
    """Collection only imports and builds (nothing it makes is garbage): the collector paused for it."""
    gc.disable()


def pytest_collection_finish(session):
    """What collection imported (torch, Lightning, the SDK: some million objects) is frozen out of the collector: a
    full collection, the gc.collect() of a test or Python's own, scans only what the tests made since."""
    gc.freeze()
    gc.enable()


def pytest_xdist_make_scheduler(config, log):
    """`make test` (-n 2 --dist loadscope): the tiers that run jobs are one scope, run by one worker one test after
    another as in a plain run (each job uses both cores; their servers, images and ports assume it), and each unit test
    is a scope of its own, run by the other worker beside them: the unit tier's 2 minutes on CI's cores were the run's
    own before. (xdist's loadgroup would do it by a marker, but xdist 3.8 names a group in `item._nodeid`, which
    pytest 9 no longer reads: every test ran anywhere.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class JobsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:  # xdist's own point of change (its loadfile overrides it too)
            if nodeid.startswith(FORKED):
                return "forked"
            return nodeid if nodeid.startswith("tests/unit/") else "jobs"

    return JobsApart(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With REQUIRE_ALL_TIERS=1 a skipped test is a failed one: CI runs every test or says which it could not."""
    report = (yield).get_result()
    if report.skipped and not hasattr(report, "wasxfail") and os.environ.get("REQUIRE_ALL_TIERS") == "1":
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome, report.longrepr = "failed", f"skipped, but REQUIRE_ALL_TIERS=1: {reason}"


@pytest.fixture(autouse=True)
def environment_kept():
    """Every test leaves os.environ as it found it: an in-process DDP run sets MASTER_ADDR, NODE_RANK and LOCAL_RANK,
    and a later test's subprocess would inherit them (Lightning then takes it for a local rank of another job)."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def as_script(monkeypatch):
    """Calls a function as a script's process ends it: what escapes goes to sys.excepthook, which the runtime's
    LightningCLI sets (one line, an exit code: SystemExit). Returns the call's result; the hook is restored after."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)

    def run(call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except Exception as e:
            sys.excepthook(type(e), e, e.__traceback__)  # the runtime's raises SystemExit
            raise

    return run


@pytest.fixture(scope="session")
def archive_dir(tmp_path_factory) -> str:
    """A directory holding cifar-10-python.tar.gz with 160 training and 40 test images."""
    out = str(tmp_path_factory.mktemp("cifar-archive"))
    make_dataset.synthetic(out, train=160, test=40, seed=0)
    return out


def _ports():
    """TCP ports below the kernel's ephemeral range, each free when handed out and never handed out twice: the
    kernel gives no port of this range to a bind to port 0 or to an outgoing connection (gloo's, a client's), so
    none is taken between the check here and the bind of the job or server it is for. Each xdist worker walks its
    own share of the range (two workers' pids are near, and so were their walks: a port handed out by both), and the
    start within it differs per process, so that two test runs on one machine do not walk the same ports."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral = int(f.read().split()[0])
    low = 10000 if ephemeral > 11000 else 1024
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = (ephemeral - low) // workers
    low += share * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    high, start = low + share, low + os.getpid() % share
    for port in [*range(start, high), *range(low, start)]:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue  # in use
        yield port


@pytest.fixture(scope="session")
def free_port():
    """A function that returns a TCP port free on this machine."""
    return _ports().__next__


def _wait_until_up(server: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Return once `url` answers with any HTTP status (401 too: up, asking for credentials); fail when the
    server exits or does not answer within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, f"{' '.join(server.args)} did not start"
            time.sleep(0.1)


@pytest.fixture(scope="session")
def wait_until_up():
    """A function that waits for a local server process to answer HTTP at a URL (moto, docker-registry)."""
    return _wait_until_up


@pytest.fixture
def no_aws(monkeypatch, tmp_path) -> None:
    """No AWS configuration at all, in this process and its children: no keys, profile, config files or instance role."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # on an EC2 machine its role's credentials would be found


@pytest.fixture(scope="session")
def make():
    """Runs `make TARGET... VAR=value...` in the repository as a user would: not as a sub-make of `make test`, which
    would print make[1] lines around the output the tests read."""

    def run(*words: str, **kwargs) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
        return subprocess.run(["make", *words], cwd=ROOT, env=env, **kwargs)

    return run


@pytest.fixture(scope="session")
def user_project(tmp_path_factory) -> str:
    """examples/user_project as a user ships it: its source directory, with a requirements.txt that installs the
    project's own dependency from a wheel beside it (no index needed), as a project may have one."""
    out = str(tmp_path_factory.mktemp("user-project") / "my_project")
    shutil.copytree(USER_PROJECT, out, ignore=shutil.ignore_patterns("__pycache__"))
    write_wheel(os.path.join(out, "wheels"), "tinyhelper", "0.1", "def scaled(lr):\n    return lr\n")
    with open(os.path.join(out, "requirements.txt"), "w") as f:
        f.write("--no-index\n--find-links wheels\ntinyhelper==0.1\n")
    return out


@pytest.fixture(scope="session")
def points_dir(tmp_path_factory) -> str:
    """The user project's data: points.pt in a directory (its training channel), written by the project's own code
    (loaded by path: its module names would shadow the example's)."""
    spec = importlib.util.spec_from_file_location("user_points", os.path.join(USER_PROJECT, "points.py"))
    points = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(points)
    return points.write_points(str(tmp_path_factory.mktemp("points")))


@pytest.fixture(scope="session")
def moto_endpoint(free_port, wait_until_up):
    """moto in server mode on a free port: S3, ECR, SageMaker; boto3, s3fs and both SDKs reach it."""
    url = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", url.rsplit(":", 1)[1]],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until_up(server, f"{url}/moto-api/", timeout_s=60)
    yield url
    server.terminate()
    server.wait()


class MlflowServer:
    """A real `mlflow server` (this venv's) on 127.0.0.1: a sqlite backend store and a local artifact store in
    `root`, without its job runner (MLflow's evaluation jobs; a start takes 9 s without, 40 s with it on 2 busy
    cores). stop() ends its processes (a process group: uvicorn is a child) as a crash would, by SIGKILL; start()
    serves the same stores again, on the same port."""

    def __init__(self, root: str, port: int):
        self.root, self.url = root, f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host", "127.0.0.1"]
        command += ["--port", self.url.rsplit(":", 1)[1], "--workers", "1"]
        command += ["--backend-store-uri", f"sqlite:///{self.root}/mlflow.db"]
        command += ["--artifacts-destination", os.path.join(self.root, "artifacts")]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(os.path.join(self.root, "server.log"), "a") as log:
            self.process = subprocess.Popen(
                command, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        _wait_until_up(self.process, f"{self.url}/health", timeout_s=120)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, free_port):
    """One `mlflow server` for the session (MlflowServer); a test that stops it starts it again."""
    server = MlflowServer(str(tmp_path_factory.mktemp("mlflow")), free_port())
    server.start()
    yield server
    if server.process.poll() is None:
        server.stop()


@pytest.fixture
def aws(moto_endpoint, monkeypatch) -> dict[str, str]:
    """The environment (also set in this process) that points AWS clients at a fresh moto server."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"))
    env = {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # moto 5.2.5 gives a multipart object's composite CRC32 without S3's "-N" suffix (getmoto/moto#8762): clients
        # validate it as the whole object's and reject every read; S3's suffix makes them skip it
        "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return env
