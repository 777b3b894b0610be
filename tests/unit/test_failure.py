"""The failure contract: one line on stderr and in SageMaker's failure file, first cause wins; the table that turns
exceptions into that line (the toolkit's failure text: boot/test_toolkit_failure.py)."""

import pytest

from sagemaker_lightning import failure
from sagemaker_lightning.launch.plan import make_plan

pytestmark = pytest.mark.unit

PLAN = make_plan({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "MASTER_ADDR": "10.0.0.1"}, ())
ADDRESSES = {"algo-1": "10.0.0.1", "algo-2": "10.0.0.2"}


def test_report_writes_one_line_to_stderr_and_the_failure_file(tmp_path, capsys):
    assert failure.report("no data in /x;\n  upload it", env={"SM_OUTPUT_DIR": str(tmp_path)}) == 1
    assert capsys.readouterr().err == "ERROR: no data in /x; upload it\n"
    assert (tmp_path / "failure").read_text() == "no data in /x; upload it\n"


def test_the_first_failure_stays(tmp_path):
    env = {"SM_OUTPUT_DIR": str(tmp_path)}
    failure.report("rank 0: the cause", env)
    failure.report("rank 1: a consequence", env)
    assert (tmp_path / "failure").read_text() == "rank 0: the cause\n"


def test_outside_sagemaker_only_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    failure.report("oops", env={})
    assert capsys.readouterr().err == "ERROR: oops\n" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "message, expected",
    [
        (
            "Timed out after 16 seconds waiting for clients. 1/2 clients joined.",
            "only 1 of 2 processes joined within 16 s: the other hosts (algo-1) did not start training or cannot reach 10.0.0.1:29500",
        ),
        (
            "The client socket has timed out after 600000ms while trying to connect to (10.0.0.1, 29500). connect() timed out.",
            "could not reach the first host algo-1 at 10.0.0.1:29500 within dist_timeout",
        ),
        (
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:40339",
            "lost the connection to host algo-1 during training",
        ),
        (
            "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation to complete",
            "a collective operation did not finish within dist_timeout: a process on another host (algo-1) stopped or hangs",
        ),
        ("CUDA error: an illegal memory access was encountered", None),
    ],
)
def test_peer_failures_name_the_host(message, expected):
    line = failure.peer_failure(PLAN, message, ADDRESSES.__getitem__)
    assert line == expected if expected is None else expected in line


def wrapped(cause: BaseException) -> ValueError:
    """`cause` wrapped as jsonargparse wraps a class's error when none of a Union's types validates."""
    e = ValueError("Does not validate against any of the Union subtypes\nSubtypes: [...]")
    e.__cause__ = cause  # raise ... from cause
    return e


def from_worker(e: BaseException) -> BaseException:
    """`e` raised in a DataLoader worker, as torch raises it again in the loader's process: the worker's traceback in
    its text."""
    from torch._utils import ExceptionWrapper

    try:
        raise e
    except type(e):
        wrapper = ExceptionWrapper(where="in DataLoader worker process 0")
    try:
        wrapper.reraise()
    except type(e) as again:
        return again


class OutOfMemoryError(RuntimeError):  # stands for torch.OutOfMemoryError: the table matches by class name
    pass


@pytest.mark.parametrize(
    "exception, ctx, expected, code, traceback",
    [
        (failure.UserError("no data in /x"), {}, "no data in /x", 1, False),
        # jsonargparse builds a class chosen by name (a data module in subclass mode) and raises its own ValueError
        # from the class's error: the project's UserError is still the line
        (wrapped(failure.UserError("data.batch_size=-4 is not a batch size")), {"stage": "configure"},
         "data.batch_size=-4 is not a batch size", 1, False),
        # raised in a DataLoader worker (streamed data refused there): its own line, not torch's traceback
        (from_worker(failure.UserError("s3://b/ids holds data that could run code")), {"stage": "train"},
         "s3://b/ids holds data that could run code", 1, False),
        (OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), {"host": "algo-2", "rank": 3},
         "out of GPU memory on host algo-2 rank 3 (CUDA out of memory. Tried to allocate 2 GiB); lower data.batch_size", 1, False),
        (ValueError("gpu"), {"stage": "configure", "accelerator": "gpu", "cuda_available": False},
         "trainer.accelerator=gpu asks for a GPU but this instance has none", 1, False),
        # a configuration error that mentions GPUs while the accelerator is the CPU: its own reason, not the GPU line
        (ValueError("The strategy `fsdp` requires a GPU accelerator"), {"stage": "configure", "accelerator": "cpu"},
         "bad configuration: The strategy `fsdp` requires a GPU accelerator", 1, False),
        (ValueError("x"), {"stage": "train"}, "ValueError: x", 1, True),  # during training: unforeseen
        (RuntimeError("Connection closed by peer [10.0.0.1]:1"), {"plan": PLAN, "resolve": ADDRESSES.__getitem__},
         "lost the connection to host algo-1 during training", 1, False),
        (KeyError("k"), {}, "KeyError: 'k'", 1, True),
    ],
)  # fmt: skip
def test_exceptions_become_one_line(exception, ctx, expected, code, traceback):
    line, exit_code, show_traceback, file = failure.explain(exception, **ctx)
    assert line.startswith(expected) and (exit_code, show_traceback) == (code, traceback)
    assert "\n" not in line or show_traceback


def test_sigterm_is_a_stop_not_a_failure():
    class SIGTERMException(SystemExit):  # Lightning's, by class name
        pass

    assert failure.explain(SIGTERMException()) == (failure.STOPPED, 143, False, True)


def test_under_torchrun_a_lost_local_peer_leaves_the_failure_file_to_torchrun():
    """Rank 0 sees its local peer go first; torchrun's summary (the entrypoint reads it) names the peer."""
    env = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2", "TORCHELASTIC_RUN_ID": "job"}
    torchrun = make_plan({**env, "RANK": "2", "LOCAL_RANK": "0"}, (), devices=2, accelerator="cpu")
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:40339")
    assert failure.explain(lost, plan=torchrun, resolve=ADDRESSES.__getitem__)[3] is False  # stderr only
    remote = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:40339")
    assert failure.explain(remote, plan=torchrun, resolve=ADDRESSES.__getitem__)[3] is True  # another host: named


def test_a_process_of_lightnings_launcher_that_ended_is_named():
    plan = make_plan({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}, (), devices=4, accelerator="cpu")
    lost = RuntimeError("Connection closed by peer [10.0.0.2]:1")
    line, *_ = failure.explain(lost, plan=plan, resolve=ADDRESSES.__getitem__, ended=[(3, -9)])
    assert line.startswith("training process rank 7 (local rank 3) on host algo-2 was killed with SIGKILL")
    line, *_ = failure.explain(lost, plan=plan, resolve=ADDRESSES.__getitem__, ended=[(1, 1)])
    assert line == "training process rank 5 (local rank 1) on host algo-2 exited with code 1; its log shows why"
