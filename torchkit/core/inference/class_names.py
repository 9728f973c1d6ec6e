"""The names of a model's outputs when the model records none: eval and predict name them alike,
by the classes of labelled data in sorted order (as torchvision's ImageFolder numbers them);
predict names 1,000 outputs that nothing else names as ImageNet-1k's classes (timm's names for a
timm model, torchvision's for others), and a timm model's outputs as many as the classes of one of
timm's larger ImageNet subsets (ImageNet-12k, -22k...) as that subset's classes."""

from __future__ import annotations

from collections.abc import Sequence

from torchkit.core.io.redaction import redact_url
from torchkit.core.io.wording import counted


def unsettled_class_order(names: Sequence[str], data: str) -> str | None:
    """Why the classes `names` of `data` cannot name the outputs of a model that records no
    class names ("which of its outputs is which class ... is a guess: ..."), or None when they
    can: numbered classes sort as text in a folder (`1, 10, 2`, as ImageFolder) and as numbers
    in a CSV index, parquet or shards (`1, 2, 10`), so the same weights would name the same
    images differently by the data's form."""
    from torchkit.core.data.sources.csv_index import natural_key

    names, data = list(names), redact_url(data)  # a URL whole: a raw space in a token too
    if names == [str(index) for index in range(len(names))]:
        return None  # labels that are the outputs' indices (shards, parquet without class names)
    as_text, as_numbers = sorted(names), sorted(names, key=natural_key)
    if names == as_text == as_numbers:
        return None

    def shown(order: list[str]) -> str:
        return ", ".join(order[:6]) + (" ..." if len(order) > 6 else "")

    return (
        f"which of its outputs is which class of {data} is a guess: sorted as text they are "
        f"{shown(as_text)}, as numbers {shown(as_numbers)}"
        + ("" if names in (as_text, as_numbers) else f", in the data {shown(names)}")
    )


IMAGENET_OUTPUTS = 1000


def imagenet_class_names() -> list[str] | None:
    """The names torchvision gives ImageNet-1k's 1,000 classes, in their order (shipped with
    it, offline: its ImageNet weights' `categories`); None where the installed torchvision has
    none to give."""
    try:
        from torchvision.models._meta import _IMAGENET_CATEGORIES as names
    except Exception:  # another torchvision, a broken one: the outputs keep their indices
        return None
    if not isinstance(names, (list, tuple)) or len(names) != IMAGENET_OUTPUTS:
        return None
    if not all(isinstance(name, str) and name for name in names):
        return None
    return list(names)


def timm_imagenet_subset(num_outputs: int) -> str | None:
    """timm's ImageNet subset of `num_outputs` classes (`imagenet-1k`, `imagenet-12k`,
    `imagenet-21k-goog`...), as timm's inference.py infers it from the size of a head; None
    where timm knows no subset of that size, or where two of the subsets it ships list that
    many classes in other orders (which of them the head's are would be a guess)."""
    try:
        from timm.data import infer_imagenet_subset

        subset = infer_imagenet_subset({"num_classes": num_outputs})
    except Exception:  # no timm, another timm, a broken one
        return None
    if not isinstance(subset, str) or not subset:
        return None
    return None if len(_timm_class_lists(num_outputs)) > 1 else subset


def _timm_class_lists(num_outputs: int) -> set[tuple[str, ...]]:
    """The distinct class lists of `num_outputs` classes among the ImageNet subsets the
    installed timm ships (its private table of them: empty where it has none to read, and
    then timm's own inference of the subset is trusted)."""
    try:
        import pkgutil

        from timm.data import imagenet_info

        files = set(imagenet_info._SUBSETS.values())
        lists = set()
        for file in files:
            data = pkgutil.get_data(imagenet_info.__name__, f"_info/{file}")
            synsets = tuple(data.decode("utf-8").splitlines()) if data else ()
            if len(synsets) == num_outputs:
                lists.add(synsets)
        return lists
    except Exception:
        return set()


def timm_imagenet_names(num_outputs: int) -> tuple[list[str], str] | None:
    """The names timm gives the classes of its ImageNet subset of `num_outputs` classes
    (`timm_imagenet_subset`), in their order (shipped with it, offline), and the subset: the
    first name of each class timm describes (`tench` of `tench, Tinca tinca`, `crane` for the
    bird and the machine alike: `timm_models.imagenet_subset_names`), as timm's own ImageNet
    weights are named; None where the installed timm has none to give."""
    subset = timm_imagenet_subset(num_outputs)
    if subset is None:
        return None
    from torchkit.core.models.timm_models import imagenet_subset_names

    try:
        names = imagenet_subset_names(subset)
    except Exception:  # another timm, a broken one: no names (torchvision's for 1,000)
        return None
    if len(names) != num_outputs or not all(names):
        return None
    return names, subset


def timm_imagenet_class_names() -> list[str] | None:
    """The names timm gives ImageNet-1k's 1,000 classes (`timm_imagenet_names`); None where
    the installed timm has none to give."""
    found = timm_imagenet_names(IMAGENET_OUTPUTS)
    return found[0] if found is not None else None


def imagenet_names_for(
    timm: bool, num_outputs: int = IMAGENET_OUTPUTS
) -> tuple[list[str], str, str] | None:
    """ImageNet's class names for the `num_outputs` outputs of a model, whose names they are
    and which ImageNet they are (`ImageNet-1k`): for a `timm` model, timm's names of the one
    subset of that many classes it ships (ImageNet-1k, -12k, -22k... as timm's inference.py
    assumes them); else, and for a timm without them, torchvision's ImageNet-1k names for
    1,000 outputs; None where neither names them."""
    if timm:
        found = timm_imagenet_names(num_outputs)
        if found is not None:
            names, subset = found
            return names, "timm", _shown_subset(subset)
    if num_outputs != IMAGENET_OUTPUTS:
        return None
    names = imagenet_class_names()
    return (names, "torchvision", "ImageNet-1k") if names is not None else None


