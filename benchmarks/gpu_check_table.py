"""The table of `gpu_check.sh`, from its work folder: the run folders' metrics.csv, the JSON
files of `torchkit benchmark` and `plain_loop.py`, the log (timm's lines) and the step times.

    python benchmarks/gpu_check_table.py WORK LOG OUT MODEL DEVICE IMAGES SIZE BATCH WORKERS AMP

Prints the table (Markdown) and writes it to OUT/gpu_check.md, the figures to OUT/gpu_check.json.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys

work, log, out, big, dev, n, img, batch, workers, amp = sys.argv[1:]
steps = {}
with open(os.path.join(work, "steps.txt")) as lines:
    for line in lines:
        name, rc, seconds = line.split()
        steps[name] = (int(rc), float(seconds))


def epochs(run):
    try:
        with open(os.path.join(work, run, "metrics.csv")) as f:
            return [(float(r["epoch_time_s"]), float(r["images_per_s"])) for r in csv.DictReader(f)]
    except (OSError, KeyError, ValueError):
        return []


def wall(step):
    """The seconds a step took, if it ran and succeeded."""
    rc, seconds = steps.get(step, (1, None))
    return seconds if rc == 0 else None


def first_epoch_s(rows):
    return rows[0][0] if rows else None


def steady(rows):
    """Images/s and mean seconds of the epochs after the first."""
    rest = rows[1:]
    if not rest:
        return None, None
    seconds = sum(s for s, _ in rest)
    return sum(s * r for s, r in rest) / seconds, seconds / len(rest)


def ran(run, step):
    """The epochs of a run whose step ran (an empty list if it left no metrics), else None."""
    found = epochs(run)
    return found if found or step in steps else None


def first_vs_steady(what, run_rows):
    return (what, first_epoch_s(run_rows), steady(run_rows)[1])


def big_variant(run, step, flag, against):
    """The big model run with `flag`: its first vs steady epoch, and its steady rate against
    the default run's (`against` names the default)."""
    found = ran(run, step)
    if found is None:
        return []
    return [
        first_vs_steady(f"{big} first vs steady epoch s, {flag}", found),
        (f"{big} steady epoch img/s: {flag} vs {against}", steady(found)[0], big_rate),
    ]


def digits_variant(step, flag, against):
    """The digits job run with `flag`: its first vs steady epoch, and its wall time against
    the default job's (`against` names the default)."""
    found = ran(step, step)
    if found is None:
        return []
    return [
        first_vs_steady(f"digits first vs steady epoch s, {flag}", found),
        (f"digits main job wall s: {flag} vs {against}", wall(step), wall("digits")),
    ]


