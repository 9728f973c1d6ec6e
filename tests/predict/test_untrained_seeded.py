"""An untrained model (--allow-untrained: a pipeline check) is drawn from a fixed seed, so two
runs of predict or eval give the same rows, whatever torch's random state was before; the
caller's random state is left as it was."""

from __future__ import annotations

import json

import torch
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.models import ModelSpec, resolve_spec


def test_the_random_weights_of_an_untrained_model_come_from_its_seed():
    spec = ModelSpec(model="convnet", allow_untrained=True, num_classes=2, image_size=8)
    built = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        state = torch.random.get_rng_state()
        model = resolve_spec(spec, command="predict", predicting=True).model
        assert torch.equal(torch.random.get_rng_state(), state)  # the caller's, untouched
        built.append(model.state_dict())
    assert all(torch.equal(built[0][name], built[1][name]) for name in built[0])
    other = ModelSpec(model="convnet", allow_untrained=True, num_classes=2, image_size=8)
    other.build_seed = 1  # extract-features' --seed
    drawn = resolve_spec(other, command="predict", predicting=True).model.state_dict()
    assert not all(torch.equal(built[0][name], drawn[name]) for name in drawn)


def _scores(command: str, data, global_seed: int, *options: str) -> str:
    torch.manual_seed(global_seed)
    result = run_torchkit_in_process(
        command, "convnet", "--allow-untrained", "--data", data, "--image-size", "8",
        "-j", "0", "--format", "json", *options,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_predict_and_eval_of_an_untrained_model_agree_run_to_run(tmp_path):
    data = write_image_folder(tmp_path / "data", {"a": 1, "b": 1})
    first, second = (_scores("predict", data, seed) for seed in (1, 2))
    assert [row["probability"] for row in first] == [row["probability"] for row in second]
    first, second = (_scores("eval", data, seed, "--num-classes", "2") for seed in (1, 2))
    assert first["loss"] == second["loss"] and first["per_class"] == second["per_class"]


def test_a_build_on_the_gpu_is_seeded_and_the_callers_cuda_state_put_back(monkeypatch):
    """torch.manual_seed seeds CUDA too (a build factory's weights made on the GPU come from
    the seed), but only the CPU generator was saved and put back: a started CUDA's generators
    were left at the build's seed. CUDA mocked: one started GPU, its generator a number."""
    cuda = {"state": "the caller's", "seeded": []}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": cuda["state"])

    def set_rng_state(state, device="cuda"):
        cuda["state"] = state

    def manual_seed_all(seed):
        cuda["seeded"].append(seed)
        cuda["state"] = f"seed {seed}"

    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda, "manual_seed_all", manual_seed_all)
    spec = ModelSpec(model="convnet", allow_untrained=True, num_classes=2, image_size=8)
    resolve_spec(spec, command="predict", predicting=True)
    assert cuda == {"state": "the caller's", "seeded": [0]}


def test_a_cuda_not_started_yet_starts_from_the_callers_seed(monkeypatch):
    """torch.manual_seed queues its seed for a CUDA that has not started, for its start: the
    build's seed 0 took the place of the caller's, so the caller's CUDA numbers, once it
    started, came from 0. CUDA's start played: one GPU, its generator a CPU one."""
    import torch.cuda.random

    assert not torch.cuda.is_initialized()
    torch.manual_seed(5)
    spec = ModelSpec(model="convnet", allow_untrained=True, num_classes=2, image_size=8)
    resolve_spec(spec, command="predict", predicting=True)
    gpu = torch.Generator()
    monkeypatch.setattr(torch.cuda.random, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "default_generators", (gpu,))
    for call in torch.cuda._lazy_seed_tracker.get_calls():  # as CUDA's start runs them
        if call:
            call[0]()
    assert gpu.initial_seed() == 5
