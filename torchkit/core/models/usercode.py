"""Running the user's model code (`package.module:Callable`, trusted pickles): the working
directory importable as with `python -m`, and anything it prints sent to stderr."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from torchkit.core.io.errors import InputError, TorchkitError, UsageError, first_line
from torchkit.core.io.pickle_records import MAX_STRUCTURE_BYTES, pickle_record

log = logging.getLogger("torchkit")


@dataclass(frozen=True)
class _TrainedIn:
    folder: str  # the working directory the run trained in
    source: str  # the checkpoint that records it, as the messages name it


_trained_in: ContextVar[_TrainedIn | None] = ContextVar("trained_in", default=None)
# The working directories (this one, a resumed run's) that `user_code` looked for code in
_searched: set[str] = set()


@contextlib.contextmanager
def code_of_the_run_in(folder: str | None, source: str | os.PathLike) -> Iterator[None]:
    """Around building the model of a checkpoint (`source`) whose run found its model code
    (`package.module:Callable`) in the working directory `folder`: the code is looked for
    there first, before here, as the run found it (a run resumed, evaluated or exported from
    another folder). None or "" (a checkpoint that records none): from here only. Only for
    code already trusted: a file's `arch` is imported with `--trust-checkpoint` alone."""
    token = _trained_in.set(_TrainedIn(folder, os.fspath(source)) if folder else None)
    try:
        yield
    finally:
        _trained_in.reset(token)


def model_code_folder(checkpoint: Mapping[str, Any] | None) -> str | None:
    """The working directory a checkpoint's model code (`package.module:Callable`) was
    imported from when its run trained: the folder it records, else (written before it was)
    the run's working directory; None for none, or a value that is no absolute path."""
    from torchkit.core.data.sources.required import absolute_folder

    if checkpoint is None:
        return None
    data = checkpoint.get("data")
    folder = checkpoint.get("model_code_folder") or (
        data.get("workdir") if isinstance(data, Mapping) else None
    )
    return absolute_folder(folder) or None


def _elsewhere(cwd: str) -> _TrainedIn | None:
    """The resumed run's working directory when that is another folder than `cwd`."""
    trained = _trained_in.get()
    if trained is None or trained.folder in ("", cwd):
        return None
    from torchkit.core.data.sources.required import same_place

    return None if same_place(trained.folder, cwd) else trained  # a folder gone: elsewhere


def is_callable_spec(spec: str) -> bool:
    """`package.module:Callable`, unless a file of that name exists."""
    return ":" in spec and not os.path.exists(spec)


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Around an import or call of user code: the working directory on `sys.path` (as `python -m`
    puts it there) and stdout redirected to stderr, so that machine-readable output stays clean."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)  # after installed packages: a local folder never shadows them
    _searched.add(cwd)
    # A resumed run's working directory, where its code was found, comes just before this
    # one, for this import or call only.
    trained = _elsewhere(cwd)
    added = trained is not None and trained.folder not in sys.path
    if added:
        here = next(index for index, path in enumerate(sys.path) if path in ("", cwd))
        sys.path.insert(here, trained.folder)
    if trained is not None:
        _searched.add(os.path.abspath(trained.folder))
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    except SystemExit as error:  # else the command would end with its code, silently
        raise InputError(
            f"the model code called sys.exit({error.code!r}) while it was imported or run",
            "a model module must build its model, not end the program",
        ) from error
    finally:
        if added:
            sys.path.remove(trained.folder)


# `timm.create_model("hf-hub:ORG/NAME")` given as `timm/hf-hub:ORG/NAME`: before the colon.
TIMM_HUB_PREFIX = "timm/hf-hub"


