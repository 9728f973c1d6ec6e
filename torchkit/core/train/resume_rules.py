"""What `--resume` does with the options given again: the tables `resume_merge` follows, and the
help text of `--resume` that names them (written before the options table exists).
"""

from __future__ import annotations

from torchkit.core.train.option_specs import default_flag

# What `--resume` does with options given again. Those below define the checkpoint's weights,
# its optimiser state, the data split or what an epoch and an update are: a different value is
# refused, naming both values. Every other option applies from the resumed step on (the
# learning rates and weight decay too: see `optim.load_optimizer_state`), and config.json
# records the values the run trains with.
FIXED_ON_RESUME: dict[str, str] = {
    "model": "the weights are of that model",
    "image_size": "the weights were trained at that size",
    "resize_size": "the validation metrics so far were measured at that size",
    "mean": "the weights expect inputs normalised that way",
    "interpolation": "the weights were trained on images resized that way",
    "crop_mode": "the validation metrics so far were measured with that crop",
    "std": "the weights expect inputs normalised that way",
    "sync_bn": "the weights and the optimiser state are of that model",
    "optimizer": "the optimiser state is of that optimiser",
    "freeze_backbone": "the optimiser state is of those parameters",
    "decay_all": "the optimiser's parameter groups would change",
    "batch_size": "the schedule and the place inside the epoch count batches of that size",
    "accum_steps": "the schedule counts updates of that many batches",
    "seed": "the data order, the augmentation and --val-split's split follow the seed",
    "balanced_sampler": "the place inside the epoch counts images of that order",
    "val_split": "another split would move validation images into training",
    "best_metric": "best.pt and the best epoch so far were picked by it",
}
# Options whose default the run chose for its machine (core.train.setup): a resumed run not
# given one chooses again, for the machine it continues on (a digits run recorded on a GPU
# with --cuda-graphs may resume on a CPU).
CHOSEN_FOR_THE_MACHINE = ("cuda_graphs",)
# Options that only make sense for a run that starts from scratch: refused with --resume.
NEW_RUN_ONLY = {"weights": "the run continues from the checkpoint's weights"}
# Not training options: how this invocation runs, never compared.
IGNORED_ON_RESUME = (
    "resume",
    "force",
    "out",
    "data_defaults",
    "dist_timeout",
    "trust_checkpoint",
    "profile_steps",
)


def resume_help() -> str:
    """What `--resume` says about options given again (its help text). Written before the
    options table exists, so the names are the fields' plain spellings (a test holds them to
    the table)."""
    fixed = ", ".join(default_flag(name) for name in FIXED_ON_RESUME)
    return (
        "Continue a run exactly: its folder (last.pt) or a checkpoint file. Options given again "
        "apply from the resumed step on (--epochs extends the run and its schedule; --lr, "
        "--weight-decay, the schedule, regularisation, --device, --workers... take effect), "
        f"except {fixed}, which cannot change."
    )
