"""The containers of one local-mode job, and their removal (local mode never removes them). A job is known by a
folder of its own that holds every folder the SDK mounts into its containers (config, model, output): SDK 2.x makes
them under TMPDIR, SDK 3.x under the job's output folder. So the containers of one test's jobs are told from those
of another test, or of another run on the machine.
"""

import os
import subprocess


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
