"""Near-duplicate search over 64-bit hashes, and the leakage report built on it.

`near_pairs(hashes, threshold)` finds every pair of hashes at Hamming distance <= threshold
without comparing all n^2/2 pairs: multi-index hashing (Norouzi, Punjani and Fleet, 2012). The 64
bits are cut into m chunks; two hashes within distance t agree to within floor(t / m) bits on at
least one chunk (pigeonhole), so each chunk's values are sorted once and every hash looks up the
few values within that radius of its own chunk (all flips of up to floor(t / m) bits), then the
candidates are checked on all 64 bits. m is chosen from a cost model (lookups plus expected
candidates for n uniform hashes); small sets, or thresholds where no m pays, are compared in
blocks (numpy, all pairs). Equal hashes are searched once. Each chunk's values are looked up
in a table of a few buckets a hash (not one entry for every value of the chunk), and the
candidates are checked a block at a time: memory grows linearly in n. Time does while n stays
under about 2^(64/m): past it each lookup meets n / 2^(64/m) other hashes by chance, so at a
fixed m the candidates grow as n^2 (at t = 8, three chunks of 21-22 bits from about 65,000
hashes on: 0.25-0.5 candidates a lookup at a million, 254 lookups a hash a chunk).

`find_pairs(...)` turns the hashes of a dataset's files into the report `dataset-stats` gives:
byte-identical files (same SHA-256) and near-duplicates (pHash within the threshold) whose
members lie in different splits ("leakage"), and near-duplicates within one split.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchkit.core.data.sources.splitting import SPLIT_NAMES

BITS = 64
# The default `--near-threshold`, measured with benchmarks/bench_near_duplicates.py (1,600
# images, 400 planted copies, 36 of them 5% crops; the exact pHash, imagededup's bit for bit):
# every re-encoded (JPEG quality 50 to 95, PNG), resized (0.5x to 2x, 128 px thumbnails), 10%
# brighter or slightly blurred copy lay within 6 bits of its original (all but JPEG quality 50
# within 4), so 8 leaves a margin of 2; it also finds about half of the 5%-cropped copies,
# with 13 false pairs among 1.28 million (at imagededup's default of 10: 26). The default
# pHash (large images reduced first) gives the same recall with 14 false pairs.
DEFAULT_NEAR_THRESHOLD = 8
MAX_THRESHOLD = 24  # beyond it, pHash no longer separates copies from different images
_BLOCK_CELLS = 1 << 22  # pairs compared at once by the all-pairs path
# A chunk's values are looked up in a table of up to 2^_TABLE_BITS buckets (16 MB of int32),
# 8 to 16 buckets a hash (fewer past half a million hashes, at the cap: 4 at a million): memory
# linear in n, and few other values met in a bucket.
_TABLE_BITS = 22
_TABLE_BLOCK = 1 << 20  # table entries made at once
_CANDIDATE_BLOCK = 1 << 16  # candidate pairs checked at once


def popcount(values: Any) -> Any:
    """Set bits of each uint64 (numpy array), as int64."""
    import numpy as np

    values = np.ascontiguousarray(values, dtype=np.uint64)
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(values).astype(np.int64)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)
    return table[values.view(np.uint8).reshape(*values.shape, 8)].sum(axis=-1)


def _chunk_bits(m: int) -> list[int]:
    """64 bits cut into m chunks as even as possible (the larger ones first)."""
    return [BITS // m + (1 if j < BITS % m else 0) for j in range(m)]


def _ball(bits: int, radius: int) -> int:
    return sum(math.comb(bits, i) for i in range(radius + 1))


def plan_search(n: int, threshold: int) -> int:
    """The number of chunks for multi-index hashing of n hashes (0: compare all pairs)."""
    best_m, best_cost = 0, n * (n - 1) / 2
    for m in range(1, min(threshold + 1, 16) + 1):
        radius = threshold // m
        cost = sum(_ball(b, radius) * (n + n * n / 2.0**b) for b in _chunk_bits(m))
        cost += n * m * math.log2(max(n, 2))  # the sorts
        if cost < best_cost:
            best_m, best_cost = m, cost
    return best_m


def _all_pairs(values: Any, threshold: int) -> tuple[Any, Any, Any]:
    import numpy as np

    n = len(values)
    found_a, found_b, found_d = [], [], []
    block = max(1, _BLOCK_CELLS // max(n, 1))
    for start in range(0, n - 1, block):
        rows = values[start : start + block]
        distances = popcount(rows[:, None] ^ values[None, :])
        a, b = np.nonzero(distances <= threshold)
        a += start
        upper = a < b
        found_a.append(a[upper])
        found_b.append(b[upper])
        found_d.append(distances[a[upper] - start, b[upper]])
    if not found_a:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    return np.concatenate(found_a), np.concatenate(found_b), np.concatenate(found_d)


def _flips(bits: int, radius: int) -> list[int]:
    masks = []
    for r in range(radius + 1):
        for chosen in itertools.combinations(range(bits), r):
            masks.append(sum(1 << i for i in chosen))
    return masks


def _bucket_bits(n: int, bits: int) -> int:
    """The bits of a chunk a table is made of for n hashes: 8 to 16 table entries a hash (all
    the chunk's bits once n passes a sixteenth of its values), at most _TABLE_BITS."""
    return max(1, min(bits, _TABLE_BITS, (max(n, 2) - 1).bit_length() + 3))


def _bucket_ends(sorted_buckets: Any, size: int) -> Any:
    """ends[v] = how many of `sorted_buckets` are < v, for v in 0..size: int32 (for fewer than
    2^31 hashes), made a block at a time, so no table of 64-bit integers is made."""
    import numpy as np

    dtype = np.int32 if len(sorted_buckets) < 2**31 else np.int64
    ends = np.empty(size + 1, dtype=dtype)
    for start in range(0, size + 1, _TABLE_BLOCK):
        stop = min(size + 1, start + _TABLE_BLOCK)
        ends[start:stop] = np.searchsorted(sorted_buckets, np.arange(start, stop))
    return ends


def _chunk_candidates(
    values: Any, chunk: Any, bits: int, radius: int, threshold: int
) -> tuple[list[Any], list[Any]]:
    """The pairs (i < j) within `threshold` whose `chunk` values (of `bits` bits) are within
    `radius`: each hash looks up every flip of up to `radius` bits of its chunk in a table of
    the chunk's low `_bucket_bits` bits (a bucket a value), checks that the chunk matches whole,
    then all 64 bits."""
    import numpy as np

    bucket_bits = _bucket_bits(len(values), bits)
    bucket_mask = (1 << bucket_bits) - 1
    buckets = chunk & bucket_mask
    order = np.argsort(buckets, kind="stable")
    ends = _bucket_ends(buckets[order], 1 << bucket_bits)
    del buckets
    found_a, found_b = [], []
    for flip in _flips(bits, radius):
        query = chunk ^ flip
        wanted = query & bucket_mask if bucket_bits < bits else query
        low = ends[wanted]
        counts = ends[wanted + 1] - low
        hit = np.nonzero(counts)[0]
        counts, low = counts[hit], low[hit]
        # The candidates (a hash and each one in its bucket) a block of about _CANDIDATE_BLOCK
        # at a time: their number grows as n^2 / 2^bucket_bits, their arrays stay bounded.
        if not len(hit):
            continue
        reached = np.cumsum(counts, dtype=np.int64)
        cuts = np.searchsorted(reached, np.arange(0, reached[-1], _CANDIDATE_BLOCK), side="right")
        for first, last in zip(cuts.tolist(), [*cuts[1:].tolist(), len(hit)], strict=True):
            if first == last:
                continue
            part = counts[first:last]
            total = int(part.sum())
            source = np.repeat(hit[first:last], part)
            offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(part) - part, part)
            target = order[np.repeat(low[first:last], part) + offsets]
            del offsets
            # A bucket narrower than the chunk holds other chunk values too.
            keep = source < target
            if bucket_bits < bits:
                keep &= chunk[target] == query[source]
            source, target = source[keep], target[keep]
            close = popcount(values[source] ^ values[target]) <= threshold
            found_a.append(source[close])
            found_b.append(target[close])
    return found_a, found_b


