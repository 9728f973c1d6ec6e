"""The inference floor eval, predict and extract-features share: their options and scoring."""
