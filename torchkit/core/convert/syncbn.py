"""BatchNorm <-> SyncBatchNorm conversion of a model, with a report of every layer touched.

`convert_batchnorm(model, to="sync")` is what `train --sync-bn` uses before wrapping the model in
DDP; `to="bn"` turns SyncBatchNorm back into BatchNorm1d/2d/3d, which a model trained with
SyncBatchNorm needs to run on a CPU or one GPU without a process group.

The layers are replaced in place (every parent that holds one, so a layer shared by two parents
stays shared) and the new layer takes over the old one's Parameter and buffer objects: values,
requires_grad, dtype and device carry over exactly, and an optimizer built earlier still points at
the right tensors. Its hooks carry over too.

timm's BatchNormAct2d (normalisation, then its own `drop` and `act` layers) becomes timm's
SyncBatchNormAct, as timm's own converter makes it, and back: a plain SyncBatchNorm would drop the
activation from the model's forward pass. Any child module of a converted layer stays on it.

SyncBatchNorm accepts any input of 2 or more dimensions, so it forgets whether it replaced a
BatchNorm1d, 2d or 3d. Conversion records that on the layer (it survives pickling and deepcopy);
for a SyncBatchNorm made elsewhere the dimensionality is taken from an example forward pass when
one is given, else from the nearest convolution / linear / pooling / flatten layer registered
before it.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchkit.core.io.errors import CheckpointError, InputError, UsageError
from torchkit.core.models.image_size import image_size_refusal

log = logging.getLogger("torchkit")

# Instance attribute set on each SyncBatchNorm this module creates: 1, 2 or 3.
RECORDED_DIM_ATTR = "torchkit_batchnorm_dim"
# `checkpoint["config"][SYNC_BN_KEY]` tells `train --resume` to rebuild the model with SyncBN.
SYNC_BN_KEY = "sync_bn"
TARGETS = ("sync", "bn")


def _batchnorm_classes() -> dict[int, type]:
    from torch import nn

    return {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def _sync_twins() -> list[tuple[type, type]]:
    """(BatchNorm subclass, the SyncBatchNorm subclass that keeps its forward) pairs: timm's
    BatchNormAct2d and SyncBatchNormAct. Read only where timm is already imported (a model
    holding its layers imported it), so converting a torchvision model never imports timm."""
    norm_act = sys.modules.get("timm.layers.norm_act")
    plain = getattr(norm_act, "BatchNormAct2d", None)
    sync = getattr(norm_act, "SyncBatchNormAct", None)
    return [(plain, sync)] if plain is not None and sync is not None else []


def _is_plain_batchnorm(module: Any) -> bool:
    from torch import nn

    return isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, nn.SyncBatchNorm
    )


def _batchnorm_dim(module: Any) -> int | None:
    """1, 2 or 3 for a BatchNorm layer (subclasses included), None for anything else."""
    for dim, cls in _batchnorm_classes().items():
        if isinstance(module, cls):
            return dim
    return None


def find_batchnorm_layers(
    model: Any, *, sync: bool = False, seen: set[int] | None = None
) -> list[dict]:
    """One row per BatchNorm layer (SyncBatchNorm layers with `sync=True`), in registration
    order: name, type, num_features, affine, track_running_stats. `seen`: ids of layers listed
    already (in another model sharing them), left out; each listed layer's id is added."""
    from torch import nn

    seen = set() if seen is None else seen
    rows = []
    for name, module in model.named_modules():
        wanted = isinstance(module, nn.SyncBatchNorm) if sync else _is_plain_batchnorm(module)
        if wanted and id(module) not in seen:
            seen.add(id(module))
            rows.append(_describe(name, module))
    return rows


def _describe(name: str, module: Any) -> dict:
    return {
        "name": name or "(model)",
        "type": type(module).__name__,
        "num_features": int(module.num_features),
        "affine": bool(module.affine),
        "track_running_stats": bool(module.track_running_stats),
    }


