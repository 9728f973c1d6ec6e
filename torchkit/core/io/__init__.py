"""Files and outputs: errors, atomic files, the output transaction, progress hooks."""
