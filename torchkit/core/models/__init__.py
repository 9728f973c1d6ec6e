"""Models: one resolver (`resolve_model`) from a spec to a model, with small modules for each job:
`builders` (names to architectures), `convnet`, `usercode` (`package.module:Callable`),
`timm_models` (`timm/NAME`, the optional timm extra),
`weights` (reading model files), `heads` (the classifier layer), `specs` (what a spec reads),
`spec` (a model as a command names it, resolved with its preprocessing options), `inputs`
(inputs made up for a model) and `image_size` (the refusal of an image size a model cannot run
at, naming the smallest it takes)."""

from torchkit.core.models.builders import (
    BUILTIN_MODELS,
    build_model,
    is_checkpoint_path,
    is_timm_spec,
    list_models,
    model_from_checkpoint,
    suggest,
)
from torchkit.core.models.heads import find_head, replace_head
from torchkit.core.models.resolver import ResolvedModel, exported_format_of, resolve_model
from torchkit.core.models.spec import ModelSpec, resolve_spec
from torchkit.core.models.specs import is_model_file, model_inputs, require_model_files
from torchkit.core.models.usercode import call_model_factory
from torchkit.core.models.weights import pickled_module

__all__ = [
    "BUILTIN_MODELS",
    "ModelSpec",
    "ResolvedModel",
    "build_model",
    "call_model_factory",
    "exported_format_of",
    "find_head",
    "is_checkpoint_path",
    "is_model_file",
    "is_timm_spec",
    "list_models",
    "model_from_checkpoint",
    "model_inputs",
    "pickled_module",
    "replace_head",
    "require_model_files",
    "resolve_model",
    "resolve_spec",
    "suggest",
]