def convert_batchnorm(
    module: Any,
    *,
    to: str = "sync",
    process_group: Any = None,
    example_inputs: Sequence[Any] | None = None,
    converted: dict[int, tuple[Any, Any]] | None = None,
) -> tuple[Any, list[dict]]:
    """Replace BatchNorm layers by SyncBatchNorm (`to="sync"`) or back (`to="bn"`).

    Returns the converted module (the same object, unless `module` itself is a BatchNorm layer)
    and one row per converted layer: name, from_type, to_type, num_features, affine,
    track_running_stats, dim_source (how the BatchNorm dimensionality is known).
    `process_group` (`to="sync"`) scopes the synchronisation of every SyncBatchNorm layer of
    the result, the new ones and those the model held already, which keep their objects (their
    parameters, buffers and hooks) and take the group in place: converting a model again for a
    group made with `torch.distributed.new_group` leaves no layer synchronising over another
    one. Without it (None) new layers synchronise over the world and the others keep theirs;
    `torch.distributed.group.WORLD` brings every layer back to the world.
    `example_inputs` (positional inputs of the model) tell `to="bn"` which dimensionality each
    unrecorded SyncBatchNorm layer sees. `converted` (id -> (old layer, new layer)), shared by
    the calls for several models that share layers: a layer converted in an earlier model takes
    the same replacement here, unlisted, and the layers converted here are added.
    """
    if to not in TARGETS:
        raise UsageError(f"unknown conversion target {to!r}", "use 'sync' or 'bn'")
    from torch import nn

    converted = {} if converted is None else converted
    wanted = _is_plain_batchnorm if to == "sync" else lambda m: isinstance(m, nn.SyncBatchNorm)
    found = [(n, m) for n, m in module.named_modules() if wanted(m)]
    done = {id(m): converted[id(m)][1] for _, m in found if converted.get(id(m), (None,))[0] is m}
    targets = [(n, m) for n, m in found if id(m) not in done]
    if to == "sync":
        _refuse_uninitialised(targets)
        replacements = {}
        rows = []
        for name, old in targets:
            new = _to_sync(old, process_group)
            _refuse_missing_state(name, old, new)
            replacements[id(old)] = new
            row = _conversion_row(name, old, new)
            row["dim_source"] = None  # only reverting has to work the dimensionality out
            rows.append(row)
    else:
        dims = _deduce_dims(module, targets, example_inputs)
        replacements = {}
        rows = []
        for name, old in targets:
            dim, source = dims[id(old)]
            new = _to_batchnorm(old, dim)
            _refuse_missing_state(name, old, new)
            replacements[id(old)] = new
            row = _conversion_row(name, old, new)
            row["dim_source"] = source
            rows.append(row)
    # Done once every layer is known to convert: a refused conversion leaves the hooks where
    # they were (a load_state_dict pre-hook would be handed a layer thrown away) and warns of
    # nothing.
    for name, old in targets:
        _take_over_hooks(replacements[id(old)], old)
        warning = _subclass_warning(name, old, replacements[id(old)])
        if warning:
            log.warning(warning)
    converted.update({id(m): (m, replacements[id(m)]) for _, m in targets})
    result = _replace(module, {**done, **replacements})
    if to == "sync" and process_group is not None:
        # A SyncBatchNorm the model held (timm's SyncBatchNormAct is one) is not rebuilt, as
        # torch's converter rebuilds it (its hooks lost): it would stay on its old group, where
        # a group passed is meant for every layer. It takes the group in place.
        for layer in result.modules():
            if isinstance(layer, nn.SyncBatchNorm):
                layer.process_group = process_group
    return result, rows


def _subclass_warning(name: str, old: Any, new: Any) -> str | None:
    """The warning for a subclass of BatchNorm (of SyncBatchNorm, reverting) whose replacement
    is a plain layer, as torch's converter makes it: the weights, statistics and settings carry
    over, not what the subclass adds. Names what that is: its own forward() (the model computes
    something else), its extra state (`get_extra_state`: the state dict loses its
    `_extra_state` key), its other methods, its public attributes. None for the layers that
    have a like-for-like replacement (BatchNorm1d/2d/3d, SyncBatchNorm, timm's pair)."""
    from torch import nn

    standard = {nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm}
    standard.update(cls for pair in _sync_twins() for cls in pair)
    if type(old) in standard:
        return None
    inherited = {cls for base in standard for cls in base.__mro__}
    own: set[str] = set()
    for cls in type(old).__mro__:
        if cls not in inherited:
            own.update(
                attr
                for attr, value in vars(cls).items()
                if not attr.startswith("__")
                and (callable(value) or isinstance(value, (property, staticmethod, classmethod)))
            )
    lost = []
    if "forward" in own:
        lost.append("its own forward()")
    if "get_extra_state" in own:
        lost.append("its extra state (get_extra_state)")
    methods = sorted(own - {"forward", "get_extra_state", "set_extra_state"})
    if methods:
        lost.append(f"its method{'s' * (len(methods) > 1)} {', '.join(methods)}")
    # (not those every BatchNorm or SyncBatchNorm has: a SyncBatchNorm's `process_group`)
    plain = {*vars(nn.SyncBatchNorm(1, device="meta")), *vars(nn.BatchNorm2d(1, device="meta"))}
    attributes = sorted(
        attr
        for attr in vars(old)
        if not attr.startswith("_") and attr not in {*vars(new), *plain, RECORDED_DIM_ATTR}
    )
    if attributes:
        lost.append(f"its attribute{'s' * (len(attributes) > 1)} {', '.join(attributes)}")
    kind = "SyncBatchNorm" if isinstance(old, nn.SyncBatchNorm) else "BatchNorm"
    said = f"{name or 'the model'} ({type(old).__name__}, a {kind} subclass) becomes a plain "
    said += f"{type(new).__name__}, "
    if not lost:
        return said + "the same but for its class (it adds no method and no attribute)"
    lost_said = ", ".join(lost[:-1]) + " nor " + lost[-1] if len(lost) > 1 else lost[0]
    return said + f"which keeps its weights and statistics, not {lost_said}"


