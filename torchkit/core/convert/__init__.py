"""`torchkit convert`: image files <-> arrays <-> tensors (`tensor`), CIFAR python batches to
PNG folders (`cifar`), and checkpoints to clean CPU state dicts (`checkpoint`).

Submodules import their heavy dependencies (numpy, PIL, torch) inside functions.
"""
