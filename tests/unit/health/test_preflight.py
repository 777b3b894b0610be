"""Pre-flight's pure parts: the instance table and its figures, busbw, the device and EFA findings from a fake sysfs
and environment, the slow-host rule and the verdict every rank reaches from the gathered findings; then pre-flight
itself on two real gloo processes: one verdict on every rank, the hosts it names, and preflight=off.

    .venv/bin/pytest tests/unit/health/test_preflight.py
"""

import datetime
import json
import os
import re
from types import SimpleNamespace

import pytest
import spawned
import torch
import torch.distributed as dist

from sagemaker_lightning.failure import UserError
from sagemaker_lightning.health import preflight, preflight_verdict
from sagemaker_lightning.health.efa import findings as efa_findings
from sagemaker_lightning.health.preflight import Preflight, compute_problem
from sagemaker_lightning.health.preflight_verdict import (
    Findings,
    Measured,
    busbw,
    device_problems,
    floor,
    slow_hosts,
    summary,
    verdict,
)
from sagemaker_lightning.launch import instances
from sagemaker_lightning.launch.network import network_env
from sagemaker_lightning.launch.plan import make_plan

pytestmark = pytest.mark.unit

MiB = 1 << 20


@pytest.mark.parametrize("name", ["ml.p5.48xlarge", "p5.48xlarge"])
def test_lookup_takes_the_type_with_or_without_ml(name):
    p5 = instances.lookup(name)
    assert (p5.name, p5.gpus, p5.efa, p5.rdma) == ("ml.p5.48xlarge", 8, 32, True)


@pytest.mark.parametrize("name", ["local", "local_gpu", "ml.c5.xlarge", "m5.large", "", None, "ml.p99.huge"])
def test_local_mode_cpu_and_unknown_types_have_no_row(name):
    assert instances.lookup(name) is None


def test_gpu_counts_of_g5_sizes():
    assert [instances.lookup(f"g5.{s}").gpus for s in ("xlarge", "12xlarge", "48xlarge")] == [1, 4, 8]
    assert instances.lookup("g5.48xlarge").efa == 1 and instances.lookup("g5.12xlarge").efa == 0


def test_the_table_has_efa_exactly_where_the_plan_sets_libfabric_to_it():
    """network.network_env sets FI_PROVIDER=efa by its own lists: pre-flight checks EFA on the same types."""
    for name, instance in instances.TABLE.items():
        efa = network_env({"SM_CURRENT_INSTANCE_TYPE": name}, [], workers=False).get("FI_PROVIDER") == "efa"
        assert efa == (instance.efa > 0), name
        assert instance.rdma == ("FI_EFA_USE_DEVICE_RDMA" in network_env({"SM_CURRENT_INSTANCE_TYPE": name}, [], False))


def test_published_figures_for_two_hosts_only():
    p4de = instances.expected_busbw("ml.p4de.24xlarge", 2)
    assert (p4de.gbs, p4de.at_bytes) == (76.79, 1 << 30) and "awsome-distributed-training" in p4de.source
    assert instances.expected_busbw("p5.48xlarge", 2).gbs == 436.95
    assert instances.expected_busbw("ml.p5.48xlarge", 4) is None  # none published: no warning
    assert instances.expected_busbw("ml.p4d.24xlarge", 2) is None
    assert instances.expected_busbw("local", 2) is None
    assert all(f.source.startswith("https://") for i in instances.TABLE.values() for f in i.busbw.values())


def test_busbw_is_nccl_tests_definition():
    # nccl-tests' 2× p5 row: 2147483648 B in 9074.5 µs among 16 ranks → algbw 236.65, busbw 443.72
    assert busbw(2147483648, 9074.5e-6, 16) == pytest.approx(443.72, abs=0.01)
    assert busbw(16 * MiB, 0.1, 2) == pytest.approx(16 * MiB / 0.1 / 1e9)  # two ranks: busbw = algbw


def test_floor_is_the_users_else_a_fraction_of_the_published_figure():
    assert floor(5.0, "ml.p5.48xlarge", 2) == (5.0, "preflight_min_busbw")
    gbs, source = floor(None, "ml.p5.48xlarge", 2)
    assert gbs == pytest.approx(0.8 * 436.95) and "436.95 GB/s at 1 GiB published for 2× ml.p5.48xlarge" in source
    assert floor(None, "local", 2) is None


def test_device_counts_against_sm_num_gpus_and_the_type():
    p4d = instances.lookup("ml.p4d.24xlarge")
    assert device_problems(8, 8, p4d) == []
    assert device_problems(7, 8, p4d) == [
        "torch sees 7 GPU(s) but SM_NUM_GPUS=8",
        "torch sees 7 GPU(s) but ml.p4d.24xlarge has 8",
    ]
    assert device_problems(0, 0, p4d) == ["torch sees 0 GPU(s) but ml.p4d.24xlarge has 8"]  # the driver found none
    assert device_problems(0, 0, None) == []  # a CPU instance, local mode


