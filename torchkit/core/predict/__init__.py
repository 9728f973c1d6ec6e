"""`torchkit predict`: classes and probabilities for images, streamed in input order."""

from torchkit.core.predict.inputs import collect_images
from torchkit.core.predict.run import PredictRequest, PredictRun, PredictSummary

__all__ = ["PredictRequest", "PredictRun", "PredictSummary", "collect_images"]
