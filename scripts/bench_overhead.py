"""The runtime's own cost per training step: a model whose compute is negligible (a 4→16→2 MLP, batch 32, one epoch,
32-true, on the CPU), trained by Lightning's own LightningCLI and by the runtime's as a one-host SageMaker job (the
SM_* variables set), on 1 process and on 2 (Lightning's process launcher, gloo), each run in fresh processes with
one intra-op thread each (`--threads`), the runs of each setup interleaved. Timed from step `--warmup` to the last
step on rank 0; what is left is the fixed work per step: Lightning's loop, the data loader, and the runtime's
callbacks and resumable loader. `--profile` adds a run of each under Lightning's SimpleProfiler and prints µs per
step of each callback's per-step hooks (the profiler's own few µs per hook included; the runtime's all under Steps,
which calls them) and of fetching a batch. With `--accelerator gpu` the model trains on the GPU, one process per
GPU. `--instructions` counts instead of timing: the instructions per step of rank 0's main thread under valgrind's
callgrind, each CLI run at two lengths and differenced so that start-up cancels out; a count does not move with the
machine's load, as its time does (±10 % between runs on a shared 2-core machine). The threads beside the steps are
left out: their work is paced by the clock (the goodput file's write every 30 s, the watchdog's beat every 2 s),
which valgrind does not slow as it slows the steps (about 50-fold), so they would be counted far too often.
`--paired` times one process of each CLI at once, each on a core of its own, and takes the median of the pairs'
ratios. The last line is machine-readable:
  bench-overhead: p1_lightning=<steps/s> p1_runtime=<steps/s> p1_ratio=<x> p2_lightning=... p2_ratio=<y>
  (--instructions: p1_lightning_instructions=<per step> p1_runtime_instructions=... p1_instructions_ratio=<x>;
  --paired: p1_paired_ratio=<x>)

    python scripts/bench_overhead.py                    # 1 and 2 processes, 5 runs each: about 6 minutes on 2 cores
    python scripts/bench_overhead.py --processes 2 --repeat 5 --profile
    python scripts/bench_overhead.py --accelerator gpu --processes 1   # on a GPU, one process per GPU (NCCL)
    python scripts/bench_overhead.py --mlflow http://127.0.0.1:5000 --profile   # and tracking's cost (an `mlflow server`)
    python scripts/bench_overhead.py --processes 1 --instructions   # needs valgrind: about 9 minutes on 2 cores
    python scripts/bench_overhead.py --processes 1 --paired --repeat 6   # pairs at once: about 2 minutes
"""

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import machine

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLIS = ("lightning", "runtime")
# --instructions: the two lengths each CLI runs, under callgrind (about 50 ms a step on 2 Xeon cores)
COUNTED_STEPS = (300, 1300)
# --paired: each run's steps, so that the two timed windows overlap for most of their length although the runtime's
# start-up takes 1-2 s longer
PAIRED_STEPS = 8150


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run(cli: str, processes: int, args: argparse.Namespace, profile=False, counted=False, core=None) -> dict:
    """One run in fresh processes, the runtime's as a one-host SageMaker job; what rank 0 measured. counted: rank 0
    under callgrind, its main thread's instructions in "instructions" (the other ranks run as they are). core: the
    one CPU its processes run on."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = {
            **os.environ,
            "MASTER_PORT": free_port(),
            "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(ROOT, "app"), os.environ.get("PYTHONPATH")])),
        }
        if cli != "lightning":
            for d in ("model", "output/data", "checkpoints", "run"):
                os.makedirs(os.path.join(tmp, d))
            env.update(
                SM_HOSTS='["localhost"]',
                SM_CURRENT_HOST="localhost",
                SM_NUM_GPUS=str(processes if args.accelerator == "gpu" else 0),
                SM_MODEL_DIR=os.path.join(tmp, "model"),
                SM_OUTPUT_DATA_DIR=os.path.join(tmp, "output/data"),
                SAGEMAKER_BASE_DIR=tmp,
                SAGEMAKER_LIGHTNING_RUN_DIR=os.path.join(tmp, "run"),
            )
        if cli == "mlflow":
            env.update(MLFLOW_TRACKING_URI=args.mlflow, TRAINING_JOB_NAME=f"bench-overhead-{processes}")
        env.update(BENCH_OVERHEAD_CLI=cli, BENCH_OVERHEAD_OUT=out, OMP_NUM_THREADS=str(args.threads))
        command = [
            sys.executable,
            os.path.join(HERE, "bench_overhead_run.py"),
            "fit",
            "--trainer.accelerator",
            args.accelerator,
            "--trainer.devices",
            str(processes),
        ]
        command += ["--trainer.strategy", "ddp" if processes > 1 else "auto", "--trainer.precision", "32-true"]
        command += ["--trainer.max_epochs", "1", "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
        command += ["--trainer.enable_model_summary", "false", "--trainer.default_root_dir", tmp]
        command += ["--model.steps", str(args.steps), "--model.warmup", str(args.warmup)]
        command += ["--trainer.log_every_n_steps", str(args.log_every_n_steps)]
        command += ["--trainer.profiler", "simple"] * profile
        counts = os.path.join(tmp, "callgrind.out")
        if counted:
            command = [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={counts}",
                *command,
            ]
        pinned = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
        done = subprocess.run(
            command, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=pinned
        )
        if done.returncode != 0 or not os.path.exists(out):
            tail = "\n".join(done.stdout.splitlines()[-20:])
            raise SystemExit(f"error: the {cli} run on {processes} processes failed (exit {done.returncode}):\n{tail}")
        with open(out) as f:
            result = json.load(f)
        if counted:
            with open(f"{counts}-01") as f:  # the main thread's
                result["instructions"] = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
        return result


def instructions(clis, processes: int, args: argparse.Namespace) -> dict[str, float]:
    """The instructions per training step of each CLI's rank 0, its main thread: its runs of COUNTED_STEPS steps
    differenced, all of them at once, one a core."""
    runs = [(cli, steps) for cli in clis for steps in COUNTED_STEPS]
    with concurrent.futures.ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        counted = {
            job: pool.submit(
                run, job[0], processes, argparse.Namespace(**{**vars(args), "steps": job[1], "warmup": 1}), counted=True
            )
            for job in runs
        }
    short, long = COUNTED_STEPS
    return {
        cli: (counted[cli, long].result()["instructions"] - counted[cli, short].result()["instructions"])
        / (long - short)
        for cli in clis
    }


def paired(args: argparse.Namespace) -> list[tuple[float, float]]:
    """(Lightning's, the runtime's) steps/s of each round, in which the two train at once, one process each, each on a
    core of its own: which core and which starts first swap each round. Whatever the machine does meanwhile slows both
    (its speed drifts by ±10 % between runs here), so their ratio holds where separate runs' medians do not."""
    cores, rounds = sorted(os.sched_getaffinity(0))[:2], []
    long = argparse.Namespace(**{**vars(args), "steps": PAIRED_STEPS})
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for i in range(args.repeat):
            order = CLIS[::-1] if i % 2 else CLIS
            runs = {cli: pool.submit(run, cli, 1, long, core=cores[(j + i) % 2]) for j, cli in enumerate(order)}
            rounds.append(tuple(runs[cli].result()["steps_per_s"] for cli in CLIS))
    return rounds


