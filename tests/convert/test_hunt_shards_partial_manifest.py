"""convert shards' `manifest.partial.json` lists every sample written so far (its extension and
class), and was rewritten every 2 s however long a rewrite took: at 200,000 samples a rewrite
took about 2 s, so half the run went into it, and the share grew with the data (a time that
grew with its square). A rewrite now waits at least ten times as long as the last one took."""

from __future__ import annotations

import json

from torchkit.core.convert import shards


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class GrowingReport:
    """A report whose partial manifest takes longer to write the more samples it lists (3 s at
    200,000, as on a loaded 2-core machine), counted on the fake clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.samples = 0
        self.saving = 0.0  # clock seconds spent writing the partial manifest

    def manifest(self, *, complete: bool) -> dict:
        cost = 15e-6 * self.samples
        self.clock.now += cost
        self.saving += cost
        return {"complete": complete, "samples": self.samples}


def partial_on_a_clock(tmp_path, monkeypatch):
    """(clock, report, partial manifest) with `convert shards`' clock made `clock`, started."""
    clock = Clock()
    monkeypatch.setattr(shards, "time", clock)
    report = GrowingReport(clock)
    partial = shards._PartialManifest(tmp_path / shards.PARTIAL_MANIFEST, report)
    partial.start()
    return clock, report, partial


def test_the_partial_manifest_takes_a_bounded_share_of_a_long_run(tmp_path, monkeypatch):
    clock, report, partial = partial_on_a_clock(tmp_path, monkeypatch)
    for _shard in range(1000):  # 1,000 shards of 1,000 samples, 0.5 s each
        clock.now += 0.5
        report.samples += 1000
        partial.shard_done()
    writing = 1000 * 0.5
    assert report.saving < 0.15 * writing, (report.saving, writing)
    # Still saved as it goes (the first shard at once), and the last shards when it stops.
    assert json.loads(partial.path.read_text())["samples"] < report.samples
    partial.save_quietly()
    assert json.loads(partial.path.read_text())["samples"] == report.samples


def test_a_quick_rewrite_still_comes_every_partial_every_s(tmp_path, monkeypatch):
    clock, report, partial = partial_on_a_clock(tmp_path, monkeypatch)
    saved = []
    for _shard in range(20):  # tiny shards: 10 samples, 0.5 s each
        clock.now += 0.5
        report.samples += 10
        partial.shard_done()
        saved.append(json.loads(partial.path.read_text())["samples"])
    assert saved[0] == 10  # the first shard at once
    assert len(set(saved)) == 5  # then every 2 s: at 0.5, 2.5, 4.5, 6.5 and 8.5 s
