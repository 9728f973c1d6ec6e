"""What kind of thing a model spec names, and which files it reads (without loading anything)."""

from __future__ import annotations

import os

from torchkit.core.io.files import require_input
from torchkit.core.io.overlap import InputPath
from torchkit.core.models.builders import BUILTIN_MODELS, is_callable_spec, is_checkpoint_path


def is_model_file(spec: str) -> bool:
    """A path to a checkpoint or pickled model (as opposed to a model name)."""
    if os.path.isfile(spec):
        return True
    return ":" not in spec and spec not in BUILTIN_MODELS and is_checkpoint_path(spec)


def model_inputs(spec: str | None, weights: str | None = None) -> list[InputPath]:
    """The files a model spec reads, which no output of the command may replace: a checkpoint
    or pickled model, the source of a `package.module:Callable` found under the working
    directory, and a `--weights` file. Nothing is imported or loaded."""
    inputs: list[InputPath] = []
    if spec and is_model_file(spec):
        inputs.append(InputPath.of(spec, "model file"))
    elif spec and is_callable_spec(spec):
        parts = spec.split(":", 1)[0].split(".")
        for candidate in (os.path.join(*parts) + ".py", os.path.join(*parts, "__init__.py")):
            if os.path.isfile(candidate):
                inputs.append(InputPath.of(candidate, "model source"))
                break
    if weights and weights != "DEFAULT" and os.path.exists(weights):
        inputs.append(InputPath.of(weights, "--weights file"))
    return inputs


def require_model_files(spec: str | None, weights: str | None = None) -> None:
    """The checkpoint MODEL names and a `--weights` file exist and are files, with the
    resolver's own errors: checked before a command's outputs, so that a missing or mistyped
    input is not reported as an output that "already exists". Nothing is imported or loaded."""
    if spec and is_model_file(spec):
        require_input(spec, what="checkpoint", kind="file")
    if weights and is_checkpoint_path(weights):  # DEFAULT and weight names are no paths
        require_input(weights, what="checkpoint", kind="file")
