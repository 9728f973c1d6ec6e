"""Image files on disk: which names are images, a fast recursive scan, and the two folder layouts
read as samples (`ROOT/<class>/<image>`, and a flat folder of images without classes)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from torchkit.core.data.sources.samples import (
    Samples,
    class_index,
    find_class,
    refuse_spelling_twins,
)
from torchkit.core.io.errors import InputError
from torchkit.core.io.files import tree_entries

IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm", ".jfif"}
)


def is_image_file(path: str | os.PathLike) -> bool:
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def is_apple_double(name: str) -> bool:
    """`._NAME`: the AppleDouble file macOS writes beside NAME (its extended attributes) on
    other disks, in zips and in tars; never an image, whatever its extension."""
    return name.startswith("._")


def is_skipped_folder(name: str) -> bool:
    """A folder that is never a class or a split: a hidden one, or `__MACOSX` (the AppleDouble
    files macOS's Finder adds to a zip archive; torchvision's ImageFolder takes it for a class)."""
    return name.startswith(".") or name == "__MACOSX"


def is_folder_name(name: str) -> bool:
    """A name that can be one folder on this system: not empty, `.` or `..`, no separator or NUL,
    encodable, at most 255 bytes."""
    if not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        return False
    try:
        return len(os.fsencode(name)) <= 255
    except UnicodeError:
        return False


def class_folder_problem(name: str) -> str | None:
    """Why `name` cannot be the folder of a class that image-folder readers see (None when it
    can): for the commands that write class folders (convert cifar, split of a CSV index)."""
    if not name.strip() or not is_folder_name(name):
        return (
            "a class folder must be one folder name: not blank, '.' or '..', without / \\ or "
            "NUL, at most 255 bytes"
        )
    if is_skipped_folder(name):
        return "image-folder readers skip hidden folders and __MACOSX: the class would vanish"
    return None


def _scan_tree(
    folder: str | os.PathLike,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """(image files, other files not hidden, symbolic links named like images that point
    nowhere, symbolic links to folders) under `folder`, AppleDouble files (`._NAME`) left out,
    unsorted, spelled as pathlib spells them; symlinked files are included, symlinked folders
    not entered and unreadable folders skipped, as `Path.rglob` does
    (`core.io.files.tree_entries`)."""
    images: list[str] = []
    others: list[str] = []
    dangling: list[str] = []
    linked: list[str] = []
    for path, entry in tree_entries(folder):
        name = entry.name
        if is_apple_double(name):
            continue
        try:
            is_file = entry.is_file()
            if not is_file and not entry.is_symlink():
                continue
        except OSError:  # vanished while listing
            continue
        dot = name.rfind(".")  # Path.suffix's rule, without making a Path
        image = 0 < dot < len(name) - 1 and name[dot:].lower() in IMAGE_EXTENSIONS
        if not is_file:  # a link to a folder, a FIFO... or to nothing
            if image and not os.path.exists(path):
                dangling.append(path)
            elif entry.is_symlink() and os.path.isdir(path):
                linked.append(path)
        elif image:
            images.append(path)
        elif not name.startswith("."):
            others.append(path)
    return images, others, dangling, linked


def list_image_files(folder: str | os.PathLike) -> list[str]:
    """Image files under `folder`, recursively, sorted: what `sorted(Path.rglob("*"))` filtered
    by `is_file()` and extension gives, but with `os.scandir`, so 100,000 files take a fraction of
    a second instead of several."""
    return sorted(_scan_tree(folder)[0])


def list_non_image_files(folder: str | os.PathLike) -> list[str]:
    """Files under `folder` that image datasets leave out (not hidden ones such as .DS_Store),
    relative to `folder`, sorted."""
    return relative_ids(sorted(_scan_tree(folder)[1]), folder)


def list_dangling_image_links(folder: str | os.PathLike) -> list[str]:
    """Symbolic links under `folder`, recursively, named like image files but pointing nowhere,
    sorted (spelled as `list_image_files` spells paths, which leaves them out)."""
    return sorted(_scan_tree(folder)[2])


def list_left_out(folder: str | os.PathLike) -> tuple[list[str], list[str], list[str]]:
    """(files that are not images, hidden ones aside; symbolic links named like images that
    point nowhere; symbolic links to folders) under `folder`, relative to it, sorted, in one
    listing: what the readers pass over (torchvision's ImageFolder follows links to folders,
    and fails on a link to nothing)."""
    _, others, dangling, linked = _scan_tree(folder)
    return (
        relative_ids(sorted(others), folder),
        relative_ids(sorted(dangling), folder),
        relative_ids(sorted(linked), folder),
    )


def relative_ids(paths: Sequence[str], folder: str | os.PathLike) -> list[str]:
    """`os.path.relpath(p, folder)` for paths under `folder`, by slicing where that is exact."""
    base = str(Path(folder))
    prefix = base + os.sep
    if base == ".":
        return [os.path.relpath(p, base) for p in paths]
    return [p[len(prefix) :] if p.startswith(prefix) else os.path.relpath(p, base) for p in paths]


def discover_image_folder(
    root: str | os.PathLike, *, classes: Sequence[str] | None = None, allow_empty_classes=True
) -> Samples:
    """`ROOT/<class>/<image>` (searched recursively inside each class folder)."""
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(f"dataset folder not found: {folder}", "check --data")
    class_dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not is_skipped_folder(p.name))
    if not class_dirs:
        if any(is_image_file(p) and not is_apple_double(p.name) for p in folder.iterdir()):
            raise InputError(
                f"{folder} holds images but no class folders",
                "arrange it as ROOT/<class>/<image>",
            )
        raise InputError(f"no class folders in {folder}", "arrange it as ROOT/<class>/<image>")
    _refuse_links_around(folder, class_dirs)
    names = [d.name for d in class_dirs]
    refuse_spelling_twins(names, f"class folders in {folder}:")
    class_list = list(classes) if classes is not None else names
    index_of = class_index(class_list)
    unknown = [name for name in names if find_class(index_of, name) is None]
    if unknown:
        raise InputError(
            f"class folder(s) {', '.join(unknown[:5])} in {folder} are not among the model's "
            f"{len(class_list)} classes",
            "the classes are: "
            + ", ".join(class_list[:10])
            + (" ..." if len(class_list) > 10 else ""),
        )
    paths, labels = [], []
    for class_dir in class_dirs:
        files = list_image_files(class_dir)
        paths.extend(files)
        labels.extend([find_class(index_of, class_dir.name)] * len(files))
    if not paths:
        raise InputError(
            f"no images in {folder}", "supported: " + ", ".join(sorted(IMAGE_EXTENSIONS))
        )
    ids = relative_ids(paths, folder)
    return Samples(class_list, labels, paths=paths, source=str(folder), ids=ids)


def _refuse_links_around(folder: Path, class_dirs: list[Path]) -> None:
    """A class folder that links to ROOT or above would be one more class holding every other
    class's images again (`ROOT/loop -> ROOT`)."""
    root = os.path.realpath(folder)
    for class_dir in class_dirs:
        if not class_dir.is_symlink():
            continue
        real = os.path.realpath(class_dir)
        if os.path.commonpath([root, real]) == real:
            raise InputError(
                f"class folder {class_dir} links to {real}, which holds {folder} itself: its "
                "images would be counted again under another class",
                "remove the link, or link to the class's own folder",
            )


def discover_flat_folder(root: str | os.PathLike) -> Samples:
    """A folder of images with no class folders (searched recursively): one unnamed class ""."""
    folder = Path(root)
    if not folder.is_dir():
        raise InputError(f"folder not found: {folder}", "check the path")
    paths = list_image_files(folder)
    if not paths:
        raise InputError(
            f"no images in {folder}", "supported: " + ", ".join(sorted(IMAGE_EXTENSIONS))
        )
    ids = relative_ids(paths, folder)
    return Samples([""], [0] * len(paths), paths=paths, source=str(folder), ids=ids)
