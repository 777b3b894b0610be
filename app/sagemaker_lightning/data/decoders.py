"""Which of litdata's decoders a streamed dataset may use: only those that cannot run code.

litdata decodes each field of an item with the decoder that the dataset's index.json names (its `data_format`), and
`pickle` means pickle.loads on the chunk's bytes: whoever can write a data prefix or channel could otherwise run code
in the job. A field whose decoder is not ADMITTED is refused in one line naming the field and the format, before the
first batch (streaming.check_source for each split a data module reads; streaming.check for the training loader in a
job); and every reader of a loader the runtime prepared (in a job, every streamed loader: training_loader.py) checks
the index it loaded again (litdata downloads index.json anew in
each DataLoader worker at each epoch, so one changed after the first check is refused too, not decoded). A project
whose own data needs another decoder names it in the setting `streaming.trusted_formats` (its help names the risk).

    python -c "from sagemaker_lightning.data import decoders; print(sorted(decoders.ADMITTED))"
"""

import json
import os

from sagemaker_lightning.failure import UserError

SETTING = "streaming.trusted_formats"  # the runtime's setting (training_loader.py): decoders admitted beyond these
VARIABLE = "SAGEMAKER_LIGHTNING_TRUSTED_FORMATS"  # the setting as the runtime hands it to the job's processes
# (data/training_loader.py): the data module's check_source and litdata's DataLoader workers read it there
# litdata 0.2.76's decoders (litdata/streaming/serializers.py, each read there) that make a number, an array, text,
# bytes or an image from a field's bytes and call nothing the data chooses: struct, numpy's and torch's frombuffer
# (numpy refuses an object dtype from a buffer), UTF-8, JSON, and PIL's and torchvision's image decoders. The
# example's items (scripts/optimize_data.py: id, image as a uint8 array, label) are int, numpy, int.
ADMITTED = frozenset(
    {
        "int", "float", "bool",  # numbers
        "numpy", "no_header_numpy", "tensor", "no_header_tensor",  # arrays
        "pil", "jpeg", "jpeg_array", "image",  # images
        "str", "text", "json", "bytes", "file",  # text and bytes ("file" too: its decoder returns the bytes)
    }
)  # fmt: skip
# what decodes each of litdata's other formats, as the refusal names it
REFUSED = {
    "pickle": "pickle.loads, which runs any code the data's writer chose",
    "graph": "pickle.loads for its metadata, which runs any code the data's writer chose",
    "video": "torchcodec (FFmpeg), not reviewed here",
    "audio": "torchcodec (FFmpeg), not reviewed here",
    "nifti": "nibabel, not reviewed here",
    "mesh": "trimesh, in a file type index.json chooses, not reviewed here",
    "pdf": "pdfplumber, whose pdfminer.six unpickled files a PDF named (CVE-2025-64512)",
    "tifffile": "tifffile, not reviewed here",
    "parquet": "pyarrow and polars (pyarrow before 14.0.1 unpickled extension types: CVE-2023-47248)",
}
PARQUET = "ParquetLoader"  # index.json's item_loader for parquet files, which litdata reads with pyarrow and polars


def admit(formats, env) -> None:
    """The setting's decoders handed to the job's processes (VARIABLE in `env`), or none."""
    if formats:
        env[VARIABLE] = ",".join(formats)
    else:
        env.pop(VARIABLE, None)


def trusted(env=None) -> frozenset:
    """The decoders the project admits beyond ADMITTED (SETTING, as VARIABLE holds it)."""
    return frozenset(filter(None, ((os.environ if env is None else env).get(VARIABLE) or "").split(",")))


def decoder(data_format, names) -> str:
    """The decoder litdata 0.2.76 picks for `data_format` among `names` (BaseItemLoader._data_format_to_key): of
    "a:b" the decoder b where there is one (so "numpy:pickle" is pickle's), else a; a format litdata cannot split
    names itself (litdata fails on it; it is refused here)."""
    if not isinstance(data_format, str) or data_format.count(":") > 1:
        return repr(data_format)
    first, _, second = data_format.partition(":")
    return second if second and second in names else first


