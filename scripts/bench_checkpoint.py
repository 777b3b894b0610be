"""What a checkpoint save costs the training, and what it could cost (issue 49): for a Lightning-shaped state (a model
and Adam's moments, about 25M parameters: last.ckpt about 300 MB by default),
  snapshot  the copy of the state to host memory a background save must block for (fresh, or into reused buffers)
  local     a whole-file save: synchronous (today), Lightning's AsyncCheckpointIO, a snapshot written by a thread, by
            a process; the training thread's stall, the write's time, training steps' time while it is written
  s3        whole-file writes and reads on a moto server here (or a real bucket: --s3-url), each way against
            boto3's raw transfer of the same bytes
  sharded   fsdp's sharded save through DCP on 2 gloo ranks: dcp.save against dcp.async_save (thread, process) and
            the runtime's own (sharded_writer), their stall against the snapshot
  copies    the same state under a second name: written again, or a hard link; uploaded again, or a server-side copy
  cadence   last.ckpt every 3.7 s of a GPU's training (the host thread waits, the cores are free) through the runtime's
            CheckpointIO, locally and to S3: each save's stall, the write's time
Each figure is the fastest/median of --repeat runs, after one warm-up but for S3's transfers; the last line is
machine-readable. The checkpoint_bench/ modules measure, one concern each. A full run took 9 minutes on a shared
2-core machine, 4.5 of them in S3's section (moto serves on the same cores), the cadence section 75 s more; --only
picks sections.

    .venv/bin/python scripts/bench_checkpoint.py                       # the issue's case, all sections
    .venv/bin/python scripts/bench_checkpoint.py --quick               # a tiny state, one run: seconds
    .venv/bin/python scripts/bench_checkpoint.py --params 1e9 --only snapshot local sharded  # on a GPU
"""

import argparse
import importlib.metadata
import math
import os
import platform
import shutil
import sys
import tempfile
import time

import machine
from checkpoint_bench import report

SECTIONS = ("snapshot", "local", "s3", "sharded", "copies", "cadence")
PACKAGES = ("torch", "lightning", "s3fs", "boto3", "s3torchconnector", "moto")
QUICK_PARAMS = 2e5  # --quick: a 2.4 MB state, one run of each


def versions() -> str:
    import torch

    def version(name: str) -> str:
        if name == "torch":
            return torch.__version__  # with its build: +cpu, +cu130
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return f"python {platform.python_version()}, " + ", ".join(f"{p} {version(p)}" for p in PACKAGES)


def hardware() -> str:
    import torch

    gpu = f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}" if torch.cuda.is_available() else "no GPU"
    return f"{machine.cpu()}, {len(os.sched_getaffinity(0))} cores; {gpu}"


def options(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=25e6, help="the model's parameters (1e9 for a GPU run)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each measurement, after a warm-up")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where the state lives (default: cuda if present)")
    parser.add_argument("--folder", default=tempfile.gettempdir(), help="where local saves are written")
    parser.add_argument("--s3-url", help="s3://bucket/prefix/ to measure on AWS instead of a moto server here")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_PARAMS:.0e} parameters, one run")
    args = parser.parse_args(argv)
    if args.quick:
        args.params, args.repeat = QUICK_PARAMS, 1
    if args.params < 1 or args.repeat < 1:
        raise SystemExit("error: --params and --repeat must be at least 1")
    if not os.path.isdir(args.folder):
        raise SystemExit(f"error: --folder {args.folder} is not a folder: give an existing one")
    if args.s3_url:
        from checkpoint_bench import s3

        s3.parse(args.s3_url)
    return args


def lost_s(run: dict) -> float:
    """Training time a save cost: its stall, plus what the steps run while it was written took beyond their time
    alone just before (a background write competes for the cores, and for the GIL from a thread)."""
    return run["stall_s"] + (run["steps"] * (run["step_s"] - run["alone_s"]) if run["steps"] else 0.0)


