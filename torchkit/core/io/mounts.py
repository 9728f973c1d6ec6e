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
# The device of no file system: Linux gives none "0:0", kernels that emulate its mountinfo give
# it to every mount (one file system to all appearances, each mount's root `/`: every mount a
# place of every folder). Nothing is known of a folder's other places there.
_NO_DEVICE = "0:0"
_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space as \040, a `\` as \134


@dataclass(frozen=True)
class Mount:
    point: str  # where it is mounted, as this process sees it
    device: str  # "major:minor" of its file system
    root: str  # the folder of that file system shown there
    id: str = ""  # mountinfo's mount ID, and the ID of the mount it is mounted in
    parent: str = ""
    kind: str = ""  # its file system's type ("ext4", "cgroup2") and super options ("rw,memory")
    options: str = ""


def unescaped(field: str) -> str:
    """A path field of mountinfo (a mount's root or point) as the path it names: its octal
    escapes undone."""
    return _ESCAPED.sub(lambda found: chr(int(found.group(1), 8)), field)


def within(inner: str, outer: str) -> bool:
    """`inner` is the absolute path `outer` or lies inside it, judged at a path boundary
    (`/a/bc` is not inside `/a/b`)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def below(inner: str, outer: str) -> str:
    """What `inner` adds to `outer` (which it lies `within`): "" or "/a/b"."""
    return "" if inner == outer else inner[len(outer.rstrip("/")) :]


def _in_sight(mounts: list[Mount]) -> list[Mount]:
    """The mounts of `mounts` (mountinfo's order) that can be reached: mountinfo lists a mount
    hidden by a later one too, which a path can no longer lead into. A mount is hidden where
    one mounted later in the same parent covers its point or a folder above it (mounted
    first, it would have been mounted inside that one), where one is stacked on its point (a
    child at its own point), or where the mount it is in is out of reach (covered)."""
    by_id = {mount.id: mount for mount in mounts}
    # each parent's children: point -> the order of the last one mounted there
    children: dict[str, dict[str, int]] = {}
    stacked_on: set[str] = set()
    for order, mount in enumerate(mounts):
        if mount.parent != mount.id:  # a root listed as its own parent is no child of its own
            children.setdefault(mount.parent, {})[mount.point] = order
        parent = by_id.get(mount.parent)
        if parent is not None and parent is not mount and parent.point == mount.point:
            stacked_on.add(parent.id)
    order_of = {mount.id: order for order, mount in enumerate(mounts)}

    def covered(mount: Mount) -> bool:
        points = children.get(mount.parent, {})
        if points.get(mount.point, -1) > order_of[mount.id]:
            return True  # a sibling mounted on the same point after it
        if len(points) < 2:
            return False
        place = mount.point  # each folder above it (an absolute, normal path: cut at a `/`)
        while (cut := place.rfind("/")) > 0:
            place = place[:cut]
            if place in points:
                return True
        return mount.point != "/" and "/" in points

    reachable: dict[str, bool] = {}
    for mount in mounts:
        chain = []  # up to the nearest mount judged already, or one in no mount listed
        at: Mount | None = mount
        while at is not None and at.id not in reachable and at.id not in chain:
            chain.append(at.id)
            at = by_id.get(at.parent)
        above = True if at is None or at.id in chain else reachable[at.id]
        for mount_id in reversed(chain):
            above = above and not covered(by_id[mount_id])
            reachable[mount_id] = above
    return [mount for mount in mounts if reachable[mount.id] and mount.id not in stacked_on]


class MountTable:
    """The mounts this process sees: the topmost at each point, none hidden (`_in_sight`)."""

    def __init__(self, mounts: list[Mount]) -> None:
        if all(mount.id for mount in mounts) and len({m.id for m in mounts}) == len(mounts):
            mounts = _in_sight(mounts)
        self.by_point = {mount.point: mount for mount in mounts}  # later lines are on top

    @classmethod
    def read(cls, path: str | None = None) -> MountTable:
        """The table of `path` (mountinfo's format; MOUNTINFO by default); an empty one where
        it cannot be read (no `/proc`: macOS, Windows, a container without it): no bind mount
        is known then, and only a mount of another file system at a path itself is seen
        (`is_mount_point`), none inside a folder (`points_below`)."""
        return cls.parse(_text_of(MOUNTINFO if path is None else path))

    @classmethod
    def parse(cls, text: str) -> MountTable:
        """The table of mountinfo's `text`."""
        return cls(parse_mounts(text))

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
        if mount is None or mount.device == _NO_DEVICE or len(self.by_point) < 2:
            return [], []
        own = mount.root.rstrip("/") + below(path, mount.point) or "/"
        whole, parts = [], []
        for other in self.by_point.values():
            if other.device != mount.device:
                continue
            if within(own, other.root):
                place = other.point.rstrip("/") + below(own, other.root) or "/"
                if place != path:
                    whole.append(place)
            elif within(other.root, own) and other.point != path:
                parts.append(other.point)
        return whole, parts

    def points_below(self, path: str) -> list[str]:
        """The mount points inside the folder `path` (not `path` itself)."""
        return [point for point in self.by_point if point != path and within(point, path)]


def parse_mounts(text: str) -> list[Mount]:
    """Every mount of mountinfo's `text`, in its order (hidden ones too)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            root, point = unescaped(fields[3]), unescaped(fields[4])
            # After the optional fields and "-": the file system's type, source, super options.
            tail = fields[fields.index("-", 6) + 1 :] if "-" in fields[6:] else []
            kind, options = (tail + ["", "", ""])[0], (tail + ["", "", ""])[2]
            mounts.append(Mount(point, fields[2], root, fields[0], fields[1], kind, options))
    return mounts


def read_mounts(path: str = MOUNTINFO) -> list[Mount]:
    """Every mount of the mountinfo file `path`; [] where it cannot be read (no `/proc`)."""
    return parse_mounts(_text_of(path))


def _text_of(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read()
    except OSError:
        return ""


def _escaped(path: str) -> str:
    """`path` as mountinfo writes it (`\\`, space, tab and newline in octal)."""
    for char in "\\ \t\n":
        path = path.replace(char, f"\\{ord(char):03o}")
    return path


def is_mount_point(path: str | os.PathLike) -> bool:
    """Whether the folder or file at `path` is a mount point: another file system's
    (`os.path.ismount`) or a bind mount from the same one (the mount table). Such a folder or
    file cannot be renamed, nor another renamed onto it (EBUSY). The table is parsed only where
    it names the path at all (not so for most: a write's check of its file stays cheap)."""
    if os.path.ismount(path):
        return True
    real = os.path.realpath(path)
    text = _text_of(MOUNTINFO)
    if f" {_escaped(real)} " not in text:
        return False
    return real in MountTable.parse(text).by_point
