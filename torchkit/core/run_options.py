"""How an inference command (eval, predict, extract-features) runs its model: batches, loader
workers, device, precision and where images are decoded. Declared once here; each command's
request inherits them."""

from __future__ import annotations

from dataclasses import dataclass


# kw_only: the fields go after a subclass's own positional fields, in __init__, so they can be
# inherited by requests whose first fields have no default (`FeatureRequest(model, images, out)`).
@dataclass(kw_only=True)
class RunOptions:
    batch_size: int = 64  # images per forward pass
    workers: int | None = None  # data-loader processes; None: a sensible number for this machine
    device: str = "auto"  # auto, cpu, cuda, cuda:N or mps (core.device)
    amp: bool = False  # autocast mixed precision
    amp_dtype: str = "auto"  # auto, bf16 or fp16 (core.device.resolve_amp_dtype)
    channels_last: bool = False  # the model and its inputs in the channels-last memory format
    # exact: PIL decodes, resizes and crops in the loader workers; device: JPEGs are decoded,
    # resized and cropped on the device (core.device_decode.DeviceEvalTransform)
    decode: str = "exact"
