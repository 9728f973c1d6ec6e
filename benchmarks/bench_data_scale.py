"""Benchmark: the data paths at 10k, 100k and 1M samples of tiny images, stored in shards and
parquet: CPU seconds (user + sys of the process tree), peak memory and cost per sample.

Parts (--parts, comma-separated):

- convert: `convert shards` (`--per-shard 10000`, `-j 0`) of a CSV index (bench_scaling.py's
  ROOT/n<N>/index.csv: 300 distinct 8x8 PNGs hard-linked, 100 classes), of HF parquet (the
  same PNGs' bytes, 10 files, row groups of 1,000 rows, a ClassLabel of 100 names) and of the
  index's folder of class folders (ROOT/n<N>/images): the whole run. The CSV index's shards
  are kept (ROOT/shards-<N>) for the infer part.
- convert-large: `convert shards` (`--per-shard 1000`, `-j 0`) of parquet of large images
  (--large-kb, 250: 50 distinct noise PNGs over and over; one file, row groups of 100 rows),
  each parquet row group read counted; with --before, an older checkout's run too and every
  shard's SHA-256 compared with it (--window-mb: convert shards' window smaller than its 256
  MiB, to stand for data that many times larger). Its shards are removed after each run.
- neardup: `dataset-stats --near-duplicates --format json -o` of parquet holding N distinct
  random 8x8 PNGs, a tenth of them planted near copies (one pixel moved by one level): the
  listing, then the whole run (every image read and hashed).
- infer: `predict` (`--format csv -o`) and `extract-features` (untrained convnet, 8 px) of the
  shards and of the parquet above: the time to the first batch and, up to --whole-max samples,
  the whole run (its output written). Past 100,000 samples the shards are copies of the 10k
  run's shard (`shards_of`), so no conversion of a million samples is needed.
- labels: `open_data` of the shards in a process of its own (`--before DIR`: also with an older
  checkout's torchkit): CPU s, peak MB, and how many class-name objects the listed samples
  hold (each `KEY.json` label parsed into a str of its own, before they were shared).

Each command is one `python -m torchkit` process (bench_scaling.py's `run_watched`: stderr on a
pseudo-terminal so the progress bar is drawn; the first batch is the bar's first count). Peak
MB is the largest resident set of the process tree (`wait4`), CPU s its user + sys time.

    uv run python benchmarks/bench_data_scale.py --sizes 10000,100000
    uv run python benchmarks/bench_data_scale.py --sizes 1000000 --parts convert --timeout 600
    uv run python benchmarks/bench_data_scale.py --sizes 2000,6000 --parts convert-large \
        --before OLD_CHECKOUT

Data is built once under --root and reused; remove it when done (1M: about 1.5 GB).
Benchmarks are not tests: they print figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling  # noqa: E402

CLASSES = [f"class_{c:03d}" for c in range(100)]
PARQUET_FILES = 10
ROW_GROUP = 1_000


def hf_schema():
    import pyarrow as pa

    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": CLASSES}}
    metadata = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.schema([("image", image), ("label", pa.int64())], metadata=metadata)


def write_parquet(
    folder: Path,
    samples: int,
    image_bytes,
    files: int = PARQUET_FILES,
    row_group: int = ROW_GROUP,
    dictionary: bool = True,
) -> Path:
    """FOLDER/data/train-0000K-of-0000F.parquet: `samples` rows in `files` files of row groups of
    `row_group` rows, image i `image_bytes(i)`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = folder / ".complete"
    if done.exists():
        return folder
    (folder / "data").mkdir(parents=True, exist_ok=True)
    schema = hf_schema()
    per_file = -(-samples // files)
    for k in range(files):
        rows = range(k * per_file, min(samples, (k + 1) * per_file))
        name = folder / "data" / f"train-{k:05d}-of-{files:05d}.parquet"
        with pq.ParquetWriter(name, schema, use_dictionary=dictionary) as writer:
            for start in range(rows.start, rows.stop, row_group):
                chunk = range(start, min(rows.stop, start + row_group))
                table = pa.table(
                    {
                        "image": [{"bytes": image_bytes(i), "path": None} for i in chunk],
                        "label": [i % len(CLASSES) for i in chunk],
                    },
                    schema=schema,
                )
                writer.write_table(table, row_group_size=row_group)
    done.touch()
    return folder


def png(pixels) -> bytes:
    from PIL import Image

    encoded = io.BytesIO()
    Image.fromarray(pixels).save(encoded, "PNG")
    return encoded.getvalue()


def same_pngs(root: Path, samples: int) -> Path:
    """Parquet of bench_scaling's 300 distinct PNGs, over and over."""
    sources = sorted((root / "sources").glob("s*.png"))
    data = [p.read_bytes() for p in sources]
    return write_parquet(root / f"pq-{samples}", samples, lambda i: data[i % len(data)])


def distinct_pngs(root: Path, samples: int) -> Path:
    """Parquet of `samples` distinct random 8x8 PNGs; every tenth a near copy of the one before
    (one pixel moved by one level)."""
    import numpy as np

    def image(i: int) -> bytes:
        original = i - 1 if i % 10 == 9 else i
        pixels = np.random.default_rng(original).integers(0, 255, (8, 8, 3), dtype=np.uint8)
        if original != i:
            pixels[0, 0, 0] += 1
        return png(pixels)

    return write_parquet(root / f"pq-distinct-{samples}", samples, image)


def run(arguments: list[str], marks: dict, stop_after: str | None, timeout: float) -> dict:
    """One `python -m torchkit ARGUMENTS` process: seconds of each mark, CPU s, peak MB."""
    return run_python(["-m", "torchkit", *arguments], timeout, marks, stop_after)


def run_python(
    arguments: list[str], timeout: float, marks: dict | None = None, stop_after: str | None = None
) -> dict:
    """One `python ARGUMENTS` process: seconds of each mark, CPU s, peak MB."""
    marks = {} if marks is None else marks
    before = os.times()
    watched = bench_scaling.run_watched(
        [sys.executable, *arguments],
        Path(__file__).resolve().parents[1],
        marks,
        stop_after,
        timeout,
    )
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return {
        "marks": {k: round(v, 2) for k, v in watched.marks.items()},
        "cpu_s": round(cpu, 2),
        "peak_mb": round(watched.peak_mb),
        "exit": watched.exit_code,
        "timed_out": watched.timed_out,
        "last": watched.last_line if watched.exit_code not in (0, 143) else "",
    }


def show(part: str, samples: int, result: dict) -> None:
    per = result["cpu_s"] / samples * 1e6
    print(
        f"{part:<44} {samples:>9,}  cpu {result['cpu_s']:8.2f} s ({per:6.0f} us a sample)  "
        f"peak {result['peak_mb']:6} MB  marks {result['marks']}  exit {result['exit']}"
        + (" TIMED OUT" if result["timed_out"] else "")
        + (f"  {result['last']}" if result["last"] else ""),
        flush=True,
    )


def first_counted(line, count) -> bool:
    return count is not None and count[0] != "0"


def convert(root: Path, samples: int, timeout: float, sources: str = "csv,parquet,folder") -> None:
    data = bench_scaling.build_data(root, samples)
    parquet = same_pngs(root, samples) if "parquet" in sources.split(",") else None
    runs = root / "runs"
    for key, name, spec, out in (
        ("csv", "convert shards, CSV index", data / "index.csv", root / f"shards-{samples}"),
        ("parquet", "convert shards, parquet", parquet, runs / f"shards-pq-{samples}"),
        ("folder", "convert shards, folder", data / "images", runs / f"shards-folder-{samples}"),
    ):
        if key not in sources.split(","):
            continue
        arguments = ["convert", "shards", str(spec), str(out), "--per-shard", "10000"]
        result = run([*arguments, "-j", "0", "--force"], {}, None, timeout)
        show(name, samples, result)


def large_pngs(root: Path, samples: int, kilobytes: int) -> Path:
    """Parquet of 50 distinct noise PNGs of about `kilobytes` KB each, over and over: one file,
    row groups of 100 rows (as HF writes images), no dictionary (which would store the repeated
    images once, where distinct images take their size each)."""
    import numpy as np

    side = int((kilobytes * 1000 / 3) ** 0.5)
    rng = np.random.default_rng(0)
    data = [png(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)) for _ in range(50)]
    folder = root / f"pq-large-{kilobytes}k-plain-{samples}"
    image = lambda i: data[i % len(data)]  # noqa: E731
    return write_parquet(folder, samples, image, files=1, row_group=100, dictionary=False)