def _refuse_uninitialised(targets: list[tuple[str, Any]]) -> None:
    from torch.nn.parameter import UninitializedParameter

    for name, layer in targets:
        if any(isinstance(p, UninitializedParameter) for p in layer.parameters(recurse=False)):
            raise UsageError(
                f"{name or 'the model'} is a lazy BatchNorm that has not seen any input",
                "run one forward pass before converting",
            )


def _refuse_missing_state(name: str, old: Any, new: Any) -> None:
    """A layer whose weight torch.nn.utils.prune or parametrize replaced (a `weight_orig`
    parameter and a hook, or a property) has no `weight` of its own to hand over: the new layer
    would keep its empty meta-device one, and the model would fail at its first forward pass
    (or be saved so). Refused before any layer is replaced."""
    missing = [
        key
        for key, tensor in (*new._parameters.items(), *new._buffers.items())
        if tensor is not None and key not in old._parameters and key not in old._buffers
    ]
    if missing:
        raise InputError(
            f"layer {name or '(model)'} ({type(old).__name__}) has no {' or '.join(missing)} of "
            "its own (pruned or parametrized with torch.nn.utils), so it cannot be converted",
            "make it permanent first with torch.nn.utils.prune.remove or "
            "torch.nn.utils.parametrize.remove_parametrizations, then convert",
        )


def _conversion_row(name: str, old: Any, new: Any) -> dict:
    described = _describe(name, old)
    return {
        "name": described["name"],
        "from_type": described["type"],
        "to_type": type(new).__name__,
        "num_features": described["num_features"],
        "affine": described["affine"],
        "track_running_stats": described["track_running_stats"],
    }


def _take_over_state(new: Any, old: Any) -> None:
    """Give `new` (built on the meta device, so nothing is allocated twice) the very Parameter
    and buffer objects of `old`, and its flags."""
    for name, param in old._parameters.items():
        new._parameters[name] = param
    for name, buffer in old._buffers.items():
        new._buffers[name] = buffer
    for name, child in old._modules.items():  # timm's `drop` and `act`, say
        new._modules[name] = child
    new._non_persistent_buffers_set = set(old._non_persistent_buffers_set)
    new.training = old.training
    if hasattr(old, "qconfig"):
        new.qconfig = old.qconfig


def _take_over_hooks(new: Any, old: Any) -> None:
    """The hooks registered on `old` act on `new` (torch's and timm's converters drop them): a
    timm features_only model's feature hooks (mobilenetv3's first feature map is a
    BatchNormAct2d's output), a quantization observer's, a user's. The hook dicts themselves
    move (the layers built here register none of their own), so a handle taken before still
    removes its hook. A load_state_dict pre-hook registered with the public method is handed
    its module through a weak reference, which is pointed at the new layer."""
    import weakref

    from torch import nn

    for attr in vars(nn.Module()):
        if "hook" in attr and attr in vars(old):
            vars(new)[attr] = vars(old)[attr]
    for hook in vars(new).get("_load_state_dict_pre_hooks", {}).values():
        held = getattr(hook, "module", None)
        if getattr(hook, "with_module", False) and callable(held) and held() is old:
            hook.module = weakref.ref(new)


def _to_sync(old: Any, process_group: Any) -> Any:
    from torch import nn

    cls = next((sync for plain, sync in _sync_twins() if isinstance(old, plain)), nn.SyncBatchNorm)
    new = cls(
        old.num_features,
        eps=old.eps,
        momentum=old.momentum,
        affine=old.affine,
        track_running_stats=old.track_running_stats,
        process_group=process_group,
        device="meta",
    )
    _take_over_state(new, old)
    setattr(new, RECORDED_DIM_ATTR, _batchnorm_dim(old))
    return new


def _to_batchnorm(old: Any, dim: int) -> Any:
    twin = next((plain for plain, sync in _sync_twins() if isinstance(old, sync)), None)
    cls = twin or _batchnorm_classes()[dim]
    new = cls(
        old.num_features,
        eps=old.eps,
        momentum=old.momentum,
        affine=old.affine,
        track_running_stats=old.track_running_stats,
        device="meta",
    )
    _take_over_state(new, old)
    if twin is not None:
        # SyncBatchNormAct applies the `drop` and `act` it holds; BatchNormAct2d always calls
        # both, and builds a ReLU for `act`: one the layer lacks must do nothing.
        from torch import nn

        for attr in ("drop", "act"):
            if attr not in old._modules:
                new._modules[attr] = nn.Identity()
    return new


