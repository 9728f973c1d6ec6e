"""The classifier head: finding it, replacing it, and sizing it from a state dict."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torchkit.core.io.errors import UsageError
from torchkit.core.io.sizes import gigabytes_text
from torchkit.core.runtime.memory import beyond_half_free, limit_words

# Wider than any classifier input of torchvision's and timm's models (regnet_y_128gf: 7,392): a
# head of --num-classes outputs that fits in memory at this width fits every model's.
WIDEST_HEAD_INPUT = 8192
# The most layers of --num-classes outputs a model has: GoogLeNet's classifier and its two
# auxiliary ones (a distilled DeiT, LeViT, VOLO, CrossViT, RepViT: two).
MOST_CLASS_LAYERS = 3
LARGEST_INDEX = 2**63 - 1  # int64: the most elements a tensor dimension holds
_FEWER_CLASSES = "give a smaller --num-classes"


def find_head(model) -> tuple[str, Any]:
    """The classifier layer: the one a timm model names (`get_classifier`), else the last
    `nn.Linear` in registration order (or the final 1x1 convolution of SqueezeNet-style
    heads)."""
    from torch import nn

    named = _timm_classifier(model)
    if named is not None:
        return named
    last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            last = (name, module)
    if last is None:
        for name, module in model.named_modules():
            if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1):
                last = (name, module)
    if last is None:
        raise UsageError("cannot find the classifier layer of the model (no nn.Linear)")
    return last


def classifier_heads(model) -> list[tuple[str, Any]]:
    """(name, layer) of every classifier the model's output is made from: the layers of a timm
    model whose `get_classifier` gives several (the distilled DeiT, PiT, LeViT... models: head
    and head_dist, whose outputs the model averages; CrossViT's ModuleList, one per branch),
    else `find_head`'s one."""
    classifiers = _layers_of(_timm_get_classifier(model))
    if len(classifiers) > 1:
        names = {id(module): name for name, module in model.named_modules()}
        if all(id(module) in names for module in classifiers):
            return [(names[id(module)], module) for module in classifiers]
    return [find_head(model)]


def head_names(model) -> list[str]:
    """Names of the modules and parameters that make the classifier head, what trains as the
    head (--freeze-backbone, --head-lr-mult, --backbone-lr): every classifier the output is
    made from (`classifier_heads`) and, of a timm model, the modules `get_classifier` names
    and every parameter `reset_classifier` makes anew (a MetaFormer's MLP head, LeViT's and
    RepViT's BatchNorm before the Linear, CrossViT's per-branch heads, VOLO's aux_head): all of
    them are new, untrained layers when fine-tuning on other classes."""
    names = [name for name, _ in classifier_heads(model)]
    names += _timm_named_classifiers(model) + _made_anew_by_reset(model)
    names = list(dict.fromkeys(names))  # each once, and none inside another
    return [n for i, n in enumerate(names) if not in_heads(n, names[:i] + names[i + 1 :])]


def in_heads(name: str, heads: Sequence[str]) -> bool:
    """Whether the parameter or module `name` is one of the modules `heads` or lies inside one."""
    return any(name == head or name.startswith(f"{head}.") for head in heads)


def _timm_named_classifiers(model) -> list[str]:
    """The names of the modules a timm model's `get_classifier` gives (one or several)."""
    classifier = _timm_get_classifier(model)
    if classifier is None:
        return []
    wanted = {id(classifier)} | {id(module) for module in _layers_of(classifier)}
    return [name for name, module in model.named_modules() if name and id(module) in wanted]


def _made_anew_by_reset(model) -> list[str]:
    """The parameters a timm model's `reset_classifier` replaces, found on a copy of its
    structure on the meta device (no weights copied, nothing computed); none where the copy or
    the reset fails."""
    import copy

    import torch
    from torch import nn

    if not _is_timm_style(model):
        return []
    try:
        memo: dict[int, Any] = {}
        for param in model.parameters():
            memo[id(param)] = nn.Parameter(torch.empty_like(param, device="meta"))
        for buffer in model.buffers():
            memo[id(buffer)] = torch.empty_like(buffer, device="meta")
        kept = list(memo.values())  # alive, so that a new parameter cannot take an old id
        old = {id(tensor) for tensor in kept}
        clone = copy.deepcopy(model, memo)
        classes = getattr(model, "num_classes", None)
        if not isinstance(classes, int):
            classes = out_features(find_head(model)[1])
        with torch.device("meta"):
            _reset_timm_classifier(clone, classes)
    except Exception:  # noqa: BLE001 - an unusual model: its named classifiers are the head
        return []
    return [name for name, param in clone.named_parameters() if id(param) not in old]


def _timm_classifier(model) -> tuple[str, Any] | None:
    """(name, layer) of the classifier of a timm model; None for other models, and for timm
    models whose `get_classifier` is not one layer (DeiT's two heads: the generic search)."""
    from torch import nn

    classifier = _timm_get_classifier(model)
    if not isinstance(classifier, (nn.Linear, nn.Conv2d)):
        return None
    return next(((n, m) for n, m in model.named_modules() if m is classifier), None)


def _timm_get_classifier(model) -> Any:
    """What a timm model's `get_classifier` gives (a layer, or a tuple of them); None for
    models without timm's classifier API."""
    if _is_timm_style(model) and callable(getattr(model, "get_classifier", None)):
        return model.get_classifier()
    return None


def _layers_of(classifier: Any) -> list[Any]:
    """The layers of what a timm model's `get_classifier` gives: a tuple's (a distilled DeiT's
    head and head_dist), a ModuleList's (CrossViT's head per branch), or the one layer."""
    from torch import nn

    if classifier is None:
        return []
    if isinstance(classifier, (tuple, list, nn.ModuleList)):
        return list(classifier)
    return [classifier]


def _reset_timm_classifier(model, num_classes: int) -> None:
    """timm's `reset_classifier(num_classes)`, keeping the heads the model has: RepViT's drops
    its distillation head unless told to keep it, and the model would no longer be the one timm
    builds for its name (a checkpoint trained from it would not load into that)."""
    import inspect

    kwargs = {}
    if "distillation" in inspect.signature(model.reset_classifier).parameters:
        kwargs["distillation"] = any(
            getattr(module, "distillation", None) is True for module in model.modules()
        )
    model.reset_classifier(num_classes, **kwargs)


def _is_timm_style(model) -> bool:
    """A model with timm's classifier API (`reset_classifier(num_classes)`), which knows its
    head better than a search does (attention-pool heads, distillation heads...)."""
    return callable(getattr(model, "reset_classifier", None))


def class_layers(model) -> list[tuple[str, Any]]:
    """(name, layer) of every layer whose outputs are the model's classes: the Linear and 1x1
    convolution layers of the head (`head_names`: both of a distilled DeiT or LeViT, VOLO's
    aux_head, CrossViT's per branch) as wide as its classifier, and GoogLeNet's and
    Inception's auxiliary classifiers."""
    from torch import nn

    heads = head_names(model)
    classes = out_features(find_head(model)[1])
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, nn.Conv2d))
        and in_heads(f"{name}.weight", heads)  # VOLO's head names aux_head's parameters
        and out_features(module) == classes
    ]
    return found + [aux for aux in auxiliary_heads(model) if aux not in found]