def counted_run(
    reads_file: Path, torchkit_root: Path | None, window_mb: int | None, arguments: list[str]
) -> None:
    """`torchkit ARGUMENTS` in this process, each parquet row group read counted: the count
    written to `reads_file` at exit (`torchkit_root`: an older checkout's torchkit;
    `window_mb`: convert shards' window of reads, in MiB, instead of its 256)."""
    import atexit
    import runpy

    if torchkit_root is not None:
        sys.path.insert(0, str(torchkit_root))
    import pyarrow.parquet as pq

    reads = [0]
    real = pq.ParquetFile.read_row_group

    def counted(self, *args, **kwargs):
        reads[0] += 1
        return real(self, *args, **kwargs)

    pq.ParquetFile.read_row_group = counted
    if window_mb is not None:
        from torchkit.core.convert import shards

        shards.WINDOW_BYTES = window_mb << 20
    atexit.register(lambda: reads_file.write_text(str(reads[0])))
    sys.argv = ["torchkit", *arguments]
    runpy.run_module("torchkit", run_name="__main__")


def convert_large(
    root: Path,
    samples: int,
    timeout: float,
    kilobytes: int,
    before: Path | None,
    window_mb: int | None = None,
) -> None:
    """`convert shards` of parquet of large images (a window of 256 MB holds few of them), with
    row-group reads counted; with --before, the older checkout's run first, and every shard's
    SHA-256 compared. The shards are removed after."""
    import hashlib

    parquet = large_pngs(root, samples, kilobytes)
    digests = {}
    for label, torchkit_root in (("before", before), ("after", None)):
        if label == "before" and before is None:
            continue
        out = root / "runs" / f"shards-large-{label}-{samples}"
        reads_file = root / "runs" / "reads.txt"
        reads_file.unlink(missing_ok=True)
        command = [__file__, "--counted-run", str(reads_file)]
        command += ["--before", str(torchkit_root)] if torchkit_root else []
        command += ["--window-mb", str(window_mb)] if window_mb else []
        arguments = ["convert", "shards", str(parquet), str(out), "--per-shard", "1000"]
        with_reads = ["--", *arguments, "-j", "0", "--force"]
        result = run_python([*command, *with_reads], timeout)
        reads = reads_file.read_text() if reads_file.exists() else "?"
        window = f", {window_mb} MiB windows" if window_mb else ""
        title = f"convert shards, parquet {kilobytes} KB{window}: {label} ({reads} reads)"
        show(title, samples, result)
        digests[label] = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("*.tar"))
        }
        shutil.rmtree(out)
    if len(digests) == 2:
        same = digests["before"] == digests["after"]
        print(f"  {len(digests['after'])} shards, SHA-256 of every one the same: {same}")


