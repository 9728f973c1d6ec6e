"""`python -m torchkit` (and `torchrun -m torchkit`)."""

from torchkit.cli import main

if __name__ == "__main__":
    main()
