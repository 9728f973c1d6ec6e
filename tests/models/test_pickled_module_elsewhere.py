"""A whole pickled `nn.Module` (`torch.save(model, "net.pt")`) whose class is the user's code
(`nets.py` in the folder it was saved in), used from another working directory.

`train` refuses a pickled model (no architecture to rebuild for eval and --resume) and names
its class as the `--model MODULE:Class` to give, with the file as `--weights`: that run's
checkpoint records the folder of the code, so every command loads it from anywhere. A pickle
loaded from a folder where its class's module is not found is one error line that names the
class, the module and where it was looked for, and the folder beside the file that has it."""

from __future__ import annotations

import importlib
import json
import pickle
import sys
from pathlib import Path

import pytest
from image_folders import write_image_folder
from output_checks import error_line
from processes import run_torchkit_in_process

NET = (
    "from torch import nn\n"
    "class Net(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())\n"
    "        self.fc = nn.Linear(4, 3)\n"
    "    def forward(self, x):\n"
    "        return self.fc(self.body(x))\n"
)
CPU = ["--device", "cpu", "--workers", "0"]
VAL = ["--val-split", "0.5", "--image-size", "8", *CPU]


@pytest.fixture
def folders(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """(the folder the model was saved in, another one); sys.path and sys.modules as found."""
    saved, other = tmp_path / "saved", tmp_path / "other"
    saved.mkdir()
    other.mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield saved, other
    for name in set(sys.modules) - before:
        if name.split(".")[0].startswith("pickled_"):
            del sys.modules[name]


def pickle_net(folder: Path, module: str, *, protocol: int = 2, legacy: bool = False) -> Path:
    """folder/net.pt, a pickled Net of `module` (`a` or `a.b`, written under `folder`), saved
    with `folder` importable, then forgotten: as a new process elsewhere finds it."""
    import torch

    path = folder.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    for package in path.relative_to(folder).parents:
        if package != Path("."):
            (folder / package / "__init__.py").touch()
    path.write_text(NET)
    sys.path.insert(0, str(folder))
    try:
        net = importlib.import_module(module).Net()
        target = folder / "net.pt"
        torch.save(net, target, pickle_protocol=protocol, _use_new_zipfile_serialization=not legacy)
    finally:
        sys.path.remove(str(folder))
        for name in [name for name in sys.modules if name.split(".")[0] == module.split(".")[0]]:
            del sys.modules[name]
    return target


@pytest.mark.parametrize("module", ["pickled_flat_nets", "pickled_pkg.nets"])
def test_train_refuses_a_pickled_model_naming_its_class_to_give_as_model(folders, module):
    """It said to `name the architecture as --model`; the user's class is that name."""
    saved, _ = folders
    net = pickle_net(saved, module)
    write_image_folder(saved / "data", {"a": 2, "b": 2})
    refused = run_torchkit_in_process(
        "train", "--data", "data", "--model", "net.pt", "--trust-checkpoint", *VAL, cwd=saved
    )
    assert refused.returncode == 2
    assert error_line(refused.stderr) == (
        "Error: net.pt is a pickled model: train needs an architecture it can rebuild for eval "
        f"and --resume (give its class as --model {module}:Net, or a function that builds it, "
        "and the file as --weights net.pt)"
    )
    assert net.is_file()


@pytest.mark.parametrize("module", ["pickled_flat_nets", "pickled_pkg.nets"])
def test_train_without_trust_refuses_a_pickled_model_naming_its_class_first(folders, module):
    """It said to pass --trust-checkpoint, which loaded the pickle (running its code) only to be
    refused then as a pickled model: the class is read from the file, nothing imported, and the
    line says at once how to train from it, --trust-checkpoint included for the weights."""
    saved, _ = folders
    net = pickle_net(saved, module)
    write_image_folder(saved / "data", {"a": 2, "b": 2})
    refused = run_torchkit_in_process(
        "train", "--data", "data", "--model", "net.pt", *VAL, cwd=saved
    )
    assert refused.returncode == 2
    assert error_line(refused.stderr) == (
        "Error: net.pt is a pickled model: train needs an architecture it can rebuild for eval "
        f"and --resume (give its class as --model {module}:Net, or a function that builds it, "
        "and the file as --weights net.pt with --trust-checkpoint, only if you trust where it "
        "came from)"
    )
    assert module not in sys.modules and net.is_file()


def test_the_class_of_a_pickled_object_is_read_only_where_it_is_the_whole_object(tmp_path):
    """A state dict or a checkpoint's dict is no pickled model, even where it holds classes."""
    import argparse

    import torch

    from torchkit.core.models.usercode import pickled_root_class

    torch.save({"model": {}, "args": argparse.Namespace(lr=1)}, tmp_path / "dict.pt")
    torch.save(torch.nn.Linear(1, 1).state_dict(), tmp_path / "state.pt")
    torch.save(argparse.Namespace(lr=1), tmp_path / "whole.pt")
    torch.save(argparse.Namespace(lr=1), tmp_path / "whole4.pt", pickle_protocol=4)
    (tmp_path / "junk.pt").write_bytes(b"PK\x03\x04 not a zip")
    assert pickled_root_class(tmp_path / "dict.pt") is None
    assert pickled_root_class(tmp_path / "state.pt") == ("collections", "OrderedDict")
    assert pickled_root_class(tmp_path / "whole.pt") == ("argparse", "Namespace")
    assert pickled_root_class(tmp_path / "whole4.pt") == ("argparse", "Namespace")
    assert pickled_root_class(tmp_path / "junk.pt") is None


def test_a_pickled_model_of_a_class_on_pythonpath_names_it_to_give_as_model(folders, monkeypatch):
    """The user's code found on PYTHONPATH (a folder of their own, not the working directory)
    is theirs as the working directory's is: its class is the --model to give."""
    saved, other = folders
    lib = other / "lib"
    lib.mkdir()
    pickle_net(lib, "pickled_lib_nets")
    (lib / "net.pt").rename(saved / "net.pt")
    monkeypatch.setenv("PYTHONPATH", str(lib))
    monkeypatch.syspath_prepend(str(lib))  # what Python makes of PYTHONPATH at its start
    write_image_folder(saved / "data", {"a": 2, "b": 2})
    refused = run_torchkit_in_process(
        "train", "--data", "data", "--model", "net.pt", "--trust-checkpoint", *VAL, cwd=saved
    )
    assert refused.returncode == 2
    assert error_line(refused.stderr) == (
        "Error: net.pt is a pickled model: train needs an architecture it can rebuild for eval "
        "and --resume (give its class as --model pickled_lib_nets:Net, or a function that "
        "builds it, and the file as --weights net.pt)"
    )


@pytest.mark.parametrize("pythonpath", [False, True], ids=["plain", "site-packages-on-pythonpath"])
def test_a_pickled_model_of_an_installed_class_is_refused_with_the_general_hint(
    folders, monkeypatch, pythonpath
):
    """A PYTHONPATH that names the installed packages' folder (as some clusters set it) does
    not make torch's Sequential the user's code: it said --model
    torch.nn.modules.container:Sequential, which builds an empty model."""
    import os

    import torch

    saved, _ = folders
    if pythonpath:
        monkeypatch.setenv("PYTHONPATH", os.path.dirname(os.path.dirname(torch.__file__)))
    torch.save(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(2)), saved / "s.pt")
    write_image_folder(saved / "data", {"a": 2, "b": 2})
    refused = run_torchkit_in_process(
        "train", "--data", "data", "--model", "s.pt", "--trust-checkpoint", *VAL, cwd=saved
    )
    assert refused.returncode == 2
    assert error_line(refused.stderr).endswith(
        "(name the architecture as --model and pass the file as --weights)"
    )


