"""Loading and saving checkpoints safely.

A torchkit checkpoint is a dict of tensors and plain Python values, so it loads with
`torch.load(..., weights_only=True)`: loading never runs code from the file. Arbitrary pickles
(a whole pickled `nn.Module`, say) load only with `trust_checkpoint=True` (`--trust-checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import stat
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from torchkit.core.io.errors import CheckpointError, TorchkitError, first_line
from torchkit.core.io.files import atomic_path, copy_bytes, require_input, torch_save
from torchkit.core.models.exported.formats import EXPORTED_PROGRAM, TORCHSCRIPT, sniff_format

# 2: googlenet and inception_v3 from torchvision's weights are trained without transform_input
# (1: with it, when trained from its named weights; see transform_input.py).
FORMAT_VERSION = 2
CHECKPOINT_KEYS = (
    "format_version",
    "torchkit_version",
    "arch",
    "num_classes",
    "classes",
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "epoch",
    "global_step",
    "best_metric",
    "rng_state",
    "config",
    "preprocess",
)


class UntrustedPickleError(CheckpointError):
    """A pickle that `weights_only` refused without --trust-checkpoint: `blocked` is the class
    or function it holds (`nets.Net`), so that a command can say what the file is in its own
    words (train: a pickled model it cannot train from, whatever the trust)."""

    def __init__(self, message: str, hint: str | None = None, blocked: str = "object") -> None:
        super().__init__(message, hint)
        self.blocked = blocked

    def __reduce__(self):
        return (type(self), (self.message, self.hint, self.blocked))


def load_checkpoint(path: str | os.PathLike, *, trust_checkpoint: bool = False) -> Any:
    """Load a checkpoint on the CPU, whatever device it was saved from. A torchkit checkpoint
    this torchkit cannot read as it was meant (`check_torchkit_checkpoint`) is refused."""

    loaded = _load_checkpoint(path, trust_checkpoint=trust_checkpoint)
    if is_torchkit_checkpoint(loaded):
        check_torchkit_checkpoint(loaded, str(path))
    return loaded


def check_torchkit_checkpoint(checkpoint: Mapping[str, Any], source: str) -> None:
    """Refuse a torchkit checkpoint of a format newer than this torchkit's (its keys may mean
    other things: loaded anyway, it could be fed or labelled wrongly without a word), and one
    whose class names no torchkit writes (`stored_class_names`: a class None or ""). A class
    named twice is no damage: torchvision's ImageNet names hold two `crane`s and two `maillot`s,
    and eval refuses only data whose class is such a name."""
    from torchkit.core.models.stored_classes import stored_class_names
    from torchkit.core.models.written_versions import check_written_version

    check_written_version(
        checkpoint.get("format_version"),
        checkpoint.get("torchkit_version"),
        FORMAT_VERSION,
        where=f"checkpoint {source}",
        field="format_version",
        kind="checkpoint format",
        error=CheckpointError,
    )
    stored_class_names(checkpoint.get("classes"), f"checkpoint {source}", CheckpointError)


def _load_checkpoint(path: str | os.PathLike, *, trust_checkpoint: bool) -> Any:
    source = require_input(path, what="checkpoint", kind="file")
    if source.stat().st_size == 0:
        raise CheckpointError(f"checkpoint is empty (0 bytes): {source}")
    if _holds_safetensors(source):
        return _load_safetensors(source)
    kind = sniff_format(source)
    _refuse_exported_programs(source, kind)
    if not trust_checkpoint:
        _refuse_code_archives(source, kind)
    refuse_expanding_archive(source)
    _refuse_plain_pickle(source)
    try:
        if kind == TORCHSCRIPT:  # what torch.load hands it to, with a warning
            from torchkit.core.models.exported.loading import torchscript_module

            return torchscript_module(source)[0]
        with warnings.catch_warnings():
            # Said of any pickle of protocol 3 or later (plain pickle.dump, a torch.save with
            # pickle_protocol=4): a raw warning on the user's terminal, an error under -W error.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            newer = not trust_checkpoint and _pickle_protocol(source) in (3, 4, 5)
            if source.suffix.lower() != ".safetensors":
                return _torch_load(source, trust_checkpoint, newer)
            # torch.save's file under a .safetensors name: torch.load would hand a path that
            # ends so to safetensors (recent torch), so it gets the open file.
            with open(source, "rb") as handle:
                return _torch_load(handle, trust_checkpoint, newer)
    except TorchkitError:  # a TorchScript file's torchkit record of a newer torchkit
        raise
    except pickle.UnpicklingError as error:
        blocked = None if trust_checkpoint else blocked_global(error)
        if blocked is None:
            # weights_only also fails on garbage ("Unsupported operand"): that is not a model.
            raise _unreadable(source, error, trusted=trust_checkpoint) from error
        if blocked.startswith("__main__."):  # --trust-checkpoint would fail to import it
            from torchkit.core.models.usercode import script_class

            what, hint = script_class(blocked.removeprefix("__main__."))
            raise CheckpointError(f"cannot unpickle checkpoint {source}: {what}", hint) from error
        raise UntrustedPickleError(
            f"{source} holds a pickled {blocked}, not only tensors and plain values",
            "pass --trust-checkpoint to load it anyway, only if you trust where it came from",
            blocked,
        ) from error
    except (AttributeError, ImportError) as error:  # trusted pickle of a class we cannot import
        if not trust_checkpoint:  # weights_only imports nothing: a damaged file's own call
            raise _unreadable(source, error, trusted=False) from error
        from torchkit.core.models.usercode import unimportable_pickle

        unimportable = unimportable_pickle(source, error)
        if unimportable is not None:  # which module or class, and where it was looked for
            what, hint = unimportable
            raise CheckpointError(f"cannot unpickle checkpoint {source}: {what}", hint) from error
        raise CheckpointError(
            f"cannot unpickle checkpoint {source}: {first_line(error)}",
            "it pickles classes from the code that saved it; make that code importable, "
            "or save a state_dict instead",
        ) from error
    except Exception as error:  # truncated or junk files raise anything (KeyError, EOFError...)
        raise _unreadable(source, error, trusted=trust_checkpoint) from error


def _torch_load(file: Any, trust_checkpoint: bool, newer_protocol: bool = False) -> Any:
    """torch.load on the CPU; without trust, weights only, plus the harmless classes of
    common training checkpoints (`safe_classes`). `newer_protocol`: a file pickled with
    protocol 3, 4 or 5, which the weights-only unpickler reads rewritten as protocol 2 (it
    reads protocol 3 itself, but not its bytes)."""
    import torch

    if trust_checkpoint:
        return torch.load(file, map_location="cpu", weights_only=False)
    with _allowed_classes(safe_classes()):
        if newer_protocol:
            from torchkit.core.models.newer_pickles import load_newer_protocol

            return load_newer_protocol(file)
        return torch.load(file, map_location="cpu", weights_only=True)


@contextlib.contextmanager
def _allowed_classes(classes: list[type]) -> Iterator[None]:
    """`classes` allowed to a weights-only load while the block runs, as
    `torch.serialization.safe_globals` (torch 2.5) allows them; torch 2.4, which has only
    add/get/clear_safe_globals, gets its earlier list back the same way."""
    import torch

    serialization = torch.serialization
    if hasattr(serialization, "safe_globals"):
        with serialization.safe_globals(classes):
            yield
        return
    before = serialization.get_safe_globals()
    serialization.add_safe_globals(classes)
    try:
        yield
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)


def safe_classes() -> list[type]:
    """Classes a weights-only load rebuilds besides tensors and plain values: timm's train.py
    (and many another script) saves its options as an `argparse.Namespace` beside the weights,
    a bag of attributes whose values are held to the same rules (no code runs)."""
    import argparse

    return [argparse.Namespace]


def _refuse_code_archives(source: Path, kind: str | None) -> None:
    """TorchScript and torch.export archives (`kind`, from `sniff_format`) run code from the
    file when loaded: say so, rather than torch's "Cannot use weights_only=True with
    TorchScript archives"."""
    if kind in (TORCHSCRIPT, EXPORTED_PROGRAM):
        what = "a TorchScript archive" if kind == TORCHSCRIPT else "a torch.export archive"
        raise CheckpointError(
            f"{source} is {what}, whose code runs when it is loaded",
            "pass --trust-checkpoint to load it, only if you trust where it came from",
        )


