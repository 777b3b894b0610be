"""checkpoints/compile_cache.py: torch.compile's artifacts written beside the checkpoints with a first line naming
the torch that wrote them, rewritten only with more than the file holds; a file that is not such a cache, or another
torch's, is one line and a compile afresh, never a failure. The round trip through a real job and torch.compile is
tests/toolkit/test_compile_cache_toolkit.py."""

from types import SimpleNamespace

import pytest
import torch

from sagemaker_lightning.checkpoints import compile_cache
from sagemaker_lightning.checkpoints.compile_cache import FILE, CompileCache

pytestmark = pytest.mark.unit

RANK_ZERO = SimpleNamespace(is_global_zero=True)


def compiled() -> torch.nn.Module:
    """A model that compiles (in place, as model.compile does); nothing is compiled before its first call."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model[0].compile()
    return model


def cache(tmp_path) -> CompileCache:
    return CompileCache(SimpleNamespace(dirpath=str(tmp_path)))


def info(*keys: str) -> SimpleNamespace:
    """What torch's CacheInfo says of a set of artifacts: their keys by type (Inductor's here)."""
    return SimpleNamespace(artifacts={"inductor": list(keys)})


def test_the_artifacts_are_saved_with_their_torch_and_only_when_new(tmp_path, monkeypatch, capsys):
    artifacts = [None, (b"graphs", info("a")), (b"graphs", info("a")), (b"graphs+more", info("a", "b"))]
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: artifacts.pop(0))
    saver = cache(tmp_path)
    saver.on_save_checkpoint(RANK_ZERO, None, {})  # nothing compiled: no file
    assert not (tmp_path / FILE).exists()
    saver.on_save_checkpoint(RANK_ZERO, None, {})
    assert (tmp_path / FILE).read_bytes() == f"torch {torch.__version__}\n".encode() + b"graphs"
    (tmp_path / FILE).write_bytes(b"left as it is")
    saver.on_save_checkpoint(RANK_ZERO, None, {})  # nothing new since: not written again
    assert (tmp_path / FILE).read_bytes() == b"left as it is"
    saver.on_save_checkpoint(RANK_ZERO, None, {})
    assert (tmp_path / FILE).read_bytes().endswith(b"graphs+more")
    assert capsys.readouterr().out.count("compile cache: saved compile_cache.bin") == 1  # said once
    cache(tmp_path).on_save_checkpoint(SimpleNamespace(is_global_zero=False), None, {})  # other ranks write nothing


@pytest.mark.parametrize(
    "content, why",
    [
        (b"\x00\x01 not a cache", "ValueError: not a compile cache of the runtime's"),
        (b"torch 1.0.0\nartifacts", f"ValueError: written by torch 1.0.0, and this is torch {torch.__version__}"),
        (f"torch {torch.__version__}\n".encode() + b"\xff" * 64, "ValueError: torch could not read it"),
    ],
    ids=["junk", "another torch", "truncated"],
)
def test_a_cache_torch_cannot_use_is_one_line_and_a_compile(tmp_path, capsys, content, why):
    (tmp_path / FILE).write_bytes(content)
    cache(tmp_path).setup(RANK_ZERO, compiled(), "fit")
    captured = capsys.readouterr()
    assert captured.out == f"compile cache compile_cache.bin not used ({why}): torch.compile compiles afresh\n"
    assert not captured.err  # torch's own warning and traceback are not shown


def test_no_cache_no_line(tmp_path, capsys):
    cache(tmp_path).setup(RANK_ZERO, compiled(), "fit")
    CompileCache(SimpleNamespace(dirpath=None)).setup(RANK_ZERO, compiled(), "fit")
    assert capsys.readouterr().out == "" and compile_cache.header().startswith(b"torch ")


def test_a_model_that_compiles_nothing_never_reads_the_file(tmp_path, capsys, monkeypatch):
    """Its checkpoints still run nothing: a planted file is not even read."""
    (tmp_path / FILE).write_bytes(compile_cache.header() + b"planted")
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: pytest.fail("a cache was loaded"))
    cache(tmp_path).setup(RANK_ZERO, torch.nn.Sequential(torch.nn.Linear(2, 2)), "fit")
    assert capsys.readouterr().out == ""
    assert compile_cache.compiles(compiled()) and compile_cache.compiles(torch.compile(torch.nn.Linear(2, 2)))


def test_the_file_is_never_replaced_by_fewer_artifacts_and_new_ones_of_the_same_length_are_written(
    tmp_path, monkeypatch
):
    """Issue 48, item 12: the file was compared by its length only. A restart that had loaded artifacts a and b and
    then used only a (fewer bytes) overwrote the file with a alone; one that compiled c in a's place (the same length)
    never wrote it. Now the file is rewritten only with a superset of what it holds."""
    header = compile_cache.header()
    (tmp_path / FILE).write_bytes(header + b"a+b")
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: info("a", "b"))
    restarted = cache(tmp_path)
    restarted.setup(RANK_ZERO, compiled(), "fit")
    artifacts = [(b"a", info("a")), (b"a+c", info("a", "c")), (b"a+b+c", info("a", "b", "c"))]
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: artifacts.pop(0))
    restarted.on_save_checkpoint(RANK_ZERO, None, {})  # fewer bytes, a subset: the file keeps b
    assert (tmp_path / FILE).read_bytes() == header + b"a+b"
    restarted.on_save_checkpoint(RANK_ZERO, None, {})  # the same length, c new, but b missing: not yet
    assert (tmp_path / FILE).read_bytes() == header + b"a+b"
    restarted.on_save_checkpoint(RANK_ZERO, None, {})  # all of the file's and c: written
    assert (tmp_path / FILE).read_bytes() == header + b"a+b+c"

    first = cache(tmp_path / "first")
    (tmp_path / "first").mkdir()
    artifacts[:] = [(b"xy", info("x")), (b"xz", info("x", "z"))]  # a first run: z new, the same number of bytes
    first.on_save_checkpoint(RANK_ZERO, None, {})
    first.on_save_checkpoint(RANK_ZERO, None, {})
    assert (tmp_path / "first" / FILE).read_bytes() == header + b"xz"