def local_section(tree, device: str, work: str, args, snapshot_s: float) -> dict[str, float]:
    """Each way with the compute-bound training loop, then the background ways with the launch-bound one."""
    from checkpoint_bench import local, state

    compute, launch = state.Trainer(device, "compute"), state.Trainer(device, "launch")
    results, start_s = local.saves(tree, compute, work, args.repeat)
    launched, _ = local.saves(tree, launch, work, args.repeat, keys=("runtime", "lightning_async", "thread", "process"))
    rows, summary, alone = [], {}, {}
    for key, runs in results.items():
        stalls = [r["stall_s"] for r in runs]
        row = [local.LABELS[key], report.seconds(stalls), report.ratio(report.spread(stalls)[0], snapshot_s),
               report.seconds([r["write_s"] for r in runs])]  # fmt: skip
        for loop, group in (("compute", runs), ("launch", launched.get(key, runs))):
            alone.setdefault(loop, []).extend(r["alone_s"] for r in group)
            slower = report.spread([r["step_s"] / r["alone_s"] for r in group])[1]
            lost = [lost_s(r) for r in group]
            row += ["-" if math.isnan(slower) else f"{slower:.2f}x", report.seconds(lost)]
            summary[f"{key}_{loop}_lost_s"] = report.spread(lost)[1]
        rows.append(row)
        summary[f"{key}_stall_s"] = report.spread(stalls)[0]
    header = [
        "whole-file save to local disk",
        "stall s",
        "/snapshot",
        "write s",
        "compute",
        "lost s",
        "launch",
        "lost s",
    ]
    compute_ms, launch_ms = (report.spread(alone[loop])[1] * 1e3 for loop in ("compute", "launch"))
    print(f"\nlocal: steps while the file is written against steps alone just before, and the training time each "
          f"save cost (lost): compute-bound steps ({compute_ms:.1f} ms alone: a CPU's training), launch-bound ones "
          f"({launch_ms:.1f} ms of tiny ops: a GPU's host thread); the writer process took {start_s:.1f} s to start "
          f"(once, untimed)\n{report.table(header, rows)}")  # fmt: skip
    stall = report.spread([r["stall_s"] for r in results["runtime"]])[1] if "runtime" in results else math.nan
    print(report.verdict("the runtime's local save stalls (median)", stall / snapshot_s, "x the snapshot", at_most=3))
    return summary


def s3_section(tree, file: str, where, repeat: int) -> dict[str, float]:
    """Writes then reads, each against its raw transfer (the first way: median to median)."""
    from checkpoint_bench import s3

    size, summary = os.path.getsize(file), {}
    on = "moto here" if where.endpoint else where.url("")
    for kind, ways in (("writes", s3.writes(tree, file, where)), ("reads", s3.reads(file, where))):
        times = s3.timings(ways, repeat)
        raw = report.spread(next(iter(times.values())))[1]
        rows = [[name, report.seconds(runs), f"{report.rate(size, report.spread(runs)[1]):.0f}",
                 report.ratio(raw, report.spread(runs)[1])] for name, runs in times.items()]  # fmt: skip
        header = [f"S3 {kind} ({on})", "s", "MB/s", "x raw"]
        print(f"\ns3 {kind}: {size / 1e6:.0f} MB\n{report.table(header, rows)}")
        summary[f"s3_{kind}_best_x_raw"] = max(raw / report.spread(t)[1] for t in list(times.values())[1:])
        runtime = raw / report.spread(times[s3.RUNTIME])[1]
        print(report.verdict(f"the runtime's S3 {kind[:-1]}", runtime, "x raw", at_least=0.8))
    print(f"{on}: one 1 KiB ranged GET of this object takes {s3.ranged_get_s(where):.3f} s; readers by ranges pay it "
          "per part (moto reads the whole object for each ranged request, S3 does not)")  # fmt: skip
    return summary


def copies_section(tree, work: str, where, repeat: int) -> None:
    from checkpoint_bench import local, s3

    copies = {**local.second_copy(tree, work, repeat), **s3.second_copy(s3.serialised(tree), where, repeat)}
    rows = [[k, report.seconds(v)] for k, v in copies.items()]
    print(f"\ncopies: the same state under a second name\n{report.table(['way', 's'], rows)}")


def cadence_section(tree, work: str, where, snapshot_s: float, repeat: int) -> dict[str, float]:
    """The same saves locally and to S3 (moto or --s3-url) with a GPU's steps, against the steps alone."""
    from checkpoint_bench import cadence

    trainer, count, every = cadence.DeviceBound(), max(repeat, cadence.SAVES), cadence.EVERY
    alone_s = cadence.alone(trainer, every * count)
    places = {"local": os.path.join(work, "cadence", "last.ckpt"), "S3": where.url("last.ckpt")}
    rows, summary, said = [], {}, []
    for name, url in places.items():
        run = cadence.saves(tree, trainer, url, every, count)
        stall = report.spread(run["stall_s"])[1]
        rows.append([name, report.seconds(run["stall_s"]), report.ratio(stall, snapshot_s), f"{max(run['stall_s']):.3f}",
                     report.seconds(run["write_s"]), f"{(run['loop_s'] - alone_s) / count:.3f}"])  # fmt: skip
        summary[f"cadence_{name.lower()}_stall_s"] = stall
        said += [f"{name}: {line}" for line in run["said"]]
    header = ["last.ckpt at a cadence", "stall s", "/snapshot", "most s", "write s", "lost s"]
    print(f"\ncadence: last.ckpt every {every} steps of a GPU's training ({alone_s / count:.2f} s alone), {count} saves "
          f"after an untimed one: the training thread's stall per save (its wait), the write's time, and the loop's "
          f"time per save beyond its steps without saves (lost)\n{report.table(header, rows)}")  # fmt: skip
    if said:
        print("\n".join(f"said: {line}" for line in said))
    return summary


