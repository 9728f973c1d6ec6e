"""`--seed` and `--deterministic`."""

from __future__ import annotations

import logging
import os
import random

from torchkit.core.io.errors import UsageError, short_repr

log = logging.getLogger("torchkit")

# The seeds of every --seed: what Python's random, NumPy (np.random.seed: 0 to 2**32-1) and torch
# all take, so that a seed one command accepts every other command accepts too.
SEEDS = (0, 2**32 - 1)

# splitmix64 (Steele, Lea and Flood, 2014): its state increment and its output function's two
# multipliers; `train.loaders.mix_seed`/`mix_seeds` and `train.memory_images.uniforms` are
# splitmix64.
SPLITMIX_INCREMENT = 0x9E3779B97F4A7C15
SPLITMIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)


def splitmix_output(z):
    """splitmix64's output function on a uint64 NumPy array (its arithmetic wraps, as meant)."""
    import numpy as np

    first, second = (np.uint64(m) for m in SPLITMIX_MULTIPLIERS)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * first
        z = (z ^ (z >> np.uint64(27))) * second
        return z ^ (z >> np.uint64(31))


def check_seed(seed: object) -> int:
    """`seed` if it is one of SEEDS; a UsageError naming --seed otherwise (one wording for every
    command, the CLI's check and core's)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEEDS[0] <= seed <= SEEDS[1]:
        raise UsageError(
            f"--seed {short_repr(seed)} is not a seed",
            f"give a whole number from {SEEDS[0]} to {SEEDS[1]}",
        )
    return seed


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed Python, NumPy and torch (all devices); optionally make cuDNN and torch deterministic."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        # Must be set before the first cuBLAS call for deterministic GEMMs on CUDA >= 10.2.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        use_deterministic_algorithms(True, warn_only=True)


def use_deterministic_algorithms(mode: bool, warn_only: bool = False) -> None:
    """`torch.use_deterministic_algorithms(mode, warn_only=warn_only)` without importing
    torch._inductor while nothing has: torch's function imports it (and torch._dynamo and
    sympy with it: about 3 s of CPU, each --deterministic run) only to copy `mode` into
    inductor's own `deterministic` flag, which only a model inductor compiles reads; a model
    torchkit compiles gets it then (`compiled.compile_module`)."""
    import sys

    import torch

    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def capture_rng_state(device=None) -> dict:
    """RNG states of Python, NumPy and torch, as plain values that load with weights_only=True.

    CUDA's is the state of one GPU: `device` (the one training runs on) or the current one, with
    its index; a process under torchrun uses one GPU, and reading every visible GPU's state would
    also create a CUDA context on each of them."""
    import numpy as np
    import torch

    np_state = np.random.get_state()
    state = {
        "python": _python_state_to_plain(random.getstate()),
        "numpy": {
            "kind": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype("int64")),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    index = _cuda_index(device)
    if index is not None and torch.cuda.is_initialized():
        state["cuda"] = [torch.cuda.get_rng_state(index)]
        state["cuda_device"] = index
    return state


def restore_rng_state(state: dict, device=None) -> None:
    """Put back what `capture_rng_state` saved. CUDA's state goes to `device` (or the current
    GPU) whichever GPU it was saved from. A checkpoint of an older torchkit holds every visible
    GPU's state: only the training GPU's is restored, so fewer visible GPUs than were saved is
    fine. Without CUDA, a saved CUDA state is left out with a warning."""
    import numpy as np
    import torch

    random.setstate(_python_state_from_plain(state["python"]))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype("uint32"),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    saved = state.get("cuda")
    if not saved:
        return
    index = _cuda_index(device)
    if index is None:
        if device is None or getattr(device, "type", "cpu") == "cuda":
            log.warning("the checkpoint's CUDA random state is not restored: no GPU is available")
        return
    if "cuda_device" in state:
        torch.cuda.set_rng_state(saved[0], index)
    elif index < len(saved):  # older checkpoints: a list indexed by GPU
        torch.cuda.set_rng_state(saved[index], index)
    else:
        log.warning(
            "the checkpoint holds the CUDA random state of %d GPU(s), none for cuda:%d: "
            "random numbers on the GPU start afresh",
            len(saved),
            index,
        )


def _cuda_index(device) -> int | None:
    """The GPU index of `device` (None: the current GPU), or None when it is no GPU or CUDA is
    not available."""
    import torch

    if device is not None and getattr(device, "type", str(device)) != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    index = getattr(device, "index", None) if device is not None else None
    return torch.cuda.current_device() if index is None else int(index)


def _python_state_to_plain(state: tuple) -> dict:
    version, internal, gauss = state
    return {"version": version, "internal": list(internal), "gauss": gauss}


def _python_state_from_plain(plain: dict) -> tuple:
    return (plain["version"], tuple(plain["internal"]), plain["gauss"])