def refuse_unholdable_head(
    num_classes: int, head_inputs: Callable[[], Sequence[int] | None]
) -> None:
    """Refuse (usage error naming --num-classes), before the head is built, classifiers of
    `num_classes` outputs past what a tensor can index or half the memory free can hold: their
    allocation ended in torch's "can't allocate memory" or an "Overflow" TypeError, or in the
    OOM killer. `head_inputs` gives the input width of each layer of `num_classes` outputs
    (`class_layers`), asked only near the limit (None: unknown, one layer of 1 taken)."""
    if num_classes > LARGEST_INDEX:
        raise UsageError(
            f"--num-classes {num_classes} is more than a tensor can index (2**63 - 1)",
            _FEWER_CLASSES,
        )
    if beyond_half_free(num_classes * (WIDEST_HEAD_INPUT + 1) * 4 * MOST_CLASS_LAYERS) is None:
        return
    widths = list(head_inputs() or [1])
    needed = num_classes * sum(inputs + 1 for inputs in widths) * 4  # float32 weights, biases
    free = beyond_half_free(needed)
    if free is not None:
        if len(widths) == 1:
            what = f"a classifier of {widths[0]:,} x {num_classes:,} weights"
        else:
            inputs = " + ".join(f"{inputs:,}" for inputs in widths)
            what = f"{len(widths)} classifiers of ({inputs}) x {num_classes:,} weights"
        raise UsageError(
            f"--num-classes {num_classes} needs {gigabytes_text(needed)} for {what}, more than "
            f"half the {gigabytes_text(free)} free{limit_words(free)}",
            _FEWER_CLASSES,
        )


def in_features(layer) -> int:
    return layer.in_features if hasattr(layer, "in_features") else layer.in_channels


def out_features(layer) -> int:
    return layer.out_features if hasattr(layer, "out_features") else layer.out_channels