def fields(config: dict) -> list[tuple[str, str]]:
    """(field, format) of each leaf of an item, named as the items' keys are ("image", "meta.caption", "[2]"); by
    position where the index's data_spec does not describe the leaves."""
    formats, spec = list(config.get("data_format") or []), config.get("data_spec")
    try:
        from litdata.utilities._pytree import tree_unflatten, treespec_loads  # only registered types: no code

        tree = tree_unflatten(formats, treespec_loads(spec) if isinstance(spec, str) else spec)
    except Exception:  # no spec, or one of another shape: litdata decodes each leaf before it fails
        return [(f"#{i}", fmt) for i, fmt in enumerate(formats)]
    named = []

    def walk(node, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        else:
            named.append((path or "the item", node))

    walk(tree, "")
    return named


def refused(config: dict, names, trust: frozenset) -> list[tuple[str, str, str]]:
    """(field, format, decoder) of each field of index.json's `config` whose decoder is neither ADMITTED nor in
    `trust`; parquet files as one field (their reader is pyarrow, whatever data_format says)."""
    found = [(f, fmt, decoder(fmt, names)) for f, fmt in fields(config)]
    if config.get("item_loader") == PARQUET:
        found.append(("its parquet files", "parquet", "parquet"))
    return [(f, fmt, key) for f, fmt, key in found if key not in ADMITTED | trust]


def check_index(config, where: str, names=None) -> None:
    """One line when an item of the dataset at `where` (index.json's `config`) has a field litdata would decode with a
    decoder that can run code (module docstring); `names`: the decoders litdata has (its own by default)."""
    if not isinstance(config, dict):
        raise UserError(f"{where} has an index.json that is not litdata's (no config); write it again with litdata")
    if names is None:
        from litdata.streaming.serializers import _SERIALIZERS

        names = _SERIALIZERS
    found = refused(config, names, trusted())
    if not found:
        return
    which = "; ".join(
        f"field {f!r} is stored as {fmt!r} (read by {REFUSED.get(k, 'a decoder the runtime does not know')})"
        for f, fmt, k in found[:3]
    )
    keys = ",".join(sorted({k for _, _, k in found}))
    raise UserError(
        f"{where} holds data that could run code when read, refused unread: {which}; only numbers, "
        f"arrays, text and images are read (scripts/upload_data.py --format litdata writes those); or, where no one "
        f"else can write {where}, admit it with {SETTING}=[{keys}]"
    )


def read_index(path: str) -> dict | None:
    """index.json's `config` in the directory `path`; None where it does not parse (check_index says so)."""
    with open(os.path.join(path, "index.json"), "rb") as f:
        return parsed(f.read())


def parsed(text: bytes) -> dict | None:
    try:
        index = json.loads(text)
    except ValueError:
        return None
    return index.get("config") if isinstance(index, dict) else None


def check_cache(cache, where: str, serializers=None) -> None:
    """check_index on the index litdata's `cache` loaded: the very one its reader decodes with (litdata loads it
    once per reader; a reader is made for each DataLoader worker at each epoch). `serializers`: the dataset's own."""
    from litdata.streaming.serializers import _get_serializers

    cache.get_chunk_intervals()  # loads the index where it is not yet (what the shuffler does next)
    check_index(cache._reader._config._config, where, _get_serializers(serializers))


def check_dataset(dataset, loader) -> None:
    """check_cache on a StreamingDataset of `loader`, its index loaded as Lightning's len() loads it."""
    if dataset.shuffler is None:
        dataset.get_len(loader.num_workers, loader.batch_size)
    check_cache(dataset.shuffler.cache, dataset.input_dir.url or dataset.input_dir.path, dataset.serializers)
