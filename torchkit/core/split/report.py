"""What a split did: the result `split` reports (and `--format json` writes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchkit.core.io.errors import InputError
from torchkit.core.io.incomplete import incomplete_run


@dataclass
class SplitResult:
    source: str
    out: str
    mode: str
    names: list[str]
    ratio: list[float]  # normalised to sum to 1
    seed: int
    stratified: bool
    group: str | None
    groups: int | None  # number of groups with --group
    classes: list[str]
    counts: list[list[int]]  # [class][split]
    manifest: str
    resumed: bool = False
    already_done: bool = False  # a rerun of a finished move: nothing was touched
    dedup: bool = True  # byte-identical files kept in one split
    dedup_groups: int = 0  # groups of byte-identical files (two or more) kept together
    dedup_files: int = 0  # the files in them
    # Those of them filed under more than one class: {"paths", "classes", "split"} each
    label_conflicts: list[dict] = field(default_factory=list)
    fixed: list[int] | None = None  # --fixed: images per class in the second (and third) split
    repeats: list[int] | None = None  # --oversample: extra train copies per class
    notes: list[str] = field(default_factory=list)  # for the user, beside the report
    # The folders in the source that could not be listed (their places in it): their files
    # are in no split.
    unlisted_folders: list[str] = field(default_factory=list)

    @property
    def totals(self) -> list[int]:
        return [sum(row[j] for row in self.counts) for j in range(len(self.names))]

    @property
    def oversample(self) -> bool:
        return self.repeats is not None

    def incomplete(self) -> InputError | None:
        """The error a split that left out folders it could not list ends in, once the rest is
        placed (as `cp -r` exits 1): exiting 0 let `split data out && rm -r data` delete their
        files."""
        return incomplete_run(
            self.source,
            self.unlisted_folders,
            left_out=f"their files are in no split in {self.out}",
            again="make them readable and split again; --strict stops before placing any file",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "out": self.out,
            "mode": self.mode,
            "ratio": self.ratio,
            "seed": self.seed,
            "stratified": self.stratified,
            "group": self.group,
            "groups": self.groups,
            "dedup_groups": self.dedup_groups if self.dedup else None,
            "dedup_files": self.dedup_files if self.dedup else None,
            "label_conflicts": self.label_conflicts if self.dedup else None,
            "fixed": self.fixed,
            "oversample": self.oversample,
            "files": sum(self.totals),
            "repeats": sum(self.repeats) if self.repeats is not None else 0,
            "splits": dict(zip(self.names, self.totals, strict=True)),
            "classes": [
                {
                    "name": name,
                    **dict(zip(self.names, row, strict=True)),
                    "total": sum(row),
                    **({"repeats": self.repeats[i]} if self.repeats is not None else {}),
                }
                for i, (name, row) in enumerate(zip(self.classes, self.counts, strict=True))
            ],
            "manifest": self.manifest,
            "resumed": self.resumed,
            "unlisted_folders": list(self.unlisted_folders),
        }
