"""`torchkit benchmark`: images/s, latency per batch, peak memory and achieved TFLOP/s of a
model, for inference and training, with the warm-up excluded and CUDA synchronised around the
timed steps. Small modules: `timing` (the loop), `memory` (peak memory, --memory-limit), `steps`
(an inference or training step), `search` (--find-batch-size), `report` (rows, CSV append) and
`run` (from a model spec to a result)."""

from torchkit.core.benchmark.report import (
    COLUMNS,
    BenchmarkResult,
    BenchmarkRow,
    append_csv,
    check_append_target,
)
from torchkit.core.benchmark.run import (
    BenchmarkOptions,
    benchmark_model,
    check_options,
    parse_batch_sizes,
    run_benchmark,
)
from torchkit.core.benchmark.search import BatchSearch, Trial, search_batch_size
from torchkit.core.benchmark.timing import Timings, percentile, time_steps

__all__ = [
    "COLUMNS",
    "BatchSearch",
    "BenchmarkOptions",
    "BenchmarkResult",
    "BenchmarkRow",
    "Timings",
    "Trial",
    "append_csv",
    "benchmark_model",
    "check_append_target",
    "check_options",
    "parse_batch_sizes",
    "percentile",
    "run_benchmark",
    "search_batch_size",
    "time_steps",
]
