"""The benchmark's report: the fastest run per path counts, and the last line is the machine-readable summary."""

import argparse
import re

import pytest
import torch

import benchmark
import throughput

pytestmark = pytest.mark.unit

SUMMARY = re.compile(
    r"^bench: baseline=(?P<baseline>[\d.]+) default=(?P<default>[\d.]+) model_only=(?P<model_only>[\d.]+) "
    r"default/baseline=(?P<vs_baseline>[\d.]+) default/model_only=(?P<vs_model_only>[\d.]+)$"
)


def run(images_per_s: float, first_step_s: float = 5.0) -> dict:
    return {
        "images_per_s": images_per_s,
        "first_step_s": first_step_s,
        "peak_host_mib": 1500.0,
        "peak_device_mib": None,
        "device": "cpu",
        "batch_size": 128,
        "data": "DeviceCIFAR10DataModule",
        "precision": "bf16-mixed",
        "precision_line": "precision: bf16-mixed for a CPU with AMX; trainer.precision sets another",
        "channels_last": True,
        "compile": False,
        "hardware": throughput.hardware(),
    }


def test_last_line_parses_and_the_fastest_runs_count(capsys):
    results = {
        "baseline": [run(50.0), run(60.0)],
        "default": [run(150.0, 9.0), run(120.0, 6.0)],
        "model_only": [run(160.0), run(100.0)],
    }
    args = argparse.Namespace(train_images=50000, warmup=3, steps=12, repeat=2)
    benchmark.report(results, args, "data/bench/50000")
    lines = capsys.readouterr().out.splitlines()
    summary = SUMMARY.match(lines[-1])
    assert summary, lines[-1]
    assert {k: float(v) for k, v in summary.groupdict().items()} == {
        "baseline": 60.0,
        "default": 150.0,
        "model_only": 160.0,
        "vs_baseline": 2.5,
        "vs_model_only": 0.94,
    }
    default_row = next(line for line in lines if line.startswith("default "))
    assert " 6.0 " in default_row  # the fastest start-up of the runs
    assert any(line.startswith("versions: python ") and "torch " in line for line in lines)
    hardware = next(line for line in lines if line.startswith("hardware: "))
    assert f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}" in hardware
    assert any(line.startswith("precision: bf16-mixed for a CPU with AMX") for line in lines)


def test_measured_steps_write_no_checkpoint(archive_dir, tmp_path):
    """The timed steps are training steps alone: last.ckpt every N steps and at epoch ends would add its saves to
    the default path only (model_only trains one long epoch), and make the figures depend on the disk."""
    result = throughput.measure(
        ["--data.data_dir", archive_dir, "--trainer.accelerator", "cpu", "--trainer.precision", "32-true"]
        + ["--data.batch_size", "32", "--data.val_split", "96", "--model.arch", "mobilenet_v3_small"]
        + ["--trainer.strategy", "auto", "--logger.save_dir", str(tmp_path)],
        warmup=1,
        steps=2,  # 64 training images: an epoch ends at step 2, inside the timed steps
        started=0.0,
        model_only=False,
    )
    assert result["images"] == 2 * 32 and result["images_per_s"] > 0  # the 2 timed steps' images, not the warm-up's
    assert not list(tmp_path.rglob("*.ckpt"))
