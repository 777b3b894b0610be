"""The training precision for the machine a process runs on, when the project sets none (trainer.precision unset).

Mixed precision pays only where the hardware multiplies in the narrow type; elsewhere torch emulates it, many times
slower than 32-bit (ResNet-18 CIFAR, torch 2.14.1: app/example/trainer.yaml's comments):
  CUDA GPU, compute capability 8.0+ (A100, A10G, L4, H100, ...)    bf16-mixed   bf16 tensor cores
  CUDA GPU, compute capability 7.x or 6.0 (V100, T4, P100)        16-mixed     fp16 units, no bf16
  other CUDA GPUs (6.1 and older: P4, P40, ...)                   32-true      fp16 at a fraction of fp32's rate
  CPU with AMX or AVX512-BF16, torch at AVX512                    bf16-mixed   oneDNN's bf16 kernels
  other CPUs (AVX2 only, ARM, ...; torch held at AVX2)            32-true
  another accelerator (MPS, XLA, ...)                             Lightning's default
A precision the project sets (trainer.yaml, --trainer.precision, a hyperparameter) always wins. The decision (choose)
is a pure function of what torch reports (probe), so that it is tested as a table.

    python -m sagemaker_lightning.cli.precision            # this machine's choice, and why
    python -m sagemaker_lightning.cli.precision cpu        # with trainer.accelerator=cpu
"""

import sys
from dataclasses import dataclass

CPU_BF16 = (("AMX", "amx_tile"), ("AVX512-BF16", "avx512_bf16"))  # a CPU's bf16 units, and torch.cpu's test of each


@dataclass(frozen=True)
class Machine:
    """What torch reports about the device a process trains on."""

    device: str  # "cuda", "cpu", or another accelerator's name ("mps", ...)
    cuda_capability: tuple[int, int] | None = None  # torch.cuda.get_device_capability()
    gpu: str = ""  # torch.cuda.get_device_name()
    cpu_capability: str = ""  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", "DEFAULT", "SVE256", ...
    cpu_bf16: str = ""  # the CPU's bf16 units: "AMX", "AVX512-BF16" or "" (none)


@dataclass(frozen=True)
class Choice:
    precision: str | None  # None: Lightning's default (32-true)
    why: str  # a few words for the start-up line
    chosen: bool = True  # False: the project set it

    def line(self) -> str:
        """The start-up line."""
        if not self.chosen:
            return f"precision: {self.precision} (trainer.precision)"
        if self.precision is None:
            return f"precision: Lightning's default ({self.why})"
        return f"precision: {self.precision} for {self.why}; trainer.precision sets another"


def choose(machine: Machine | None, given=None, strategy=None) -> Choice:
    """The precision to train with: `given` (the project's trainer.precision) when set, else the machine's for
    trainer.strategy (fsdp has no fp16 gradient scaler: fsdp.py refuses 16-mixed)."""
    if given is not None:
        return Choice(str(given), "the project's setting", chosen=False)
    if machine.device == "cuda" and machine.cuda_capability is None:
        return Choice(None, "a GPU not asked: a strategy that forks needs CUDA untouched before it")
    if machine.device == "cuda":
        major, minor = machine.cuda_capability
        gpu = f"{machine.gpu or 'a GPU'} (compute capability {major}.{minor})"
        if major >= 8:
            return Choice("bf16-mixed", f"{gpu}: bf16 tensor cores")
        if (major == 7 or (major, minor) == (6, 0)) and strategy == "fsdp":
            return Choice("32-true", f"{gpu}: no bf16, and fsdp takes no 16-mixed")
        if major == 7 or (major, minor) == (6, 0):
            return Choice("16-mixed", f"{gpu}: fp16 units, no bf16")
        return Choice("32-true", f"{gpu}: no fast fp16 or bf16")
    if machine.device == "cpu":
        if machine.cpu_bf16 and machine.cpu_capability == "AVX512":
            return Choice("bf16-mixed", f"a CPU with {machine.cpu_bf16}")
        if machine.cpu_bf16:  # ATEN_CPU_CAPABILITY holds torch below AVX512
            return Choice("32-true", f"a CPU torch runs at {machine.cpu_capability}, its {machine.cpu_bf16} unused")
        return Choice("32-true", f"a CPU without bf16 units ({machine.cpu_capability or 'capability unknown'})")
    return Choice(None, f"{machine.device}: no rule")


def device_type(accelerator) -> str:
    """The device trainer.accelerator resolves to on this machine, as Lightning resolves "auto" and "gpu"."""
    import torch

    if accelerator is not None and not isinstance(accelerator, str):  # an Accelerator instance
        accelerator = type(accelerator).__name__.lower().removesuffix("accelerator")
    accelerator = (accelerator or "auto").lower()
    if accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return "cuda"
    if accelerator in ("auto", "gpu", "mps") and torch.backends.mps.is_available():
        return "mps"
    if accelerator in ("gpu", "cuda"):
        return "no GPU"  # Lightning's error follows
    return "cpu" if accelerator == "auto" else accelerator


def probe(accelerator=None, strategy=None) -> Machine:
    """What torch reports about this machine's device for trainer.accelerator. Asking a GPU initializes CUDA in this
    process, which a strategy that forks processes (ddp_fork, ddp_notebook) cannot have: then it is not asked."""
    import torch

    device = device_type(accelerator)
    if device == "cuda" and _forks(strategy) and not torch.cuda.is_initialized():
        return Machine(device)
    if device == "cuda":
        return Machine(device, torch.cuda.get_device_capability(), torch.cuda.get_device_name())
    if device != "cpu":
        return Machine(device)
    supported = {name: getattr(torch.cpu, f"_is_{attr}_supported", lambda: False)() for name, attr in CPU_BF16}
    units = next((name for name, ok in supported.items() if ok), "")
    return Machine(device, cpu_capability=torch.backends.cpu.get_cpu_capability(), cpu_bf16=units)


def _forks(strategy) -> bool:
    """Whether trainer.strategy (a name or a Strategy) starts its processes by fork."""
    name = strategy if isinstance(strategy, str) else getattr(strategy, "_start_method", "")
    return "fork" in name or "notebook" in name


def for_trainer(trainer) -> Choice:
    """trainer.precision when the project sets it, else the machine's (probe, choose)."""
    if trainer["precision"] is not None:
        return choose(None, trainer["precision"])
    return choose(probe(trainer.get("accelerator"), trainer.get("strategy")), strategy=trainer.get("strategy"))


if __name__ == "__main__":
    machine = probe(sys.argv[1] if len(sys.argv) > 1 else None)
    print(machine)
    print(choose(machine).line())