def test_the_cpu_passes_its_own_computation_check():
    assert compute_problem(torch.device("cpu")) is None


def sysfs(tmp_path, *devices, plugin_dir=None):
    """A fake root: /sys/class/infiniband/<dev>/device/driver → .../efa, and a plugin library in plugin_dir."""
    for name in devices:
        driver = tmp_path / "sys/bus/pci/drivers/efa"
        driver.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"sys/class/infiniband/{name}/device").mkdir(parents=True)
        os.symlink(driver, tmp_path / f"sys/class/infiniband/{name}/device/driver")
    if plugin_dir:
        (tmp_path / plugin_dir.lstrip("/")).mkdir(parents=True)
        (tmp_path / plugin_dir.lstrip("/") / "libnccl-net-ofi.so").touch()
    return str(tmp_path)


P4D = instances.lookup("ml.p4d.24xlarge")
OFI = "/opt/amazon/ofi-nccl/lib"


def test_efa_present_and_used(tmp_path):
    root = sysfs(tmp_path, "rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27", plugin_dir=OFI)
    env = {"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": f"/usr/local/cuda/lib64:{OFI}"}
    assert efa_findings(P4D, env, root) == ("4 of 4 devices, libnccl-net-ofi.so", [])


def test_efa_plugin_found_through_ld_so_conf(tmp_path):
    root = sysfs(tmp_path, "efa_0", plugin_dir=OFI)  # older kernels name the device efa_0 (no driver link here)
    (tmp_path / "etc/ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc/ld.so.conf.d/efa.conf").write_text(f"# EFA\n{OFI}\n")
    assert efa_findings(P4D, {}, root)[1] == []


def test_efa_problems_each_named(tmp_path):
    root = sysfs(tmp_path, plugin_dir=OFI)  # the plugin is installed but not on the loader's path, and no device
    env = {"FI_PROVIDER": "tcp", "NCCL_NET": "Socket", "FI_EFA_USE_DEVICE_RDMA": "0"}
    seen, problems = efa_findings(P4D, env, root)
    assert seen == "0 of 4 devices, no plugin"
    assert problems == [
        "ml.p4d.24xlarge has EFA but no EFA device shows in /sys/class/infiniband",
        "FI_PROVIDER=tcp points libfabric away from EFA (unset it)",
        "NCCL_NET=Socket keeps NCCL off EFA (unset it)",
        "FI_EFA_USE_DEVICE_RDMA=0 turns GPUDirect RDMA off (unset it)",
        "the aws-ofi-nccl plugin (libnccl-net*.so) is not on the loader's path (LD_LIBRARY_PATH)",
    ]


def test_a_rank_of_a_two_host_job_finds_its_devices_and_its_hosts_efa(tmp_path, monkeypatch):
    """Preflight.local, as each rank runs it: on a job of several hosts it reads this host's EFA (a local name that
    hid the efa module once broke every two-host job here, and only the toolkit tier saw it)."""
    root = sysfs(tmp_path, "rdmap16s27", plugin_dir=OFI)
    env = {
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_CURRENT_HOST": "algo-2",
        "SM_CURRENT_INSTANCE_TYPE": "ml.p4d.24xlarge",
    }
    monkeypatch.setenv("LD_LIBRARY_PATH", OFI)
    check = Preflight(make_plan(env, {"eth0"}), root=root)
    found = check.local(SimpleNamespace(global_rank=1), torch.device("cpu"))
    assert (found.rank, found.host, found.devices, found.efa) == (
        1,
        "algo-2",
        f"cpu with {torch.get_num_threads()} thread(s), not checked",
        "1 of 4 devices, libnccl-net-ofi.so",
    )
    assert ("EFA", "ml.p4d.24xlarge has EFA but no EFA device shows in /sys/class/infiniband") not in found.problems
    one_host = Preflight(make_plan({**env, "SM_HOSTS": '["algo-2"]'}, {"eth0"}), root=root)
    assert one_host.local(SimpleNamespace(global_rank=0), torch.device("cpu")).efa == "not needed (one host)"


def test_no_efa_check_where_the_type_has_none(tmp_path):
    assert efa_findings(None, {"FI_PROVIDER": "tcp"}, str(tmp_path)) == ("not on this instance type", [])
    assert efa_findings(instances.lookup("g5.12xlarge"), {}, str(tmp_path)) == ("not on this instance type", [])