def test_the_class_and_the_pickle_as_weights_train_a_run_used_from_another_folder(folders):
    """The way the refusal gives: the checkpoint records the folder of the class's module, and
    eval, predict, summary, export, extract-features and train --resume of the run work from
    another folder, where the module is not."""
    import torch

    saved, other = folders
    module = "pickled_route_nets"
    pickle_net(saved, module)
    write_image_folder(saved / "data", {"a": 3, "b": 3})
    options = ["--image-size", "8", "--batch-size", "4", "--val-split", "0.34", *CPU]
    trained = run_torchkit_in_process(
        "train", "--data", "data", "--model", f"{module}:Net", "--weights", "net.pt",
        "--trust-checkpoint", "--epochs", "1", "--out", "run", *options, cwd=saved,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    best = saved / "run" / "best.pt"
    assert torch.load(best, weights_only=True)["model_code_folder"] == str(saved)
    sys.path.remove(str(saved))  # as a new process started in the other folder
    del sys.modules[module]
    data = saved / "data"
    trusted = ["--trust-checkpoint"]
    commands = {
        "eval": ["eval", best, "--data", data, *trusted, *CPU, "--format", "json"],
        "predict": ["predict", best, data, *trusted, *CPU, "--format", "json"],
        "summary": ["summary", best, *trusted, "--format", "json"],
        "export": ["export", best, other / "net.ts", *trusted],
        "extract-features": ["extract-features", best, data, other / "feats", *trusted, *CPU],
        "resume": ["train", "--resume", saved / "run", "--epochs", "2", *trusted, "-q"],
    }
    ran = {}
    for name, command in commands.items():
        ran[name] = run_torchkit_in_process(*command, cwd=other)
        assert ran[name].returncode == 0, (name, ran[name].stderr)
        assert str(saved) not in sys.path, name  # for the import only
        sys.modules.pop(module, None)  # each command imports it again
    evaluated = json.loads(ran["eval"].stdout)
    assert evaluated["arch"] == f"{module}:Net"
    assert len(json.loads(ran["predict"].stdout)) == 6
    assert (other / "net.ts").is_file() and (other / "feats" / "meta.json").is_file()
    assert len(torch.load(saved / "run" / "last.pt", weights_only=True)["history"]) == 2


@pytest.mark.parametrize(
    ("module", "beside"),
    [("pickled_here_nets", "pickled_here_nets.py"), ("pickled_p.nets", "pickled_p/")],
)
@pytest.mark.parametrize("command", ["eval", "predict", "summary", "export", "extract-features"])
def test_a_pickle_whose_module_is_not_found_here_names_it_and_the_folder_that_has_it(
    folders, module, beside, command
):
    """It said `No module named ...` and to make the code importable; it names the class,
    the module and where it was looked for, and the pickle's folder that has the module."""
    saved, other = folders
    net = pickle_net(saved, module)
    write_image_folder(other / "data", {"a": 1})
    arguments = {
        "eval": ["--data", "data"],
        "predict": ["data"],
        "summary": [],
        "export": ["net.onnx"],
        "extract-features": ["data", "feats"],
    }[command]
    ran = run_torchkit_in_process(command, net, *arguments, "--trust-checkpoint", cwd=other)
    assert ran.returncode == 1
    top = module.split(".")[0]
    assert error_line(ran.stderr, besides="nothing") == (
        f"Error: cannot unpickle checkpoint {net}: it pickles {module}.Net, and no module {top} "
        f"is found here, in {other}, on PYTHONPATH or among the installed packages (run "
        f"torchkit from {saved}, which has {beside}, or put that folder on PYTHONPATH)"
    )
    assert not (other / "net.onnx").exists() and not (other / "feats").exists()


def test_a_pickle_loads_from_its_folder_and_is_refused_untrusted_without_an_import(folders):
    saved, other = folders
    module = "pickled_trust_nets"
    net = pickle_net(saved, module)
    loaded = run_torchkit_in_process("summary", "net.pt", "--trust-checkpoint", cwd=saved)
    assert loaded.returncode == 0, loaded.stderr
    del sys.modules[module]
    untrusted = run_torchkit_in_process("summary", net, cwd=other)
    assert error_line(untrusted.stderr, besides="nothing") == (
        f"Error: {net} holds a pickled {module}.Net, not only tensors and plain values (pass "
        "--trust-checkpoint to load it anyway, only if you trust where it came from)"
    )
    assert module not in sys.modules


def test_a_pickle_unfound_beside_its_file_too_names_the_folder_to_look_for(folders):
    saved, other = folders
    net = pickle_net(saved, "pickled_gone_nets")
    (saved / "pickled_gone_nets.py").unlink()
    ran = run_torchkit_in_process("summary", net, "--trust-checkpoint", cwd=other)
    assert error_line(ran.stderr, besides="nothing").endswith(
        "among the installed packages (run torchkit from the folder that has "
        "pickled_gone_nets.py or pickled_gone_nets/, or put that folder on PYTHONPATH)"
    )


def test_another_module_of_its_name_here_without_the_class_is_named_with_its_file(folders):
    """It said `Can't get attribute 'Net' on <module ...>`."""
    saved, other = folders
    module = "pickled_other_nets"
    net = pickle_net(saved, module)
    (other / f"{module}.py").write_text("X = 1\n")
    ran = run_torchkit_in_process("summary", net, "--trust-checkpoint", cwd=other)
    assert ran.returncode == 1
    assert error_line(ran.stderr, besides="nothing") == (
        f"Error: cannot unpickle checkpoint {net}: it pickles {module}.Net, and {module}, "
        f"imported from {other / module}.py, has no Net (run torchkit from {saved}, which has "
        f"{module}.py, or put that folder on PYTHONPATH)"
    )


def test_a_package_found_here_without_the_module_is_named_with_its_folder(folders):
    saved, other = folders
    net = pickle_net(saved, "pickled_q.nets")
    (other / "pickled_q").mkdir()
    (other / "pickled_q" / "__init__.py").touch()
    ran = run_torchkit_in_process("summary", net, "--trust-checkpoint", cwd=other)
    assert error_line(ran.stderr, besides="nothing") == (
        f"Error: cannot unpickle checkpoint {net}: it pickles pickled_q.nets.Net, and "
        f"pickled_q, imported from {other / 'pickled_q'}, has no module nets (run torchkit "
        f"from {saved}, which has pickled_q/, or put that folder on PYTHONPATH)"
    )


def test_a_module_that_imports_one_found_nowhere_names_both(folders):
    saved, other = folders
    module = "pickled_needy_nets"
    net = pickle_net(saved, module)
    (saved / f"{module}.py").write_text("import pickled_nowhere_dependency\n" + NET)
    ran = run_torchkit_in_process("summary", net, "--trust-checkpoint", cwd=saved)
    assert ran.returncode == 1
    assert error_line(ran.stderr, besides="nothing") == (
        f"Error: cannot unpickle checkpoint {net}: it pickles {module}.Net, and importing "
        f"{module} from {saved / module}.py failed: No module named "
        "'pickled_nowhere_dependency' (install pickled_nowhere_dependency, which "
        f"{module} imports, or make it importable)"
    )


# pickle's own message of the failed lookup shows pytest's __main__ (a repr Python deprecates)
@pytest.mark.filterwarnings("ignore:BuiltinImporter.module_repr:DeprecationWarning")
def test_a_class_of_the_script_that_saved_it_is_said_to_be_importable_nowhere(folders, monkeypatch):
    """`Can't get attribute 'MainNet' on <module '__main__' from '.../torchkit'>` said nothing
    a user could act on: only the script that defined it has its class. Without
    --trust-checkpoint the same line: it said to pass --trust-checkpoint, which then failed."""
    import torch

    saved, other = folders

    class MainNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 2)

    MainNet.__module__, MainNet.__qualname__ = "__main__", "MainNet"
    with monkeypatch.context() as saving:
        saving.setattr(sys.modules["__main__"], "MainNet", MainNet, raising=False)
        torch.save(MainNet(), saved / "main.pt")
    for folder, trusted in ((saved, True), (other, True), (other, False)):
        trust = ["--trust-checkpoint"] if trusted else []
        ran = run_torchkit_in_process(
            "eval", saved / "main.pt", "--data", "digits", *trust, cwd=folder
        )
        assert ran.returncode == 1
        assert error_line(ran.stderr, besides="nothing") == (
            f"Error: cannot unpickle checkpoint {saved / 'main.pt'}: it pickles "
            "__main__.MainNet, defined in the script that saved it, which no other program can "
            "import (move MainNet into a module such as nets.py, import it from there and save "
            "the model again, or save its state_dict and give --model nets:MainNet --weights "
            "FILE)"
        )


