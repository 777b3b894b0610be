"""Memory per process under ddp and fsdp: the same model trained by 2 processes on this machine's CPU (gloo).

For each strategy a fresh job of the example (app/example/train.py) with two processes (trainer.devices=2) takes a few optimizer steps on
generated CIFAR-10-format data; each process counts the bytes it holds itself (a sharded tensor's local part):
  parameters, gradients    at the optimizer step, when both are there in full (their peak in every step)
  optimizer state          after the step (SGD momentum: one tensor per parameter; Adam: two)
  largest gathered unit    fsdp: the most parameter bytes one sharded unit gathers at once for its forward/backward
and its peak resident memory (VmHWM: the framework, activations and buffers included). DDP's gradient buckets
(another copy of the gradients, Lightning's default gradient_as_bucket_view=False) are not in its figures.
The last line is machine-readable:
  bench-memory: ddp=<MiB> fsdp=<MiB> fsdp/ddp=<ratio>   (parameters + gradients + optimizer state per process)

    python scripts/bench_memory.py                               # ConvNeXt-T, about a minute on 2 cores
    python scripts/bench_memory.py --arch convnext_base -- --optimizer Adam
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRATEGIES = ("ddp", "fsdp")
MIB = 2**20


def local_bytes(tensors) -> int:
    """Bytes of the tensors' own storage: for a sharded tensor (DTensor) its local shard only."""
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def largest_unit_bytes(module) -> int:
    """fsdp: the parameter bytes of the largest sharded unit, gathered in full for its forward and backward."""
    from torch.distributed.fsdp import FSDPModule

    largest = 0
    for unit in (m for m in module.modules() if isinstance(m, FSDPModule)):
        nested = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule) for p in m.parameters()}
        own = [p for p in unit.parameters() if id(p) not in nested]
        largest = max(largest, sum(p.numel() * p.element_size() for p in own))  # a DTensor's numel is its full size
    return largest


def measure(train_args: list[str]) -> dict:
    """One process of the job: train, count, return this process's figures."""
    import pytorch_lightning as pl
    import torch

    import throughput  # puts the example on the path
    import train
    from sagemaker_lightning.parallel import fsdp

    class Ledger(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            params = list(pl_module.parameters())
            self.params = local_bytes(params)
            self.grads = local_bytes(p.grad for p in params if p.grad is not None)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            optimizer = trainer.optimizers[0]
            states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            self.optimizer = local_bytes(s for s in states if s.dim() > 0)  # not the step counters

    cli = train.main(train_args, run=False)
    ledger = Ledger()
    cli.trainer.callbacks.append(ledger)
    cli.trainer.fit(cli.model, cli.datamodule)
    sharded = isinstance(cli.trainer.strategy, fsdp.FullyShardedStrategy)
    return {
        "rank": cli.trainer.global_rank,
        "params_mib": ledger.params / MIB,
        "grads_mib": ledger.grads / MIB,
        "optimizer_mib": ledger.optimizer / MIB,
        "largest_unit_mib": largest_unit_bytes(cli.trainer.strategy.model) / MIB if sharded else None,
        "peak_rss_mib": throughput.peak_rss_mib(),
        "parameters": sum(p.numel() for p in cli.model.parameters()),
        "precision": cli.trainer.precision,
        "optimizer": type(cli.trainer.optimizers[0]).__name__,
        "hardware": throughput.hardware(),
    }


def run(strategy: str, arch: str, steps: int, data_dir: str, work: str, train_args: list[str]) -> list[dict]:
    """A two-process job of one strategy; each process's figures, by rank."""
    args = ["--trainer.strategy", strategy, "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    args += ["--model.arch", arch, "--data.data_dir", data_dir, "--data.batch_size", "8"]
    args += ["--trainer.max_steps", str(steps), "--trainer.limit_val_batches", "0", "--trainer.precision", "32-true"]
    args += ["--checkpoint.save_top_k", "0", "--last_checkpoint_every_n_steps", "0", "--trainer.enable_progress_bar"]
    args += ["false", "--logger.save_dir", work, "--checkpoint.dirpath", os.path.join(work, strategy), *train_args]
    out = os.path.join(work, f"{strategy}-figures")
    os.makedirs(out)
    command = [sys.executable, os.path.abspath(__file__), "--measure", out, "--", *args]
    done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    figures = sorted(os.listdir(out))
    if done.returncode != 0 or len(figures) != 2:
        tail = "\n".join(done.stdout.splitlines()[-20:])
        raise SystemExit(f"error: the {strategy} job failed (exit {done.returncode}):\n{tail}")
    return [json.load(open(os.path.join(out, name))) for name in figures]


def report(results: dict[str, list[dict]], arch: str, steps: int) -> None:
    first = results["ddp"][0]
    hw = first["hardware"]
    print(f"date: {time.strftime('%Y-%m-%d')}")
    print(f"hardware: CPU {hw['cpu']}, {hw['cores']} cores, {hw['torch_threads']} torch threads per process")
    print(
        f"versions: python {hw['python']}, torch {hw['torch']}, torchvision {hw['torchvision']}, "
        f"pytorch-lightning {hw['lightning']}"
    )
    print(
        f"model: {arch}, {first['parameters'] / 1e6:.1f} M parameters, precision {first['precision']}, "
        f"{first['optimizer']}; 2 processes on the CPU (gloo), batch 8 each, {steps} steps\n"
    )
    print(
        f"{'strategy':<9}{'rank':>5}{'params MiB':>12}{'grads MiB':>11}{'optim MiB':>11}{'sum MiB':>10}"
        f"{'largest unit MiB':>18}{'peak RSS MiB':>14}"
    )
    totals = {}
    for strategy, ranks in results.items():
        for r in ranks:
            total = r["params_mib"] + r["grads_mib"] + r["optimizer_mib"]
            totals[strategy] = max(totals.get(strategy, 0), total)
            unit = "-" if r["largest_unit_mib"] is None else f"{r['largest_unit_mib']:.1f}"
            print(
                f"{strategy:<9}{r['rank']:>5}{r['params_mib']:>12.1f}{r['grads_mib']:>11.1f}{r['optimizer_mib']:>11.1f}"
                f"{total:>10.1f}{unit:>18}{r['peak_rss_mib']:>14,.0f}"
            )
    ratio = totals["fsdp"] / totals["ddp"]
    print(f"\nbench-memory: ddp={totals['ddp']:.1f} fsdp={totals['fsdp']:.1f} fsdp/ddp={ratio:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--arch", default="convnext_tiny", help="torchvision model, the same for both strategies")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per job")
    parser.add_argument("--measure", metavar="DIR", help="(internal) be one process of a job, figures into DIR")
    parser.add_argument("train_args", nargs="*", help="more app/example/train.py arguments for both jobs, after --")
    args = parser.parse_args()
    if args.measure:  # Lightning starts the second process with these same arguments
        figures = measure(args.train_args)
        with open(os.path.join(args.measure, f"rank{figures['rank']}.json"), "w") as f:
            json.dump(figures, f)
        return 0
    import make_dataset

    with tempfile.TemporaryDirectory() as work:
        make_dataset.synthetic(work, train=200, test=20, seed=0)
        results = {s: run(s, args.arch, args.steps, work, work, args.train_args) for s in STRATEGIES}
    report(results, args.arch, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