def _replace(root: Any, replacements: Mapping[int, Any]) -> Any:
    """Swap every reference to a replaced layer, in every parent (shared layers stay shared)."""
    if id(root) in replacements:
        new_root = replacements[id(root)]
        _replace_children(new_root, replacements)
        return new_root
    _replace_children(root, replacements)
    return root


def _replace_children(root: Any, replacements: Mapping[int, Any]) -> None:
    # `modules()` yields each module once even when shared; edit `_modules` directly so the
    # slot keeps its position in registration order.
    # The new layers too: a converted layer keeps the children of the old one.
    for parent in [*root.modules(), *replacements.values()]:
        for attr, child in list(parent._modules.items()):
            if child is not None and id(child) in replacements:
                parent._modules[attr] = replacements[id(child)]


# --- which BatchNorm a SyncBatchNorm stood for -----------------------------------------------


def _dim_of_input(ndim: int) -> int | None:
    return {2: 1, 3: 1, 4: 2, 5: 3}.get(ndim)


def _layer_dim(module: Any) -> int | None:
    """The spatial dimensionality a layer works in, when its type says so."""
    from torch import nn

    recorded = getattr(module, RECORDED_DIM_ATTR, None)
    if recorded in (1, 2, 3):
        return recorded
    if isinstance(module, nn.Linear):
        return 1
    by_type = (
        (1, (nn.Conv1d, nn.ConvTranspose1d, nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d)),
        (2, (nn.Conv2d, nn.ConvTranspose2d, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d)),
        (3, (nn.Conv3d, nn.ConvTranspose3d, nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveAvgPool3d)),
    )
    for dim, types in by_type:
        if isinstance(module, types):
            return dim
    return _batchnorm_dim(module)


def _deduce_dims(
    model: Any, targets: list[tuple[str, Any]], example_inputs: Sequence[Any] | None
) -> dict[int, tuple[int, str]]:
    dims: dict[int, tuple[int, str]] = {}
    twins = tuple(sync for _, sync in _sync_twins())
    for _, layer in targets:
        recorded = getattr(layer, RECORDED_DIM_ATTR, None)
        if recorded in (1, 2, 3):
            dims[id(layer)] = (recorded, "recorded at conversion")
        elif twins and isinstance(layer, twins):  # timm's: only ever a BatchNormAct2d
            dims[id(layer)] = (2, f"its type ({type(layer).__name__})")
    missing = [(n, m) for n, m in targets if id(m) not in dims]
    if missing and example_inputs is not None:
        dims.update(_observe_input_dims(model, missing, example_inputs))
        missing = [(n, m) for n, m in targets if id(m) not in dims]
    if missing:
        dims.update(_neighbour_dims(model, missing))
    return dims


def _observe_input_dims(
    model: Any, layers: list[tuple[str, Any]], example_inputs: Sequence[Any]
) -> dict[int, tuple[int, str]]:
    """Run one eval-mode forward pass and look at the input each layer receives."""
    import torch

    seen: dict[int, tuple[int, str]] = {}

    def hook(layer, args):
        if args and isinstance(args[0], torch.Tensor):
            dim = _dim_of_input(args[0].dim())
            if dim is not None:
                seen.setdefault(id(layer), (dim, f"{args[0].dim()}-D input"))

    modes = {id(m): m.training for m in model.modules()}
    handles = [layer.register_forward_pre_hook(hook) for _, layer in layers]
    try:
        model.eval()
        with torch.no_grad():
            model(*example_inputs)
    except Exception as error:
        if len(example_inputs) == 1:  # a batch of square images too small for the model
            sample = example_inputs[0]
            refusal = image_size_refusal(
                model, "the model", tuple(sample.shape), error, dtype=sample.dtype
            )
            if refusal is not None:
                raise refusal from error
        shapes = ", ".join(str(tuple(getattr(x, "shape", ()))) for x in example_inputs)
        raise UsageError(
            f"the model cannot run on an input of shape {shapes}: {error}".splitlines()[0],
            "check --input-size",
        ) from error
    finally:
        for handle in handles:
            handle.remove()
        for m in model.modules():
            m.training = modes[id(m)]
    return seen


def _output_dim(module: Any) -> int | None:
    """The dimensionality of what a layer hands on: a Flatten to the last dimension leaves
    (N, C) or (N, C, L), BatchNorm1d's input, whatever it was given (a head's pooling, then
    Flatten, then BatchNorm1d); any other layer's is its own."""
    from torch import nn

    if isinstance(module, nn.Flatten):
        return 1 if module.end_dim == -1 and module.start_dim in (1, 2) else None
    return _layer_dim(module)


