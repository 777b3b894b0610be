"""Sources are named: Martin Krasser's articles by title, author and link, never by a nickname the reader cannot look up."""

import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PART1 = "https://krasserm.github.io/2022/01/21/sagemaker-multi-node/"
PART2 = "https://krasserm.github.io/2022/02/26/sagemaker-fault-tolerance/"


def test_the_krasserm_articles_are_named_by_title_author_and_link():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    nicknamed = []
    for name in tracked:
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError):  # binary files; files deleted in the work tree
            continue
        if re.search("seed[ _-]tutorial", text, re.IGNORECASE):
            nicknamed.append(name)
    assert nicknamed == [], "name Krasser's article by title and link (README, top), not by a nickname"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())  # across line breaks
    assert "Martin Krasser" in readme
    assert f"part 1: Distributed model training with PyTorch Lightning”]({PART1})" in readme
    assert f"part 2: Fault-tolerant model training on spot instances”]({PART2})" in readme


def test_no_run_output_is_tracked_or_trackable():
    """A training run started inside the repository (the user project's own folder, say) writes lightning_logs/ and
    checkpoints there: none is committed, and .gitignore keeps them out (they would ship with a job's source_dir)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outputs = [n for n in tracked if "lightning_logs/" in n or n.endswith(".ckpt") or ".tfevents." in n]
    assert outputs == []
    written = [
        "examples/user_project/lightning_logs/version_0/events.out.tfevents.1.vm",
        "examples/user_project/last.ckpt",
    ]
    ignored = subprocess.run(["git", "check-ignore", *written], cwd=ROOT, capture_output=True, text=True).stdout
    assert ignored.split() == written
