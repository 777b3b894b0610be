"""Local-mode jobs started in the background (start_job), their containers, and their removal (local mode never
removes them). A job is known by a folder of its own that holds every folder the SDK mounts into its containers
(config, model, output): SDK 2.x makes them under TMPDIR, SDK 3.x under the job's output folder. So the containers
of one test's jobs are told from those of another test, or of another run on the machine.
"""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTED: list[subprocess.Popen] = []  # the running test's jobs (start_job); conftest's no_job_left ends them


def containers(folder, stopped: bool = False) -> list[str]:
    """The running containers (with `stopped`: all) whose mounts lie in `folder`."""
    ids = subprocess.run(["docker", "ps", "-q", *(["-a"] if stopped else [])], capture_output=True, text=True)
    if not ids.stdout.split():
        return []
    mounts = subprocess.run(  # a container that ended meanwhile is left out, and the others still listed
        ["docker", "inspect", "-f", "{{.Id}}{{range .Mounts}} {{.Source}}{{end}}", *ids.stdout.split()],
        capture_output=True,
        text=True,
    )
    inside = os.path.join(str(folder), "")
    return [
        c[:12]
        for c, *sources in map(str.split, mounts.stdout.splitlines())
        if any(s.startswith(inside) for s in sources)
    ]


def remove_containers(folder) -> None:
    if ids := containers(folder, stopped=True):
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


def job_code(tmp_path) -> str:
    """The example with the tests' faults beside it, as a job's own code (--source-dir)."""
    code = tmp_path / "code"
    if not code.exists():
        shutil.copytree(os.path.join(ROOT, "app", "example"), code, ignore=shutil.ignore_patterns("__pycache__"))
        for plugin in ("faults.py", "proctree.py"):
            shutil.copy(os.path.join(ROOT, "tests", "plugins", plugin), code)
    return str(code)


def start_job(image, data_dir, output, *words, sdk: str = "v2", env: dict | None = None) -> subprocess.Popen:
    """run_sagemaker.py in local mode, in the background; its containers: containers(job.folder)."""
    env = {"TMPDIR": os.path.join(output, "tmp"), **(env or {})}  # inside the job's own folder (SDK 2.x)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    cmd = [
        sys.executable if sdk == "v2" else os.path.join(ROOT, ".venv-sdk3", "bin", "python"),
        os.path.join(ROOT, "scripts", "run_sagemaker.py"),
        "--image",
        image,
        "--instance-type",
        "local",
        "--input",
        data_dir,
        "--output",
        str(output),
        *words,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
    proc.folder = str(output)
    STARTED.append(proc)
    return proc
