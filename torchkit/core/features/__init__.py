"""Features of named layers of a model for a folder of images (`torchkit extract-features`)."""

from torchkit.core.data.preprocessing import apply_overrides
from torchkit.core.features.extract import (
    DEFAULT_LAYERS,
    ExtractionResult,
    FeatureRequest,
    LayerListing,
    LayerOutput,
    extract_features,
    list_layers,
)
from torchkit.core.features.layers import (
    ALIASES,
    NORMALIZATIONS,
    POOLS,
    FeatureExtractor,
    Layer,
    LayerGraph,
    LayerInfo,
    reduce_feature,
)
from torchkit.core.features.store import DTYPES, FILE_FORMATS, FeatureStore

__all__ = [
    "ALIASES",
    "DEFAULT_LAYERS",
    "DTYPES",
    "FILE_FORMATS",
    "NORMALIZATIONS",
    "POOLS",
    "ExtractionResult",
    "FeatureExtractor",
    "FeatureRequest",
    "FeatureStore",
    "Layer",
    "LayerGraph",
    "LayerInfo",
    "LayerListing",
    "LayerOutput",
    "apply_overrides",
    "extract_features",
    "list_layers",
    "reduce_feature",
]
