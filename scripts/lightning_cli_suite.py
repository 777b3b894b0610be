"""Lightning's own CLI tests, run with Lightning's LightningCLI and with the runtime's: the tests only the runtime fails.

    python scripts/lightning_cli_suite.py [--lightning-repo PATH] [-k EXPR]     # make lightning-cli-suite

The README promises a drop-in. This checks it against tests nobody here wrote: Lightning's
tests/tests_pytorch/test_cli.py at the tag of the installed version (git clone, or a clone given with
--lightning-repo), run twice off SageMaker: as it is, then with `from sagemaker_lightning import LightningCLI` after
its imports, so every test and every subclass in it uses the runtime's class. The file stays in Lightning's tree (its
tests name classes by their module path, tests_pytorch.test_cli); nothing of it is copied into this project.
Prints both summaries and the tests that fail only with the runtime's class; exit code 1 when there are any.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata

REPOSITORY = "https://github.com/Lightning-AI/pytorch-lightning"
TEST_FILE = "tests/tests_pytorch/test_cli.py"
ANCHOR = "from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel\n"  # the last import used
SWAP = "from sagemaker_lightning import LightningCLI  # noqa: F811  (the runtime's, for every test)\n"
RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)", re.M)


def tests_tree(repo: str, into: str) -> tuple[str, str]:
    """Lightning's tests/ at the newest tag not newer than the installed version, as a directory under `into`."""
    installed = tuple(int(p) for p in metadata.version("lightning").split(".")[:3])
    tags = subprocess.run(["git", "-C", repo, "tag"], check=True, capture_output=True, text=True).stdout.split()
    released = sorted((tuple(int(p) for p in t.split(".")), t) for t in tags if re.fullmatch(r"\d+\.\d+\.\d+", t))
    tag = [t for v, t in released if v <= installed][-1]  # 2.6.6 was released without a tag of its own
    archive = subprocess.run(["git", "-C", repo, "archive", tag, "tests"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return os.path.join(into, "tests"), tag


def run(tests: str, pytest_args: list[str]) -> dict[str, str]:
    """Each test's outcome, off SageMaker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
    env["PYTHONPATH"] = tests
    command = [sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", "-W", "ignore", TEST_FILE[6:]]
    done = subprocess.run(command + pytest_args, cwd=tests, env=env, capture_output=True, text=True)
    outcomes = {name: outcome for outcome, name in RESULT.findall(done.stdout)}
    print(done.stdout.strip().splitlines()[-1])
    return outcomes


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--lightning-repo", help="a clone of Lightning's repository (default: a fresh one)")
    options.add_argument("-k", help="only the tests this pytest expression selects")
    given = options.parse_args()
    pytest_args = ["-k", given.k] if given.k else []
    with tempfile.TemporaryDirectory() as into:
        repo = given.lightning_repo or os.path.join(into, "repo")
        if not given.lightning_repo:
            subprocess.run(["git", "clone", "-q", "--filter=blob:none", "--no-checkout", REPOSITORY, repo], check=True)
        tests, tag = tests_tree(repo, into)
        print(f"lightning {metadata.version('lightning')}; {TEST_FILE} at tag {tag}")
        print("Lightning's LightningCLI: ", end="", flush=True)
        theirs = run(tests, pytest_args)
        path = os.path.join(tests, TEST_FILE[6:])
        with open(path) as f:
            text = f.read()
        if ANCHOR not in text:
            sys.exit(f"error: {TEST_FILE} no longer has the line the swap follows: {ANCHOR.strip()}")
        with open(path, "w") as f:
            f.write(text.replace(ANCHOR, ANCHOR + SWAP, 1))
        print("the runtime's LightningCLI: ", end="", flush=True)
        ours = run(tests, pytest_args)
    only_ours = sorted(n for n, o in ours.items() if o in ("FAILED", "ERROR") and theirs.get(n) == "PASSED")
    for name in only_ours:
        print(f"fails only with the runtime's class: {name}")
    print(f"{len(only_ours)} tests fail only with the runtime's class")
    return 1 if only_ours else 0


if __name__ == "__main__":
    sys.exit(main())