def neardup(root: Path, samples: int, timeout: float) -> None:
    data = distinct_pngs(root, samples)
    out = root / "runs" / f"stats-{samples}.json"
    arguments = ["dataset-stats", str(data), "--near-duplicates", "--format", "json", "-o"]
    result = run(
        [*arguments, str(out), "--force"], {"listed": bench_scaling.listed(samples)}, None, timeout
    )
    show("dataset-stats --near-duplicates (distinct)", samples, result)
    if out.exists():
        report = json.loads(out.read_text(encoding="utf-8"))
        pairs = report.get("near_duplicates") or []
        print(f"{'':<44} near pairs within: {len(pairs):,}", flush=True)


def shards_of(root: Path, samples: int, timeout: float) -> Path:
    """ROOT/shards-N: convert shards' output of the CSV index; past 100,000 samples (where the
    conversion alone takes many minutes) copies of the 10,000-sample shard it wrote for 10k
    (each its own file: links to one shard are refused), its classes.txt beside them."""
    shards = root / f"shards-{samples}"
    if (shards / "manifest.json").exists() or (shards / ".complete").exists():
        return shards
    if samples <= 100_000 or samples % 10_000:
        convert(root, samples, timeout)
        return shards
    one = shards_of(root, 10_000, timeout)
    shards.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(one / "classes.txt", shards / "classes.txt")
    for k in range(samples // 10_000):
        shutil.copyfile(one / "shard-000000.tar", shards / f"shard-{k:06d}.tar")
    (shards / ".complete").touch()
    return shards


def infer(root: Path, samples: int, timeout: float, whole_max: int) -> None:
    shards = shards_of(root, samples, timeout)
    parquet = same_pngs(root, samples)
    untrained = ["--model", "convnet", "--allow-untrained", "--image-size", "8"]
    for layout, spec in (("shards", shards), ("parquet", parquet)):
        out = root / "runs" / f"infer-{layout}-{samples}"
        commands = {
            "predict": [
                "predict",
                *untrained,
                str(spec),
                "--format",
                "csv",
                "-o",
                str(out / "predict.csv"),
                "--force",
            ],  # fmt: skip
            "extract-features": [
                "extract-features",
                *untrained,
                str(spec),
                str(out / "features"),
                "--force",
            ],  # fmt: skip
        }
        out.mkdir(parents=True, exist_ok=True)
        for command, arguments in commands.items():
            whole = samples <= whole_max
            marks = {"first batch": first_counted}
            result = run(arguments, marks, None if whole else "first batch", timeout)
            how = "whole run" if whole else "to its first batch"
            show(f"{command}, {layout} ({how})", samples, result)
            if whole:
                written = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
                print(f"{'':<44} output {written / 1e6:.1f} MB", flush=True)


LABELS_SCRIPT = """
import resource, sys, time
from torchkit.core.data.sources import shards
from torchkit.core.data.sources.source import open_data
found = []
real_source = shards.shards_source
def source(spec, root, samples, *args, **kwargs):
    found.extend(samples)
    return real_source(spec, root, samples, *args, **kwargs)
shards.shards_source = source
started = time.process_time()
data = open_data(sys.argv[1])
cpu = time.process_time() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
names = len({id(s.name) for s in found if s.name is not None})
size = sum(sys.getsizeof(s.name) for s in found if s.name is not None) / 1e6
print(f"open_data: cpu {cpu:.2f} s, peak {peak:.0f} MB; {len(found):,} samples, {names:,} "
      f"class-name objects ({size:.1f} MB were each its own)")
"""


def labels(root: Path, samples: int, timeout: float, before: Path | None) -> None:
    """open_data of the shards in a process of its own: CPU s, peak MB and how many class-name
    objects the listed samples hold (`before`: also with that checkout's torchkit)."""
    shards = shards_of(root, samples, timeout)
    trees = {"after": Path(__file__).resolve().parents[1]}
    if before is not None:
        trees = {"before": before, **trees}
    for side, tree in trees.items():
        done = subprocess.run(
            [sys.executable, "-c", LABELS_SCRIPT, str(shards)],
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        shown = done.stdout.strip() or done.stderr.strip()[-300:]
        print(f"{'labels, shards: ' + side:<44} {samples:>9,}  {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="samples, e.g. 10000,100000")
    parser.add_argument("--parts", default="convert,neardup,infer,labels")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_data_scale"))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run")
    parser.add_argument("--whole-max", type=int, default=100_000,
                        help="predict and extract-features run whole up to this size")  # fmt: skip
    parser.add_argument("--before", type=Path,
                        help="labels: also open the shards with this torchkit")  # fmt: skip
    parser.add_argument("--sources", default="csv,parquet,folder",
                        help="convert: the sources converted")  # fmt: skip
    parser.add_argument("--large-kb", type=int, default=250,
                        help="convert-large: KB an image")  # fmt: skip
    parser.add_argument("--window-mb", type=int,
                        help="convert-large: convert shards' window in MiB (256), smaller to "
                        "stand for data that many windows larger")  # fmt: skip
    parser.add_argument("--counted-run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.counted_run:
        counted_run(args.counted_run, args.before, args.window_mb, args.arguments)
        return
    (args.root / "runs").mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {when} UTC, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    for samples in [int(s) for s in args.sizes.split(",")]:
        for part in args.parts.split(","):
            if part == "convert":
                convert(args.root, samples, args.timeout, args.sources)
            elif part == "convert-large":
                convert_large(
                    args.root, samples, args.timeout, args.large_kb, args.before, args.window_mb
                )
            elif part == "neardup":
                neardup(args.root, samples, args.timeout)
            elif part == "infer":
                infer(args.root, samples, args.timeout, args.whole_max)
            elif part == "labels":
                labels(args.root, samples, args.timeout, args.before)


if __name__ == "__main__":
    main()
