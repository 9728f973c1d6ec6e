"""What the GPU did during `train --profile-steps`' steps, read from the profile's Chrome trace
(`profile/epoch-K.json`): whether the steps kept it busy, and if not, what it waited for.

torch.profiler's operator table sums each operator's time; it cannot say whether the GPU sat
idle between them, nor which stream ran what. This reads the trace's device activity (kernels,
copies, memsets, each with its stream) and the host's CUDA calls (each with its thread):

- per stream: its kernels and the time it was busy (activities merged where they overlap), and
  its kernels by total time;
- per host thread that launched them (the launch's correlation id): the device time of its
  kernels and copies. The decoding threads' crops run on the training thread's stream, so only
  this tells their kernels from the steps';
- the busiest stream (the training steps' own) idle: in how many gaps, how long in all, how much
  of it in gaps of 1 ms or more, and how much of that idle time another stream (the JPEG
  decoder's, the decoded crops') was busy;
- the host's waits for the GPU, by thread and call (stream, event and device synchronisations,
  synchronous copies, frees and allocations, which wait for the device too).

On the H200 resnet50 trained at 0.82 of what `torchkit benchmark --mode train` says it can, and
the decode thread was busy for nearly the whole epoch: whether the steps waited for the decoder,
or the decoder's kernels took the steps' time, is what these figures tell.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Device activity in Kineto's traces (older versions capitalise the category).
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
HOST_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
# Host calls that wait for the device: synchronisations, and the copies, frees and allocations
# that synchronise implicitly.
WAITING_CALLS = re.compile(
    r"Synchronize|^cudaMemcpy(2D|3D)?$|^cuMemcpy[HD]to[HD](_v2)?$|^cudaFree|^cuMemFree"
    r"|^cudaMalloc|^cudaHostAlloc|^cuMemAlloc|^cuMemHostAlloc"
)
LONG_GAP_US = 1000.0
TOP_KERNELS = 5
TOP_WAITS = 8


@dataclass
class StreamTime:
    """One stream's share of the profiled steps."""

    stream: str
    activities: int
    busy_ms: float
    top: list[tuple[str, float, int]] = field(default_factory=list)  # (name, ms, count)


@dataclass
class HostWait:
    """The host's waits for the GPU in one call, in one thread."""

    thread: str
    call: str
    count: int
    ms: float
    longest_ms: float


@dataclass
class LaunchingThread:
    """The device work one host thread launched."""

    thread: str
    activities: int
    ms: float  # summed durations (overlaps counted twice)


@dataclass
class GpuTimeline:
    """The device's activity in a trace (module doc). Times in milliseconds."""

    window_ms: float  # from the first device activity to the end of the last
    busy_ms: float  # some stream busy
    streams: list[StreamTime]  # busiest first
    main_idle_ms: float  # the busiest stream idle within the window
    main_gaps: int
    main_long_gaps: int  # gaps of LONG_GAP_US or more
    main_long_gaps_ms: float
    others_while_main_idle_ms: float  # another stream busy while the busiest was idle
    waits: list[HostWait]  # longest first
    launchers: list[LaunchingThread] = field(default_factory=list)  # most device time first


def gpu_timeline(trace: dict[str, Any]) -> GpuTimeline | None:
    """The timeline of a Chrome trace's events (None when it holds no device activity: a
    profile on a CPU)."""
    events = [event for event in trace.get("traceEvents", []) if isinstance(event, dict)]
    threads = _thread_names(events)
    by_stream: dict[str, list[tuple[float, float]]] = defaultdict(list)
    kernels: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    waits: dict[tuple[str, str], list[float]] = defaultdict(list)
    launched_by: dict[Any, str] = {}  # correlation id -> the launching thread
    device_work: list[tuple[Any, float]] = []  # (correlation id, duration)
    for event in events:
        if event.get("ph") != "X":
            continue
        category = str(event.get("cat", "")).lower()
        start, length = _number(event.get("ts")), _number(event.get("dur"))
        if start is None or length is None or length < 0:
            continue
        if category in DEVICE_CATEGORIES:
            stream = _stream(event)
            by_stream[stream].append((start, start + length))
            kernels[stream][str(event.get("name", "?"))].append(length)
            device_work.append(((event.get("args") or {}).get("correlation"), length))
        elif category in HOST_CATEGORIES:
            key = (event.get("pid"), event.get("tid"))
            thread = threads.get(key, f"thread {event.get('tid')}")
            correlation = (event.get("args") or {}).get("correlation")
            if correlation is not None:
                launched_by[correlation] = thread
            if WAITING_CALLS.search(str(event.get("name", ""))):
                waits[(thread, str(event["name"]))].append(length)
    if not by_stream:
        return None
    merged = {stream: _merged(spans) for stream, spans in by_stream.items()}
    everything = _merged([span for spans in by_stream.values() for span in spans])
    window = (everything[0][0], everything[-1][1])
    streams = sorted(
        (
            StreamTime(
                stream,
                len(by_stream[stream]),
                _total(merged[stream]) / 1000,
                _top(kernels[stream]),
            )
            for stream in merged
        ),
        key=lambda stream: -stream.busy_ms,
    )
    main = streams[0].stream
    gaps = _gaps(merged[main], window)
    others = _merged([span for stream, spans in merged.items() if stream != main for span in spans])
    long_gaps = [gap for gap in gaps if gap[1] - gap[0] >= LONG_GAP_US]
    return GpuTimeline(
        window_ms=(window[1] - window[0]) / 1000,
        busy_ms=_total(everything) / 1000,
        streams=streams,
        main_idle_ms=_total(gaps) / 1000,
        main_gaps=len(gaps),
        main_long_gaps=len(long_gaps),
        main_long_gaps_ms=_total(long_gaps) / 1000,
        others_while_main_idle_ms=_overlap(gaps, others) / 1000,
        waits=sorted(
            (
                HostWait(thread, call, len(times), sum(times) / 1000, max(times) / 1000)
                for (thread, call), times in waits.items()
            ),
            key=lambda wait: -wait.ms,
        )[:TOP_WAITS],
        launchers=_launchers(device_work, launched_by),
    )


