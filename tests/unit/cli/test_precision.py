"""The precision the runtime picks when trainer.precision is unset: what torch reports → precision, as a table; what
this machine reports; and the runtime's LightningCLI using it."""

import pytest
import torch

import train
from sagemaker_lightning.cli.precision import Choice, Machine, choose, probe

pytestmark = pytest.mark.unit


def gpu(major, minor, name="GPU"):
    return Machine("cuda", (major, minor), name)


def cpu(capability, bf16=""):
    return Machine("cpu", cpu_capability=capability, cpu_bf16=bf16)


# machine (what torch reports), the project's trainer.precision → the precision trained with
TABLE = {
    "P4 (Pascal 6.1: fp16 at 1/64 of fp32)": (gpu(6, 1), None, "32-true"),
    "P100 (Pascal 6.0: fp16 units)": (gpu(6, 0), None, "16-mixed"),
    "V100 (Volta)": (gpu(7, 0), None, "16-mixed"),
    "T4 (Turing)": (gpu(7, 5), None, "16-mixed"),
    "A100 (Ampere)": (gpu(8, 0), None, "bf16-mixed"),
    "A10G (Ampere)": (gpu(8, 6), None, "bf16-mixed"),
    "L4 (Ada)": (gpu(8, 9), None, "bf16-mixed"),
    "H100 (Hopper)": (gpu(9, 0), None, "bf16-mixed"),
    "B200 (Blackwell)": (gpu(10, 0), None, "bf16-mixed"),
    "GPU not asked (a strategy that forks)": (Machine("cuda"), None, None),
    "CPU with AMX (Sapphire Rapids)": (cpu("AVX512", "AMX"), None, "bf16-mixed"),
    "CPU with AVX512-BF16 (Cooper Lake, Zen 4)": (cpu("AVX512", "AVX512-BF16"), None, "bf16-mixed"),
    "CPU with AVX512, no bf16 (Skylake, Cascade Lake)": (cpu("AVX512"), None, "32-true"),
    "CPU with AVX2 only": (cpu("AVX2"), None, "32-true"),
    "CPU with AMX, torch held at AVX2 (ATEN_CPU_CAPABILITY)": (cpu("AVX2", "AMX"), None, "32-true"),
    "CPU without AVX (DEFAULT)": (cpu("DEFAULT"), None, "32-true"),
    "ARM CPU (SVE256)": (cpu("SVE256"), None, "32-true"),
    "Apple GPU (MPS)": (Machine("mps"), None, None),
    "a GPU asked for, none found": (Machine("no GPU"), None, None),
    "user's choice on a CPU with AMX": (cpu("AVX512", "AMX"), "32-true", "32-true"),
    "user's choice on an AVX2 CPU": (cpu("AVX2"), "bf16-mixed", "bf16-mixed"),
    "user's choice on a T4": (gpu(7, 5), "32-true", "32-true"),
    "user's choice on an H100": (gpu(9, 0), "16-mixed", "16-mixed"),
    "user's choice as a number": (gpu(9, 0), 32, "32"),
}


def test_fsdp_on_a_gpu_without_bf16_trains_in_fp32():
    """fsdp.py refuses 16-mixed (no sharded fp16 gradient scaler): on a V100 or T4 fsdp gets 32-true, not an error."""
    assert choose(gpu(7, 0), strategy="fsdp").precision == "32-true"
    assert choose(gpu(8, 0), strategy="fsdp").precision == "bf16-mixed"
    assert choose(gpu(7, 5), "16-mixed", strategy="fsdp").precision == "16-mixed"  # set: the project's (refused later)


@pytest.mark.parametrize("machine, given, expected", TABLE.values(), ids=TABLE.keys())
def test_decision_table(machine, given, expected):
    choice = choose(machine, given)
    assert choice.precision == expected
    assert choice.chosen is (given is None)
    assert choice.line().startswith(f"precision: {expected or 'Lightning'}")


def test_the_line_says_why():
    assert choose(gpu(7, 5, "Tesla T4")).line() == (
        "precision: 16-mixed for Tesla T4 (compute capability 7.5): fp16 units, no bf16; trainer.precision sets another"
    )
    assert choose(cpu("AVX2")).line() == (
        "precision: 32-true for a CPU without bf16 units (AVX2); trainer.precision sets another"
    )
    assert choose(None, "bf16-mixed").line() == "precision: bf16-mixed (trainer.precision)"


def test_probe_reads_what_torch_and_the_cpu_flags_say():
    machine = probe("cpu")
    assert machine.device == "cpu" and machine.cpu_capability == torch.backends.cpu.get_cpu_capability()
    with open("/proc/cpuinfo") as f:
        flags = next(line for line in f if line.startswith("flags")).split()
    expected = "AMX" if "amx_tile" in flags else "AVX512-BF16" if "avx512_bf16" in flags else ""
    assert machine.cpu_bf16 == expected
    assert probe("auto").device == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        assert choose(probe("gpu")).line() == "precision: Lightning's default (no GPU: no rule)"


def test_the_cli_trains_with_the_machines_choice_unless_the_project_sets_one(archive_dir):
    cli = train.main(["--data.data_dir", archive_dir, "--trainer.accelerator", "cpu"], run=False)
    expected = choose(probe("cpu"))
    assert cli.precision == expected and cli.trainer.precision == expected.precision
    cli = train.main(["--data.data_dir", archive_dir, "--trainer.precision", "32-true"], run=False)
    assert cli.precision == Choice("32-true", "the project's setting", chosen=False)
    assert cli.trainer.precision == "32-true"
