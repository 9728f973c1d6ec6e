"""`torchkit summary`: a layer table with shapes, parameters, mult-adds, FLOPs and memory."""

from torchkit.core.summary.counting import LayerCall, ModelSummary, leaf_mult_adds, summarize

__all__ = ["LayerCall", "ModelSummary", "leaf_mult_adds", "summarize"]