def _neighbour_dims(model: Any, layers: list[tuple[str, Any]]) -> dict[int, tuple[int, str]]:
    """The dimensionality of the nearest layer of known dimensionality registered before each
    SyncBatchNorm (or after it, for one that comes first)."""
    ordered = list(model.named_modules())
    wanted = {id(m) for _, m in layers}
    found: dict[int, tuple[int, str]] = {}
    for index, (name, layer) in enumerate(ordered):
        if id(layer) not in wanted or id(layer) in found:
            continue
        # Walked outwards from the layer without copying the list: a copy per layer made a
        # model of thousands of layers quadratic.
        earlier, later = range(index - 1, -1, -1), range(index + 1, len(ordered))
        before = ((*ordered[at], _output_dim(ordered[at][1])) for at in earlier)
        after = ((*ordered[at], _layer_dim(ordered[at][1])) for at in later)
        for neighbour_name, neighbour, dim in itertools.chain(before, after):
            if id(neighbour) in wanted:
                continue
            if dim is not None:
                found[id(layer)] = (dim, f"like {neighbour_name} ({type(neighbour).__name__})")
                break
        else:
            raise UsageError(
                f"cannot tell whether {name or 'the model'} stands for BatchNorm1d, 2d or 3d",
                "give an example input size with --input-size so a forward pass shows it",
            )
    return found


# --- checkpoints -----------------------------------------------------------------------------


def checkpoint_uses_sync_bn(checkpoint: Mapping[str, Any]) -> bool:
    """True when a torchkit checkpoint is marked to be rebuilt with SyncBatchNorm."""
    config = checkpoint.get("config") or {}
    return bool(isinstance(config, Mapping) and config.get(SYNC_BN_KEY, False))


def mark_checkpoint(checkpoint: Mapping[str, Any], *, sync: bool) -> dict:
    """A copy of a torchkit checkpoint whose config says whether `train --resume` should rebuild
    the model with SyncBatchNorm. BatchNorm and SyncBatchNorm have the same state_dict keys, so
    the weights themselves need no change."""
    marked = dict(checkpoint)
    config = dict(marked.get("config") or {})
    config[SYNC_BN_KEY] = bool(sync)
    marked["config"] = config
    return marked


# --- the convert-syncbn command --------------------------------------------------------------


def check_outputs(
    source: str | os.PathLike,
    destination: str | os.PathLike | None = None,
    output: str | os.PathLike | None = None,
    *,
    weights: str | None = None,
    force: bool = False,
) -> None:
    """Check every output of `convert-syncbn` before any work: DST and the report (`-o`) may
    not be SRC, the weights, nor each other, and replace an existing file only with `force`."""
    from torchkit.core.convert.checkpoint import TORCH_EXTENSIONS  # DST is a torch.save file
    from torchkit.core.io.file_outputs import check_output_file
    from torchkit.core.io.overlap import check_distinct_outputs
    from torchkit.core.io.special_files import is_special_file
    from torchkit.core.models import model_inputs, require_model_files

    # The inputs first: a missing SRC is not reported as a DST that "already exists".
    if destination is not None:
        _require_saved_model(source)
    require_model_files(os.fspath(source), weights)
    inputs = model_inputs(os.fspath(source), weights)
    if destination is not None:
        named = Path(destination)  # a FIFO or /dev/null takes the bytes whatever its name
        if named.suffix.lower() not in TORCH_EXTENSIONS and not is_special_file(named):
            raise UsageError(
                f"cannot tell the output format from {named.name!r}",
                "end DST with .pt, .pth, .ckpt or .bin: convert-syncbn writes a torch file; "
                "`torchkit convert checkpoint` makes safetensors of it",
            )
        check_output_file(destination, force, inputs, what="DST")
    if output is not None and os.fspath(output) != "-":  # `-o -` is stdout
        check_output_file(output, force, inputs, what="output")
        if destination is not None:
            check_distinct_outputs((destination, "DST"), (output, "output (-o)"))


def _require_saved_model(source: str | os.PathLike) -> Path:
    """SRC of `convert-syncbn SRC DST`: a file (`convert-syncbn resnet18 out.pt` names a model,
    not a file)."""
    from torchkit.core.io.files import require_input

    return require_input(
        source,
        what="model file",
        kind="file",
        hint="SRC DST converts a saved checkpoint or model; for a model name, leave out DST to "
        "list the layers it would convert",
    )


def modules_by_key(loaded: Mapping[str, Any]) -> list[tuple[str | None, Any]]:
    """Every module of a pickled dict (`{'model': net, 'model_ema': ema}`), not only the first,
    and those in lists, tuples and dicts inside it (`{'heads': [bn]}`: `heads.0`): a file
    reported as converted holds no layer left unconverted. Each module once (the same module
    under two keys keeps its first); the key is None when the dict holds one module, whose rows
    keep their plain names."""
    from torchkit.core.models.weights import pickled_modules

    named = list((pickled_modules(loaded) or {}).items())
    seen: set[int] = set()
    modules = []
    for key, value in named:
        if id(value) not in seen:
            seen.add(id(value))
            modules.append((key if len(named) > 1 else None, value))
    return modules


