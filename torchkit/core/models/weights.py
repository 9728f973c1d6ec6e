"""Reading model files: torchkit checkpoints, plain state dicts (with or without the `module.` and
`_orig_mod.` prefixes), `.safetensors`, and pickled modules (trusted loading only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchkit.core.errors import CheckpointError, UsageError
from torchkit.core.models.heads import find_head, fit_head_to, out_features, replace_head
from torchkit.core.models.usercode import user_code


def read_model_file(path: str, *, trust: bool = False) -> Any:
    """What `path` holds, loaded on the CPU. A trusted pickle may import the user's classes: the
    working directory is importable and their prints go to stderr."""
    from torchkit.core.checkpoint import load_checkpoint

    if not trust:
        return load_checkpoint(path)
    with user_code():
        return load_checkpoint(path, trust=True)


def load_weights_file(
    model,
    path: str,
    *,
    num_classes: int | None = None,
    trust: bool = False,
    loaded: Any = None,
) -> Any:
    """Load the weights in `path` (or what was already `loaded` from it) into `model`, the head
    first sized from the weights; then, if `num_classes` differs, replaced by a fresh head of
    that size (fine-tuning). Returns what the file held."""
    from torchkit.core.checkpoint import extract_state_dict, load_weights_into

    if loaded is None:
        loaded = read_model_file(path, trust=trust)
    state = extract_state_dict(loaded)
    fit_head_to(model, state)
    load_weights_into(model, state, source=path)
    if num_classes is not None and out_features(find_head(model)[1]) != num_classes:
        replace_head(model, num_classes)
    return loaded


def model_from_checkpoint(checkpoint: Mapping[str, Any], *, trust: bool = False):
    """Rebuild the model a torchkit checkpoint was trained with and load its weights."""
    from torchkit.core.checkpoint import extract_state_dict, load_weights_into
    from torchkit.core.models.builders import build_model

    try:
        arch = checkpoint["arch"]
        num_classes = int(checkpoint["num_classes"])
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(
            f"checkpoint lacks {error}", "is it a torchkit checkpoint?"
        ) from error
    preprocess = checkpoint.get("preprocess") or {}
    model = build_model(
        arch,
        num_classes,
        image_size=int(preprocess.get("image_size", 224)),
        in_channels=int(preprocess.get("in_channels", 3)),
        trust=trust,
    )
    load_weights_into(model, extract_state_dict(checkpoint), source=f"the {arch} checkpoint")
    return model


def pickled_module(loaded: Any) -> Any:
    """The `nn.Module` of a whole pickled model, or of a dict holding one (`{'model': net}`)."""
    import torch

    if isinstance(loaded, torch.nn.Module):
        return loaded
    if isinstance(loaded, Mapping):
        for value in loaded.values():
            if isinstance(value, torch.nn.Module):
                return value
    return None


def is_state_dict(loaded: Any) -> bool:
    import torch

    return (
        isinstance(loaded, Mapping)
        and bool(loaded)
        and all(isinstance(v, torch.Tensor) for v in loaded.values())
    )


def weights_only_error(path: str) -> UsageError:
    return UsageError(
        f"{path} holds plain weights (a state dict), not the architecture they belong to",
        f"name the architecture they belong to: MODEL --weights {path}",
    )
