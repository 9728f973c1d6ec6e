"""Layers of a model by name and an extractor that returns several of them from one forward pass.

Names are torch.fx node names as `torchvision.models.feature_extraction` gives them
(`layer4.1.relu_1`); a module name (`layer4`, `features`) stands for its last node, as in
`create_feature_extractor`. Two aliases cover the classic choices: `penultimate` (of a model with
timm's API, what its `forward_head(x, pre_logits=True)` gives, as timm defines the feature;
else the input of the classifier head: ResNet's pooled feature, VGG's fc7 after its ReLU; of a
model that averages several heads, the mean of their inputs) and `logits` (the model's output).
Models that torch.fx cannot trace fall back to forward hooks on module names.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.io.errors import TorchkitError, UsageError, first_line
from torchkit.core.io.shell_words import shell_line
from torchkit.core.io.wording import with_article
from torchkit.core.runtime.device import to_channels_last

logger = logging.getLogger("torchkit")

ALIASES = ("penultimate", "logits")
POOLS = ("avg", "max", "none")
NORMALIZATIONS = ("l2",)
# Resolved "nodes" that are not graph nodes: captured by hooks instead.
HEAD_INPUT = "<input of the classifier>"
MODEL_OUTPUT = "<model output>"
# The mean of several graph nodes (`LayerGraph.penultimate_nodes`): the inputs of the heads of a
# model whose output is their outputs' mean.
HEADS_MEAN = "<mean of the classifiers' inputs>"
# The features timm's API defines (`has_pre_logits`): what the model's forward_head gives with
# pre_logits=True for the features its forward passes it (CrossViT's two branches' class tokens
# concatenated, a distilled DeiT's two tokens averaged, a MetaFormer's before its MLP head).
PRE_LOGITS = "<forward_head(pre_logits=True)>"
# The submodule the pre-logits are computed in while an extractor runs (`_PreLogitsTap`).
_PRE_LOGITS_MODULE = "torchkit_pre_logits"


@dataclass
class LayerInfo:
    """One row of `--list-layers`: a node (or alias) and its per-image output shape."""

    name: str
    op: str
    shape: list[int] | None
    alias_of: str | None = None


@dataclass(frozen=True)
class Layer:
    name: str  # as the user asked for it
    node: str  # the graph node (or module name, or HEAD_INPUT / MODEL_OUTPUT) it reads


class LayerGraph:
    """The named layers of one model (in eval mode) and what each alias points at."""

    def __init__(self, model: Any, *, arch: str = "model") -> None:
        model.eval()
        self.model = model
        self.arch = arch
        self.pre_logits = has_pre_logits(model)
        self.head_names = _head_names(model)
        self.nodes: list[str] = []
        self.ops: dict[str, str] = {}
        self.penultimate_node: str | None = None
        # The heads' inputs, where they differ (DeiT's class and distillation tokens): the
        # penultimate layer is their mean, as timm's forward_head(x, pre_logits=True) gives.
        self.penultimate_nodes: list[str] = []
        self.logits_node: str | None = None
        # Where the traced forward returns no one tensor (a tuple, a dict): what it returns, and
        # the layers of its items, for the refusal of `logits`.
        self.output_items: tuple[str, list[str]] | None = None
        self.trace_error: str | None = None
        # Of each node whose value is indexed (a tuple, a list, a dict: nn.MultiheadAttention's
        # output), the nodes that take its items, with their keys: what to pick instead of it.
        self.items: dict[str, list[tuple[Any, str]]] = {}
        self._graph_module = None
        # Of a model with timm's API, the pre-logits tap, traced with the rest (`_trace`): the
        # extractor reads `penultimate` from that one graph. None where the model's own attribute
        # takes the tap's name (the extractor then refuses `penultimate`, as installing would).
        self.tap: _PreLogitsTap | None = None
        try:
            self._trace()
        except Exception as error:  # dynamic control flow and the like: fx cannot trace it
            self.trace_error = first_line(error)
            logger.warning(
                "torch.fx cannot trace %s (%s); layers are module names, read with hooks",
                arch,
                self.trace_error,
            )
            self.nodes = [name for name, _ in model.named_modules() if name]
            self.ops = {name: type(m).__name__ for name, m in model.named_modules() if name}
        self._node_set = set(self.nodes)

    @property
    def traced(self) -> bool:
        return self._graph_module is not None

    def _trace(self) -> None:
        from torch import fx
        from torchvision.models.feature_extraction import NodePathTracer

        # The one trace of a run: the listing, the aliases and the extractor (`feature_module`)
        # all read this graph, so every listed name can be extracted. (torchvision's
        # create_feature_extractor traced twice more, with torchvision.ops blocks such as
        # Conv2dNormActivation as leaves, so it could not find the nodes listed inside them.)
        model = self.model
        if self.pre_logits and not hasattr(model, _PRE_LOGITS_MODULE):
            self.tap = _PreLogitsTap(model)
        # The tap is one node (a leaf module) whose output is the pre-logits; once the graph
        # module holds it, it comes off the model again.
        leaf_modules = [type(self.tap.module)] if self.tap else []
        tracer = NodePathTracer(leaf_modules=leaf_modules)
        with self.tap.installed() if self.tap else contextlib.nullcontext():
            graph = tracer.trace(model)
            graph_module = fx.GraphModule(tracer.root, graph, type(model).__name__)
        qualname = tracer.node_to_qualname
        for node in graph.nodes:
            if node.op == "output":
                result = node.args[0] if node.args else None
                if isinstance(result, fx.Node):
                    self.logits_node = qualname.get(result)
                else:
                    self.output_items = _output_items(result, qualname)
                continue
            name = qualname.get(node)
            if name is None or (self.tap and name == _PRE_LOGITS_MODULE):
                continue  # not a layer of the model: listed as `penultimate`
            self.nodes.append(name)
            self.ops[name] = _describe_node(node, model)
            if node.op == "call_function" and node.target is operator.getitem:
                source, key = node.args
                if isinstance(source, fx.Node) and source in qualname:
                    self.items.setdefault(qualname[source], []).append((key, name))
        inputs = [_module_input(graph, qualname, head) for head in self.head_names]
        if inputs and all(inputs):
            if len(set(inputs)) == 1:  # one head, or heads that read the same node (LeViT's)
                self.penultimate_node = inputs[0]
            else:
                self.penultimate_nodes = inputs
        self._graph_module = graph_module
        self._qualname = qualname

    def feature_module(self, nodes: list[str]) -> Any:
        """A torch.fx GraphModule of the traced graph that returns {node name: value} of `nodes`
        (in graph order), what create_feature_extractor gives for those names, without tracing
        the model again: a copy of the graph with those nodes as its output and the nodes they
        do not need removed. Only the eval-mode graph: features are only ever extracted in eval
        mode, so create_feature_extractor's train-mode graph (and its warning where the two
        differ) has no use here. A name not in the graph raises KeyError."""
        from torch import fx

        traced = self._graph_module.graph
        graph = fx.Graph(tracer_cls=traced._tracer_cls, tracer_extras=traced._tracer_extras)
        copies: dict[Any, Any] = {}
        graph.graph_copy(traced, copies)  # all but the output node; copies: old -> new node
        wanted = set(nodes)
        outputs = {
            self._qualname[node]: copy
            for node, copy in copies.items()
            if self._qualname.get(node) in wanted
        }
        missing = [name for name in nodes if name not in outputs]
        if missing:
            raise KeyError(missing[0])
        graph.output(outputs)
        # The modules and parameters it calls are the model's own (the tap's: installed again).
        with self.tap.installed() if self.tap else contextlib.nullcontext():
            module = fx.GraphModule(self.model, graph, type(self.model).__name__)
        # Dead-code elimination reads the modules (their purity), so it runs on the module's graph.
        graph.eliminate_dead_code()
        module.delete_all_unused_submodules()
        module.recompile()
        return module

    def lookup(self, name: str) -> str | None:
        """The node `name` reads, or None when the model has no such layer."""
        if name in self._node_set:
            return name
        if self.traced:
            # A module name stands for its last node (create_feature_extractor's rule).
            prefix = name + "."
            matches = [node for node in self.nodes if node.startswith(prefix)]
            if matches:
                return matches[-1]
        if name == "penultimate":
            if self.pre_logits:
                return PRE_LOGITS
            if self.penultimate_node:
                return self.penultimate_node
            if self.penultimate_nodes:
                return HEADS_MEAN
            return HEAD_INPUT if self.head_names else None
        if name == "logits":
            if self.traced:
                return self.logits_node
            return MODEL_OUTPUT
        return None

    def resolve(
        self, requested: list[str], named: str | None = None, options: Sequence[str] = ()
    ) -> list[Layer]:
        """The layers asked for (duplicates dropped), or a UsageError naming close matches.
        `named`: the model as the command line gave it (a checkpoint, `timm/NAME`), which the
        error names and its --list-layers hint runs with `options` (`--weights FILE`); the
        architecture if not given."""
        layers, unknown = [], []
        for name in dict.fromkeys(requested):
            node = self.lookup(name)
            if node is None:
                unknown.append(name)
            else:
                layers.append(Layer(name, node))
        if unknown:
            choices = [*ALIASES, *self.nodes, *_module_prefixes(self.nodes)]
            close = difflib.get_close_matches(unknown[0], choices, n=5, cutoff=0.5)
            close = [name for name in close if name != unknown[0]][:4]  # an alias it lacks
            hint = self._missing_alias(unknown[0]) or ""
            hint += f"did you mean {', '.join(close)}? " if close else ""
            names = ", ".join(repr(n) for n in unknown)
            named = named or self.arch
            listing = shell_line(["torchkit", "extract-features", named, *options, "--list-layers"])
            # A module of the model that the traced forward pass never calls (a branch not
            # taken): saying so spares the user searching the listing for a name it has.
            modules = dict(self.model.named_modules()) if self.traced else {}
            uncalled = [name for name in unknown if name in modules]
            if uncalled:
                hint = (
                    f"module {uncalled[0]} is never called in the forward pass torch.fx traced: "
                    "a branch not taken, or code that computes nothing; " + hint
                )
            raise UsageError(f"{named} has no layer {names}", hint + f"`{listing}` lists them")
        return layers

    def _missing_alias(self, name: str) -> str | None:
        """Why the model has no `penultimate` or `logits` (`name`), where it lacks that alias."""
        if name == "penultimate":
            return (
                "penultimate is the input of the classifier, and it has no nn.Linear classifier; "
            )
        if name == "logits" and self.output_items:
            kind, items = self.output_items
            layers = f": its items are the layers {', '.join(items)}" if items else ""
            return f"logits is the model's output, and its forward returns a {kind}{layers}; "
        return None

    def describe(self, image_size: int, in_channels: int) -> list[LayerInfo]:
        """Every layer and alias with the shape it gives for one image of that size."""
        shapes = self._shapes(image_size, in_channels)
        rows = [LayerInfo(n, self.ops.get(n, ""), shapes.get(n)) for n in self.nodes]
        for alias in ALIASES:
            node = self.lookup(alias)
            if node is not None and alias not in self._node_set:
                # the heads' inputs have one shape: their mean's
                shape = shapes.get(self.penultimate_nodes[0] if node == HEADS_MEAN else node)
                rows.append(LayerInfo(alias, "alias", shape, alias_of=node))
        return rows

    def _shapes(self, image_size: int, in_channels: int) -> dict[str, list[int]]:
        import torch

        example = torch.zeros(1, in_channels, image_size, image_size)
        shapes: dict[str, list[int]] = {}
        try:
            with torch.inference_mode():
                if self.traced:
                    from torch.fx.passes.shape_prop import ShapeProp

                    ShapeProp(self._graph_module).propagate(example)
                    for node, name in self._qualname.items():
                        meta = node.meta.get("tensor_meta")
                        if meta is not None and hasattr(meta, "shape"):
                            shapes[name] = list(meta.shape)[1:]
                    if self.pre_logits:
                        features = self.model.forward_features(example)
                        pre_logits = self.model.forward_head(features, pre_logits=True)
                        shapes[PRE_LOGITS] = list(pre_logits.shape)[1:]
                else:
                    layers = [Layer(n, n) for n in self.nodes]
                    for alias in ALIASES:
                        node = self.lookup(alias)
                        if node in _MARKERS:
                            layers.append(Layer(node, node))
                    extractor = FeatureExtractor(self, layers)
                    try:
                        for name, value in extractor(example, partial=True).items():
                            if isinstance(value, torch.Tensor):
                                shapes[name] = list(value.shape)[1:]
                    finally:
                        extractor.close()
        except Exception as error:
            logger.warning(
                "cannot run a %dx%d image through %s (%s); shapes left out",
                image_size,
                image_size,
                self.arch,
                first_line(error),
            )
        return shapes


class FeatureExtractor:
    """Calls the model once and returns {layer name: tensor} for the layers asked for."""

    def __init__(self, graph: LayerGraph, layers: list[Layer]) -> None:
        self.layers = list(layers)
        self.arch = graph.arch
        # The input a checkpoint's model was trained on (image_size.trained_input), if known.
        self.trained: tuple[int, ...] | None = None
        self._graph = graph
        self._captured: dict[str, Any] = {}
        self._hooks: list[Any] = []  # handles, removed by close(): the model is the caller's
        self._fx = graph.traced
        # Installed on the model while the extractor is made (torch.fx) or used (hooks).
        self._tap = None
        if self._needs(PRE_LOGITS):
            if not graph.traced:
                self._tap = _PreLogitsTap(graph.model)
            elif graph.tap is None:  # the model's own attribute has the tap's name
                raise _name_taken()
            else:
                self._tap = graph.tap  # traced in LayerGraph's graph
        nodes = list(dict.fromkeys(x.node for x in self.layers if x.node not in _MARKERS))
        if self._needs(HEADS_MEAN):
            nodes = list(dict.fromkeys([*nodes, *graph.penultimate_nodes]))
        if self._fx:
            if self._needs(HEAD_INPUT):
                # Keep the graph whole so that the head runs and its pre-hook sees its input.
                if graph.logits_node is None:
                    raise _no_head_input(graph.arch)
                nodes = list(dict.fromkeys([*nodes, graph.logits_node]))
            if self._tap is not None:
                nodes = list(dict.fromkeys([*nodes, _PRE_LOGITS_MODULE]))
            try:
                module = graph.feature_module(nodes)
            except KeyError as error:  # the forward never calls forward_head: no tap node
                if self._tap is None:
                    raise
                raise _no_head_input(graph.arch) from error
            self.module = module.eval()
            _snapshot_outputs(self.module)
        else:
            self.module = graph.model
            for node in nodes:
                module = self.module.get_submodule(node)
                self._hooks.append(module.register_forward_hook(self._keep_output(node)))
            if self._tap is not None:
                self._tap.install()
                tap = self._tap.module
                self._hooks.append(tap.register_forward_hook(self._keep_output(PRE_LOGITS)))
        if self._needs(HEAD_INPUT):
            for key, name in zip(self._head_keys(), graph.head_names, strict=True):
                try:
                    head = self.module.get_submodule(name)
                except AttributeError as error:
                    raise _no_head_input(graph.arch) from error
                self._hooks.append(head.register_forward_pre_hook(self._keep_input(key)))

    def close(self) -> None:
        """Remove the hooks (they sit on modules shared with the caller's model)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()
        if self._tap is not None:
            self._tap.remove()

    def _needs(self, marker: str) -> bool:
        return any(layer.node == marker for layer in self.layers)

    def _head_keys(self) -> list[str]:
        """Where each head's captured input is kept (HEAD_INPUT: the mean of them all)."""
        return [f"{HEAD_INPUT}{index}" for index in range(len(self._graph.head_names))]

    def _keep_output(self, key: str):
        def hook(module, inputs, output):
            self._captured[key] = snapshot(output)

        return hook

    def _keep_input(self, key: str):
        def hook(module, inputs):
            if key not in self._captured:
                self._captured[key] = snapshot(inputs[0]) if inputs else None

        return hook

    def to(self, device, *, channels_last: bool = False) -> FeatureExtractor:
        # The pre-logits run in the model's own head, which torch.fx's module may not hold.
        modules = [self.module, *([self._graph.model] if self._tap else [])]
        for module in modules:
            module.to(device)
            if channels_last:
                to_channels_last(module)
        return self

    def __call__(self, images, *, partial: bool = False) -> dict[str, Any]:
        """{layer name: value} of one forward pass of `images`; `partial`: the layers that did
        not run in it (a ViT's attention dropout under fused attention) are left out, not an
        error (what --list-layers shows of a model torch.fx cannot trace)."""
        import torch

        self._captured.clear()
        output = self.module(images)
        results = {}
        for layer in self.layers:
            hooked = not self._fx and layer.node not in (MODEL_OUTPUT, HEAD_INPUT)
            if partial and hooked and layer.node not in self._captured:
                continue
            if layer.node == MODEL_OUTPUT:
                value = output
            elif layer.node == HEAD_INPUT:
                keys = self._head_keys()
                if not all(key in self._captured for key in keys):
                    if partial:
                        continue
                    raise _no_head_input(self._graph.arch)
                value = _mean([self._captured[key] for key in keys])
            elif layer.node == HEADS_MEAN:
                value = _mean([output[node] for node in self._graph.penultimate_nodes])
            elif layer.node == PRE_LOGITS:
                value = output[_PRE_LOGITS_MODULE] if self._fx else self._captured.get(PRE_LOGITS)
                if value is None:  # the forward pass never called forward_head
                    raise _no_head_input(self._graph.arch)
            elif self._fx:
                value = output[layer.node]
                if not partial and not isinstance(value, torch.Tensor):
                    raise not_a_tensor(layer.name, value, self._graph.items.get(layer.node, []))
            else:
                if layer.node not in self._captured:
                    raise TorchkitError(
                        f"layer {layer.name} of {self._graph.arch} did not run in the forward pass",
                        "pick another layer: --list-layers lists them",
                    )
                value = self._captured[layer.node]
            results[layer.name] = value
        self._captured.clear()
        return results


def not_a_tensor(name: str, value: Any, items: Sequence[tuple[Any, str]] = ()) -> TorchkitError:
    """The error for layer `name` whose value is a tuple or dict (nn.MultiheadAttention's
    output, a block returning two maps), naming the layers that take its items (`items`: their
    keys and names, where the traced graph has them), as create_feature_extractor would have
    them asked for."""
    picks = ", ".join(f"{node} is item {key!r}" for key, node in items)
    hint = (
        f"ask for its items, layers of their own: {picks}"
        if picks
        else "pick another layer: --list-layers lists them"
    )
    # The layer asked for is the mistake, as a name the model lacks is (exit 2).
    given = with_article(type(value).__name__)
    return UsageError(f"layer {name} gives {given}, not a tensor", hint)


def reduce_feature(
    value: Any,
    *,
    name: str,
    pool: str | None = None,
    normalize: str | None = None,
    flatten: bool = False,
    dtype: str = "float32",
):
    """Pool a (N, C, H, W) map over H and W (avg by default; `none` keeps it; a channels-last
    (N, H, W, C) map over its H and W: `spatial_dims`), scale each row to unit L2 norm, flatten
    to (N, D), cast. Arithmetic is in float32 whatever the model ran in."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise not_a_tensor(name, value)
    features = value.float()
    if features.ndim == 4 and pool in (None, "avg"):
        features = features.mean(dim=spatial_dims(features.shape))
    elif features.ndim == 4 and pool == "max":
        features = features.amax(dim=spatial_dims(features.shape))
    if normalize == "l2":
        # reshape, not flatten(1): a layer of one value per image is (N,), each row a scalar.
        norms = features.reshape(len(features), -1).norm(dim=1).clamp_min(1e-12)
        features = features / norms.view(-1, *([1] * (features.ndim - 1)))
    if flatten and features.ndim > 2:
        features = features.flatten(1)
    return features.to(getattr(torch, dtype))


def spatial_dims(shape) -> tuple[int, int]:
    """The H and W dimensions of a 4-D map: (2, 3) of (N, C, H, W), or (1, 2) of the
    channels-last (N, H, W, C) maps of Swin-style stages (torchvision's swin_t, timm's swin and
    mambaout...), which pooling (2, 3) would average over W and C. Crops are square, so H and W
    are the two equal sizes; a map where that does not tell is taken as (N, C, H, W)."""
    _, first, second, third = shape
    return (1, 2) if first == second != third else (2, 3)


_MARKERS = (HEAD_INPUT, MODEL_OUTPUT, HEADS_MEAN, PRE_LOGITS)


def has_pre_logits(model: Any) -> bool:
    """Whether `model` has timm's feature API: `forward_features(x)`, and a `forward_head` that
    takes `pre_logits` (the features before the classifier, as the model defines them)."""
    import inspect

    head = getattr(model, "forward_head", None)
    if not (callable(head) and callable(getattr(model, "forward_features", None))):
        return False
    try:
        return "pre_logits" in inspect.signature(head).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


class _PreLogitsTap:
    """Makes the forward pass of a model with timm's API (`has_pre_logits`) also compute its
    pre-logits from the features its forward gives its head. While installed, the model's
    `forward_head` (patched on the instance) first passes its arguments, with pre_logits=True,
    to the submodule `torchkit_pre_logits`, which runs the model's own forward_head; then it
    runs as before. torch.fx keeps that submodule as one node (a leaf module) whose output the
    extractor returns; without torch.fx a forward hook reads it. `remove` takes the patch and
    the submodule off the model again."""

    def __init__(self, model: Any) -> None:
        import inspect

        from torch import nn

        head = model.forward_head
        signature = inspect.signature(head)

        class PreLogits(nn.Module):
            def forward(self, *args: Any, **kwargs: Any) -> Any:
                return head(*args, **kwargs)

        self.module = PreLogits()
        tap = self.module

        def forward_head(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            if not bound.arguments.get("pre_logits"):
                bound.arguments["pre_logits"] = True
                tap(*bound.args, **bound.kwargs)
            return head(*args, **kwargs)

        self._model = model
        self._patched = forward_head
        self._earlier: Any = None  # an instance attribute forward_head the patch hides
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        model = self._model
        if hasattr(model, _PRE_LOGITS_MODULE):
            raise _name_taken()
        self._earlier = vars(model).get("forward_head")
        model.add_module(_PRE_LOGITS_MODULE, self.module)
        object.__setattr__(model, "forward_head", self._patched)
        self._installed = True

    def remove(self) -> None:
        if not self._installed:
            return
        model = self._model
        delattr(model, _PRE_LOGITS_MODULE)
        if self._earlier is None:
            del model.__dict__["forward_head"]
        else:
            object.__setattr__(model, "forward_head", self._earlier)
        self._installed = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        self.install()
        try:
            yield
        finally:
            self.remove()


def snapshot(value: Any) -> Any:
    """A copy of a tensor as it is now: later in-place ops (ReLU(inplace=True) after a conv,
    ResNet's `out += identity` after bn2) would otherwise change the feature we keep."""
    import torch

    return value.clone() if isinstance(value, torch.Tensor) else value


def _snapshot_outputs(graph_module) -> None:
    """Make the feature extractor return a snapshot of each node taken right where it is computed,
    not the tensor itself, which in-place ops further down the graph may overwrite."""
    graph = graph_module.graph
    output = next(node for node in graph.nodes if node.op == "output")
    returned = output.args[0]
    kept = {}
    for name, node in returned.items():
        with graph.inserting_after(node):
            kept[name] = graph.call_function(snapshot, (node,))
    output.args = (kept,)
    graph_module.recompile()


def _mean(values: list[Any]) -> Any:
    """The mean of tensors as timm's distilled models average their heads, (x + x_dist) / 2:
    the one value itself."""
    if len(values) == 1:
        return values[0]
    shapes = {tuple(value.shape) for value in values}
    if len(shapes) > 1:  # heads on different features (branches of several widths)
        raise TorchkitError(
            "the classifiers read features of different shapes ("
            + ", ".join("x".join(map(str, shape[1:])) for shape in sorted(shapes))
            + "): `penultimate` is none of them",
            "pick the layer by name instead of `penultimate`: --list-layers lists them",
        )
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total / len(values)


def _head_names(model) -> list[str]:
    """The names of the classifiers the model's output is made from (`classifier_heads`); none
    where it has no classifier layer."""
    from torchkit.core.models.heads import classifier_heads

    try:
        return [name for name, _ in classifier_heads(model)]
    except UsageError:
        return []


def _module_input(graph, qualname: dict, module: str) -> str | None:
    """The node the module named `module` reads, in a traced graph: the one node from outside
    the module that its nodes take (a leaf module's call, or the nodes traced inside it, as in
    LeViT's NormLinear heads); None where it is not one node or the module never runs."""
    from torch import fx

    prefix = module + "."
    inside = {node for node, name in qualname.items() if name == module or name.startswith(prefix)}
    outside: dict[Any, None] = {}
    for node in graph.nodes:
        if node in inside:
            fx.node.map_arg((node.args, node.kwargs), lambda arg: outside.setdefault(arg))
    read = [node for node in outside if node not in inside and node.op != "get_attr"]
    return qualname.get(read[0]) if len(read) == 1 else None


def _output_items(result: Any, qualname: dict) -> tuple[str, list[str]]:
    """What a traced forward returns that is not one node (a tuple, a dict...), and the layers
    of its items, each once."""
    from torch import fx

    items: dict[str, None] = {}
    fx.node.map_arg(result, lambda arg: items.setdefault(qualname.get(arg)))
    kinds = {dict: "dict", list: "list", tuple: "tuple"}
    kind = next((word for base, word in kinds.items() if isinstance(result, base)), None)
    return kind or type(result).__name__, [name for name in items if name]


def _name_taken() -> TorchkitError:
    return TorchkitError(f"the model already has an attribute {_PRE_LOGITS_MODULE}")


def _no_head_input(arch: str) -> TorchkitError:
    return TorchkitError(
        f"cannot find the input of the classifier of {arch}",
        "pick the layer by name instead of `penultimate`: --list-layers lists them",
    )


def _describe_node(node, model) -> str:
    if node.op == "placeholder":
        return "input"
    if node.op == "call_module":
        try:
            return type(model.get_submodule(node.target)).__name__
        except AttributeError:
            return str(node.target)
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "get_attr":
        return "attribute"
    return getattr(node.target, "__name__", str(node.target))


def _module_prefixes(nodes: list[str]) -> list[str]:
    prefixes = {}
    for node in nodes:
        parts = node.split(".")
        for depth in range(1, len(parts)):
            prefixes[".".join(parts[:depth])] = None
    return list(prefixes)
