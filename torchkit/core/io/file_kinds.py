"""What a path is, in words, for an error that names it: an image path that is not a regular
file, an output folder that is a FIFO."""

from __future__ import annotations

import stat

# What a symbolic link that leads to no file is, in the same words wherever it is read
LINK_TO_NOTHING = "a symbolic link to nothing"


def file_kind(mode: int) -> str:
    """What a path of `st_mode` `mode` is: "a file", "a FIFO", "a device", "a folder"..."""
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a special file"
