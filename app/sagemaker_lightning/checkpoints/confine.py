"""ModelCheckpoint's state in a checkpoint a job resumes from, confined to the callback's own checkpoint.dirpath.

That state names files ModelCheckpoint later reads (best_model_path: the export) and deletes (the k-th best, on a
top-k update, with `fs.rm(recursive=True)`, on any URL): when a job resumes, every path there outside the callback's
dirpath is dropped (`confined`), said in one line (`confine`, LastCheckpoint.on_load_checkpoint), so that whoever can
write the checkpoint location cannot steer a delete or a read elsewhere. No torch.

    python -c "from sagemaker_lightning.checkpoints.confine import confined; print(confined({'best_model_path': 's3://other/x.ckpt'}, '/ckpts', 'min'))"
"""

from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.location import inside

# ModelCheckpoint's state that names a file it reads or deletes (and best_k_models' keys)
STATE_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")


def confined(state: dict, dirpath: str | None, mode: str) -> tuple[dict, list[str]]:
    """ModelCheckpoint's `state` less the paths outside `dirpath` (location.inside; all of them without one), and those
    paths. A path dropped is "", an entry of best_k_models removed; the k-th best is then the worst one kept, as
    ModelCheckpoint chooses it (`mode`: "min" or "max"), or left to the callback's own when none is kept."""

    def outside(path) -> bool:
        return bool(path) and not (dirpath and inside(str(path), dirpath))

    kept = dict(state)
    dropped = [str(state[key]) for key in STATE_PATHS if outside(state.get(key))]
    kept.update({key: "" for key in STATE_PATHS if outside(state.get(key))})
    best = state.get("best_k_models") or {}
    dropped += [str(path) for path in best if outside(path)]
    best = kept["best_k_models"] = {path: score for path, score in best.items() if not outside(path)}
    if dropped and kept.get("kth_best_model_path") not in best:  # a top-k update pops it from best_k_models
        if best:
            kth = kept["kth_best_model_path"] = (max if mode == "min" else min)(best, key=best.get)
            kept["kth_value"] = best[kth]
        else:
            kept.pop("kth_best_model_path", None)
            kept.pop("kth_value", None)
    return kept, list(dict.fromkeys(dropped))


def confine(checkpoint: dict, model_checkpoints: list, announce: bool) -> None:
    """Each of `model_checkpoints`' states in `checkpoint` (Lightning's dict, before any callback loads it) confined in
    place to that callback's dirpath; what it drops said where `announce` (global rank 0)."""
    states = checkpoint.get("callbacks") or {}
    for callback in model_checkpoints:
        for key in {callback.state_key, callback._legacy_state_key} & states.keys():
            states[key], dropped = confined(states[key], callback.dirpath, callback.mode)
            if dropped and announce:
                say(
                    f"ModelCheckpoint's state in the checkpoint names {', '.join(dropped)}, outside "
                    f"checkpoint.dirpath {callback.dirpath}: dropped, never read or deleted (the checkpoint was "
                    "written for another location, or not by a training job)"
                )