def _multi_index_pairs(values: Any, threshold: int, m: int) -> tuple[Any, Any, Any]:
    import numpy as np

    n = len(values)
    radius = threshold // m
    keys_a, keys_b = [], []
    shift = BITS
    for bits in _chunk_bits(m):
        shift -= bits
        chunk = ((values >> np.uint64(shift)) & np.uint64((1 << bits) - 1)).astype(np.int64)
        found_a, found_b = _chunk_candidates(values, chunk, bits, radius, threshold)
        keys_a.extend(found_a)
        keys_b.extend(found_b)
    if not keys_a:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    # A pair close on several chunks is found once per chunk: keep one of each.
    packed = np.unique(np.concatenate(keys_a) * n + np.concatenate(keys_b))
    a, b = packed // n, packed % n
    return a, b, popcount(values[a] ^ values[b])


def near_pairs(hashes: Sequence[int] | Any, threshold: int) -> tuple[Any, Any, Any]:
    """Every pair (i < j) of `hashes` (64-bit integers) at Hamming distance <= `threshold`:
    three int64 numpy arrays (i, j, distance), sorted by (i, j). Equal hashes are pairs at
    distance 0."""
    import numpy as np

    values = np.asarray(
        [int(h) for h in hashes] if not hasattr(hashes, "dtype") else hashes, dtype=np.uint64
    )
    empty = np.zeros(0, dtype=np.int64)
    if len(values) < 2 or threshold < 0:
        return empty, empty, empty
    unique, inverse = np.unique(values, return_inverse=True)
    inverse = inverse.ravel()
    if threshold == 0 or len(unique) < 2:
        ua = ub = ud = empty
    else:
        m = plan_search(len(unique), threshold)
        if m == 0:
            ua, ub, ud = _all_pairs(unique, threshold)
        else:
            ua, ub, ud = _multi_index_pairs(unique, threshold, m)
    # Back from distinct values to the hashes that have them.
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=len(unique))
    starts = np.cumsum(counts) - counts

    def members(k: int) -> Any:  # the hashes of distinct value k (a view each: made on demand)
        return order[starts[k] : starts[k] + counts[k]]

    parts_a, parts_b, parts_d = [], [], []
    single = (counts[ua] == 1) & (counts[ub] == 1)
    parts_a.append(order[starts[ua[single]]])
    parts_b.append(order[starts[ub[single]]])
    parts_d.append(ud[single])
    for u, v, d in zip(ua[~single], ub[~single], ud[~single], strict=True):
        grid_a, grid_b = np.meshgrid(members(u), members(v), indexing="ij")
        parts_a.append(grid_a.ravel())
        parts_b.append(grid_b.ravel())
        parts_d.append(np.full(grid_a.size, d, dtype=np.int64))
    for k in np.nonzero(counts > 1)[0]:
        group = members(k)
        a, b = np.triu_indices(len(group), 1)
        parts_a.append(group[a])
        parts_b.append(group[b])
        parts_d.append(np.zeros(len(a), dtype=np.int64))
    a = np.concatenate(parts_a).astype(np.int64)
    b = np.concatenate(parts_b).astype(np.int64)
    d = np.concatenate(parts_d).astype(np.int64)
    low, high = np.minimum(a, b), np.maximum(a, b)
    order = np.lexsort((high, low))
    return low[order], high[order], d[order]


