"""The torchkit library: one module per command, no CLI code, no printing."""