@pytest.mark.parametrize(
    ("protocol", "legacy"), [(2, False), (pickle.HIGHEST_PROTOCOL, False), (2, True)]
)
def test_the_classes_a_pickle_names_are_read_without_importing_them(folders, protocol, legacy):
    """torch.save's zip (GLOBAL opcodes, and STACK_GLOBAL with a memo from protocol 4) and
    its legacy format (pickles in a row) alike; nothing else read is none."""
    from torchkit.core.models.usercode import pickled_globals

    saved, _ = folders
    net = pickle_net(saved, "pickled_read_nets", protocol=protocol, legacy=legacy)
    found = pickled_globals(net)
    assert found[0] == ("pickled_read_nets", "Net")
    assert ("torch.nn.modules.linear", "Linear") in found
    assert "pickled_read_nets" not in sys.modules
    (saved / "junk.pt").write_bytes(b"PK\x03\x04 not a zip")
    assert pickled_globals(saved / "junk.pt") == []
    assert pickled_globals(saved / "none.pt") == []


# pickle's own message of the failed lookup shows pytest's __main__ (a repr Python deprecates)
@pytest.mark.filterwarnings("ignore:BuiltinImporter.module_repr:DeprecationWarning")
def test_an_untrusted_file_that_fails_so_is_unreadable_and_its_classes_are_not_looked_up(
    folders, monkeypatch
):
    """weights_only imports nothing: an AttributeError of an untrusted file is the file's own
    allowed call on damaged values, not a class missing here. It said `__main__.Later` (named
    after the failing call, never reached) was defined in the script that saved it."""
    import collections

    import torch
    from hostile_pickles import RunsShell

    saved, other = folders

    class Later:
        pass

    class Damaged:
        def __reduce__(self):  # an allowed call with a value that is no storage
            no_storage = (1, 0, (1,), (1,), False, collections.OrderedDict())
            return (torch._utils._rebuild_tensor_v2, no_storage)

    Later.__module__, Later.__qualname__ = "__main__", "Later"
    marker = saved / "ran"
    with monkeypatch.context() as saving:
        saving.setattr(sys.modules["__main__"], "Later", Later, raising=False)
        torch.save({"a": Damaged(), "b": Later}, saved / "damaged.pt")
        torch.save({"a": RunsShell(marker), "b": Later}, saved / "hostile.pt")
    damaged = run_torchkit_in_process("summary", saved / "damaged.pt", cwd=other)
    assert damaged.returncode == 1
    assert error_line(damaged.stderr, besides="nothing") == (
        f"Error: cannot read checkpoint {saved / 'damaged.pt'}: AttributeError: 'int' object "
        "has no attribute 'dtype' (the file may be truncated or not a PyTorch checkpoint)"
    )
    hostile = run_torchkit_in_process("summary", saved / "hostile.pt", cwd=other)
    assert error_line(hostile.stderr, besides="nothing") == (
        f"Error: {saved / 'hostile.pt'} holds a pickled posix.system, not only tensors and plain "
        "values (pass --trust-checkpoint to load it anyway, only if you trust where it came from)"
    )
    assert not marker.exists()