def _with_converted(value: Any, converted_of: dict[int, Any], built: dict[int, Any]) -> Any:
    """`value` (a pickled dict, or a list, tuple or dict inside it) with each module replaced
    by its conversion (`converted_of`: id -> converted module; the same object but for a
    BatchNorm layer stored bare). A container held twice is rebuilt once (`built`), so what
    the file shared stays shared."""
    from torch import nn

    if isinstance(value, nn.Module):
        return converted_of.get(id(value), value)
    if not isinstance(value, (dict, list, tuple)):
        return value
    if id(value) not in built:
        if isinstance(value, dict):
            rebuilt: Any = copy.copy(value)  # its kind kept: an OrderedDict, a defaultdict
            rebuilt.update({k: _with_converted(v, converted_of, built) for k, v in value.items()})
        else:
            items = [_with_converted(v, converted_of, built) for v in value]
            if isinstance(value, list):
                rebuilt = items
            elif type(value) is tuple:
                rebuilt = tuple(items)
            else:  # a named tuple
                rebuilt = type(value)(*items)
        built[id(value)] = rebuilt
    return built[id(value)]


def _left_unconverted(saved: Any, wanted: Any) -> list[str]:
    """The paths of the layers `wanted` picks (those the conversion replaces) still held by
    what is about to be saved, wherever it holds them: in a set, as an attribute of a plain
    object, in a module's plain attribute or list beside its registered layers. The
    conversion reaches a module's registered layers and the dicts, lists and tuples of a
    pickled dict; a layer anywhere else would be written back unconverted."""
    import torch

    left: list[str] = []
    seen: set[int] = set()
    # A torch.fx graph names layers by their path in the module that runs it, not by the
    # module it holds as its owner: a feature extractor's graph of the other mode holds the
    # one it was traced in until .eval() hands it over, and that one never runs.
    not_held = (torch.Tensor, str, bytes, int, float, torch.fx.Graph, torch.fx.Node)
    # Each path is spelled only for a layer found: a key may be a tensor (an optimizer's state).
    stack: list[tuple[Any, tuple[Any, ...]]] = [(saved, ())]
    while stack:
        value, path = stack.pop()
        if id(value) in seen or isinstance(value, not_held):
            continue
        seen.add(id(value))
        if wanted(value):
            left.append(".".join(map(_path_part, path)) or "(model)")
        if isinstance(value, torch.nn.Module):
            # its layers under their names; plain attributes beside them by theirs
            items = [*value._modules.items(), *_plain_attributes(value)]
        elif isinstance(value, Mapping):
            items = list(value.items())
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        elif isinstance(value, (set, frozenset)):
            items = [("(in a set)", item) for item in value]
        elif isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, type):
            items = list(vars(value).items())
        else:
            continue
        stack += [(item, (*path, key)) for key, item in reversed(items)]
    return left


def _out_of_reach(saved: Any, wanted: Any, converted: Sequence[Any]) -> list[str]:
    """Before converting: the paths of the layers `wanted` picks that converting `converted`
    (the modules of the unpickled file `saved`) would leave behind, which `_left_unconverted`
    then refuses. Converting rewrites the registered slots of the modules inside `converted`
    (in place, wherever those modules are held) and rebuilds the dicts, lists and tuples of a
    pickled dict; a layer held in any other slot (a plain attribute, a set, a plain object)
    stays. Each layer once, by the first such path."""
    import torch

    rewritten_parents = {id(m) for module in converted for m in module.modules()}
    not_held = (torch.Tensor, str, bytes, int, float, torch.fx.Graph, torch.fx.Node)
    left: dict[int, str] = {}
    seen: set[tuple[int, bool]] = set()  # a value held in both kinds of slot is walked twice
    # (value, path, whether converting rewrites the slot it is held in)
    stack: list[tuple[Any, tuple[Any, ...], bool]] = [(saved, (), True)]
    while stack:
        value, path, rewritten = stack.pop()
        if (id(value), rewritten) in seen or isinstance(value, not_held):
            continue
        seen.add((id(value), rewritten))
        if wanted(value) and not rewritten:
            left.setdefault(id(value), ".".join(map(_path_part, path)) or "(model)")
        if isinstance(value, torch.nn.Module):
            registered = id(value) in rewritten_parents
            items = [(k, v, registered) for k, v in value._modules.items()]
            items += [(k, v, False) for k, v in _plain_attributes(value)]
        elif isinstance(value, Mapping):  # rebuilt as `_with_converted` rebuilds: dicts only
            items = [(k, v, rewritten and isinstance(value, dict)) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(k, v, rewritten) for k, v in enumerate(value)]
        elif isinstance(value, (set, frozenset)):
            items = [("(in a set)", item, False) for item in value]
        elif isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, type):
            items = [(k, v, False) for k, v in vars(value).items()]
        else:
            continue
        stack += [(item, (*path, key), kept) for key, item, kept in reversed(items)]
    return list(left.values())