# --------------------------------------------------------------------------- the report


@dataclass
class DuplicatePair:
    """Two files that are the same image: `exact` (same bytes, distance 0) or `near` (pHash
    within the threshold, their bytes differ). `split_*` is None for data without splits.
    `same_file`: the two paths are one file (a link, a hard link, a linked folder: one inode),
    so removing the link, not a copy, ends the leak."""

    path_a: str
    split_a: str | None
    path_b: str
    split_b: str | None
    kind: str
    distance: int
    same_file: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "path_a": self.path_a,
            "split_a": self.split_a,
            "path_b": self.path_b,
            "split_b": self.split_b,
            "kind": self.kind,
            "distance": self.distance,
            "same_file": self.same_file,
        }


PAIR_COLUMNS = ("path_a", "split_a", "path_b", "split_b", "kind", "distance", "same_file")


def _split_rank(split: str | None) -> int:
    return SPLIT_NAMES.index(split) if split in SPLIT_NAMES else len(SPLIT_NAMES)


def find_pairs(
    ids: Sequence[str],
    splits: Sequence[str | None],
    digests: Sequence[bytes | None] | Any,
    phashes: Sequence[int | None] | Any,
    *,
    threshold: int,
    within: bool = False,
    same_file: Sequence[int | None] | None = None,
) -> tuple[list[DuplicatePair], list[DuplicatePair]]:
    """(leakage, near duplicates within a split) among files i (`ids[i]` in `splits[i]`, its
    SHA-256 `digests[i]` and pHash `phashes[i]`; None for a file that could not be read or
    decoded, or numpy masked arrays, masked there). `same_file[i]`: a number the names of one
    file in two splits share (a link across splits), None for the others.

    Files are ordered by split (train, val, test) then path. Byte-identical files form one
    content (as do the names of one file, read or not); each copy in another split than its
    content's first file is listed once, paired with that first file (`exact`), or with the
    first name of its own file in another split, marked `same_file`. Distinct contents within
    `threshold` (by pHash) give one pair each (`near`): the first files of the two in different
    splits, when they have any (leakage), and, with `within`, the first files of the two in
    each split they share. Contents with equal pHashes are linked to the first of them, one
    pair each, and searched as one; a content of such a cluster that no pair names yet, in a
    later split than a first file of a near cluster, is named once, paired with that file. So
    n copies of one image give n - 1 pairs, not n^2 / 2, and every leaked file is named.

    Contents and clusters are numpy arrays over the files: Python objects (lists, dicts) are
    made only for the contents of several files and the clusters that are paired, so a
    million distinct images cost tens of bytes each here, not a kilobyte.
    """
    position = _rank_files(ids, splits)
    contents = _Contents.of(_content_of_files(digests, same_file), position)
    pairs = _Pairs(ids, splits, within)
    _pair_exact_copies(contents, pairs, same_file)
    clusters = _Clusters.of(contents, phashes, pairs)
    if len(clusters.values) > 1:
        near = _near_cluster_pairs(clusters, threshold)
        for d, u, v in near:
            pairs.link(clusters.firsts(u), clusters.firsts(v), d)
        _name_other_near_copies(near, clusters, pairs)
    return pairs.sorted()


