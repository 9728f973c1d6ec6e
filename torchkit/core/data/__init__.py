"""The data floor: image files into pixels, decoding, transforms, datasets and batches;
`sources/` resolves what `--data` names."""