def sharded_section(params: float, device: str, work: str, repeat: int) -> dict[str, float]:
    """Each run's figure is its slowest rank's (a step waits for every rank)."""
    from checkpoint_bench import sharded

    folder = os.path.join(work, "sharded")
    os.makedirs(folder)
    ranks = sharded.saves(params, device, folder, repeat)
    rows, summary, alone = [], {}, []
    for key, label in sharded.LABELS.items():
        for name, runs in ((label, [[r[key][i] for r in ranks] for i in range(repeat)]),
                           (f"{label}: first", [[r["first " + key] for r in ranks]])):  # fmt: skip
            slowest = [{k: max(f[k] for f in run) for k in run[0]} for run in runs]
            alone += [run["alone_s"] for run in slowest]
            slower = report.spread([run["step_s"] / run["alone_s"] for run in slowest])[1]
            stalls, lost = [run["stall_s"] for run in slowest], [lost_s(run) for run in slowest]
            rows.append([name, report.seconds(stalls), report.seconds([run["total_s"] for run in slowest]),
                         "-" if math.isnan(slower) else f"{slower:.2f}x", report.seconds(lost)])  # fmt: skip
            summary.setdefault(f"{key}_stall_s", report.spread(stalls)[0])
            summary.setdefault(f"{key}_lost_s", report.spread(lost)[1])
    snapshots = [max(r["snapshot_s"][i] for r in ranks) for i in range(repeat)]
    rows.append(["snapshot: the shards into kept host buffers", report.seconds(snapshots), "", "", ""])
    summary["sharded_snapshot_s"] = report.spread(snapshots)[1]
    header = ["sharded save (slowest rank)", "stall s", "total s", "steps", "lost s"]
    print(f"\nsharded: {len(ranks)} ranks, {ranks[0]['bytes'] / 1e6:.0f} MB of tensors each; FSDP2 steps while it "
          f"is written against steps alone just before ({report.spread(alone)[1]:.3f} s), the training time each save "
          f"cost (lost); DCP's writer processes logged {sum(r['log_lines'] for r in ranks)} lines\n"
          f"{report.table(header, rows)}")  # fmt: skip
    runtime = [max(r["runtime"][i]["stall_s"] for r in ranks) for i in range(repeat)]
    stall = report.spread(runtime)[1] / summary["sharded_snapshot_s"]
    print(report.verdict("the runtime's sharded save stalls (median)", stall, "x the snapshot", at_most=3))
    return summary


def run(args) -> dict[str, float]:
    """Every section asked for, each printed as it ends; the summary's figures."""
    import torch

    from checkpoint_bench import local, s3, state

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch sees no GPU; leave --device out or give cpu")
    tree = state.checkpoint(state.model(args.params, device))
    work = tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.folder)
    try:
        file = os.path.join(work, "state.ckpt")
        local.write_file(tree, file)
        width, layers = state.layout(args.params)
        print(f"state: {state.parameters(width, layers) / 1e6:.1f} M parameters ({layers} Linear layers of {width}) "
              f"+ Adam's moments on {device}: tensors {state.nbytes(tree) / 1e6:.0f} MB, file "
              f"{os.path.getsize(file) / 1e6:.0f} MB; fastest/median of {args.repeat} runs; files in {work}")  # fmt: skip
        snaps = local.snapshot_times(tree, args.repeat)
        summary = {"snapshot_s": min(report.spread(v)[0] for k, v in snaps.items() if "reused" in k)}
        if "snapshot" in args.only:
            rows = [[k, report.seconds(v), f"{report.rate(state.nbytes(tree), report.spread(v)[0]):.0f}"]
                    for k, v in snaps.items()]  # fmt: skip
            print(f"\nsnapshot: the copy to host memory\n{report.table(['way', 's', 'MB/s'], rows)}")
        if "local" in args.only:
            summary |= local_section(tree, device, work, args, summary["snapshot_s"])
        if {"s3", "copies", "cadence"} & set(args.only):
            with s3.bucket(args.s3_url) if args.s3_url else s3.moto_server() as where:
                if "s3" in args.only:
                    summary |= s3_section(tree, file, where, args.repeat)
                if "copies" in args.only:
                    copies_section(tree, work, where, args.repeat)
                if "cadence" in args.only:
                    summary |= cadence_section(tree, work, where, summary["snapshot_s"], args.repeat)
        if "sharded" in args.only:
            del tree  # the ranks build their own
            summary |= sharded_section(args.params, device, work, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return summary


def main(argv=None) -> int:
    args = options(argv)
    print(f"date: {time.strftime('%Y-%m-%d')}; {hardware()}")
    print(f"versions: {versions()}")
    summary = run(args)
    print(report.summary({k: v for k, v in summary.items() if not math.isnan(v)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