def _path_part(key: Any) -> str:
    """A key, index or attribute name as a path names it (another kind of key by its type)."""
    return str(key) if isinstance(key, (str, int)) else f"<{type(key).__name__}>"


def _plain_attributes(module: Any) -> list[tuple[str, Any]]:
    """A module's attributes other than its parameters, buffers and layers."""
    registered = ("_parameters", "_buffers", "_modules")
    return [(name, value) for name, value in vars(module).items() if name not in registered]


def _refuse_left_unconverted(src: Path, saved: Any, *, revert: bool) -> None:
    """An InputError, before anything is written, when the conversion of `src` left a layer
    it should have converted (`_left_unconverted`)."""
    from torch import nn

    wanted = (lambda m: isinstance(m, nn.SyncBatchNorm)) if revert else _is_plain_batchnorm
    left = _left_unconverted(saved, wanted)
    if left:
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        kind = "SyncBatchNorm" if revert else "BatchNorm"
        raise InputError(
            f"{src} holds {kind} layers convert-syncbn cannot reach: {shown}",
            "it converts a model's registered layers and the modules in the dicts, lists and "
            "tuples of a pickled dict, not those in sets or plain objects; nothing was written",
        )


def _keyed(row: dict, key: str | None) -> dict:
    """A layer's row named KEY.LAYER (KEY for the module itself) in a dict of several modules."""
    if key is not None:
        row["name"] = f"{key}.{row['name']}" if row["name"] != "(model)" else key
    return row


def batchnorm_report(
    spec: str,
    *,
    revert: bool = False,
    num_classes: int | None = None,
    weights: str | None = None,
    trust_checkpoint: bool = False,
) -> dict[str, Any]:
    """The layers `convert_batchnorm` would replace in the model `spec` names: BatchNorm layers,
    or SyncBatchNorm layers with `revert`."""
    from torchkit.core.models import ModelSpec, resolve_spec

    named = ModelSpec(
        model=spec, weights=weights, trust_checkpoint=trust_checkpoint, num_classes=num_classes
    )
    loaded = resolve_spec(named, command="convert-syncbn", new_head=True, every_pickled_module=True)
    model = loaded.model
    if loaded.checkpoint is not None and checkpoint_uses_sync_bn(loaded.checkpoint):
        # What `train --resume` builds from it: its layers are SyncBatchNorm already.
        model, _ = convert_batchnorm(model, to="sync")
    layers = find_batchnorm_layers(model, sync=revert)
    if loaded.pickled_modules is not None:  # the layers of each module SRC DST converts, once
        listed: set[int] = set()
        layers = [
            _keyed(row, key)
            for key, module in modules_by_key(loaded.pickled_modules)
            for row in find_batchnorm_layers(module, sync=revert, seen=listed)
        ]
    if loaded.pickled_file is not None:  # what SRC DST would refuse to convert, said now
        from torch import nn

        wanted = (lambda m: isinstance(m, nn.SyncBatchNorm)) if revert else _is_plain_batchnorm
        modules = (
            [module for _, module in modules_by_key(loaded.pickled_modules)]
            if loaded.pickled_modules is not None
            else [model]
        )
        left = _out_of_reach(loaded.pickled_file, wanted, modules)
        if left:
            shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
            log.warning(
                f"{spec} also holds {'SyncBatchNorm' if revert else 'BatchNorm'} layers "
                f"convert-syncbn cannot reach, not listed: {shown} (converting it is refused; "
                "it converts a model's registered layers and the modules in the dicts, lists "
                "and tuples of a pickled dict)"
            )
    report = {
        "model": loaded.arch,
        "origin": loaded.source,
        "target": "BatchNorm" if revert else "SyncBatchNorm",
        "layers": layers,
        "count": len(layers),
    }
    if loaded.checkpoint is not None:
        report["marked_sync_bn"] = checkpoint_uses_sync_bn(loaded.checkpoint)
    return report


