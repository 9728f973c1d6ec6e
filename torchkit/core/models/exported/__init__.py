"""Reading the files `torchkit export` writes (and ONNX, TorchScript and torch.export files from
elsewhere): `formats` (format names, extensions, runtimes, `sniff_format`), `metadata` (what the
file says about its model, and how each format carries it) and `loading` (`load_exported`: the
runtimes). It sits below `core.checkpoint` and `core.models`, which take exported files as models,
and below `core.export`, which writes and verifies them. Nothing here imports torch at module
level, and this package re-exports nothing (import the modules)."""