def versions(accelerator: str) -> str:
    import lightning
    import torch

    cores = len(os.sched_getaffinity(0))
    gpu = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}) in " if accelerator == "gpu" else ""
    return f"{gpu}{machine.cpu()}, {cores} cores; Python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts to measure")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each setup; their median counts")
    parser.add_argument("--steps", type=int, default=2150, help="training steps per process")
    parser.add_argument("--warmup", type=int, default=100, help="steps before the timing starts")
    parser.add_argument("--profile", action="store_true", help="also each callback's µs per step (runtime)")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads per process: the model needs none; idle ones spin"
    )
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu", help="gpu: a process per GPU, NCCL")
    parser.add_argument(
        "--mlflow", metavar="URI", help="also the runtime tracking its run there (an `mlflow server`): setup `mlflow`"
    )
    parser.add_argument(
        "--log-every-n-steps", type=int, default=50, help="trainer.log_every_n_steps (Lightning's default)"
    )
    parser.add_argument(
        "--instructions", action="store_true", help="count rank 0's instructions per step (valgrind) instead of timing"
    )
    parser.add_argument(
        "--paired", action="store_true", help="one process: the two CLIs at once, a core each, the ratio of each pair"
    )
    args = parser.parse_args()
    if args.paired and (args.processes != [1] or len(os.sched_getaffinity(0)) < 2 or args.mlflow or args.instructions):
        parser.error("--paired runs one process of each CLI at once on two cores: with --processes 1, alone")
    clis = (*CLIS, "mlflow") if args.mlflow else CLIS
    if args.instructions and not shutil.which("valgrind"):
        parser.error("--instructions counts with valgrind, which is not installed here: apt-get install valgrind")
    counter = (
        subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout.strip()
        if args.instructions
        else ""
    )
    print(
        f"date: {time.strftime('%Y-%m-%d')}; {versions(args.accelerator)}; {args.threads} intra-op thread(s) a process"
        + (f"; {counter}" if counter else "")
    )
    summary, prefix = [], "gpu_" if args.accelerator == "gpu" else ""
    for processes in args.processes:
        if args.paired:
            rounds = paired(args)
            ratios = [runtime / lightning for lightning, runtime in rounds]
            for (lightning, runtime), ratio in zip(rounds, ratios, strict=True):
                print(f"1 process, at once: lightning {lightning:6.1f}, runtime {runtime:6.1f} steps/s: {ratio:.3f}")
            print(f"1 process, runtime/lightning: median {statistics.median(ratios):.3f} of {len(ratios)} pairs")
            summary.append(f"{prefix}p1_paired_ratio={statistics.median(ratios):.3f}")
            continue
        if args.instructions:
            counts = instructions(clis, processes, args)
            for cli in clis:
                print(f"{processes} process(es), {cli:9s}: {counts[cli]:,.0f} instructions per step (callgrind)")
            ratio = counts["runtime"] / counts["lightning"]
            print(f"{processes} process(es), runtime/lightning: {ratio:.3f} instructions per step")
            summary += [f"{prefix}p{processes}_{cli}_instructions={counts[cli]:.0f}" for cli in CLIS]
            summary.append(f"{prefix}p{processes}_instructions_ratio={ratio:.3f}")
            continue
        runs: dict[str, list[dict]] = {cli: [] for cli in clis}
        for _ in range(args.repeat):
            for cli in clis:
                runs[cli].append(run(cli, processes, args))
        median = {cli: statistics.median(r["steps_per_s"] for r in runs[cli]) for cli in clis}
        cpu = {cli: statistics.median(r["cpu_us_per_step"] for r in runs[cli]) for cli in clis}
        ratio = median["runtime"] / median["lightning"]
        for cli in clis:
            listed = ", ".join(f"{r['steps_per_s']:.0f}" for r in runs[cli])
            print(
                f"{processes} process(es), {cli:9s}: median {median[cli]:6.1f} steps/s (runs: {listed}); "
                f"rank 0's CPU time {cpu[cli]:.0f} µs/step"
            )
        print(
            f"{processes} process(es), runtime/lightning: {ratio:.3f} steps/s, {cpu['runtime'] / cpu['lightning']:.3f} CPU time"
        )
        if args.mlflow:
            tracked = median["mlflow"] / median["runtime"]
            print(
                f"{processes} process(es), mlflow/runtime: {tracked:.3f} steps/s, "
                f"{cpu['mlflow'] / cpu['runtime']:.3f} CPU time (log_every_n_steps {args.log_every_n_steps})"
            )
            summary.append(f"{prefix}p{processes}_mlflow_ratio={tracked:.3f}")
        if args.profile:
            hooks = {cli: run(cli, processes, args, profile=True)["hooks"] for cli in clis}
            for name in sorted(set().union(*hooks.values())):
                costs = "  ".join(
                    f"{cli} {hooks[cli][name]:7.1f}" if name in hooks[cli] else f"{cli}       -" for cli in clis
                )
                print(f"{processes} process(es), profiled µs/step: {costs}  {name}")
        summary += [f"{prefix}p{processes}_{cli}={median[cli]:.1f}" for cli in CLIS] + [
            f"{prefix}p{processes}_ratio={ratio:.3f}"
        ]
    print("bench-overhead: " + " ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
