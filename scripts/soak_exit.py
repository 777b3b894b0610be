"""Run the same finished job again and again and count how its processes exit: a job that trained and exported must
exit 0 on every host, every time. Made for the two-host fsdp job on CPUs (gloo), which once in three CI runs aborted
at exit after its export (`terminate called without an active exception`, exit -6) before the runtime destroyed its
process groups itself (stop/process.leave_process_group). Not a test: it takes minutes (about 13 s a run on 2 cores).

    .venv/bin/python scripts/soak_exit.py --runs 20           # two hosts, trainer.strategy=fsdp (the toolkit tier's)
    .venv/bin/python scripts/soak_exit.py --runs 5 --strategy ddp
"""

import argparse
import collections
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the toolkit tier's modules, the plugins its conftest imports (proctree), the example
sys.path[:0] = [os.path.join(ROOT, "tests", d) for d in ("toolkit", "plugins")] + [os.path.join(ROOT, "app", "example")]

from test_sharded_toolkit import FSDP, HOSTS  # noqa: E402  (its two-host fsdp job)

import make_dataset  # noqa: E402
from conftest import ENTRYPOINT, EXAMPLE, make_opt_ml  # noqa: E402  (the toolkit tier's /opt/ml and entrypoint)


def run_once(work: str, data: str, strategy: str) -> list[int]:
    """One job on HOSTS at once, as the toolkit tier runs it; each host's exit code."""
    with socket.socket() as s:  # MASTER_PORT: a port free now, for this run only
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    with contextlib.ExitStack() as logs:
        for i, host in enumerate(HOSTS):
            base = os.path.join(work, f"host{i}")
            make_opt_ml(base, HOSTS, host, {**FSDP, "trainer.strategy": strategy}, {"training": data})
            env = {**os.environ, "SAGEMAKER_BASE_DIR": base, "SAGEMAKER_LIGHTNING_EXAMPLE": EXAMPLE}
            env |= {"MASTER_PORT": port, "SAGEMAKER_LIGHTNING_RUN_DIR": os.path.join(base, "run")}
            log = logs.enter_context(open(os.path.join(base, "log"), "w"))
            procs.append(subprocess.Popen(ENTRYPOINT, env=env, stdout=log, stderr=subprocess.STDOUT))
        return [p.wait(timeout=600) for p in procs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--strategy", default="fsdp", choices=["fsdp", "ddp"])
    args = parser.parse_args()
    import torch  # noqa: PLC0415  (the version line only)

    print(f"{machine.cpu()}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}")
    counts, start = collections.Counter(), time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        make_dataset.synthetic(data, train=160, test=40, seed=0)
        for run in range(args.runs):
            work = os.path.join(tmp, f"run{run}")
            codes = run_once(work, data, args.strategy)
            counts[tuple(codes)] += 1
            kept = os.path.join(ROOT, "runs", f"soak-{run}")
            if codes != [0, 0]:  # each host's /opt/ml and log, kept for a look
                shutil.copytree(work, kept, ignore=shutil.ignore_patterns("*.ckpt", "data"))
            print(f"run {run + 1}/{args.runs}: exit codes {codes}" + ("" if codes == [0, 0] else f" (kept: {kept})"))
            shutil.rmtree(work)
    clean = counts[(0, 0)]
    print(
        f"{clean} of {args.runs} two-host {args.strategy} jobs exited 0 on both hosts ({time.monotonic() - start:.0f} s)"
    )
    return 0 if clean == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
