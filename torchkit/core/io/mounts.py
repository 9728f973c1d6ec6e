"""Where else a folder can be reached: a bind mount shows a folder (or a folder inside it) at a
second path, which `realpath` cannot see, and two such paths compare by identity only where one
lies on the other's way up. The mounts are read from `/proc/self/mountinfo` (Linux): each shows
a folder (`root`) of a file system (`device`) at a path (`point`); two paths name one folder
where they name the same path of the same file system. Elsewhere nothing is known (no places).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space as \040, a `\` as \134


@dataclass(frozen=True)
class Mount:
    point: str  # where it is mounted, as this process sees it
    device: str  # "major:minor" of its file system
    root: str  # the folder of that file system shown there


def _unescaped(field: str) -> str:
    return _ESCAPED.sub(lambda found: chr(int(found.group(1), 8)), field)


def _within(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _below(inner: str, outer: str) -> str:
    """What `inner` adds to `outer` (which it lies within): "" or "/a/b"."""
    return "" if inner == outer else inner[len(outer.rstrip("/")) :]


class MountTable:
    """The mounts this process sees, the topmost at each point (a mount stacked on another
    hides it)."""

    def __init__(self, mounts: list[Mount]) -> None:
        self.by_point = {mount.point: mount for mount in mounts}  # later lines are on top

    @classmethod
    def read(cls, path: str = MOUNTINFO) -> MountTable:
        """The table of `path` (mountinfo's format); an empty one where it cannot be read."""
        mounts = []
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as handle:
                for line in handle:
                    fields = line.split(" ")
                    if len(fields) > 4:
                        root, point = _unescaped(fields[3]), _unescaped(fields[4])
                        mounts.append(Mount(point, fields[2], root))
        except OSError:
            pass
        return cls(mounts)

    def mount_of(self, path: str) -> Mount | None:
        """The mount that holds the absolute, resolved `path` (the nearest point above it)."""
        place = path
        while place not in self.by_point:
            parent = os.path.dirname(place)
            if parent == place:
                return None
            place = parent
        return self.by_point[place]

    def places(self, path: str) -> tuple[list[str], list[str]]:
        """The other paths where the folder at `path` (absolute, resolved; it need not exist
        yet) is shown: (`whole`: the folder itself, through a mount of it or of a folder above
        it; `parts`: the points of mounts of a folder inside it). `path` itself is not one."""
        mount = self.mount_of(path)
        if mount is None or len(self.by_point) < 2:
            return [], []
        own = mount.root.rstrip("/") + _below(path, mount.point) or "/"
        whole, parts = [], []
        for other in self.by_point.values():
            if other.device != mount.device:
                continue
            if _within(own, other.root):
                place = other.point.rstrip("/") + _below(own, other.root) or "/"
                if place != path:
                    whole.append(place)
            elif _within(other.root, own) and other.point != path:
                parts.append(other.point)
        return whole, parts

    def points_below(self, path: str) -> list[str]:
        """The mount points inside the folder `path` (not `path` itself)."""
        return [point for point in self.by_point if point != path and _within(point, path)]


def is_mount_point(path: str | os.PathLike) -> bool:
    """Whether the folder at `path` is a mount point: another file system's (`os.path.ismount`)
    or a bind mount of a folder of the same one (the mount table). Such a folder cannot be
    renamed, nor another renamed onto it (EBUSY)."""
    if os.path.ismount(path):
        return True
    return os.path.realpath(path) in MountTable.read().by_point
