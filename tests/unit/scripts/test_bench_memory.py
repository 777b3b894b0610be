"""The memory benchmark's accounting and report: a shard counts its local part, the last line is machine-readable."""

import re

import pytest
import torch

import bench_memory
import throughput

pytestmark = pytest.mark.unit


def figures(rank: int, mib: float, unit: float | None) -> dict:
    return {
        "rank": rank,
        "params_mib": mib,
        "grads_mib": mib,
        "optimizer_mib": mib,
        "largest_unit_mib": unit,
        "peak_rss_mib": 1600.0,
        "parameters": 27_800_000,
        "precision": "32-true",
        "optimizer": "SGD",
        "hardware": throughput.hardware(),
    }


def test_bytes_are_counted_per_tensor_and_dtype():
    tensors = [torch.zeros(10), torch.zeros(4, dtype=torch.bfloat16), torch.zeros(3, 3)[:1]]  # a view: its own size
    assert bench_memory.local_bytes(tensors) == 10 * 4 + 4 * 2 + 3 * 4


def test_last_line_parses_and_compares_the_largest_process_of_each_strategy(capsys):
    results = {
        "ddp": [figures(0, 100.0, None), figures(1, 100.0, None)],
        "fsdp": [figures(0, 50.0, 18.0), figures(1, 52.0, 18.0)],
    }
    bench_memory.report(results, "convnext_tiny", 3)
    lines = capsys.readouterr().out.splitlines()
    summary = re.match(r"^bench-memory: ddp=([\d.]+) fsdp=([\d.]+) fsdp/ddp=([\d.]+)$", lines[-1])
    assert summary and summary.groups() == ("300.0", "156.0", "0.52")
    assert lines[0].startswith("date: ") and "torch" in lines[2] and "convnext_tiny, 27.8 M parameters" in lines[3]
