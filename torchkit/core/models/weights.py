"""Reading model files: torchkit checkpoints, plain state dicts (with or without the `module.` and
`_orig_mod.` prefixes), `.safetensors`, and pickled modules (trusted loading only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.io.shell_words import shell_word
from torchkit.core.models.heads import find_head, fit_head_to, out_features, replace_head
from torchkit.core.models.random_init import skipped_weight_init
from torchkit.core.models.size_bound import size_adapted
from torchkit.core.models.usercode import is_callable_spec, user_code


def read_model_file(path: str, *, trust_checkpoint: bool = False) -> Any:
    """What `path` holds, loaded on the CPU. A trusted pickle may import the user's classes: the
    working directory is importable and their prints go to stderr."""
    from torchkit.core.models.checkpoint import load_checkpoint

    if not trust_checkpoint:
        return load_checkpoint(path)
    with user_code():
        return load_checkpoint(path, trust_checkpoint=True)


def load_weights_file(
    model,
    path: str,
    *,
    num_classes: int | None = None,
    trust_checkpoint: bool = False,
    loaded: Any = None,
) -> Any:
    """Load the weights in `path` (or what was already `loaded` from it) into `model`, the head
    first sized from the weights; then, if `num_classes` differs, replaced by a fresh head of
    that size (fine-tuning). A ViT's position embeddings for another image size are
    resampled to the model's grid, a timm model's relative position bias tables to its windows
    (`size_adapted`). Returns what the file held.
    """
    from torchkit.core.models.checkpoint import (
        extract_state_dict,
        load_weights_into,
        strip_wrapper_prefix,
        with_densenet_key_names,
    )

    if loaded is None:
        loaded = read_model_file(path, trust_checkpoint=trust_checkpoint)
    state = with_densenet_key_names(model, strip_wrapper_prefix(model, extract_state_dict(loaded)))
    with skipped_weight_init():  # a head of the file's size: loaded from it right after
        fit_head_to(model, state)
    state = size_adapted(model, state, source=path)
    load_weights_into(model, state, source=path)
    if num_classes is not None and out_features(find_head(model)[1]) != num_classes:
        replace_head(model, num_classes)
    return loaded


def checkpoint_arch(checkpoint: Mapping[str, Any], source: str) -> tuple[str, int]:
    """(arch, num_classes) of a torchkit checkpoint, checked: a name and a positive count."""
    for key in ("arch", "num_classes"):
        if key not in checkpoint:
            raise CheckpointError(f"{source} has no {key!r} entry", "is it a torchkit checkpoint?")
    arch, num_classes = checkpoint["arch"], checkpoint["num_classes"]
    if not isinstance(arch, str) or not arch.strip():
        raise CheckpointError(f"{source} has an invalid arch {arch!r}", "it must be a model name")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise CheckpointError(
            f"{source} has an invalid num_classes {num_classes!r}",
            "it must be a positive whole number; the file is damaged or not torchkit's",
        )
    widths = _dimension_sizes(checkpoint.get("model"))
    if widths is not None and num_classes not in widths:
        # A head of num_classes outputs has a weight of that many rows: a damaged count, built
        # first, took what memory its head needed (torch's "can't allocate memory", or the
        # OOM killer) before the weights were found not to fit.
        raise CheckpointError(
            f"{source} has an invalid num_classes {num_classes:,}: none of its weights has "
            "that many outputs",
            "the file is damaged or not torchkit's",
        )
    return arch, num_classes


def _dimension_sizes(state: Any) -> set[int] | None:
    """The sizes of every dimension of the tensors of a state dict; None for anything else, a
    dict with values that are not tensors too (whose own error comes when its weights are
    loaded), or one with an uninitialised lazy layer's parameter (which has no size yet)."""
    import torch

    if not isinstance(state, Mapping):
        return None
    if not all(isinstance(value, torch.Tensor) for value in state.values()):
        return None
    if any(torch.nn.parameter.is_lazy(value) for value in state.values()):
        return None
    return {size for value in state.values() for size in value.shape}


def require_trusted_arch(arch: str, source: str, trust_checkpoint: bool) -> None:
    """Refuse, without `trust_checkpoint`, an architecture a file names that would import the
    user's code."""
    if is_callable_spec(arch) and not trust_checkpoint:
        raise CheckpointError(
            f"{source} names the model code {arch!r}, which would be imported and run to "
            "build the model",
            "pass --trust-checkpoint to allow it, only if you trust where the file came from",
        )


def pickled_module(loaded: Any) -> Any:
    """The `nn.Module` of a whole pickled model, or of a dict holding one (`{'model': net}`)."""
    import torch

    if isinstance(loaded, torch.nn.Module):
        return loaded
    if not isinstance(loaded, Mapping):
        return None
    # a module under the dict's own key: one in a list beside it (a list of BatchNorm layers)
    # is no model
    return next((v for v in loaded.values() if isinstance(v, torch.nn.Module)), None)


def pickled_modules(loaded: Any) -> dict[str, Any] | None:
    """Every `nn.Module` of a pickled dict (`{'model': net, 'model_ema': ema}`) by its path, in
    the dict's order: its key, or for one inside lists, tuples and dicts under a key the keys
    and indices that lead to it (`{'heads': [a, b]}`: `heads.0`, `heads.1`); not the modules
    inside a module (its layers). None when `loaded` is no dict."""
    import torch

    if not isinstance(loaded, Mapping):
        return None
    found: dict[str, Any] = {}
    walked: set[int] = set()  # a list held twice is walked once, its modules keep one path

    def walk(value: Any, path: str) -> None:
        if isinstance(value, torch.nn.Module):
            found.setdefault(path, value)
        elif isinstance(value, (dict, list, tuple)) and id(value) not in walked:
            walked.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                walk(item, f"{path}.{key}")

    for key, value in loaded.items():
        walk(value, str(key))
    return found


def is_state_dict(loaded: Any) -> bool:
    import torch

    return (
        isinstance(loaded, Mapping)
        and bool(loaded)
        and all(isinstance(v, torch.Tensor) for v in loaded.values())
    )


def holds_weights_only(loaded: Any) -> bool:
    """A plain state dict, or one under a training wrapper's key (`{'state_dict': ...,
    'epoch': ...}` as Lightning saves, `{'model': ...}`): weights without their architecture.
    Asked once a torchkit checkpoint and a pickled module are ruled out."""
    from torchkit.core.models.checkpoint import extract_state_dict

    if is_state_dict(loaded):
        return True
    if not isinstance(loaded, Mapping):
        return False
    try:
        return is_state_dict(extract_state_dict(loaded))
    except CheckpointError:
        return False


def weights_only_error(path: str) -> UsageError:
    return UsageError(
        f"{path} holds plain weights (a state dict), not the architecture they belong to",
        f"name the architecture they belong to: MODEL --weights {shell_word(path)}",
    )