def _refuse_exported_programs(source: Path, kind: str | None) -> None:
    """A torch.export archive holds no pickle torch.load reads, trusted or not: refused before
    the trust check, whose hint (--trust-checkpoint) would only lead to torch's "failed
    locating file data.pkl"."""
    if kind == EXPORTED_PROGRAM:
        raise CheckpointError(
            f"{source} is a torch.export archive, not a checkpoint",
            "give the checkpoint it was exported from",
        )


# torch.save stores its records as they are; deflated ones (a file rezipped by another tool) are
# read, but the memory they take is what they expand to, not the file's size.
EXPANSION_LIMIT = 20
EXPANSION_FLOOR = 64 * 2**20


def refuse_expanding_archive(source: Path) -> None:
    """Refuse a zip archive whose compressed records expand to far more than the file holds
    (a zip bomb: a few MB that torch.load would unpack into GBs of memory) before reading it."""
    import zipfile

    try:
        with zipfile.ZipFile(source) as archive:
            packed = [i for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
    except (OSError, zipfile.BadZipFile):  # not a zip archive (a legacy pickle): nothing to check
        return
    expanded = sum(info.file_size for info in packed)
    compressed = sum(info.compress_size for info in packed)
    if expanded > EXPANSION_FLOOR and expanded > EXPANSION_LIMIT * max(compressed, 1):
        raise CheckpointError(
            f"{source} holds compressed records that would expand from "
            f"{compressed / 1e6:,.1f} MB to {expanded / 1e6:,.1f} MB in memory",
            "torch.save never compresses its records: give the file torch.save wrote",
        )


def blocked_global(error: BaseException) -> str | None:
    """The class or function weights_only refused, if any: "Unsupported global: GLOBAL
    torch.nn...Linear", or "unsupported GLOBAL posix.system whose module posix is blocked"."""
    match = re.search(r"Unsupported global: GLOBAL (\S+)|unsupported GLOBAL (\S+)", str(error))
    if match:
        return match.group(1) or match.group(2)
    # Other wordings of a refused class (not the advice text, which names safe_globals).
    return "object" if re.search(r"\bGLOBAL\b|Unsupported class", str(error)) else None


def _code_file_hint(source: Path) -> str:
    """A model's code given where a model file goes (MODEL, --weights, a file to convert): how
    code and weights are each given; a file that `module:NAME` would not import (code.py,
    hidden by Python's own `code`) is to be renamed, not named so."""
    from torchkit.core.models.usercode import module_found_first

    module = source.stem
    found = module_found_first(module, source)
    if found is not None:
        return (
            f"a model in Python code is named module:Callable, but {module}:NAME would import "
            f"{found}, found first, not {source.name}: rename the file, such as to "
            f"{module}_model.py, named {module}_model:NAME from the folder that holds it"
        )
    return (
        f"a model in Python code is named module:Callable, {module}:NAME for the function or "
        f"class NAME in {source.name}, from the folder that holds it; its weights are the "
        ".pt/.pth file torch.save wrote"
    )


def _unreadable(source: Path, error: BaseException, *, trusted: bool) -> CheckpointError:
    if _holds_text_pickle(source):
        if not trusted:
            return CheckpointError(
                f"cannot read checkpoint {source}: it is in torch.save's legacy format with "
                "pickle protocol 0 or 1, which the safe loader (weights_only) cannot read",
                "pass --trust-checkpoint to load it, only if you trust where it came from",
            )
        return CheckpointError(
            f"cannot read checkpoint {source}: it is in torch.save's legacy format with pickle "
            f"protocol 0 or 1, which this PyTorch cannot read ({type(error).__name__}: "
            f"{first_line(error)})",
            "save it again with a plain torch.save, without pickle_protocol, where it loads",
        )
    protocol = None if trusted else _pickle_protocol(source)
    operand = re.search(r"Unsupported operand \d+ \((\w+)\)", str(error))
    if protocol is not None and protocol >= 3 and operand:
        # Read as protocol 2 (`newer_pickles`): what it holds has no protocol 2 spelling that
        # the weights-only unpickler reads (a set, a bytearray), as it has none in protocol 2.
        legacy = "" if _is_zip(source) else " in torch.save's legacy format"
        return CheckpointError(
            f"cannot read checkpoint {source}: it is pickled{legacy} with protocol {protocol} "
            f"and holds a value the safe loader (weights_only) cannot read (pickle opcode "
            f"{operand.group(1)})",
            "save the weights alone, the model's state_dict, with torch.save, or pass "
            "--trust-checkpoint to load it, only if you trust where it came from",
        )
    if not _looks_saved_by_torch(source):  # a text file, an image: torch's error says nothing
        hint = "give the .pt/.pth file torch.save wrote, or a .safetensors file"
        if source.suffix == ".py" and source.stem.isidentifier():
            hint = _code_file_hint(source)
        return CheckpointError(
            f"cannot read checkpoint {source}: not a PyTorch checkpoint (neither torch.save's "
            "zip archive nor a pickle)",
            hint,
        )
    text = str(error)
    # weights_only wraps the real reason in a paragraph of advice; keep only the reason.
    detail = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    reason = (detail.group(1) if detail else first_line(error).split(". ")[0]).strip()
    name = type(error).__name__
    return CheckpointError(
        f"cannot read checkpoint {source}: {name if reason == name else f'{name}: {reason}'}",
        "the file may be truncated or not a PyTorch checkpoint",
    )


def is_torch_save_file(source: Path) -> bool:
    """Whether `source` starts as a file torch.save wrote does: a zip archive, or a pickle of
    torch's legacy format (of any protocol). Unknown (unreadable, a FIFO): True."""
    return _looks_saved_by_torch(source) or _holds_text_pickle(source)


def _looks_saved_by_torch(source: Path) -> bool:
    """Whether `source` starts as torch.save's files do: a zip archive, or a pickle of protocol
    2 or later (torch's legacy format). Unknown (unreadable, a FIFO): True."""
    try:
        if not stat.S_ISREG(os.stat(source).st_mode):
            return True
        with open(source, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return True
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"


def _refuse_plain_pickle(source: Path) -> None:
    """A pickle written by pickle.dump, not torch.save (no zip archive, no magic number first),
    which torch.load reads in no mode: said so, where the safe loader named a class it refused
    and hinted --trust-checkpoint, which then failed with "Invalid magic number"."""
    try:
        with open(source, "rb") as handle:
            head = handle.read(32)
    except OSError:
        return
    if head[:1] == b"\x80" and _LEGACY_MAGIC not in head:
        raise CheckpointError(
            f"cannot read checkpoint {source}: it is a plain pickle (pickle.dump), not a file "
            "torch.save wrote, which torch.load does not read",
            "save the model's state_dict with torch.save",
        )


def _is_zip(source: Path) -> bool:
    try:
        with open(source, "rb") as handle:
            return handle.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _pickle_protocol(source: Path) -> int | None:
    """The pickle protocol of a torch.save file: of its `data.pkl` record in the zip format,
    of the file itself in the legacy one (its magic number first); None where it does not
    start as a pickle of protocol 2 or later (PROTO, then the number), is no torch.save file
    or cannot be read."""
    import zipfile

    try:
        if _is_zip(source):
            with zipfile.ZipFile(source) as archive:
                name = next(
                    (n for n in archive.namelist() if n.rsplit("/", 1)[-1] == "data.pkl"), None
                )
                if name is None:
                    return None
                with archive.open(name) as record:
                    head = record.read(2)
        else:
            with open(source, "rb") as handle:
                head = handle.read(32)
            if _LEGACY_MAGIC not in head:  # a plain pickle.dump, which torch.load never reads
                return None
    except (OSError, zipfile.BadZipFile, RuntimeError, ValueError):
        return None
    return head[1] if len(head) >= 2 and head[0] == 0x80 else None


# The magic number torch.save's legacy format pickles first (LONG1's little-endian bytes).
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")


# torch.save's legacy (non-zip) format pickles its magic number first: with protocol 0 or 1 that
# is the text opcode LONG, `L119547037146038801333356L` (0x1950a86a20f9469cfc6c).
_LEGACY_TEXT_MAGIC = b"L119547037146038801333356L"


def _holds_text_pickle(source: Path) -> bool:
    """Whether `source` is torch.save's legacy format written with pickle protocol 0 or 1
    (`pickle_protocol=0, _use_new_zipfile_serialization=False`): weights_only reads only
    protocol 2 and later."""
    try:
        with open(source, "rb") as handle:
            return handle.read(len(_LEGACY_TEXT_MAGIC)) == _LEGACY_TEXT_MAGIC
    except OSError:
        return False


def _holds_safetensors(source: Path) -> bool:
    """Whether to read `source` as safetensors, by what it holds rather than its name: a
    safetensors file renamed `.pt`/`.bin` is one, a torch.save file named `.safetensors` is not.
    Any other file named `.safetensors` (M.SAFETENSORS too) is, for safetensors to say what is
    wrong with it."""
    try:
        with open(source, "rb") as handle:
            if _safetensors_layout(handle, source.stat().st_size):
                return True
            handle.seek(0)
            head = handle.read(4)
    except OSError:
        return source.suffix.lower() == ".safetensors"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":  # torch.save's zip or pickle
        return False
    return source.suffix.lower() == ".safetensors"


# safetensors' own bound on its JSON header.
_SAFETENSORS_HEADER_LIMIT = 100_000_000


def _safetensors_layout(handle: BinaryIO, size: int) -> bool:
    """Whether the open file is laid out as safetensors: its JSON header's length (8 bytes,
    little-endian), then that header, an object. Judged before a pickle's first byte: a header
    of 128 + 256k bytes makes the file start with pickle's 0x80, so one safetensors file in 256
    was read as a pickle; a pickle whose ninth byte is `{` fails the JSON."""
    head = handle.read(9)
    if len(head) < 9 or head[8:9] != b"{":
        return False
    length = int.from_bytes(head[:8], "little")
    if length > min(size - 8, _SAFETENSORS_HEADER_LIMIT):
        return False
    header = head[8:] + handle.read(length - 1)
    try:
        return isinstance(json.loads(header), dict)
    except ValueError:  # not JSON, or not UTF-8
        return False


def _load_safetensors(source: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from torchkit.core.io.non_utf8_names import name_native_code_opens

    try:
        with name_native_code_opens(source) as name:
            return load_file(name, device="cpu")
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"cannot read safetensors file {source}: {error}") from error


def save_checkpoint(checkpoint: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write atomically: killing the process at any moment leaves the previous file intact."""
    save_checkpoint_as(checkpoint, [path])


def save_checkpoint_as(checkpoint: Mapping[str, Any], paths: list[str | os.PathLike]) -> None:
    """One checkpoint under each of `paths` (best.pt, last.pt...), each replaced atomically and
    in order, serialized once: the first regular file written is copied to the others
    (`files.copy_bytes`, in the kernel). A resnet50 checkpoint with its optimiser's state is
    about 300 MB, which an epoch that was the best serialized twice. Copies, not hard links:
    a user who rewrites best.pt in place (`torch.save` to its path) must not change last.pt."""
    written: Path | None = None
    for path in map(Path, paths):
        if written is not None:
            copy_checkpoint(written, path)
            continue
        with atomic_path(path) as tmp:
            torch_save(dict(checkpoint), tmp)
        if path.is_file():  # not a FIFO or device: a file to copy from
            written = path


def copy_checkpoint(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy a checkpoint file, atomically (a copy cut short leaves no half file)."""
    with atomic_path(target) as tmp:
        copy_bytes(source, tmp)


def on_cpu(obj: Any, *, copy: bool = False) -> Any:
    """`obj` with every tensor in its dicts, lists and tuples on the CPU: a checkpoint of a GPU
    run then loads with a plain `torch.load` on any machine (torch.save copies each tensor to
    host memory anyway). CPU tensors are kept as they are, not copied, unless `copy`: then
    nothing in the result shares memory with `obj` (a snapshot that training cannot change)."""
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            return obj.detach().cpu()
        return obj.detach().clone() if copy else obj
    if isinstance(obj, dict):
        return {key: on_cpu(value, copy=copy) for key, value in obj.items()}
    if isinstance(obj, list):
        return [on_cpu(value, copy=copy) for value in obj]
    if isinstance(obj, tuple):
        return tuple(on_cpu(value, copy=copy) for value in obj)
    return obj


def is_torchkit_checkpoint(obj: Any) -> bool:
    return isinstance(obj, Mapping) and "format_version" in obj and "model" in obj


# Where training scripts keep a model's weights in their checkpoints, in the order looked for.
MODEL_WEIGHT_KEYS = ("state_dict", "model", "model_state_dict", "net", "module")


def extract_state_dict(obj: Any) -> dict:
    """The model weights of a torchkit checkpoint, a plain state dict, a common wrapper
    (`{'state_dict': ...}`, `{'model': ...}`), or a pickled module (trusted loading only)."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return strip_module_prefix(obj.state_dict())
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"a checkpoint holding a {type(obj).__name__} has no model weights")
    if is_torchkit_checkpoint(obj):
        return strip_module_prefix(obj["model"])
    if obj and all(isinstance(value, torch.Tensor) for value in obj.values()):
        return strip_module_prefix(obj)
    # The model's own weights before an EMA copy beside them, as in torchkit's checkpoints
    # (--ema picks the copy) and timm's tools.
    for key in (*MODEL_WEIGHT_KEYS, "model_ema"):
        if key in obj:
            return extract_state_dict(obj[key])
    if not obj:  # an empty dict: no keys to list
        raise CheckpointError(
            "the checkpoint holds no model weights: it is empty, with no keys",
            "give the file the model's weights were saved to",
        )
    raise CheckpointError(
        "cannot find model weights in the checkpoint",
        f"its top-level keys are: {', '.join(map(str, list(obj)[:10]))}",
    )


def strip_module_prefix(
    state_dict: Mapping[str, Any], *, what: str = "the model weights in the checkpoint"
) -> dict:
    """Remove the `module.` prefix (DataParallel/DDP) and `_orig_mod.` (torch.compile).
    `what` names the weights in an error (the EMA weights of a checkpoint)."""
    if not isinstance(state_dict, Mapping):  # a damaged checkpoint: `model` a list, say
        raise CheckpointError(
            f"{what} are a {type(state_dict).__name__}, not a state dict",
            "the file is damaged or not a checkpoint of model weights",
        )
    cleaned = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):  # a model's state_dict() names every tensor
            raise CheckpointError(
                f"{what} hold a key {key!r} ({type(key).__name__}), not a parameter or buffer name",
                "a state dict of model weights has string keys; the file holds something else",
            )
        # Wrappers nest in either order: DDP(compile(m)) and compile(DDP(m)).
        while key.startswith(("module.", "_orig_mod.")):
            key = key.partition(".")[2]
        cleaned[key] = value
    return cleaned


def strip_wrapper_prefix(model, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """`state_dict` without the one prefix all its keys share (`model.`, `net.`...) when that
    prefix is all that keeps them from being `model`'s own keys: the weights of a model kept
    as an attribute of a training wrapper (a Lightning module's `self.model`), as its
    `state_dict()` saves them. Anything else is returned as it is, for `load_weights_into` to
    judge."""
    own = set(model.state_dict())
    keys = [str(key) for key in state_dict]
    if not keys or own <= set(keys):
        return state_dict
    prefix = keys[0].partition(".")[0] + "."
    if prefix == "." or not all(key.startswith(prefix) for key in keys):
        return state_dict
    stripped = {key[len(prefix) :]: value for key, value in state_dict.items()}
    # BatchNorm counters may be absent (weights of PyTorch < 0.4.1): load_weights_into adds them.
    absent = own - set(stripped)
    if not set(stripped) <= own or any(not k.endswith("num_batches_tracked") for k in absent):
        return state_dict
    return stripped


# torchvision's DenseNet files (densenet121-a639ec97.pth... as it downloads them) name the layers
# of a dense layer `norm.1`, `conv.2`: names a module can no longer have (torchvision's pattern).
_DENSENET_OLD_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$"
)


def with_densenet_key_names(model, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """`state_dict` with the old DenseNet names (`denselayer1.norm.1.weight`) renamed as the model
    has them (`denselayer1.norm1.weight`), as torchvision renames them when it loads its own
    weights; other keys, and names the model does not have, are kept."""
    own = model.state_dict()
    renamed, changed = {}, False
    for key, value in state_dict.items():
        match = _DENSENET_OLD_KEY.match(str(key))
        new = f"{match.group(1)}{match.group(2)}" if match else key
        if new != key and new in own and key not in own:
            renamed[new], changed = value, True
        else:
            renamed[key] = value
    return renamed if changed else state_dict


def load_weights_into(model, state_dict: Mapping[str, Any], *, source: str = "checkpoint") -> None:
    """`load_state_dict(strict=True)` with a one-line summary of what does not fit. A state
    dict saved before PyTorch 0.4.1 has no BatchNorm `num_batches_tracked`: accepted, as torch
    accepts it, the counters left as the model has them (0 in a new model)."""
    import torch

    own = model.state_dict()
    state_dict = with_module_versions(own, with_batch_counters(model, state_dict))
    not_tensors = [
        f"{key} is a {type(state_dict[key]).__name__}"
        for key in own
        if key in state_dict
        and isinstance(own[key], torch.Tensor)
        and not isinstance(state_dict[key], torch.Tensor)
    ]
    if not_tensors:
        raise CheckpointError(
            f"the weights in {source} are not all tensors: {len(not_tensors)} are not "
            f"(first: {not_tensors[0]})",
            "the file is damaged or not a checkpoint of this model",
        )
    # `load_state_dict` copies integer values into float weights without a word: a model of
    # rounded weights (all zeros, uniform probabilities) where the file was damaged or not ours.
    not_float = [
        f"{key} is {str(state_dict[key].dtype).removeprefix('torch.')}"
        for key in own
        if key in state_dict
        and own[key].is_floating_point()
        and not (state_dict[key].is_floating_point() or state_dict[key].is_complex())
    ]
    if not_float:
        raise CheckpointError(
            f"the weights in {source} are not all floating point: {len(not_float)} are not "
            f"(first: {not_float[0]})",
            "the file is damaged or not a checkpoint of this model",
        )
    missing = [key for key in own if key not in state_dict]
    unexpected = [key for key in state_dict if key not in own]
    mismatched = [
        f"{key} is {tuple(state_dict[key].shape)} in the weights, {tuple(own[key].shape)} in "
        "the model"
        for key in own
        if key in state_dict
        and hasattr(state_dict[key], "shape")
        and tuple(state_dict[key].shape) != tuple(own[key].shape)
    ]
    if missing or unexpected or mismatched:
        parts = []
        if mismatched:
            parts.append(f"{len(mismatched)} shape mismatches (first: {mismatched[0]})")
        if missing:
            parts.append(f"{len(missing)} missing keys (first: {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys (first: {unexpected[0]})")
        # The head follows the weights (--num-classes cannot change what fits): a layer of
        # another shape is another architecture, or one whose layers follow the image size
        # (convnet, ViT) built for another size. MODEL is --model, or convert-syncbn's SOURCE.
        raise CheckpointError(
            f"the weights in {source} do not fit the model: " + "; ".join(parts),
            "check the model and --image-size" if mismatched else "check the model",
        )
    model.load_state_dict(state_dict, strict=True)


def with_module_versions(
    own: Mapping[str, Any], state_dict: Mapping[str, Any]
) -> Mapping[str, Any]:
    """`state_dict` with the model's own per-module versions (`own._metadata`) when it has none
    (a checkpoint's plain dict, a safetensors file): torchvision's MNASNet refuses weights
    without a version, and the weights of a model built by this torch are of its versions."""
    from collections import OrderedDict

    metadata = getattr(own, "_metadata", None)
    if metadata is None or getattr(state_dict, "_metadata", None) is not None:
        return state_dict
    versioned = OrderedDict(state_dict)
    versioned._metadata = metadata
    return versioned


def with_batch_counters(model, state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """`state_dict` with each `num_batches_tracked` it lacks taken from `model`, as torch's
    BatchNorm fills it in for a state dict of PyTorch < 0.4.1 (which had no such buffer)."""
    from collections import OrderedDict

    from torch.nn.modules.batchnorm import _NormBase

    absent = {}
    for name, module in model.named_modules():
        counter = getattr(module, "num_batches_tracked", None)
        key = f"{name}.num_batches_tracked" if name else "num_batches_tracked"
        if isinstance(module, _NormBase) and counter is not None and key not in state_dict:
            absent[key] = counter
    if not absent:
        return state_dict
    filled = OrderedDict(state_dict)
    filled.update(absent)
    metadata = getattr(state_dict, "_metadata", None)  # torch's per-module versions, kept
    if metadata is not None:
        filled._metadata = metadata
    return filled