def _rank_files(ids: Sequence[str], splits: Sequence[str | None]) -> Any:
    """Each file's place when the files are ordered by split (train, val, test) then path."""
    import numpy as np

    n = len(ids)
    split_ranks = {split: _split_rank(split) for split in set(splits)}
    ranks = np.fromiter((split_ranks[split] for split in splits), dtype=np.int64, count=n)
    by_id = np.array(sorted(range(n), key=ids.__getitem__), dtype=np.int64)
    rank = by_id[np.argsort(ranks[by_id], kind="stable")]  # files by (split, path)
    del by_id
    position = np.empty(n, dtype=np.int64)
    position[rank] = np.arange(n)
    return position


def _content_of_files(
    digests: Sequence[bytes | None] | Any, same_file: Sequence[int | None] | None
) -> Any:
    """Each file's content: a number for its SHA-256, else (a file that could not be read) for
    its file's names; -1 for neither."""
    import numpy as np

    digest_codes, has_digest = _codes(digests)
    content = np.full(len(digest_codes), -1, dtype=np.int64)
    if has_digest.any():
        content[has_digest] = np.unique(digest_codes[has_digest], return_inverse=True)[1].ravel()
    if same_file is not None:
        number_codes, has_number = _codes(same_file)
        numbered = has_number & ~has_digest
        if numbered.any():
            codes = np.unique(number_codes[numbered], return_inverse=True)[1].ravel()
            content[numbered] = codes + content.max() + 1
    return content


@dataclass
class _Contents:
    """The files of each content, in rank order: `kept[starts[g] : starts[g] + sizes[g]]`;
    `order`: the contents in the order their first files rank."""

    kept: Any
    starts: Any
    sizes: Any
    order: Any

    @classmethod
    def of(cls, content: Any, position: Any) -> _Contents:
        import numpy as np

        kept = np.flatnonzero(content >= 0)
        kept = kept[np.lexsort((position[kept], content[kept]))]
        starts = np.flatnonzero(np.diff(content[kept], prepend=-1))
        sizes = np.diff(starts, append=len(kept))
        order = np.argsort(position[kept[starts]], kind="stable")
        return cls(kept, starts, sizes, order)

    def files_of(self, group: int) -> list[int]:
        return self.kept[self.starts[group] : self.starts[group] + self.sizes[group]].tolist()