def test_a_host_below_half_the_median_of_the_others_is_slow():
    assert slow_hosts({"algo-2": 10.0, "algo-3": 5.2, "algo-4": 11.0}) == ["algo-3"]  # below 0.5 × 10.5
    assert slow_hosts({"algo-2": 10.0, "algo-3": 5.3, "algo-4": 11.0}) == []
    assert slow_hosts({"algo-2": 0.1}) == []  # one peer: nothing to compare with


def ranks(*problems, hosts=("algo-1", "algo-1", "algo-2", "algo-2")):
    """Findings of 4 ranks on 2 hosts, rank i with problems[i] (if any)."""
    return [
        Findings(
            r, host, "ok (2 GPUs)", "4 of 4 devices, libnccl-net.so", list(problems[r]) if r < len(problems) else []
        )
        for r, host in enumerate(hosts)
    ]


def test_the_first_problem_in_rank_order_names_its_host_and_check():
    findings = ranks([], [], [("EFA", "FI_PROVIDER=tcp points libfabric away from EFA (unset it)")], [("devices", "x")])
    line, warnings = verdict(findings, None, None, "warn")
    assert line.startswith(
        "pre-flight EFA check failed on host algo-2 (rank 2): FI_PROVIDER=tcp points libfabric away from EFA"
    )
    assert "preflight=off" in line and warnings == []


def test_a_slow_network_warns_under_warn_and_fails_under_fail():
    slow = Measured({MiB: 1.0, 1 << 30: 50.0}, {"algo-2": 3.0})
    line, warnings = verdict(ranks(), slow, (61.4, "preflight_min_busbw"), "warn")
    assert line is None and warnings == [
        "pre-flight bandwidth check on hosts algo-1, algo-2: all-reduce busbw 50.00 GB/s at 1 GiB is below 61.4 GB/s "
        "(preflight_min_busbw)"
    ]
    line, _ = verdict(ranks(), slow, (61.4, "preflight_min_busbw"), "fail")
    assert line.startswith("pre-flight bandwidth check on hosts algo-1, algo-2: all-reduce busbw 50.00 GB/s")
    assert verdict(ranks(), slow, (49.0, "preflight_min_busbw"), "fail") == (None, [])
    assert verdict(ranks(), slow, None, "fail") == (None, [])  # no floor: measured and printed only


def test_a_slow_host_is_named_and_the_bandwidth_line_names_it():
    hosts = ("algo-1", "algo-2", "algo-3", "algo-4")
    measured = Measured({16 * MiB: 0.5}, {"algo-2": 10.0, "algo-3": 1.0, "algo-4": 9.0})
    line, warnings = verdict(ranks(hosts=hosts), measured, (1.0, "preflight_min_busbw"), "fail")
    assert warnings == [
        "host algo-3 is slow: point-to-point 1.00 GB/s from the first host, the other hosts' median 9.50 GB/s"
    ]
    assert line.startswith("pre-flight bandwidth check on hosts algo-3: ")


def test_the_line_says_what_was_measured_and_its_cost():
    measured = Measured({MiB: 0.2, 16 * MiB: 1.234}, {"127.0.0.1": 0.9})
    findings = [Findings(0, "localhost", "cpu with 2 thread(s), not checked", "not on this instance type")]
    assert summary(findings, measured, 2, 1, "unknown for local", 0.81) == (
        "pre-flight: 2 hosts × 1 process; all-reduce busbw 1.23 GB/s at 16 MiB (expected: unknown for local); "
        "p2p to 127.0.0.1 0.90 GB/s; devices: cpu with 2 thread(s), not checked; EFA: not on this instance type; "
        "0.8 s (preflight=off skips it)"
    )
    alone = summary(findings, None, 1, 1, "unknown", 0.01)
    assert alone.startswith("pre-flight: 1 host × 1 process; no bandwidth probe (one process); devices: cpu")


# ---- on two real processes: what each rank concludes -----------------------------------------------------------------

HOSTS = ["algo-1", "algo-10"]  # one process each; the first name is a prefix of the second, as on a job of 10 hosts
COLLECTIVES = ("all_gather_object", "broadcast_object_list", "all_reduce", "send", "recv")  # pre-flight's, counted
MISSING_GPU = {1: torch.cuda.device_count() + 1}  # SM_NUM_GPUS by rank: rank 1's host lacks a GPU it should have
CASES = {  # case: (preflight, preflight_min_busbw, SM_NUM_GPUS by rank); the floor is one no network reaches
    "warn": ("warn", 1e6, {}),
    "fail": ("fail", 1e6, {}),
    "off": ("off", 1e6, MISSING_GPU),  # nothing runs: not even the device check
    "devices": ("warn", None, MISSING_GPU),  # last: a mutation that fails one rank only leaves the other waiting
}


def counted(name: str, collective, called: list):
    """`collective`, its name appended to `called` at each call."""

    def call(*args, **kwargs):
        called.append(name)
        return collective(*args, **kwargs)

    return call


