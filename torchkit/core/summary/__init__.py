"""`torchkit summary`: a layer table with shapes, parameters, mult-adds, FLOPs and memory."""

from torchkit.core.summary.counting import (
    InputSpec,
    LayerCall,
    ModelSummary,
    leaf_mult_adds,
    summarize,
    summarize_tree,
)

__all__ = [
    "InputSpec",
    "LayerCall",
    "ModelSummary",
    "leaf_mult_adds",
    "summarize",
    "summarize_tree",
]
