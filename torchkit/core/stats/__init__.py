"""`dataset-stats`: exact per-channel mean/std and a health report of an image dataset.

One pass over the files, in worker processes. Each worker reads a file once: the bytes are hashed
(exact duplicates) and decoded from memory, as every loader decodes them (`core.image_files`:
16-bit scaled to 8 bits for rgb/gray, the pixels as stored). Pixels are not summed as floats but
counted into per-channel histograms (PIL's C `histogram()` for 8-bit images, `np.bincount` for
16-bit ones). Histograms add up exactly in any order, so the result does not depend on how the
work was split, and the mean and variance come out of exact integer (rational) arithmetic:
weighted by pixel, not the average of per-image means that the classic `compute_mean_and_std`
recipe returns.

Leakage between splits (issue #20). Of split data (a split root, a CSV with a split column) the
statistics are of one split (train by default), but the files of the other splits are read in
the same pass too, hashed and not measured: each file's SHA-256 (exact copies) and 64-bit pHash
(`core.hashing`: of imagededup's PHash kind; of a measured file from the decode its
statistics need) go to `core.neardup.find_pairs`, which lists the exact and near duplicates
whose members lie in different splits (and, with `near_duplicates`, those within one split).
A file read but not decoded (or of 32-bit samples no fixed scale reads right) has no pHash:
its SHA-256 alone still finds its byte-identical copies. `leakage=False` skips that (and the
other splits' files).

Modules: scan (the pass: reading, hashing, counting, in worker processes), report (DatasetStats,
the duplicates), plot (the plot and the output checks) and run (`compute_dataset_stats`).
"""

from torchkit.core.stats.plot import (
    PLOT_FORMATS,
    check_outputs,
    check_plot_output,
    plot_dataset_stats,
    plot_format,
)
from torchkit.core.stats.report import (
    ClassCount,
    DatasetStats,
    DuplicateGroup,
    SizeRange,
    Unreadable,
    write_pairs_csv,
)
from torchkit.core.stats.run import (
    STATS_SPLIT_REASON,
    check_near_threshold,
    compute_dataset_stats,
    load_stats_samples,
    warn_empty_classes,
)
from torchkit.core.stats.scan import (
    SINGLE_CHANNEL_MODES,
    STATS_MODES,
    channel_names,
    default_stats_workers,
    hash_pass,
    resized_size,
    scan_files,
    target_mode,
)

__all__ = [
    "PLOT_FORMATS",
    "SINGLE_CHANNEL_MODES",
    "STATS_MODES",
    "STATS_SPLIT_REASON",
    "ClassCount",
    "DatasetStats",
    "DuplicateGroup",
    "SizeRange",
    "Unreadable",
    "channel_names",
    "check_near_threshold",
    "check_outputs",
    "check_plot_output",
    "compute_dataset_stats",
    "default_stats_workers",
    "hash_pass",
    "load_stats_samples",
    "plot_dataset_stats",
    "plot_format",
    "resized_size",
    "scan_files",
    "target_mode",
    "warn_empty_classes",
    "write_pairs_csv",
]