def judging(rank: int, port: int, out) -> None:
    """One rank of a job on HOSTS: pre-flight in each of CASES; its outcome in each, as
    (its failure line or None, the lines it printed, the collectives it called), to `out`. Rank 1 times its all-reduces
    at half rank 0's bandwidth, as two hosts' clocks differ: only rank 0's figures may reach a verdict."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    called, said = [], []
    for name in COLLECTIVES:
        setattr(dist, name, counted(name, getattr(dist, name), called))
    preflight.say = said.append
    timed = preflight.allreduce_busbw
    preflight.allreduce_busbw = lambda size_bytes, device: timed(size_bytes, device) / (1 + rank)
    trainer = SimpleNamespace(
        world_size=2,
        global_rank=rank,
        is_global_zero=rank == 0,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
    )
    outcomes = {}
    for case, (mode, min_busbw, gpus) in CASES.items():
        env = {"SM_HOSTS": json.dumps(HOSTS), "SM_CURRENT_HOST": HOSTS[rank], "SM_NUM_GPUS": str(gpus.get(rank, 0))}
        check = preflight.Preflight(make_plan(env, {"eth0"}), mode=mode, min_busbw=min_busbw)
        called.clear()
        said.clear()
        try:
            check.setup(trainer, None, "fit")
            failed = None
        except UserError as e:
            failed = str(e)
        except Exception as e:  # a collective the other rank never joined, after the timeout: reported, not a hang
            failed = repr(e)
        outcomes[case] = (failed, list(said), list(called))
    out.put((rank, outcomes))
    dist.destroy_process_group()


def named_hosts(line: str) -> list[str]:
    """The hosts a bandwidth line names, each whole."""
    return re.search(r" on hosts (.+?): ", line)[1].split(", ")


def figure(line: str) -> str:
    return re.search(r"all-reduce busbw ([\d.]+ GB/s at \d+ MiB)", line)[1]


def test_every_rank_reaches_rank_0s_verdict_and_preflight_off_runs_nothing(free_port):
    """Pre-flight on two gloo processes, on hosts whose names are each other's prefix. warn: both go on; rank 0
    alone prints the line, with its point-to-point figure for the other host only, and the warning naming both hosts
    whole. fail: both raise the same line, with rank 0's figure, though rank 1 timed its own slower. A device problem
    on rank 1 alone: both raise its line, naming its host and rank. off: no line and no collective, on either rank,
    even with that device problem."""
    results = spawned.two_ranks(judging, free_port(), timeout_s=120)
    first, second = results[0], results[1]

    (failed, said, called), later = first["warn"], second["warn"]
    assert failed is None and later[:2] == (None, [])
    line, warning = said
    parts = line.split("; ")
    assert parts[0] == "pre-flight: 2 hosts × 1 process", line
    (p2p,) = [p.removeprefix("p2p to ") for p in parts if p.startswith("p2p to ")]
    assert [re.fullmatch(r"(\S+) [\d.]+ GB/s", p)[1] for p in p2p.split(", ")] == ["algo-10"], line
    assert (
        warning.startswith("pre-flight warning: pre-flight bandwidth check on hosts ") and named_hosts(warning) == HOSTS
    )
    assert set(called) == set(later[2]) == set(COLLECTIVES)  # the findings gathered, rank 0's figures broadcast

    assert first["fail"][0] is not None and first["fail"][0] == second["fail"][0]
    assert named_hosts(first["fail"][0]) == HOSTS
    assert figure(first["fail"][0]) == figure(first["fail"][1][0])  # the figure rank 0 printed
    assert second["fail"][1] == []  # rank 0's line only

    expected = (
        f"pre-flight devices check failed on host algo-10 (rank 1): torch sees {torch.cuda.device_count()} GPU(s) but "
        f"SM_NUM_GPUS={MISSING_GPU[1]}; {preflight_verdict.FIX['devices']}"
    )
    assert first["devices"][:2] == second["devices"][:2] == (expected, [])

    assert first["off"] == second["off"] == (None, [], [])


def test_preflight_off_reaches_the_check_from_the_settings():
    """The hub builds pre-flight with its concern(): the setting's value is the check's mode."""
    import pytorch_lightning  # here, not at the top: the processes above import this file, and need no Lightning

    env = {"SM_HOSTS": json.dumps(HOSTS), "SM_CURRENT_HOST": "algo-1"}
    from sagemaker_lightning.toolbox.concern import Context

    config = {"preflight": "off", "preflight_min_busbw": 5}
    (check,) = preflight.concern(Context(pl=pytorch_lightning, plan=make_plan(env, {"eth0"}), config=config)).callbacks
    assert (check.mode, check.min_busbw) == ("off", 5)