def timeline_of_file(path: str | Path) -> GpuTimeline | None:
    """`gpu_timeline` of a trace file."""
    with open(path, encoding="utf-8") as file:
        return gpu_timeline(json.load(file))


def render_timeline(timeline: GpuTimeline, heading: str = "") -> str:
    """The timeline as the text `profile/epoch-K-gpu.txt` holds."""

    def share(ms: float) -> str:
        return f"{100 * ms / timeline.window_ms:.1f}%" if timeline.window_ms else "-"

    lines = [heading] if heading else []
    lines += [
        f"device activity: {timeline.window_ms:.1f} ms from the first to the end of the last; "
        f"some stream busy {timeline.busy_ms:.1f} ms ({share(timeline.busy_ms)}), "
        f"none {timeline.window_ms - timeline.busy_ms:.1f} ms",
        f"the busiest stream ({timeline.streams[0].stream}) idle {timeline.main_idle_ms:.1f} ms "
        f"({share(timeline.main_idle_ms)}) in {timeline.main_gaps} gaps, "
        f"{timeline.main_long_gaps_ms:.1f} ms of it in {timeline.main_long_gaps} gaps of "
        f"{LONG_GAP_US / 1000:g} ms or more; other streams busy "
        f"{timeline.others_while_main_idle_ms:.1f} ms of that idle time",
        "",
        "streams, busiest first:",
    ]
    for stream in timeline.streams:
        lines.append(
            f"- {stream.stream}: busy {stream.busy_ms:.1f} ms ({share(stream.busy_ms)}), "
            f"{stream.activities} kernels, copies and memsets"
        )
        lines += [f"    {ms:9.2f} ms {count:6d}x  {name[:100]}" for name, ms, count in stream.top]
    if timeline.launchers:
        lines += ["", "device time by the host thread that launched it (summed durations):"]
        lines += [
            f"- {launcher.thread}: {launcher.ms:.1f} ms in {launcher.activities} kernels, "
            f"copies and memsets"
            for launcher in timeline.launchers
        ]
    lines += ["", "the host waiting for the device (by thread and call, longest first):"]
    if not timeline.waits:
        lines.append("- none")
    lines += [
        f"- {wait.thread}: {wait.call} {wait.count}x, {wait.ms:.1f} ms "
        f"(longest {wait.longest_ms:.2f} ms)"
        for wait in timeline.waits
    ]
    return "\n".join(lines) + "\n"


def _launchers(
    device_work: list[tuple[Any, float]], launched_by: dict[Any, str]
) -> list[LaunchingThread]:
    """Device time per launching thread; work whose launch the trace lacks is "unknown"."""
    counts: dict[str, int] = defaultdict(int)
    times: dict[str, float] = defaultdict(float)
    for correlation, length in device_work:
        thread = launched_by.get(correlation, "unknown") if correlation is not None else "unknown"
        counts[thread] += 1
        times[thread] += length
    return sorted(
        (LaunchingThread(thread, counts[thread], times[thread] / 1000) for thread in counts),
        key=lambda launcher: -launcher.ms,
    )


def _thread_names(events: list[dict[str, Any]]) -> dict[tuple[Any, Any], str]:
    names = {}
    for event in events:
        if event.get("ph") == "M" and event.get("name") == "thread_name":
            name = (event.get("args") or {}).get("name")
            if name:
                names[(event.get("pid"), event.get("tid"))] = f"{name} ({event.get('tid')})"
    return names


def _stream(event: dict[str, Any]) -> str:
    args = event.get("args") or {}
    device = args.get("device", event.get("pid"))
    stream = args.get("stream", event.get("tid"))
    return f"cuda:{device} stream {stream}"


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None  # NaN is no time


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `spans`, as sorted disjoint spans."""
    union: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


def _total(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _gaps(
    busy: list[tuple[float, float]], window: tuple[float, float]
) -> list[tuple[float, float]]:
    """The spans of `window` that `busy` (merged) leaves free."""
    gaps, at = [], window[0]
    for start, end in busy:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    if window[1] > at:
        gaps.append((at, window[1]))
    return gaps


def _overlap(first: list[tuple[float, float]], second: list[tuple[float, float]]) -> float:
    """The time two merged span lists share."""
    shared, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        start = max(first[i][0], second[j][0])
        end = min(first[i][1], second[j][1])
        shared += max(0.0, end - start)
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return shared


def _top(by_name: dict[str, list[float]]) -> list[tuple[str, float, int]]:
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:TOP_KERNELS]
    return [(name, sum(times) / 1000, len(times)) for name, times in ranked]
