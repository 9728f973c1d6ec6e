"""The torchvision transforms a `Preprocess` makes: the eval recipe, and the train recipe with
its augmentation policies and decode modes."""

from __future__ import annotations

from typing import NamedTuple

from torchkit.core.data.preprocessing import Preprocess
from torchkit.core.io.errors import UsageError

AUGMENT_POLICIES = (
    "none",
    "basic",
    "trivialaugment",
    "randaugment",
    "autoaugment",
    "augmix",
)
# --autoaugment-policy: which of torchvision's AutoAugment policies `--augment autoaugment` runs.
AUTOAUGMENT_POLICIES = ("imagenet", "cifar10", "svhn")


def eval_transform(preprocess: Preprocess, *, pixels: bool = False, decode: str = "exact"):
    """Resize, centre-crop (`eval_crop_steps`: torchvision's eval recipe, or timm's squash or
    border crop mode), to tensor, normalise.
    With `pixels` the transform stops at the 8-bit crop, a uint8 (C, H, W) tensor, and the
    consumer normalises whole batches on its device (`core.decode.model_input`): the same
    float32 values, bit for bit, from a quarter of the bytes. `decode="device"` (with `pixels`):
    JPEG files reach the batch as their bytes, to be decoded, resized and cropped where the
    model runs (`core.device_decode.DeviceEvalTransform`); other images as with `exact`.
    The 8-bit crops are made without torchvision (`EvalCrop`): importing it took about 0.5 s
    of the start of predict and eval on a folder of images."""
    from torchkit.core.data.decode import INFERENCE_DECODES, PixelTensor

    if decode not in INFERENCE_DECODES:
        raise UsageError(f"unknown --decode {decode!r}: choose {' or '.join(INFERENCE_DECODES)}")
    if decode == "device":
        from torchkit.core.data.device_decode import DeviceEvalTransform

        if not pixels:
            raise ValueError("decode='device' gives 8-bit crops: it needs pixels=True")
        return DeviceEvalTransform(eval_transform(preprocess, pixels=True), preprocess)

    if pixels:
        return Steps([EvalCrop(preprocess), PixelTensor()])
    from torchvision import transforms as T

    crop = eval_crop_steps(preprocess)
    return T.Compose([*crop, T.ToTensor(), T.Normalize(preprocess.mean, preprocess.std)])


class Steps:
    """Transforms applied in turn (torchvision's Compose, without importing torchvision)."""

    def __init__(self, steps: list) -> None:
        self.transforms = steps

    def __call__(self, image):
        for step in self.transforms:
            image = step(image)
        return image

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.transforms))})"


class EvalCrop:
    """`eval_crop_steps` on a PIL image with PIL alone (`core.eval_crop.crop_image`): the same
    pixels for 8-bit RGB and L images, the modes torchkit's datasets give; any other mode goes
    through torchvision's steps (its padding keeps a palette)."""

    def __init__(self, preprocess: Preprocess) -> None:
        self.preprocess = preprocess
        self._steps: list | None = None

    def __call__(self, image):
        from torchkit.core.data.decode import pil_resample
        from torchkit.core.data.eval_crop import crop_image

        p = self.preprocess
        if image.mode in ("RGB", "L"):
            resample = pil_resample(p.interpolation)
            return crop_image(image, p.resize_size, p.image_size, resample, p.crop_mode, p.mean)
        if self._steps is None:
            self._steps = eval_crop_steps(p)
        for step in self._steps:
            image = step(image)
        return image

    def __repr__(self) -> str:
        p = self.preprocess
        return (
            f"{type(self).__name__}(resize_size={p.resize_size}, size={p.image_size}, "
            f"crop_mode={p.crop_mode!r}, interpolation={p.interpolation!r})"
        )


def eval_crop_steps(preprocess: Preprocess) -> list:
    """The resize and centre crop of the eval transform, on PIL images, in the preprocessing's
    crop mode (`core.eval_crop`): timm's own steps for `squash` and `border`, torchvision's
    Resize + CenterCrop for `center`."""
    from torchvision import transforms as T

    mode = T.InterpolationMode(preprocess.interpolation)
    if preprocess.crop_mode == "border":
        return [BorderCrop(preprocess)]
    # A pair resizes both sides (squash), an int the shorter one (center).
    resize = preprocess.resize_size
    size = (resize, resize) if preprocess.crop_mode == "squash" else resize
    return [
        T.Resize(size, interpolation=mode, antialias=True),
        T.CenterCrop(preprocess.image_size),
    ]


class BorderCrop:
    """timm's `border` crop mode on a PIL image: the longer side resized to resize_size, then a
    centre crop of image_size, a side shorter than it padded with the mean colour."""

    def __init__(self, preprocess: Preprocess) -> None:
        self.resize_size, self.size = preprocess.resize_size, preprocess.image_size
        self.interpolation, self.mean = preprocess.interpolation, tuple(preprocess.mean)

    def __call__(self, image):
        from torchvision.transforms import functional as F

        from torchkit.core.data.eval_crop import border_fill, crop_start, resized_size

        width, height = resized_size(*image.size, self.resize_size, "border")
        mode = F.InterpolationMode(self.interpolation)
        image = F.resize(image, [height, width], interpolation=mode, antialias=True)
        left, top = crop_start(width, self.size), crop_start(height, self.size)
        if left < 0 or top < 0:  # pad (left, top, right, bottom) up to the crop
            padding = [
                max(0, -left),
                max(0, -top),
                max(0, self.size - width + left),
                max(0, self.size - height + top),
            ]
            fill = border_fill(self.mean, len(image.getbands()))
            image = F.pad(image, padding, fill=fill[0] if len(fill) == 1 else fill)
            left, top = max(0, left), max(0, top)
        return F.crop(image, top, left, self.size, self.size)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resize_size={self.resize_size}, size={self.size}, "
            f"interpolation={self.interpolation!r})"
        )