def load(name):
    try:
        with open(os.path.join(work, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def epoch_rate(rows, index):
    return rows[index][1] if len(rows) > index else None


big_rows, r18_rows, digit_rows = epochs("big"), epochs("r18"), epochs("digits")
share_rows = epochs("r18share")
plain = load("plain.json")
plain_rows = [(r["epoch_time_s"], r["images_per_s"]) for r in plain["epochs"]] if plain else []
bench = load("bench.json")
bench_rate = bench["results"][0]["images_per_s"] if bench and bench.get("results") else None
big_rate, big_steady_s = steady(big_rows)
_, digit_steady_s = steady(digit_rows)
with open(log, errors="replace") as f:
    text = f.read()

rows = [  # (what, torchkit, against)
    (f"{big} steady epoch img/s vs `torchkit benchmark --mode train`", big_rate, bench_rate),
]
for index in (1, 2):
    rows.append(
        (
            f"resnet18 epoch {index + 1} img/s vs plain PyTorch loop",
            epoch_rate(r18_rows, index),
            epoch_rate(plain_rows, index),
        )
    )
rows.append(
    (
        f"resnet18 epoch 3 img/s, --decode-cpu-share {os.environ.get('SHARE', '?')} vs none",
        epoch_rate(share_rows, 2),
        epoch_rate(r18_rows, 2),
    )
)
rows += [
    (f"{big} first vs steady epoch s", first_epoch_s(big_rows), big_steady_s),
    ("digits first vs steady epoch s", first_epoch_s(digit_rows), digit_steady_s),
    (
        "digits main job wall s",
        wall("digits"),
        "",  # nothing to compare with
    ),
]
if wall("digits-cold") is not None:
    rows.append(
        ("digits main job wall s: the machine's first CUDA run vs the next", wall("digits-cold"),
         wall("digits"))
    )  # fmt: skip


# --decode-cpu-share on the big model.
if (big_share := ran("big-share", "tk-big-share")) is not None:
    rows.append(
        (
            f"{big} steady epoch img/s: --decode-cpu-share {os.environ.get('SHARE', '?')} vs none",
            steady(big_share)[0],
            big_rate,
        )
    )
# --cuda-graphs: the big model's steps replayed as a graph, against eager steps.
rows += big_variant("big-graphs", "tk-big-graphs", "--cuda-graphs", "eager (default)")
# The caching allocator's expandable segments against its default.
rows += big_variant(
    "big-expandable", "tk-big-expandable", "expandable_segments:True", "default allocator"
)
# --cudnn-benchmark: what cuDNN's autotuning costs the first epoch and buys the others.
rows += big_variant("big-bench", "tk-big-bench", "--cudnn-benchmark", "default")
rows += digits_variant("digits-bench", "--cudnn-benchmark", "default")
# --cudnn-benchmark-limit 3: fewer algorithms timed per convolution (torch's default is 10).
rows += big_variant("big-limit", "tk-big-limit", "--cudnn-benchmark-limit 3", "default")
# --decode fast: the big model's JPEGs decoded by the loader workers, not on the GPU.
if (fast := ran("big-fast", "tk-big-fast")) is not None:
    rows.append((f"{big} steady epoch img/s: --decode fast vs device", steady(fast)[0], big_rate))
# The digits job's steps eager (--no-cuda-graphs) against the default, which on CUDA replays
# them as a CUDA graph.
if (eager := ran("digits-eager", "digits-eager")) is not None:
    rows.append(
        ("digits steady epoch s: --no-cuda-graphs vs default", steady(eager)[1], digit_steady_s)
    )
rows += digits_variant("digits-eager", "--no-cuda-graphs", "default")
datapath = load("datapath.json")
if datapath and datapath.get("images_per_s"):
    rates = datapath["images_per_s"]
    shared = next((name for name in rates if "share" in name), None)
    rows.append(("data path alone img/s: --decode device vs fast", rates.get("device"),
                 rates.get("fast")))  # fmt: skip
    if shared is not None:
        rows.append((f"data path alone img/s: {shared} vs none", rates[shared],
                     rates.get("device")))  # fmt: skip
    if rates.get("device, ahead") is not None:
        rows.append(("data path alone img/s: --decode device ahead vs in the loop",
                     rates["device, ahead"], rates.get("device")))  # fmt: skip
resize = load("resize.json")
if resize and resize.get("cases"):
    case = resize["cases"][0]  # on a GPU the real sizes; on a CPU the tiny case (host cost)
    rows.append(
        (
            f"crop+resize host ms, {case['images']} crops to {case['size']} px: batched vs "
            "per-image",
            case["batched_host_ms"],
            case["per_image_host_ms"],
        )
    )
loader = load("evalloader.json")
if loader and loader.get("images_per_s"):
    rates = loader["images_per_s"]
    rows.append(("eval data path alone img/s: uint8 vs float32 batches",
                 rates.get("uint8, normalised"), rates.get("float32 in the workers")))  # fmt: skip
    rows.append(("eval data path alone img/s: --decode device vs exact (uint8)",
                 rates.get("--decode device"), rates.get("uint8, normalised")))  # fmt: skip
evals = {decode: load(f"eval_{decode}.json") for decode in ("exact", "device")}
if any(evals.values()):
    rates = {d: (e or {}).get("images_per_second") for d, e in evals.items()}
    rows.append((f"{big} `torchkit eval` img/s: --decode device vs exact",
                 rates["device"], rates["exact"]))  # fmt: skip
if "timm-resnet18" in steps:  # timm logs "Train: EPOCH [...] ... (avg s, avg images/s)"
    found = re.findall(r"Train: 2 \[.*?\(\s*[\d.]+s,\s*([\d.]+)/s\)", text)
    rows.append(
        (
            "resnet18 epoch 3 img/s vs timm train.py (its running mean)",
            epoch_rate(r18_rows, 2),
            float(found[-1]) if found else None,
        )
    )
if "timm-benchmark" in steps:
    found = re.findall(r"Train benchmark of .*? done\. ([\d.]+) samples/sec", text)
    rows.append(
        (
            f"{big} `torchkit benchmark --mode train` vs timm benchmark.py",
            bench_rate,
            float(found[-1]) if found else None,
        )
    )


def cell(value):
    if value is None:
        return "n/a"
    if value == "":
        return ""
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


try:  # the header only
    import torch

    device = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "CPU"
    torch_version, threads = torch.__version__, torch.get_num_threads()
except Exception as error:  # a broken CUDA still gets its table
    device, torch_version, threads = f"{dev} ({type(error).__name__})", "?", "?"
head = (
    f"torchkit GPU check: {device} ({dev}), torch {torch_version}, {os.cpu_count()} cores, "
    f"{threads} torch threads; "
    f"{n} JPEGs at {img} px, batch {batch}, {workers} workers, "
    f"{'AMP + channels-last' if amp == '1' else 'fp32'}"
)
width = max(len(what) for what, *_ in rows)
lines = [
    head,
    "",
    f"| {'what':<{width}} | {'torchkit':>9} | {'against':>9} | {'ratio':>5} |",
    f"|{'-' * (width + 2)}|{'-' * 10}:|{'-' * 10}:|{'-' * 6}:|",
]
figures = []
for what, ours, theirs in rows:
    compared = theirs != ""
    ratio = ours / theirs if compared and ours is not None and theirs else None
    shown = f"{ratio:.2f}" if ratio is not None else "n/a" if compared else ""
    lines.append(f"| {what:<{width}} | {cell(ours):>9} | {cell(theirs):>9} | {shown:>5} |")
    figures.append(
        {"what": what, "torchkit": ours, "against": theirs if compared else None, "ratio": ratio}
    )
# `train -v`'s lines for each run's first two epochs (core/train/timeline.py): where the first
# epoch's time went, and whether a steady epoch waited for data (the loader or the decode
# thread) or for the model.
first_epochs, whole_runs, graph_lines = [], [], []
with open(log, errors="replace") as handle:
    for text in handle:
        if text.startswith("=== "):
            run = text[4:].split(":", 1)[0]
        for epoch in ("epoch 1: ", "epoch 2: "):
            if epoch + "first batch after" in text or epoch + "validation took" in text:
                first_epochs.append(f"{run} {epoch}{text.split(epoch, 1)[1].strip()}")
        if "run: " in text and " since the " in text:  # the last line: the whole run
            whole_runs.append(f"{run} {text[text.index('run: ') :].strip()}")
        if "--cuda-graphs: " in text:  # captured or not, and how the updates were made
            graph_lines.append(f"{run} {text[text.index('--cuda-graphs: ') :].strip()}")
if first_epochs:
    lines += ["", "epochs 1 and 2 (train -v):", *(f"- {line}" for line in first_epochs)]
if whole_runs:
    lines += ["", "where each run's wall time went (train -v):", *(f"- {r}" for r in whole_runs)]
if graph_lines:
    lines += ["", "--cuda-graphs (train -v):", *(f"- {line}" for line in graph_lines)]
# `train --profile-steps`: the heading and the top operators of each profiled epoch, and on a
# GPU what each stream did and what the host waited for.
PROFILE_ROWS = 15
for name in sorted(os.listdir(out)):
    if name.startswith("profile-") and name.endswith(".txt"):
        with open(os.path.join(out, name), errors="replace") as handle:
            profile = handle.read().splitlines()
        # what the GPU did (epoch-K-gpu.txt, read from the trace) is short: whole
        keep = profile if name.endswith("-gpu.txt") else profile[: 5 + PROFILE_ROWS]
        lines += ["", f"{name}:", *keep]
failed = [f"{name} (rc {rc})" for name, (rc, _) in steps.items() if rc != 0]
if failed:
    lines += ["", "failed or cut: " + ", ".join(failed) + f"; see {log}"]
table = "\n".join(lines)
print(table)
with open(os.path.join(out, "gpu_check.md"), "w") as f:
    f.write(table + "\n")
with open(os.path.join(out, "gpu_check.json"), "w") as f:
    json.dump(
        {
            "header": head,
            "rows": figures,
            "steps": steps,
            "first_epochs": first_epochs,
            "whole_runs": whole_runs,
        },
        f,
        indent=1,
    )