def import_factory(spec: str):
    """The callable `package.module:Callable` names."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"invalid model {spec!r}", "use package.module:Callable")
    if module_name == TIMM_HUB_PREFIX:  # timm's own spelling of a Hub repo, read as code
        raise UsageError(
            f"invalid model {spec!r}: timm models named by their Hugging Face Hub repository "
            "(hf-hub:) are not supported",
            "name the model as timm/NAME, with --weights DEFAULT or a pretrained tag for "
            "timm's weights, or --weights FILE for the repository's weights file",
        )
    if module_name.startswith(".") or "/" in module_name or os.sep in module_name:
        raise UsageError(
            f"invalid model {spec!r}: {module_name!r} is a path, not a module name",
            "run torchkit from the folder that holds the module and name it as "
            "package.module:Callable",
        )
    top = module_name.split(".")[0]
    try:
        with user_code():
            module = importlib.import_module(module_name)
    except ImportError as error:
        trained = _elsewhere(os.getcwd())
        if module_name.endswith(".py"):  # a file name where a module name belongs
            hint = f"name the module without .py: {module_name[:-3]}:{attr}"
        elif trained is not None and error.name == top:  # found neither there nor here
            raise UsageError(
                f"cannot import model {spec!r}, which {trained.source} records: {error}, "
                f"neither in {trained.folder}, where the run trained, nor here",
                f"put {top}.py or {top}/ back in {trained.folder}, or run torchkit from "
                "the folder that holds it now",
            ) from error
        else:
            hint = f"run torchkit from the folder that holds {top}/ or {top}.py, or install it"
        raise UsageError(f"cannot import model {spec!r}: {error}", hint) from error
    _note_another_here(spec, top)
    try:
        return getattr(module, attr)
    except AttributeError as error:
        raise UsageError(
            f"cannot import model {spec!r}: {error}", _missing_callable_hint(top, attr)
        ) from error


def _note_another_here(spec: str, top: str) -> None:
    """A note where a resumed run's model code was imported from the folder the run trained
    in and this folder holds another module of that name (not the one it trains with)."""
    import importlib.machinery

    cwd = os.getcwd()
    trained = _elsewhere(cwd)
    imported = getattr(sys.modules.get(top), "__spec__", None)
    if trained is None or imported is None or not imported.has_location:
        return
    there = _package_folder(imported)
    if os.path.dirname(there) != os.path.abspath(trained.folder):
        return  # installed, or found here: as the run found it
    here = importlib.machinery.PathFinder.find_spec(top, [cwd])
    if here is None or here.origin is None:
        return
    log.warning(
        "%s, which %s records, is imported from %s, where the run trained, not from %s here",
        spec,
        trained.source,
        there,
        os.path.relpath(_package_folder(here), cwd),
        extra={"note": True},
    )


def imported_from(spec: str) -> str | None:
    """The working directory (this one, or a resumed run's) that the module of
    `package.module:Callable` was imported from (a checkpoint records it: `--resume` from
    elsewhere looks there first); None for one installed or on PYTHONPATH, found from
    anywhere, or not imported."""
    top = spec.partition(":")[0].split(".")[0]
    found = getattr(sys.modules.get(top), "__spec__", None)
    if found is None or not found.has_location or found.origin is None:
        return None
    folder = os.path.dirname(_package_folder(found))
    return folder if folder in _searched else None


def _package_folder(found: Any) -> str:
    """The file of a module's spec, or the folder of a package's."""
    origin = os.path.abspath(found.origin)
    if found.submodule_search_locations is not None:  # a package: its __init__.py's folder
        return os.path.dirname(origin)
    return origin


def _missing_callable_hint(top: str, attr: str) -> str:
    """A module of the working directory's that another of its name comes before: to be
    renamed. Else the form of the name."""
    local = f"{top}.py"
    found = module_found_first(top, local) if os.path.isfile(local) else None
    if found is not None:
        return (
            f"{top} is {found}, found before {top}.py in this folder: rename {top}.py, "
            f"such as to {top}_model.py, named {top}_model:{attr}"
        )
    return "use package.module:Callable"


def module_found_first(module: str, source: str | os.PathLike) -> str | None:
    """What `module` names for Python when that is not the file `source` (code.py, test.py or
    sys.py, hidden by Python's own: the working directory is searched after the installed
    modules): its file, or "Python's built-in module NAME"; None when it is `source`, or is
    found nowhere else (a namespace package, which a module beats, counts as nowhere)."""
    import importlib.util

    loaded = sys.modules.get(module)
    try:
        found = loaded.__spec__ if loaded is not None else importlib.util.find_spec(module)
    except (ImportError, ValueError, AttributeError):  # its import fails, or it has no spec
        return None
    if found is None or found.origin is None:
        return None
    if not found.has_location:  # "built-in", "frozen": compiled into Python
        return f"Python's built-in module {module}"
    if os.path.abspath(found.origin) == os.path.abspath(source):
        return None
    return found.origin


def call_model_factory(
    spec: str,
    *,
    num_classes: int | None = None,
    image_size: int | Sequence[int] | None = None,
) -> tuple[Any, bool]:
    """Import `package.module:Callable` and call it, with `num_classes` and `image_size` (an
    int for square images, else (H, W)) when they are given and the callable accepts them: a
    ViT is built for the images it is fed. Returns (the nn.Module it built, whether
    num_classes was passed)."""
    import torch

    factory = import_factory(spec)
    accepted = _accepted_params(factory)
    takes_classes = num_classes is not None and "num_classes" in accepted
    kwargs: dict[str, Any] = {"num_classes": num_classes} if takes_classes else {}
    if image_size is not None and "image_size" in accepted:
        side = tuple(int(n) for n in ([image_size] if isinstance(image_size, int) else image_size))
        kwargs["image_size"] = side[0] if len(set(side)) == 1 else side
    try:
        with user_code():
            model = factory(**kwargs)
    except TorchkitError:
        raise
    except Exception as error:  # the user's code failed: say where, in one line
        hint = "fix the callable, or set TORCHKIT_DEBUG=1 to see the traceback"
        if "image_size" in kwargs:  # a ViT refuses a size its patches do not divide
            hint = f"check --image-size, here {kwargs['image_size']} px; or {hint}"
        raise InputError(
            f"{spec} could not build a model: {first_line(error, with_type=True)}", hint
        ) from error
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} returned a {type(model).__name__}, not a torch.nn.Module")
    return in_float32(model), takes_classes


def in_float32(module):
    """`module` with float16, bfloat16 or float64 weights cast to float32, as they are when
    loaded into a model built here: the dtype a model was pickled or built in by the user's
    code (`model.half()`) is a way to store it, and every command feeds float32 batches (--amp
    and export's --dtype pick others themselves)."""
    import torch

    tensors = [*module.parameters(), *module.buffers()]
    if any(t.is_floating_point() and t.dtype != torch.float32 for t in tensors):
        module.float()
    return module


def _accepted_params(factory) -> set[str]:
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


def script_class(name: str) -> tuple[str, str]:
    """(what, hint) for a pickle of `__main__.NAME`: a class of the script that saved it, which
    no other program imports, trusted or not (torchkit's `__main__` is its own)."""
    return (
        f"it pickles __main__.{name}, defined in the script that saved it, which no other "
        "program can import",
        f"move {name} into a module such as nets.py, import it from there and save the model "
        f"again, or save its state_dict and give --model nets:{name} --weights FILE",
    )


def unimportable_pickle(source: str | os.PathLike, error: BaseException) -> tuple[str, str] | None:
    """What a trusted pickle (`source`, a whole pickled `nn.Module`) that failed to load with
    `error` (ModuleNotFoundError, AttributeError) could not import, as (what, hint): the
    module of a class it pickles found nowhere, a module found without the class (another file
    of its name here), a class of the script that saved it (`__main__`), a module that one
    imports found nowhere. None where the error is none of those."""
    pickled = pickled_globals(source)
    folder = os.path.dirname(os.path.abspath(source))
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    named = [(m, n) for m, n in pickled if missing and (m + ".").startswith(missing + ".")]
    if named:  # the module of a class it pickles
        module, name = named[0]
        top = module.split(".")[0]
        if "." in missing:  # its package is found, without this module
            parent, _, last = missing.rpartition(".")
            return (
                f"it pickles {module}.{name}, and {_imported(parent)} has no module {last}",
                _where_hint(top, folder, f"the folder whose {top}/ holds {last}"),
            )
        return (
            f"it pickles {module}.{name}, and no module {top} is found here, in "
            f"{os.getcwd()}, on PYTHONPATH or among the installed packages",
            _where_hint(top, folder, f"the folder that has {top}.py or {top}/"),
        )
    if missing:  # a module that the module of a class it pickles imports
        failed = next(((m, n) for m, n in pickled if m not in sys.modules), None)
        if failed is not None:
            module, name = failed
            needed = missing.split(".")[0]
            return (
                f"it pickles {module}.{name}, and importing {_found_at(module)} failed: No "
                f"module named {missing!r}",
                f"install {needed}, which {module} imports, or make it importable",
            )
    if isinstance(error, AttributeError):
        for module, name in pickled:
            loaded = sys.modules.get(module)
            if loaded is None or _has_attribute(loaded, name):
                continue
            if module == "__main__":
                return script_class(name)
            top = module.split(".")[0]
            return (
                f"it pickles {module}.{name}, and {_imported(module)} has no {name}",
                _where_hint(top, folder, f"the folder whose {top} defines {name}"),
            )
    return None


def class_spec(model: Any) -> str | None:
    """`module:Class` that names the class of `model` (a pickled one) for --model, where the
    class is the user's code: a module of a working directory this command imported from, or
    of PYTHONPATH. None for a class of an installed package (torchvision's ResNet, which takes
    arguments no spec gives), of the script that saved it (`__main__`), or nested in another."""
    cls = type(model)
    module, name = cls.__module__, cls.__qualname__
    if module == "__main__" or "." in name or not name.isidentifier():
        return None
    where = _module_file(sys.modules.get(module.split(".")[0]))
    if where is None:
        return None
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    roots = _searched | {os.path.abspath(path) for path in paths if path}
    roots -= _installed_folders()  # (a PYTHONPATH that names the site-packages folder)
    return f"{module}:{name}" if os.path.dirname(where) in roots else None


def _installed_folders() -> set[str]:
    """The folders of the standard library and the installed packages."""
    import site
    import sysconfig

    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    folders = [path for key, path in sysconfig.get_paths().items() if key in keys]
    if hasattr(site, "getsitepackages"):
        folders += site.getsitepackages()
    folders.append(site.getusersitepackages())
    return {os.path.abspath(path) for path in folders if path}


def _found_at(module: str) -> str:
    """`module`, and the file Python finds for it (a top-level one: found, not imported)."""
    import importlib.machinery

    if "." in module:
        return module
    try:
        found = importlib.machinery.PathFinder.find_spec(module)
    except (ImportError, ValueError):
        return module
    if found is None or not found.has_location or found.origin is None:
        return module
    return f"{module} from {_package_folder(found)}"


def _imported(module: str) -> str:
    """`module`, and where it was imported from when that is a file or folder."""
    where = _module_file(sys.modules.get(module))
    return f"{module}, imported from {where}," if where else module


def _where_hint(top: str, folder: str, otherwise: str) -> str:
    """Where to run torchkit from: `folder`, the pickled file's, when it holds `top`.py or
    `top`/ that was not the one imported (or none was), else the folder `otherwise` names; an
    installed `top` imported (another version of it saved the file): the version to use."""
    beside = _code_beside(top, folder)
    imported = _module_file(sys.modules.get(top))
    if beside is not None and (
        imported is None or not _same_folder(os.path.dirname(imported), folder)
    ):
        return f"run torchkit from {folder}, which has {beside}, or put that folder on PYTHONPATH"
    if imported is not None and os.path.dirname(imported) in _installed_folders():
        return (
            f"it was saved with another version of {top} than the one installed here: install "
            "that version, or load it where that is installed and save its state_dict"
        )
    return f"run torchkit from {otherwise}, or put that folder on PYTHONPATH"


def _module_file(module: Any) -> str | None:
    found = getattr(module, "__spec__", None)
    if found is None or not found.has_location or found.origin is None:
        return None
    return _package_folder(found)


def _code_beside(top: str, folder: str) -> str | None:
    """`top`.py or `top`/ where `folder` holds it (a module beside the pickled file)."""
    if os.path.isfile(os.path.join(folder, f"{top}.py")):
        return f"{top}.py"
    if os.path.isdir(os.path.join(folder, top)):
        return f"{top}/"
    return None


def _same_folder(a: str, b: str) -> bool:
    from torchkit.core.data.sources.required import same_place

    return same_place(a, b)


def _has_attribute(module: Any, qualname: str) -> bool:
    value = module
    for part in qualname.split("."):
        try:
            value = getattr(value, part)
        except Exception:  # a module's own __getattr__ may raise anything
            return False
    return True


# The pickle opcodes that push a string, which STACK_GLOBAL takes as a module and a name.
_STRING_OPCODES = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING",
     "BINSTRING", "STRING"}
)  # fmt: skip
_MAX_PICKLE_BYTES = MAX_STRUCTURE_BYTES