def train_transform(
    preprocess: Preprocess,
    *,
    flip: bool = True,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    augment: str = "basic",
    randaugment_magnitude: int = 9,
    augmix_severity: int = 3,
    autoaugment_policy: str = "imagenet",
    random_erasing: float = 0.0,
    decode: str = "exact",
    decode_cpu_share: float = 0.0,
):
    """torchvision's train recipe: RandomResizedCrop + horizontal flip (`basic`), then a policy
    (`trivialaugment`, `randaugment` at `randaugment_magnitude`, `autoaugment`'s ImageNet
    policy, or its `autoaugment_policy`, `augmix` at `augmix_severity`), to tensor,
    normalise, RandomErasing with probability `random_erasing`. `none` is the eval transform
    (resize, centre crop). Random draws come from torch's generator, which the training loaders
    seed per image and epoch.

    `decode="fast"` (with a random crop): the same transform on PIL images, but `make_dataset`
    decodes JPEG files at 1/2, 1/4 or 1/8 of their size where the crop keeps `image_size`
    pixels (`core.decode`); `exact` decodes every image whole. `device` (flip and crop only):
    the fast path's transform on PIL images and non-JPEG files, while JPEG files reach the
    batch as their bytes, crop box and flip, decoded on the training device
    (`core.device_decode`), but for `decode_cpu_share` of them, which take the fast path."""
    from torchvision import transforms as T

    from torchkit.core.data.decode import check_decode

    if augment not in AUGMENT_POLICIES:
        raise UsageError(f"unknown --augment {augment!r}", "use " + ", ".join(AUGMENT_POLICIES))
    check_decode(decode)
    if decode == "device":
        from torchkit.core.data.device_decode import DeviceDecodeTransform, check_device_decode

        check_device_decode(augment, random_erasing)
        fast = _fast_train_transform(preprocess, flip, crop_scale, augment, PolicyLevels(), 0.0)
        return DeviceDecodeTransform(
            fast,
            flip=flip,
            interpolation=preprocess.interpolation,
            cpu_share=decode_cpu_share,
        )
    mode = T.InterpolationMode(preprocess.interpolation)
    levels = PolicyLevels(randaugment_magnitude, augmix_severity, autoaugment_policy)
    if decode == "fast" and augment != "none":
        return _fast_train_transform(preprocess, flip, crop_scale, augment, levels, random_erasing)
    if augment == "none":
        steps = eval_crop_steps(preprocess)
    else:
        steps = [
            T.RandomResizedCrop(
                preprocess.image_size, scale=crop_scale, interpolation=mode, antialias=True
            )
        ]
        if flip:
            steps.append(T.RandomHorizontalFlip())
    steps += _policy_steps(augment, levels, mode)
    steps += [T.ToTensor(), T.Normalize(preprocess.mean, preprocess.std)]
    if random_erasing > 0:
        steps.append(T.RandomErasing(p=random_erasing))
    return T.Compose(steps)


class PolicyLevels(NamedTuple):
    """How strong the policies that take a level are, --randaugment-magnitude and
    --augmix-severity (torchvision's reference script's defaults), and which AutoAugment policy
    runs."""

    randaugment_magnitude: int = 9
    augmix_severity: int = 3
    autoaugment_policy: str = "imagenet"


def _policy_steps(augment: str, levels: PolicyLevels, mode) -> list:
    """The --augment policy's own transform (none for `basic` and `none`), built as torchvision's
    reference script builds it."""
    from torchvision import transforms as T

    if augment == "trivialaugment":
        return [T.TrivialAugmentWide(interpolation=mode)]
    if augment == "randaugment":
        return [T.RandAugment(magnitude=levels.randaugment_magnitude, interpolation=mode)]
    if augment == "augmix":
        return [T.AugMix(severity=levels.augmix_severity, interpolation=mode)]
    if augment == "autoaugment":
        policy = T.AutoAugmentPolicy(levels.autoaugment_policy)
        return [T.AutoAugment(policy, interpolation=mode)]
    return []


def _fast_train_transform(
    preprocess: Preprocess,
    flip: bool,
    crop_scale: tuple[float, float],
    augment: str,
    levels: PolicyLevels,
    random_erasing: float,
):
    """`train_transform`'s steps with its crop a `ReducedDecodeCrop`, its flip and ToTensor +
    Normalize leaner equivalents (bit for bit the same), in the same order, drawing the same
    random numbers."""
    from torchvision import transforms as T

    from torchkit.core.data.decode import (
        FileTrainTransform,
        HorizontalFlip,
        NormalizedTensor,
        ReducedDecodeCrop,
    )

    mode = T.InterpolationMode(preprocess.interpolation)
    crop = ReducedDecodeCrop(
        preprocess.image_size, scale=crop_scale, interpolation=preprocess.interpolation
    )
    steps: list = [HorizontalFlip()] if flip else []
    steps += _policy_steps(augment, levels, mode)
    after = [T.RandomErasing(p=random_erasing)] if random_erasing > 0 else []
    return FileTrainTransform(crop, steps, NormalizedTensor(preprocess.mean, preprocess.std), after)