def convert_saved_model(
    source: str,
    destination: str,
    *,
    revert: bool = False,
    trust_checkpoint: bool = False,
    force: bool = False,
    sample_shape: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Convert the model saved in `source` and write it to `destination` (atomically; an existing
    file only with `force`).

    A torchkit checkpoint keeps its weights (BatchNorm and SyncBatchNorm have the same state_dict
    keys) and is marked so that `train --resume` rebuilds the model with SyncBatchNorm (or, with
    `revert`, without). A pickled model (trusted loading only) is converted and pickled again.
    `sample_shape` (one sample, no batch) lets `revert` see which BatchNorm each SyncBatchNorm
    layer stood for when the file does not record it.
    """

    from torchkit.core.io.claims import reporting_write_errors
    from torchkit.core.io.files import atomic_path, torch_save
    from torchkit.core.models import model_from_checkpoint, pickled_module
    from torchkit.core.models.checkpoint import is_torchkit_checkpoint, save_checkpoint
    from torchkit.core.models.resolver import EXPORTED_TITLES, exported_format_of
    from torchkit.core.models.weights import holds_weights_only, read_model_file

    src = _require_saved_model(source)
    fmt = exported_format_of(src)
    if fmt is not None:
        raise UsageError(
            f"{src} is {EXPORTED_TITLES[fmt]}, which convert-syncbn cannot convert",
            "convert the torchkit checkpoint it was exported from, then export again",
        )
    check_outputs(src, destination, force=force)
    loaded = read_model_file(src, trust_checkpoint=trust_checkpoint)
    to = "bn" if revert else "sync"
    already = None  # what a checkpoint already is, when it is what was asked
    if is_torchkit_checkpoint(loaded):
        model = model_from_checkpoint(loaded, trust_checkpoint=trust_checkpoint, source=str(src))
        model, rows = convert_batchnorm(model, to="sync")
        # Without a BatchNorm layer there is nothing to synchronise: a mark would only make
        # `train --resume` refuse a CPU, saying the run was trained with --sync-bn.
        sync = bool(rows) and not revert
        if revert:
            model, rows = convert_batchnorm(model, to="bn")
        if rows and checkpoint_uses_sync_bn(loaded) != revert:
            # Its layers already are what was asked: listing them as converted misled.
            already = (
                "is not marked for SyncBatchNorm (its model has BatchNorm layers)"
                if revert
                else "is already marked for SyncBatchNorm"
            )
            rows = []
        with reporting_write_errors(destination):
            save_checkpoint(mark_checkpoint(loaded, sync=sync), destination)
        kind = "torchkit checkpoint"
    else:
        module = pickled_module(loaded)
        if module is None:
            if holds_weights_only(loaded):
                raise InputError(
                    f"{src} holds a plain state dict: BatchNorm and SyncBatchNorm have the "
                    "same keys, so there is nothing to convert",
                    "load it into either model as it is; convert a torchkit checkpoint or a "
                    "pickled model instead",
                )
            raise CheckpointError(f"{src} is neither a torchkit checkpoint nor a pickled model")
        example = None
        if sample_shape:
            from torchkit.core.models.inputs import make_inputs
            from torchkit.core.summary.counting import model_device, model_dtype

            # Two samples: a layer that normalises with the batch's own statistics (BatchNorm
            # without running statistics) refuses one value per channel, even in eval mode.
            example = make_inputs([(2, *sample_shape)], model_dtype(module), model_device(module))
        if isinstance(loaded, Mapping):
            converted_of: dict[int, Any] = {}
            layers: dict[int, tuple[Any, Any]] = {}  # a layer two modules share is one layer
            rows = []
            for key, value in modules_by_key(loaded):
                converted_of[id(value)], value_rows = convert_batchnorm(
                    value, to=to, example_inputs=example, converted=layers
                )
                rows += [_keyed(row, key) for row in value_rows]
            loaded = _with_converted(loaded, converted_of, {})
        else:
            loaded, rows = convert_batchnorm(module, to=to, example_inputs=example)
        _refuse_left_unconverted(src, loaded, revert=revert)
        if not rows:  # converted twice, say: its layers already are what was asked
            modules = modules_by_key(loaded) if isinstance(loaded, Mapping) else [(None, loaded)]
            listed: set[int] = set()
            count = sum(
                len(find_batchnorm_layers(value, sync=not revert, seen=listed))
                for _, value in modules
            )
            if count:
                have, lack = "BatchNorm", "SyncBatchNorm"
                if not revert:
                    have, lack = lack, have
                already = f"holds {have} layers already ({count}) and no {lack} layer"
        with reporting_write_errors(destination), atomic_path(destination) as tmp:
            torch_save(loaded, tmp)
        kind = "pickled model"
    if already is not None:
        log.warning("%s %s: nothing was converted", src, already)
    elif not rows:
        log.warning(
            "%s has no %s layers: nothing was converted",
            src,
            "SyncBatchNorm" if revert else "BatchNorm",
        )
    return {
        "source": str(src),
        "destination": str(destination),
        "kind": kind,
        "target": "BatchNorm" if revert else "SyncBatchNorm",
        "layers": rows,
        "count": len(rows),
    }