@pytest.mark.parametrize("length", [4096, 2**62], ids=["bytes-past-the-cap", "claimed-length"])
def test_a_legacy_pickle_is_read_up_to_a_cap_and_what_was_read_stands(folders, monkeypatch, length):
    """A plain pickle's tensors are bytes within it (a 2 GB file was read whole into memory to
    find the classes it names); a damaged length is not read either. The class read before
    stands (the read past the cap, or of a claimed length, lost it)."""
    import struct

    from torchkit.core.models import usercode

    saved, _ = folders
    monkeypatch.setattr(usercode, "_MAX_PICKLE_BYTES", 1024)
    data = (
        b"\x80\x04cpickled_cap_nets\nNet\n"
        + b"\x8e" + struct.pack("<Q", length) + b"x" * 4096  # BINBYTES8
        + b"cpickled_late\nLate\n\x87."
    )  # fmt: skip
    (saved / "plain.pkl").write_bytes(data)
    assert usercode.pickled_globals(saved / "plain.pkl") == [("pickled_cap_nets", "Net")]


@pytest.mark.parametrize("module", ["torch.nn.modules.linear", "torch.nn.modules.pickled_future"])
def test_a_class_or_module_an_installed_package_lacks_is_said_to_need_its_other_version(
    folders, monkeypatch, module
):
    """It said to run torchkit from `the folder whose torch defines FutureLinear`: the file was
    saved with another version of torch (a class or module this one lacks)."""
    import types

    import torch

    saved, other = folders

    class FutureLinear(torch.nn.Linear):
        pass

    FutureLinear.__module__, FutureLinear.__qualname__ = module, "FutureLinear"
    with monkeypatch.context() as saving:
        if module not in sys.modules:
            saving.setitem(sys.modules, module, types.ModuleType(module))
        saving.setattr(sys.modules[module], "FutureLinear", FutureLinear, raising=False)
        torch.save(torch.nn.Sequential(FutureLinear(2, 2)), saved / "future.pt")
    ran = run_torchkit_in_process("summary", saved / "future.pt", "--trust-checkpoint", cwd=other)
    assert ran.returncode == 1
    parent, _, last = module.rpartition(".")
    lacks = (
        f"{parent}, imported from {Path(torch.nn.modules.__file__).parent}, has no module {last}"
    )
    if module.endswith("linear"):
        lacks = f"{module}, imported from {torch.nn.modules.linear.__file__}, has no FutureLinear"
    assert error_line(ran.stderr, besides="nothing") == (
        f"Error: cannot unpickle checkpoint {saved / 'future.pt'}: it pickles "
        f"{module}.FutureLinear, and {lacks} (it was saved with another version of torch than "
        "the one installed here: install that version, or load it where that is installed and "
        "save its state_dict)"
    )


@pytest.mark.parametrize(
    ("folder", "shown"),
    [("my nets", "'my nets/net.pt'"), ("my\nnets", "$'my\\nnets/net.pt'")],
    ids=["space", "newline"],
)
def test_the_refusal_of_a_pickled_model_quotes_the_path_it_shows(folders, folder, shown):
    """The command the hint shows is pasted as it is: a path with a space is one quoted shell
    word, and a line break in it neither splits the Error line nor the word."""
    saved, _ = folders
    net = pickle_net(saved, "pickled_quoted_nets")
    (saved / folder).mkdir()
    net.rename(saved / folder / "net.pt")
    write_image_folder(saved / "data", {"a": 2, "b": 2})
    refused = run_torchkit_in_process(
        "train",
        "--data",
        "data",
        "--model",
        f"{folder}/net.pt",
        "--trust-checkpoint",
        *VAL,
        cwd=saved,
    )
    assert refused.returncode == 2
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert lines[-1] == (
        f"Error: {folder.encode('unicode_escape').decode()}/net.pt is a pickled model: train "
        "needs an architecture it can rebuild for eval and --resume (give its class as --model "
        "pickled_quoted_nets:Net, or a function that builds it, and the file as --weights "
        f"{shown})"
    )
