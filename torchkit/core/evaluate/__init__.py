"""`torchkit eval`: metrics and reports for a trained image classifier."""

from torchkit.core.evaluate.metrics import ClassificationMetrics, compute_metrics
from torchkit.core.evaluate.results import EvalResult, Predictions
from torchkit.core.evaluate.runner import EvalOptions, evaluate
from torchkit.core.evaluate.source import load_eval_samples, parse_class_names
from torchkit.core.models.spec import ModelSpec

__all__ = [
    "ClassificationMetrics",
    "EvalOptions",
    "EvalResult",
    "ModelSpec",
    "Predictions",
    "compute_metrics",
    "evaluate",
    "load_eval_samples",
    "parse_class_names",
]
