"""Seconds to the end of the first compiled training step (forward, backward, optimizer step) with torch.compile's
caches empty, as on a new instance, then with torch's portable cache artifacts loaded first (what a restarted job
loads from its checkpoint directory: app/sagemaker_lightning/checkpoints/compile_cache.py), and with Inductor's own
cache folder kept (a restart on the same instance, or the warm pool's cache: warmpool.py). Each run is a fresh
process with a fresh TORCHINDUCTOR_CACHE_DIR; prints the hardware and versions, then one line per case.

    python scripts/bench_compile_cache.py                        # the example's ResNet-18, batch 32, on the CPU
    python scripts/bench_compile_cache.py --model mlp --repeat 3 # the user project's network: a tiny graph
    python scripts/bench_compile_cache.py --device cuda          # on a GPU
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import machine

# One run in a fresh process: argv = model, device, artifacts file to load ("-" for none), file to save to ("-")
RUN = """
import sys, time
started = time.monotonic()
import torch
model_name, device, load, save = sys.argv[1:5]
if load != "-":
    with open(load, "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
if model_name == "mlp":
    net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x, y = torch.randn(32, 2), torch.randint(0, 3, (32,))
else:
    sys.path.insert(0, "app/example")
    from model import build_network
    net = build_network("resnet18", 10, True)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
net, x, y = net.to(device), x.to(device), y.to(device)
net.compile()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
begun = time.monotonic()
torch.nn.functional.cross_entropy(net(x), y).backward()
optimizer.step()
if device == "cuda":
    torch.cuda.synchronize()
first_step = time.monotonic() - begun
if save != "-":
    with open(save, "wb") as f:
        f.write(torch.compiler.save_cache_artifacts()[0])
print(f"{first_step:.2f} {time.monotonic() - started:.2f}")
"""


def run(model: str, device: str, inductor: str, load: str = "-", save: str = "-") -> tuple[float, float]:
    """(first step's seconds, seconds from process start) of one run with Inductor's cache in `inductor`."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor, "TRITON_CACHE_DIR": os.path.join(inductor, "triton")}
    done = subprocess.run(
        [sys.executable, "-c", RUN, model, device, load, save], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"error: a run failed:\n{done.stderr[-3000:]}")
    first, total = done.stdout.split()[-2:]
    return float(first), float(total)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["resnet18", "mlp"], default="resnet18")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the three cases; medians are reported")
    args = parser.parse_args()
    import torch

    cases: dict[str, list[tuple[float, float]]] = {
        "empty caches": [],
        "artifacts loaded": [],
        "Inductor's folder kept": [],
    }
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as root:
            artifacts = os.path.join(root, "compile_cache.bin")
            kept = os.path.join(root, "inductor-1")
            cases["empty caches"].append(run(args.model, args.device, kept, save=artifacts))
            cases["artifacts loaded"].append(
                run(args.model, args.device, os.path.join(root, "inductor-2"), load=artifacts)
            )
            cases["Inductor's folder kept"].append(run(args.model, args.device, kept))
            size = os.path.getsize(artifacts)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "no GPU used"
    print(
        f"{os.cpu_count()} CPUs {machine.cpu()}, {gpu}; Python {platform.python_version()}, "
        f"torch {torch.__version__}; {args.model}, batch 32, {args.repeat} rounds; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"artifacts: {size / 2**20:.1f} MiB")
    for case, runs in cases.items():
        first = statistics.median(r[0] for r in runs)
        total = statistics.median(r[1] for r in runs)
        shown = ", ".join(f"{r[0]:.1f}" for r in runs)
        print(f"  {case:<24} first step {first:6.1f} s (runs: {shown}); process start to its end {total:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
