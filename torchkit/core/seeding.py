"""`--seed` and `--deterministic`."""

from __future__ import annotations

import os
import random


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
        torch.use_deterministic_algorithms(True, warn_only=True)


def capture_rng_state() -> dict:
    """RNG states of Python, NumPy and torch, as plain values that load with weights_only=True."""
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
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
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
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_state_to_plain(state: tuple) -> dict:
    version, internal, gauss = state
    return {"version": version, "internal": list(internal), "gauss": gauss}


def _python_state_from_plain(plain: dict) -> tuple:
    return (plain["version"], tuple(plain["internal"]), plain["gauss"])
