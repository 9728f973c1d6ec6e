"""The help panels of `torchkit train --help`; the option machinery is core.option_specs (kept
importable from here)."""

from __future__ import annotations

from torchkit.core.option_specs import OptionSpec, default_flag, option, option_specs

__all__ = ["OptionSpec", "default_flag", "option", "option_specs"]

# An option with no panel is in the general one.
DATA_PANEL = "Data and transforms"
MODEL_PANEL = "Model and fine-tuning"
OPTIM_PANEL = "Optimisation"
OUTPUTS_PANEL = "Outputs and checkpoints"
