"""What a model file is called: the one list of model-file suffixes (checkpoints, state dicts and
the files `torchkit export` writes). Standard library only: shell completion reads it."""

from __future__ import annotations

from torchkit.core.models.exported.formats import all_extensions

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
MODEL_FILE_SUFFIXES = tuple(dict.fromkeys((*CHECKPOINT_SUFFIXES, *all_extensions())))
