"""`convert checkpoint`: any checkpoint -> a plain CPU state dict in .pt or .safetensors.

Loading goes through `core.checkpoint.load_checkpoint` (CPU `map_location`, `weights_only=True`
unless trusted). The state dict is picked out of a training checkpoint, DataParallel/DDP's
`module.` prefix is stripped when every key has it, floating-point tensors can be cast, and the
result is written atomically. safetensors cannot store two names for one memory, so tensors that
share storage (tied weights) are written as copies: every key loads back with
`load_state_dict(strict=True)`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkit.core.io.claims import reporting_write_errors
from torchkit.core.io.errors import CheckpointError, UsageError
from torchkit.core.io.file_outputs import check_output_file
from torchkit.core.io.files import atomic_path, require_input, safetensors_save, torch_save
from torchkit.core.io.overlap import InputPath
from torchkit.core.models.checkpoint import is_torchkit_checkpoint, load_checkpoint

log = logging.getLogger("torchkit")

TORCH_EXTENSIONS = (".pt", ".pth", ".bin", ".ckpt")
OUTPUT_EXTENSIONS = (*TORCH_EXTENSIONS, ".safetensors")
DTYPES = ("float16", "bfloat16", "float32")
# Where training scripts keep the weights, most usual first (timm, Lightning, torchvision refs).
STATE_DICT_KEYS = (
    "state_dict",
    "model",
    "model_state_dict",
    "model_state",
    "net",
    "network",
    "module",
    "weights",
    "params",
    "model_ema",
    "state_dict_ema",
    "ema",
)
# Exponential-moving-average copies kept beside `state_dict` (timm): its tools take `state_dict`.
EMA_KEYS = ("model_ema", "state_dict_ema", "ema")
AUTO_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP, torch.compile
SAFETENSORS_METADATA = "__metadata__"  # the header entry of a .safetensors file, no tensor


@dataclass
class CheckpointReport:
    """What `convert_checkpoint` wrote. `values` counts the numbers in all tensors: a state
    dict does not say which tensors are parameters and which are buffers (BatchNorm running
    statistics, counters), so this is not a parameter count (`torchkit summary` gives that)."""

    source: str
    destination: str
    key: str | None
    tensors: int
    values: int
    bytes_before: int
    bytes_after: int
    file_bytes_before: int
    file_bytes_after: int
    keys_renamed: int
    prefix_stripped: str | None
    prefix_added: str | None
    dtype: str | None
    tensors_cast: int
    shared_tensors_copied: int
    # finite values that the cast made infinite (float16 holds at most 65,504)
    values_overflowed: int = 0
    skipped_entries: list[str] = field(default_factory=list)
    not_taken: list[str] = field(default_factory=list)  # EMA weights beside the state_dict taken

    def to_dict(self) -> dict:
        return dict(
            self.__dict__,
            skipped_entries=list(self.skipped_entries),
            not_taken=list(self.not_taken),
        )


def _is_tensor_dict(value: Any) -> bool:
    import torch

    return (
        isinstance(value, Mapping)
        and len(value) > 0
        and all(isinstance(v, torch.Tensor) for v in value.values())
    )


def _is_module(value: Any) -> bool:
    import torch

    return isinstance(value, torch.nn.Module)


def _keys_hint(obj: Mapping) -> str:
    keys = [str(k) for k in obj]
    if not keys:
        return "it is empty, with no keys: give the file the weights were saved to"
    return "its top-level keys are: " + ", ".join(keys[:12]) + (" ..." if len(keys) > 12 else "")


def _lookup(obj: Any, key: str) -> Any:
    """`obj[key]`, or a dotted path `a.b` through nested dicts when `key` itself is absent."""
    if isinstance(obj, Mapping) and key in obj:
        return obj[key]
    node = obj
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            hint = _keys_hint(obj) if isinstance(obj, Mapping) else None
            raise UsageError(f"the checkpoint has no key {key!r}", hint)
        node = node[part]
    return node


def pick_state_dict(obj: Any, key: str | None = None) -> tuple[Mapping, str | None]:
    """The state dict inside a checkpoint and the key it was found under (None: top level).

    Without `key` it must be unambiguous: a flat dict of tensors; a torchkit checkpoint's
    `model`; or the one entry that is a dict of tensors (entries with the usual names, such as
    `state_dict` or `model`, first). Several candidates (say `model` and `model_ema`) need `key`,
    except `state_dict` beside EMA copies only (`model_ema`, `state_dict_ema`): `state_dict`, as
    timm's tools take it (`ema_alternatives` names the others for a note).
    """
    if _is_module(obj):
        return obj.state_dict(), None
    if key is not None:
        value = _lookup(obj, key)
        if _is_module(value):
            return value.state_dict(), key
        if not isinstance(value, Mapping) or not value:
            raise CheckpointError(f"checkpoint[{key!r}] is a {type(value).__name__}, not weights")
        return value, key
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"the checkpoint holds a {type(obj).__name__}, not model weights")
    if _is_tensor_dict(obj):
        return obj, None
    if is_torchkit_checkpoint(obj) and _is_tensor_dict(obj["model"]):
        return obj["model"], "model"
    candidates = [k for k, v in obj.items() if _is_tensor_dict(v) or _is_module(v)]
    known = [k for k in candidates if k in STATE_DICT_KEYS]
    chosen = known if known else candidates
    if len(chosen) > 1 and "state_dict" in chosen and set(chosen) <= {"state_dict", *EMA_KEYS}:
        chosen = ["state_dict"]
    if len(chosen) == 1:
        value = obj[chosen[0]]
        return (value.state_dict() if _is_module(value) else value), str(chosen[0])
    if not chosen:
        raise CheckpointError("cannot find a state dict in the checkpoint", _keys_hint(obj))
    raise CheckpointError(
        "the checkpoint holds several state dicts: " + ", ".join(map(str, chosen)),
        "pick one with --key " + str(chosen[0]),
    )


def ema_alternatives(obj: Any, picked: str | None) -> list[str]:
    """The EMA weights a checkpoint holds beside the `state_dict` taken without --key."""
    if picked != "state_dict" or not isinstance(obj, Mapping):
        return []
    return [k for k in EMA_KEYS if k in obj and (_is_tensor_dict(obj[k]) or _is_module(obj[k]))]


def rename_keys(
    names: list[str], strip_prefix: str | None, add_prefix: str
) -> tuple[dict[str, str], str | None]:
    """{old: new} and the prefix actually stripped.

    `strip_prefix=None` strips `module.` (and torch.compile's `_orig_mod.`) only when every key
    has it, as DataParallel/DDP leave them; "" strips nothing; any other text is stripped from
    the keys that start with it.
    """
    stripped = ""
    renamed = {name: name for name in names}
    if strip_prefix is None:
        current = list(names)
        changed = True
        while changed and current:
            changed = False
            for prefix in AUTO_PREFIXES:
                if all(name.startswith(prefix) for name in current):
                    current = [name[len(prefix) :] for name in current]
                    stripped += prefix
                    changed = True
        renamed = dict(zip(names, current, strict=True))
        partial = sum(name.startswith("module.") for name in current)
        if partial:
            log.warning(
                f"{partial} of {len(names)} keys start with 'module.' and were left as they are "
                "(pass --strip-prefix module. to strip it where present)"
            )
    elif strip_prefix:
        hits = [name for name in names if name.startswith(strip_prefix)]
        if not hits:
            log.warning(f"no key starts with {strip_prefix!r}; nothing was stripped")
        else:
            stripped = strip_prefix
        renamed = {
            name: name[len(strip_prefix) :] if name.startswith(strip_prefix) else name
            for name in names
        }
    if add_prefix:
        renamed = {old: add_prefix + new for old, new in renamed.items()}
    seen: dict[str, str] = {}
    for old, new in renamed.items():
        if not new:
            raise CheckpointError(f"stripping the prefix leaves the key {old!r} empty")
        if new in seen:
            raise CheckpointError(
                f"renaming makes two keys the same: {seen[new]!r} and {old!r} -> {new!r}",
                "check --strip-prefix and --add-prefix",
            )
        seen[new] = old
    return renamed, stripped or None


def _values_overflowed(original: Any, cast: Any) -> int:
    """How many finite values of `original` are infinite in `cast` (a narrower dtype's range:
    float32's 1e6 is float16's inf, which a model's outputs then turn into NaN)."""
    import torch

    if torch.finfo(cast.dtype).max >= torch.finfo(original.dtype).max:
        return 0
    return int((torch.isinf(cast) & torch.isfinite(original)).sum())


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _unshare(tensors: dict[str, Any]) -> int:
    """Copy tensors that share memory with another one (safetensors stores each name's own
    bytes); return how many were copied."""
    seen: set[int] = set()
    copied = 0
    for name, tensor in tensors.items():
        if tensor.numel() == 0:
            continue
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen or _nbytes(tensor) != tensor.untyped_storage().nbytes():
            tensors[name] = tensor.clone()
            copied += storage in seen
        seen.add(storage)
    return copied


def _check_writable(name: str, tensor: Any) -> None:
    """Refuse tensors whose values cannot be written as a plain dense tensor (meta tensors hold
    none: written as they are, the file would hold no weights)."""
    import torch

    if tensor.is_meta:
        raise CheckpointError(f"{name!r} is a meta tensor: it holds no values to convert")
    if tensor.is_quantized or tensor.layout != torch.strided:
        kind = str(tensor.dtype if tensor.is_quantized else tensor.layout).removeprefix("torch.")
        raise CheckpointError(
            f"{name!r} is a {kind} tensor: convert checkpoint writes plain dense tensors",
            "save it with `.dequantize()` or `.to_dense()` first",
        )


def write_safetensors(tensors: dict[str, Any], target: Path) -> tuple[int, int]:
    """Write the dense, contiguous CPU `tensors` to `target` as .safetensors, atomically;
    return how many shared tensors were copied (`tensors` is changed in place) and the file's
    size (0 for a FIFO or /dev/null, which have none)."""
    if SAFETENSORS_METADATA in tensors:  # written, a header no safetensors reader parses
        raise CheckpointError(
            f"the state dict has a key {SAFETENSORS_METADATA!r}, which .safetensors keeps "
            "for its metadata",
            "write .pt, or rename every key with --add-prefix",
        )
    shared = _unshare(tensors)
    try:
        with atomic_path(target) as tmp, reporting_write_errors(target):
            safetensors_save(tensors, tmp, metadata={"format": "pt"})
            file_bytes = tmp.stat().st_size  # a FIFO or /dev/null has no size to ask
    except (ValueError, RuntimeError) as error:
        raise CheckpointError(f"cannot write {target} as safetensors: {error}") from None
    return shared, file_bytes


def output_extension(target: Path, to: str | None, extensions: tuple[str, ...], named: str) -> str:
    """The format of the checkpoint written at `target`: `to` ("pt", "safetensors"), else the
    extension of `target`, one of `extensions` (`named` says them). A name without one
    (/dev/stdout, /dev/null, a FIFO) needs `to`; a `to` the extension contradicts is refused."""
    suffix = target.suffix.lower()
    if to is not None:
        wanted = f".{to.lower()}"
        if wanted not in extensions:
            raise UsageError(f"--to {to} cannot be written here: DST is {named}")
        if suffix and suffix != wanted and not (suffix in TORCH_EXTENSIONS and to == "pt"):
            raise UsageError(f"--to {to} contradicts the extension of {target}")
        return wanted
    if suffix not in extensions:
        raise UsageError(
            f"cannot tell the output format from {target.name!r}",
            f"end DST with {named}; .pth, .bin and .ckpt count as .pt; or pass --to for a name "
            "without one",
        )
    return suffix


def convert_checkpoint(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    key: str | None = None,
    strip_prefix: str | None = None,
    add_prefix: str = "",
    dtype: str | None = None,
    trust_checkpoint: bool = False,
    force: bool = False,
    to: str | None = None,
) -> CheckpointReport:
    """Load `src` on the CPU, pick the state dict, rename and cast it, write `dst`
    (.safetensors, or a plain state dict for .pt/.pth/.bin/.ckpt; `to`, "safetensors" or "pt",
    for a name without one: /dev/stdout, /dev/null)."""
    source = require_input(src, what="checkpoint", kind="file")
    target = Path(dst)
    extension = output_extension(target, to, OUTPUT_EXTENSIONS, ".safetensors or .pt")
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    # Before the (slow) load: DST is never the source, and an existing DST needs --force.
    check_output_file(target, force, [InputPath.of(source, "source checkpoint")])
    import torch

    obj = load_checkpoint(source, trust_checkpoint=trust_checkpoint)
    state, picked = pick_state_dict(obj, key)
    not_taken = ema_alternatives(obj, picked) if key is None else []
    tensors: dict[str, Any] = {}
    skipped = []
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            skipped.append(str(name))
            continue
        if str(name) in tensors:  # 1 and "1": one of them would be dropped
            raise CheckpointError(f"the state dict has two keys that read {str(name)!r}")
        _check_writable(str(name), value)
        tensors[str(name)] = value
    if skipped:
        log.warning(
            f"{len(skipped)} entries are not tensors and were left out: {', '.join(skipped[:5])}"
            + (" ..." if len(skipped) > 5 else "")
        )
    if not tensors:
        raise CheckpointError("the state dict holds no tensors")

    renamed, stripped = rename_keys(list(tensors), strip_prefix, add_prefix)
    cast_to = getattr(torch, dtype) if dtype else None
    out: dict[str, Any] = {}
    cast = 0
    overflowed: dict[str, int] = {}
    for old, tensor in tensors.items():
        tensor = tensor.detach()
        if cast_to is not None and tensor.is_floating_point() and tensor.dtype != cast_to:
            narrowed = tensor.to(cast_to)
            count = _values_overflowed(tensor, narrowed)
            if count:
                overflowed[renamed[old]] = count
            tensor = narrowed
            cast += 1
        out[renamed[old]] = tensor if tensor.is_contiguous() else tensor.contiguous()
    if overflowed:
        names, count = list(overflowed), sum(overflowed.values())
        largest = torch.finfo(cast_to).max
        shown = f"{largest:,.0f}" if largest < 1e6 else f"{largest:.3g}"  # 65,504; 3.4e+38
        log.warning(
            f"casting to {dtype} made {count:,} finite value{'s' if count > 1 else ''} "
            f"infinite (beyond +-{shown}) in "
            + ", ".join(names[:5])
            + (f" and {len(names) - 5} more tensors" if len(names) > 5 else "")
            + (" (--dtype bfloat16 keeps float32's range)" if dtype == "float16" else "")
        )

    shared = 0
    if extension == ".safetensors":
        shared, file_bytes = write_safetensors(out, target)
    else:
        with atomic_path(target) as tmp, reporting_write_errors(target):
            torch_save(out, tmp)
            file_bytes = tmp.stat().st_size

    return CheckpointReport(
        source=str(source),
        destination=str(target),
        key=picked,
        tensors=len(out),
        values=sum(t.numel() for t in out.values()),
        bytes_before=sum(_nbytes(t) for t in tensors.values()),
        bytes_after=sum(_nbytes(t) for t in out.values()),
        file_bytes_before=source.stat().st_size,
        file_bytes_after=file_bytes,
        keys_renamed=sum(old != new for old, new in renamed.items()),
        prefix_stripped=stripped,
        prefix_added=add_prefix or None,
        dtype=dtype,
        tensors_cast=cast,
        shared_tensors_copied=shared,
        values_overflowed=sum(overflowed.values()),
        skipped_entries=skipped,
        not_taken=not_taken,
    )