class _Pairs:
    """The report's two lists as they are made: leakage (across splits) and, with `within`,
    near duplicates within a split."""

    def __init__(self, ids: Sequence[str], splits: Sequence[str | None], within: bool) -> None:
        self.ids, self.splits, self.within = ids, splits, within
        self.leakage: list[DuplicatePair] = []
        self.within_pairs: list[DuplicatePair] = []

    def place(self, i: int) -> tuple[int, str]:
        return _split_rank(self.splits[i]), self.ids[i]

    def pair(self, a: int, b: int, kind: str, distance: int, one_file: bool = False):
        if self.place(b) < self.place(a):
            a, b = b, a
        ids, splits = self.ids, self.splits
        return DuplicatePair(ids[a], splits[a], ids[b], splits[b], kind, int(distance), one_file)

    def firsts_of(self, files: Sequence[int]) -> dict[str | None, int]:
        """The first of `files` in each split."""
        first: dict[str | None, int] = {}
        for m in files:
            first.setdefault(self.splits[m], m)
        return first

    def link(self, first_u: dict, first_v: dict, distance: int) -> None:
        """One near pair between two sets of files, given the first file of each in each
        split: across splits (leakage) when they have any, and within each shared split."""
        crossing = [(first_u[su], first_v[sv]) for su in first_u for sv in first_v if su != sv]
        if crossing:
            best = min(crossing, key=lambda p: sorted((self.place(p[0]), self.place(p[1]))))
            self.leakage.append(self.pair(*best, "near", distance))
        if self.within:
            self.within_pairs.extend(
                self.pair(first_u[s], first_v[s], "near", distance) for s in first_u if s in first_v
            )

    def sorted(self) -> tuple[list[DuplicatePair], list[DuplicatePair]]:
        def order(p: DuplicatePair):
            return (p.kind != "exact", p.distance, _split_rank(p.split_a), p.path_a, p.path_b)

        return sorted(self.leakage, key=order), sorted(self.within_pairs, key=order)


def _pair_exact_copies(
    contents: _Contents, pairs: _Pairs, same_file: Sequence[int | None] | None
) -> None:
    """Each copy in another split than its content's first file, paired with that file
    (`exact`), or with the first name of its own file in another split (`same_file`). One
    content's files in one split are no pair: only contents of several files are walked."""
    splits = pairs.splits
    order = contents.order
    for group in order[contents.sizes[order] > 1].tolist():
        members = contents.files_of(group)
        anchor = members[0]
        names: dict[int, dict[str | None, int]] = {}  # a file's number -> its first name a split
        for m in members:
            number = None if same_file is None else same_file[m]
            earlier = {} if number is None else names.setdefault(number, {})
            other = next((e for split, e in earlier.items() if split != splits[m]), None)
            earlier.setdefault(splits[m], m)
            if other is not None:
                pairs.leakage.append(pairs.pair(other, m, "exact", 0, one_file=True))
            elif splits[m] != splits[anchor]:
                pairs.leakage.append(pairs.pair(anchor, m, "exact", 0))


class _Clusters:
    """Contents with the same pHash (a PNG and its lossless re-encode, blank images), in the
    order of their first contents; cluster k's contents, in content order, are
    `groups[starts[k] : starts[k] + sizes[k]]`, its pHash `values[k]`. Each cluster's first
    files a split (`firsts`) and its contents' (`parts`) are made for the clusters linked or
    paired only."""

    def __init__(self, contents: _Contents, pairs: _Pairs, values, groups, starts, sizes):
        self.contents, self.pairs = contents, pairs
        self.values, self.groups, self.starts, self.sizes = values, groups, starts, sizes
        self.cluster_firsts: dict[int, dict[str | None, int]] = {}
        self.cluster_parts: dict[int, list[dict[str | None, int]]] = {}

    @classmethod
    def of(cls, contents: _Contents, phashes: Sequence[int | None] | Any, pairs: _Pairs):
        """A content's pHash is its first file's that has one; contents of one pHash are
        linked to their first content one by one (distance 0), and searched as one value."""
        import numpy as np

        phash_values, has_phash = _phash_column(phashes)
        kept, starts, sizes = contents.kept, contents.starts, contents.sizes
        hashed = has_phash[kept]
        hashed_groups = np.repeat(np.arange(len(starts)), sizes)[hashed]
        first_hashed = np.flatnonzero(np.diff(hashed_groups, prepend=-1))
        group_value = np.zeros(len(starts), dtype=np.uint64)
        valued = np.zeros(len(starts), dtype=bool)
        group_value[hashed_groups[first_hashed]] = phash_values[kept[hashed][first_hashed]]
        valued[hashed_groups[first_hashed]] = True
        del hashed, hashed_groups, first_hashed
        valued_groups = contents.order[valued[contents.order]]  # in content order
        values, first_seen, cluster_of = np.unique(
            group_value[valued_groups], return_index=True, return_inverse=True
        )
        cluster_rank = np.argsort(first_seen)
        renumbered = np.empty_like(cluster_rank)
        renumbered[cluster_rank] = np.arange(len(cluster_rank))
        cluster_of = renumbered[cluster_of.ravel()]
        cluster_values = values[cluster_rank]
        del values, first_seen, cluster_rank, renumbered
        cluster_groups = valued_groups[np.argsort(cluster_of, kind="stable")]
        cluster_sizes = np.bincount(cluster_of, minlength=len(cluster_values))
        cluster_starts = np.cumsum(cluster_sizes) - cluster_sizes
        clusters = cls(
            contents, pairs, cluster_values, cluster_groups, cluster_starts, cluster_sizes
        )
        clusters._link_equal_phashes()
        return clusters

    def parts_of(self, cluster: int) -> list[list[int]]:
        start = self.starts[cluster]
        groups = self.groups[start : start + self.sizes[cluster]]
        return [self.contents.files_of(g) for g in groups]

    def _link_equal_phashes(self) -> None:
        import numpy as np

        firsts_of = self.pairs.firsts_of
        for cluster in np.flatnonzero(self.sizes > 1).tolist():
            parts = self.parts_of(cluster)
            first_files = [firsts_of(members) for members in parts]
            for other in first_files[1:]:
                self.pairs.link(first_files[0], other, 0)
            self.cluster_firsts[cluster] = firsts_of([m for members in parts for m in members])
            self.cluster_parts[cluster] = first_files

    def firsts(self, cluster: int) -> dict[str | None, int]:
        if cluster not in self.cluster_firsts:  # one content
            self.cluster_firsts[cluster] = self.pairs.firsts_of(self.parts_of(cluster)[0])
            self.cluster_parts[cluster] = [self.cluster_firsts[cluster]]
        return self.cluster_firsts[cluster]