def pickled_globals(source: str | os.PathLike) -> list[tuple[str, str]]:
    """The (module, qualified name) of each class or function a torch.save file's pickle
    names, in order, read from its opcodes: nothing is imported or run. [] for a file that is
    not read so (no torch.save file, damaged)."""
    import zipfile

    try:
        if zipfile.is_zipfile(source):
            with zipfile.ZipFile(source) as archive:
                record = pickle_record(archive, _MAX_PICKLE_BYTES)
                return _globals_of([archive.read(record)] if record is not None else [])
        with open(source, "rb") as handle:  # the legacy format: several pickles in a row
            return _globals_of([_Capped(handle, _MAX_PICKLE_BYTES)], pickles=4)
    except Exception:  # a damaged file: torch's error stands
        return []


def pickled_root_class(source: str | os.PathLike) -> tuple[str, str] | None:
    """(module, qualified name) of the class whose instance is a torch.save file's whole
    object (what `torch.save(model, path)` pickles first, before its state), read from the
    pickle's first opcodes: nothing is imported or run. None where the object is built
    otherwise (a dict), and for a file of the legacy format or a damaged one."""
    import pickletools
    import zipfile

    try:
        if not zipfile.is_zipfile(source):
            return None
        with zipfile.ZipFile(source) as archive:
            record = pickle_record(archive, _MAX_PICKLE_BYTES)
            data = archive.read(record) if record is not None else b""
        first: list[tuple[str, Any]] = []  # the first opcodes that are not framing or memo
        for opcode, arg, _position in pickletools.genops(data):
            kind = "STRING" if opcode.name in _STRING_OPCODES else opcode.name
            if kind not in ("PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
                first.append((kind, arg))
                if kind != "STRING" or len(first) == 3:
                    break
    except Exception:  # a damaged file: the loader's own error stands
        return None
    kinds = [kind for kind, _ in first]
    if kinds == ["GLOBAL"] and " " in str(first[0][1]):  # protocol 2: GLOBAL 'module name'
        module, _, name = str(first[0][1]).partition(" ")
        return module, name
    if kinds == ["STRING", "STRING", "STACK_GLOBAL"]:  # protocol 4
        return str(first[0][1]), str(first[1][1])
    return None


def class_spec_of_pickled(module: str, name: str) -> str | None:
    """`module:Class` for --model of a class a pickle names (`nets`, `Net`), found but not
    imported, where it is the user's code as `class_spec` says: a module of the working
    directory or of PYTHONPATH, not of the installed packages, nor `__main__`, nor a class
    nested in another."""
    import importlib.machinery

    if module == "__main__" or not name.isidentifier():
        return None
    paths = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    roots = {os.path.abspath(path) for path in paths if path} - _installed_folders()
    try:
        found = importlib.machinery.PathFinder.find_spec(module.split(".")[0], sorted(roots))
    except (ImportError, ValueError):
        return None
    return f"{module}:{name}" if found is not None and found.has_location else None


class _Capped:
    """A file read on for at most `limit` bytes in all: a read past them is an error, not
    made (a plain pickle's tensors are bytes within it: a 2 GB file is not read into memory,
    nor a damaged one's claimed length)."""

    def __init__(self, handle: Any, limit: int) -> None:
        self._handle, self._left = handle, limit

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > self._left:
            raise ValueError("past the bytes a pickle's structure is read in")
        data = self._handle.read(size)
        self._left -= len(data)
        return data

    def readline(self) -> bytes:
        line = self._handle.readline(self._left)
        self._left -= len(line)
        return line


def _globals_of(inputs: list[Any], pickles: int = 1) -> list[tuple[str, str]]:
    """The globals of the first `pickles` pickles of each input (bytes, or a file read on)."""
    found: list[tuple[str, str]] = []
    for data in inputs:
        for _ in range(pickles):
            try:
                _globals_of_one(data, found)
            except Exception:  # past the last pickle, or a damaged one: what was read stands
                break
    return list(dict.fromkeys(found))


def _globals_of_one(data: Any, found: list[tuple[str, str]]) -> None:
    """Adds to `found` the globals of the pickle `data` holds (next), as they are read."""
    import pickletools

    memo: dict[Any, Any] = {}
    recent: list[Any] = [None, None]  # the last two values pushed, where they are strings
    for opcode, arg, _position in pickletools.genops(data):
        name = opcode.name
        if name == "GLOBAL" and isinstance(arg, str) and " " in arg:
            module, _, attr = arg.partition(" ")
            found.append((module, attr))
            recent.append(None)
        elif name == "STACK_GLOBAL":
            module, attr = recent[-2], recent[-1]
            if isinstance(module, str) and isinstance(attr, str):
                found.append((module, attr))
            recent.append(None)
        elif name in _STRING_OPCODES:
            recent.append(arg if isinstance(arg, str) else None)
        elif name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            memo[len(memo) if name == "MEMOIZE" else arg] = recent[-1]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            recent.append(memo.get(arg))
        else:
            recent.append(None)
        del recent[:-2]
