"""The options eval, predict, extract-features and benchmark share, declared once here (help,
flags, choices, ranges, defaults: core.option_specs) and generated into each command by
cli.run_options:

- InferenceOptions: how a command runs its model (batches, loader workers, device, precision,
  where images are decoded). A request contains one as its `run` (`request.run.batch_size`).
- PreprocessOverrides: what the command line changes of a model's own preprocessing (crop
  size, resize, crop mode, interpolation, mean and std or a --stats file); eval, predict and
  extract-features.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchkit.core.data.decode import INFERENCE_DECODES
from torchkit.core.data.preprocessing import CROP_MODES, INTERPOLATIONS, parse_floats
from torchkit.core.input_size import parse_image_side
from torchkit.core.io.errors import UsageError
from torchkit.core.option_specs import option, option_specs
from torchkit.core.runtime.cpus import check_workers
from torchkit.core.runtime.device import AMP_DTYPES

if TYPE_CHECKING:
    from torchkit.core.models.spec import ModelSpec

# The largest batch torch takes: a batch is sliced with a Python index, its shape is a C long.
MAX_BATCH_SIZE = sys.maxsize


@dataclass(kw_only=True)
class InferenceOptions:
    """How a command runs its model."""

    batch_size: int = option(64, flags=("--batch-size", "-b"), minimum=1, help="Images per batch.")
    # None: a sensible number for this machine
    workers: int | None = option(None, shared=True)
    device: str = option("auto", shared=True)  # auto, cpu, cuda, cuda:N or mps (core.device)
    amp: bool = option(False, help="Mixed precision (autocast; the dtype: --amp-dtype).")
    amp_dtype: str = option(  # core.device.resolve_amp_dtype
        "auto",
        choices=AMP_DTYPES,
        help="With --amp. auto: bf16 on CPUs and on GPUs with native bf16 (Ampere and later), "
        "else fp16.",
    )
    channels_last: bool = option(False, help="Run the model in the channels-last memory format.")
    # exact: PIL decodes, resizes and crops in the loader workers; device: JPEGs are decoded,
    # resized and cropped on the device (core.device_decode.DeviceEvalTransform)
    decode: str = option(
        "exact",
        choices=INFERENCE_DECODES,
        help="Where images are decoded, resized and cropped. exact: PIL, in the loader workers "
        "(torchvision's eval transform). device: JPEGs on the --device (nvJPEG on CUDA, "
        "libjpeg-turbo on CPUs), resized there with PIL's filters, within 1 level of 255 of "
        "exact on CPUs for photos (nvJPEG's decode differs by a few levels); other files as "
        "exact.",
    )


RunOptions = InferenceOptions  # its former name


def check_batch_fits(batch_size: int) -> None:
    """Refuse (usage error) a --batch-size past what a batch can hold (train, benchmark and the
    inference commands)."""
    if batch_size > MAX_BATCH_SIZE:
        raise UsageError(
            f"--batch-size {batch_size} is more than a batch can hold ({MAX_BATCH_SIZE})"
        )


def check_inference_options(run: InferenceOptions) -> None:
    """Refuse (usage error) the values of the shared options no run can use, before any work."""
    if run.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {run.batch_size}")
    check_batch_fits(run.batch_size)
    if run.workers is not None and run.workers < 0:
        raise UsageError(f"--workers must be 0 or more, not {run.workers}")
    check_workers(run.workers)


def check_torch_options_apply(run: InferenceOptions, exported_format: str | None) -> None:
    """Refuse --amp and --channels-last for an ONNX file: onnxruntime runs it in the precision
    it was exported in, outside torch's autocast, so the run would be recorded as mixed
    precision while every number is the float32 run's; and it takes its input as a plain
    array, in the layout it chooses, so --channels-last would change nothing."""
    if exported_format != "onnx":  # core.models.exported.formats.ONNX
        return
    if run.amp:
        raise UsageError(
            "--amp has no effect on an ONNX model: onnxruntime runs it in the precision it was "
            "exported in",
            "drop --amp; a float16 file runs in half precision: torchkit export ... "
            "--dtype float16",
        )
    if run.channels_last:
        raise UsageError(
            "--channels-last has no effect on an ONNX model: onnxruntime chooses its own "
            "memory layout",
            "drop --channels-last",
        )


@dataclass(kw_only=True)
class PreprocessOverrides:
    """None: the model's own (its checkpoint's, else its weights' or architecture's)."""

    image_size: int | None = option(
        None,
        flags=("--image-size", "--input-size"),
        metavar="N",
        parse=parse_image_side,
        show_default=False,
        help="Input size (centre crop). Default: the checkpoint's or the weights', else the "
        "model's standard one (224 for plain state dicts). Also spelled --input-size; C,N,N "
        "crops N x N, C being the model's input channels (refused when it is not).",
    )
    # The C of --image-size C,N,N (None for N): refused by `resolve_spec` unless it is the
    # model's input channels.
    image_channels: int | None = None
    resize_size: int | None = option(
        None,
        minimum=1,
        show_default=False,
        help="Shorter side before the centre crop (both sides for a model whose crop mode is "
        "squash, the longer one for border). Default: the checkpoint's, else keeps the "
        "model's resize/crop ratio (256/224 for ImageNet models).",
    )
    crop_mode: str | None = option(
        None,
        choices=CROP_MODES,
        show_default=False,
        help="How images are fitted to --image-size: center = the shorter side resized to "
        "--resize-size, then a centre crop; squash = both sides resized (the aspect ratio is not "
        "kept), then a centre crop; border = the longer side resized, the rest padded with the "
        "mean colour. Default: the model file's, else a timm model's own, else center.",
    )
    interpolation: str | None = option(
        None,
        choices=INTERPOLATIONS,
        show_default=False,
        help="Resampling of the resize. Default: the model file's or its weights' (a timm "
        "model's own), else bilinear.",
    )
    # --mean, --std and --stats are read together (core.preprocessing.mean_std_options).
    mean: tuple[float, ...] | None = option(
        None,
        parse=parse_floats,
        show_default=False,
        help="Normalisation mean per channel, e.g. 0.485,0.456,0.406 (or one value). "
        "Default: the checkpoint's, else the model's (ImageNet's).",
    )
    std: tuple[float, ...] | None = option(
        None,
        parse=parse_floats,
        show_default=False,
        help="Normalisation std per channel, e.g. 0.229,0.224,0.225 (or one value). "
        "Default: the checkpoint's, else the model's (ImageNet's).",
    )
    stats: str | None = option(None, shared=True)  # the file mean and std were read from

    def model_spec(self, model: str | None, **fields: Any) -> ModelSpec:
        """MODEL with these options over its own preprocessing, and the model's other `fields`
        (--weights, --ema...): the one ModelSpec eval, predict and extract-features resolve."""
        from torchkit.core.models.spec import ModelSpec  # the resolver: not at start-up

        return ModelSpec(model=model, **dataclasses.asdict(self), **fields)


INFERENCE_OPTIONS = option_specs(InferenceOptions)
PREPROCESS_OPTIONS = option_specs(PreprocessOverrides)