def _near_cluster_pairs(clusters: _Clusters, threshold: int) -> list[tuple[int, int, int]]:
    """(distance, cluster, cluster) of the clusters within `threshold`, nearest first."""
    a_idx, b_idx, dist = near_pairs(clusters.values, threshold)
    return sorted(zip(dist.tolist(), a_idx.tolist(), b_idx.tolist(), strict=True))


def _name_other_near_copies(
    near: list[tuple[int, int, int]], clusters: _Clusters, pairs: _Pairs
) -> None:
    """Each pair of clusters is listed by its first files; a cluster's other contents (a JPEG
    beside its PNG, with one pHash, in a split of their own) are as near: each one still
    unnamed is named once, by the nearest cluster's first file of an earlier split. (A train
    file has no earlier split: never waiting to be named.)"""
    ids, place, leakage = pairs.ids, pairs.place, pairs.leakage
    named = {(p.path_a, p.split_a) for p in leakage} | {(p.path_b, p.split_b) for p in leakage}
    waiting: dict[int, list[tuple[str | None, int]]] = {}
    for d, u, v in near:
        for mine, theirs in ((u, v), (v, u)):
            if mine not in waiting:
                waiting[mine] = [
                    (s, f)
                    for first in clusters.cluster_parts[mine]
                    for s, f in first.items()
                    if _split_rank(s) > 0
                ]
            left = []
            for split, file in waiting[mine]:
                if (ids[file], split) in named:
                    continue
                earlier = [
                    f
                    for s, f in clusters.cluster_firsts[theirs].items()
                    if s != split and place(f) < place(file)
                ]
                if earlier:
                    leakage.append(pairs.pair(min(earlier, key=place), file, "near", d))
                    named.add((ids[file], split))
                else:
                    left.append((split, file))
            waiting[mine] = left


def _codes(values: Sequence[Any] | Any) -> tuple[Any, Any]:
    """(a numpy array equal where `values` are equal, whether each is known): a masked array's
    data and mask, or a list's values (None: unknown) numbered in the order met."""
    import numpy as np

    if isinstance(values, np.ma.MaskedArray):
        return values.data, ~np.ma.getmaskarray(values)
    numbers: dict[Any, int] = {}
    codes = np.fromiter(
        (-1 if v is None else numbers.setdefault(v, len(numbers)) for v in values),
        dtype=np.int64,
        count=len(values),
    )
    return codes, codes >= 0


def _phash_column(phashes: Sequence[int | None] | Any) -> tuple[Any, Any]:
    """(the pHashes as uint64, whether each is known): from a masked array or a list."""
    import numpy as np

    if isinstance(phashes, np.ma.MaskedArray):
        return phashes.data.astype(np.uint64, copy=False), ~np.ma.getmaskarray(phashes)
    known = np.array([h is not None for h in phashes], dtype=bool)
    values = np.array([0 if h is None else int(h) for h in phashes], dtype=np.uint64)
    return values, known