def _shown_subset(subset: str) -> str:
    """timm's subset as notes name it: `ImageNet-12k` for `imagenet-12k`."""
    head, dash, rest = subset.partition("-")
    return f"ImageNet-{rest}" if head.lower() == "imagenet" and dash and rest else subset


def labelled_classes(data_classes: Sequence[str]) -> list[str]:
    """The classes of labelled data that can name outputs: the class "" after class names
    (`with_unlabelled_class`: partly labelled data, an unlabelled test split) is no output's,
    as eval scores the others by the names alone; none of unlabelled data (class "" alone)."""
    classes = list(data_classes)
    if len(classes) > 1 and classes[-1] == "":
        classes = classes[:-1]
    return classes if "" not in classes else []


def classes_of_inputs(
    inputs: Sequence[tuple[Sequence[str], bool]], data: str = "IMAGES"
) -> tuple[list[str], bool, str | None]:
    """The classes several inputs (each one's classes, and whether it states their order) name
    together, as one input of all their images would: those of the labelled ones (unlabelled
    images name none), whether their order is stated, and why their order is unknown (None
    where it is not). Inputs of one list of classes give it, in their order; else the classes
    of every input, merged by name (in Unicode NFC, as the `label` column merges them), in the
    order the inputs that state one give, where they give one order of all the classes (where
    they give different orders, or one that leaves out classes of other inputs, the order is
    unknown), and in sorted order where none states one (as of one folder:
    `unsettled_class_order` says where sorting leaves it open)."""
    from torchkit.core.data.sources.csv_index import natural_key
    from torchkit.core.data.sources.samples import nfc

    lists = [(classes, given) for names, given in inputs if (classes := labelled_classes(names))]
    if not lists:
        return [], False, None
    first = lists[0][0]
    if all(classes == first for classes, _ in lists):
        return first, any(given for _, given in lists), None
    union: dict[str, str] = {}  # each name's first spelling, by its NFC one
    for classes, _ in lists:
        for name in classes:
            union.setdefault(nfc(name), name)
    stated = [classes for classes, given in lists if given]
    if stated:
        if any(classes != stated[0] for classes in stated):
            why = f"the inputs of {redact_url(data)} give their classes in different orders"
        elif set(union) != {nfc(name) for name in stated[0]}:
            # one order stated, of some of the classes: where the others go is unknown
            why = f"no input of {redact_url(data)} states an order of all their classes"
        else:
            return stated[0], True, None
        return sorted(union.values()), False, why
    names = sorted(union.values())
    by_number = sorted(names, key=natural_key)
    if by_number == [str(index) for index in range(len(names))]:
        names = by_number  # labels that are the outputs' indices, as of one input
    return names, False, None


def output_names_from_data(
    data_classes: Sequence[str],
    num_outputs: int | None,
    data: str,
    *,
    given: bool = False,
    order_unknown: str | None = None,
    several: bool = False,
    imagenet: bool = False,
    timm: bool = False,
) -> tuple[list[str], str]:
    """predict's names for the outputs of a model that records none, and a note saying what
    they are: the classes of labelled `data` where eval would score with them (as many as the
    outputs, in an order the data states, `given`, or sorting settles; `order_unknown` says
    why neither does, as `classes_of_inputs` gives it; `several`: `data` names several inputs,
    whose classes these are together), else, with `imagenet`, ImageNet's
    names for 1,000 outputs, or for a `timm` model as many as the classes of one ImageNet
    subset timm ships (as timm's inference.py assumes them; timm's names for a `timm` model,
    `imagenet_names_for`), else each output's index."""
    classes, data = labelled_classes(data_classes), redact_url(data)
    labelled = bool(classes)
    why = ""
    # Labelled data of as many classes as the outputs says what they are, in an order unknown
    # where sorting does not settle it: ImageNet's names would contradict its labels.
    imagenet = imagenet and not (labelled and num_outputs == len(classes))
    if labelled and num_outputs not in (None, len(classes)):
        are = "is" if len(classes) == 1 else "are"  # the 1 class of DATA is not its 7 outputs
        shown = counted(len(classes), "class", "classes")
        why = f"; the {shown} of {data} {are} not its {counted(num_outputs, 'output')}"
    elif labelled:
        unsettled = order_unknown or (None if given else unsettled_class_order(classes, data))
        if unsettled is None:
            stated = "the label order they state" if several else "its label order"
            note = (
                f"the model records no class names: its outputs are named by the classes of "
                f"{data} in {stated if given else 'sorted order'}, as eval names them "
                "(--classes names them otherwise)"
            )
            return classes, note
        why = f"; {unsettled}"
    found = imagenet_names_for(timm, num_outputs) if imagenet and num_outputs else None
    if found is not None:
        names, whose, dataset = found
        assumed = (
            f", which are assumed to be {dataset}'s classes"
            if why
            else f": its {num_outputs} outputs are assumed to be {dataset}'s classes"
        )
        note = (
            f"the model records no class names{why}{assumed}, named as {whose} names them "
            "(otherwise pass --classes with the names of its outputs, in order)"
        )
        return names, note
    indices = [str(index) for index in range(num_outputs or 0)]
    note = (
        f"the model records no class names: `class` is the index of its output{why} "
        "(pass --classes with the names of its outputs, in order)"
    )
    return indices, note