def replace_head(model, num_classes: int) -> None:
    """Swap the classifier (and GoogLeNet's and Inception's auxiliary ones) for freshly
    initialised ones with `num_classes` outputs."""
    name, head = find_head(model)
    if out_features(head) == num_classes:
        return
    if _is_timm_style(model):
        _reset_timm_classifier(model, num_classes)  # every head, freshly initialised
        return
    _swap_layer(model, name, head, num_classes)
    for aux_name, aux_head in auxiliary_heads(model):  # their classes are the model's
        if out_features(aux_head) != num_classes:
            _swap_layer(model, aux_name, aux_head, num_classes)
    if hasattr(model, "num_classes"):
        model.num_classes = num_classes


def _swap_layer(model, name: str, layer, outputs: int) -> None:
    """Put a freshly initialised copy of the classifier `layer` (model's `name`) with
    `outputs` outputs in its place."""
    from torch import nn

    if isinstance(layer, nn.Linear):
        new = nn.Linear(layer.in_features, outputs, bias=layer.bias is not None)
    else:
        new = nn.Conv2d(layer.in_channels, outputs, kernel_size=1)
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, new)


def _with_auxiliary_heads() -> tuple[type, type] | None:
    """torchvision's GoogLeNet and Inception3; None while torchvision is not imported (then no
    model can be one of them, and the built-in convnet's runs never import it)."""
    import sys

    if "torchvision" not in sys.modules:
        return None
    from torchvision.models import GoogLeNet, Inception3

    return GoogLeNet, Inception3


def auxiliary_heads(model) -> list[tuple[str, Any]]:
    """(name, last layer) of the auxiliary classifiers of torchvision's GoogLeNet and
    Inception3 (`aux1.fc2`, `aux2.fc2`; `AuxLogits.fc`), those the model has: they classify
    into the model's classes, so a new head count or a file's weights size them too."""
    classes = _with_auxiliary_heads()
    if classes is None:
        return []
    GoogLeNet, Inception3 = classes  # noqa: N806 - torchvision's class names

    if isinstance(model, GoogLeNet):
        names = ("aux1.fc2", "aux2.fc2")
    elif isinstance(model, Inception3):
        names = ("AuxLogits.fc",)
    else:
        return []
    found = []
    for name in names:
        try:
            found.append((name, model.get_submodule(name)))
        except AttributeError:  # switched off (torchvision's pretrained googlenet has none)
            continue
    return found


def fit_head_to(model, state: Mapping[str, Any]) -> None:
    """Resize the head of `model` to the number of outputs the weights in `state` have (a
    fine-tuned 2-class resnet18 gets a 2-output `fc`), and GoogLeNet's and Inception's
    auxiliary heads to theirs. Models without a head are left alone."""
    try:
        head_name, head = find_head(model)
    except UsageError:
        return
    weight = state.get(f"{head_name}.weight")
    if weight is not None and hasattr(weight, "shape") and weight.shape[0] != out_features(head):
        replace_head(model, int(weight.shape[0]))
    fit_auxiliary_heads_to(model, state)


def fit_auxiliary_heads_to(model, state: Mapping[str, Any]) -> None:
    """Size GoogLeNet's and Inception's auxiliary heads as the weights in `state` have them,
    and drop those the weights have none of (torchvision's pretrained googlenet and a run
    trained from it), as torchvision does: the weights then fit the model."""
    heads = auxiliary_heads(model)
    for aux_name, aux_head in heads:
        module_name = aux_name.partition(".")[0]
        if not any(key.startswith(f"{module_name}.") for key in state):
            setattr(model, module_name, None)
            continue
        weight = state.get(f"{aux_name}.weight")
        if hasattr(weight, "shape") and weight.shape[0] != out_features(aux_head):
            _swap_layer(model, aux_name, aux_head, int(weight.shape[0]))
    if heads and not auxiliary_heads(model):
        model.aux_logits = False


def switch_off_auxiliary_heads(model) -> int:
    """Train on the main logits only: torchvision's GoogLeNet and Inception3 in training mode
    also return their auxiliary classifiers' logits (a namedtuple no loss takes). Their
    `aux_logits` is switched off and the auxiliary heads frozen (no gradient ever reaches
    them), kept in the state dict so that the weights still fit the model every command
    builds. Returns the number of parameters frozen."""
    classes = _with_auxiliary_heads()
    if classes is None or not (isinstance(model, classes) and model.aux_logits):
        return 0
    GoogLeNet = classes[0]  # noqa: N806 - torchvision's class name
    model.aux_logits = False
    heads = [model.aux1, model.aux2] if isinstance(model, GoogLeNet) else [model.AuxLogits]
    frozen = 0
    for head in heads:
        # Inception3 runs its auxiliary head whatever `aux_logits` says (and it fails below
        # about 140 px): it returns nothing now.
        head.forward = _no_output
        for param in head.parameters():
            param.requires_grad_(False)
            frozen += param.numel()
    return frozen


def _no_output(*_inputs: Any) -> None:
    return None
