"""`torchkit env`: the torch / CUDA / GPU report, and `--require-cuda` for scripts."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from torchkit.cli import console
from torchkit.cli.options import ForceOption, FormatOption, OutputOption
from torchkit.cli.render import OutputFormat, Table, emit, report_file, resolve_format

_GIB = 1024**3


def env_command(
    require_cuda: Annotated[
        bool,
        typer.Option(
            "--require-cuda",
            help="Exit with status 1 unless a usable CUDA GPU is present. When none is, the "
            "report is not printed: one `Error: no usable CUDA GPU: ...` line on stderr says "
            "why (-o FILE still gets the report).",
        ),
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="Print no report, only problems on stderr: with --require-cuda, nothing at "
            "all when a CUDA GPU is usable (-o FILE still gets the report).",
        ),
    ] = False,
    fmt: FormatOption = None,
    output: OutputOption = None,
    force: ForceOption = False,
) -> None:
    """Report Python, OS, CPU, torch build, CUDA, cuDNN, NCCL, GPUs and package versions.

    Problems (a CUDA build of torch with no usable driver, CUDA_VISIBLE_DEVICES hiding every GPU
    or cut short by an invalid entry, torchvision operators that do not load) are shown as
    warnings on stderr.

    Examples:

      torchkit env

      torchkit env --format json -o env.json

      torchkit env --format csv | grep gpus

      torchkit env -q --require-cuda && torchkit train --data flowers/ --device cuda
    """
    from torchkit.core.env import collect_env, require_usable_cuda
    from torchkit.core.io.file_outputs import check_output_file

    fmt = resolve_format(fmt, output)
    output = report_file(output)
    if output is not None:
        check_output_file(output, force)  # before the slow part, not after it
    report = collect_env(log_diagnostics=False)
    # A script asking for CUDA where there is none gets one line, the error: no report on
    # stdout, and no warnings that only say the same thing at more length.
    missing_cuda = require_cuda and not report["cuda"]["usable"]
    if not missing_cuda:
        for message in report["diagnostics"]:
            console.warn(message)
    quiet = quiet or console.is_quiet()  # `torchkit -q env`, as `torchkit env -q`
    if output is not None or not (quiet or missing_cuda):
        tables = [flat_table(report)] if fmt == OutputFormat.csv else report_tables(report)
        emit(tables=tables, data=report, fmt=fmt, output=output, force=force)
    if require_cuda:
        require_usable_cuda(report)


def register(app: typer.Typer) -> None:
    app.command("env")(env_command)


def report_tables(report: dict[str, Any]) -> list[Table]:
    """The report for people: an overview, one row per GPU, and the package versions."""
    tables = [Table(["item", "value"], _overview_rows(report), title="torchkit env")]
    if report["gpus"]:
        tables.append(
            Table(
                ["gpu", "name", "memory GiB", "free GiB", "capability", "SMs", "usable"],
                [
                    [
                        gpu["index"],
                        gpu["name"],
                        _gib(gpu["total_memory_bytes"]),
                        _gib(gpu["free_memory_bytes"]),
                        gpu["compute_capability"],
                        gpu["multiprocessors"],
                        gpu["usable"],
                    ]
                    for gpu in report["gpus"]
                ],
                title="GPUs",
                align_right={"gpu", "memory GiB", "free GiB", "SMs"},
            )
        )
    tables.append(
        Table(
            ["package", "version"],
            [[name, version or "not installed"] for name, version in report["packages"].items()],
            title="Packages",
        )
    )
    for key, title in (
        ("cuda_packages", "NVIDIA packages"),
        ("intel_packages", "Intel packages"),
        ("conda_packages", "conda packages"),
    ):
        if report[key]:
            tables.append(
                Table(
                    ["package", "version"],
                    [list(item) for item in report[key].items()],
                    title=title,
                )
            )
    return tables


def _overview_rows(report: dict[str, Any]) -> list[list[Any]]:
    python, system, cpu = report["python"], report["platform"], report["cpu"]
    rows: list[list[Any]] = [
        ["torchkit", report["torchkit_version"]],
        [
            "Python",
            f"{python['version']} ({python['implementation']}"
            + (", free-threaded)" if python["free_threaded"] else ")"),
        ],
        ["Python executable", python["executable"]],
        ["Python environment", _python_environment(python)],
        ["OS", system["os"] or system["system"]],
        ["platform", system["description"]],
        ["C++ compiler", system["compiler"] or "none (torch.compile needs one on the CPU)"],
        ["CPU", cpu["model"] or "unknown"],
        ["CPU cores", _cores(cpu)],
    ]
    torch_info, dist, cuda = report["torch"], report["distributed"], report["cuda"]
    if torch_info is not None:
        rows += [
            ["torch", torch_info["version"]],
            [
                "torch build",
                torch_info["build"] + (" (debug)" if torch_info["debug_build"] else ""),
            ],
            ["torch built with", torch_info["build_compiler"] or "unknown"],
            *([["ROCm", torch_info["rocm_version"]]] if torch_info["rocm_version"] else []),
            _dnn_library_row(torch_info),
            ["CUDA architectures", " ".join(torch_info["cuda_arch_list"]) or "none"],
            ["CUDA available", torch_info["cuda_available"]],
            ["MPS available", torch_info["mps_available"]],
            ["XPU available", torch_info["xpu_available"]],
            ["CPU capability", torch_info["cpu_capability"]],
            ["CPU features", _cpu_features(torch_info["cpu_features"])],
            ["CPU libraries", _cpu_libraries(torch_info)],
            ["XNNPACK", "unknown" if torch_info["xnnpack"] is None else torch_info["xnnpack"]],
            ["intra-op threads", torch_info["intra_op_threads"]],
            ["inter-op threads", torch_info["inter_op_threads"]],
        ]
    if dist is not None:
        backends = [name for name in ("gloo", "nccl", "mpi") if dist[name]]
        rows += [
            ["distributed backends", ", ".join(backends) or "none"],
            ["NCCL", dist["nccl_version"] or "none"],
        ]
    set_variables = [f"{name}={value}" for name, value in report["environment"].items() if value]
    rows.append(["environment", ", ".join(set_variables) or "(none set)"])
    visible = cuda["visible_devices"]
    rows += [
        ["CUDA_VISIBLE_DEVICES", "(not set)" if visible is None else repr(visible)],
        ["NVIDIA driver", _driver(cuda)],
        ["CUDA GPUs", cuda["device_count"]],
        ["usable CUDA GPU", "yes" if cuda["usable"] else f"no: {cuda['problem']}"],
    ]
    return rows


def _driver(cuda: dict[str, Any]) -> str:
    """`550.54 (CUDA 12.4, 2 GPUs)`: the driver, the newest CUDA it supports, its GPUs."""
    driver, cuda_version = cuda["driver_version"], cuda["driver_cuda_version"]
    if not driver and not cuda_version:
        return "not found"
    supports = f"CUDA {cuda_version}, " if cuda_version else ""
    gpus = cuda["driver_gpu_count"]
    return f"{driver or 'version unknown'} ({supports}{'?' if gpus is None else gpus} GPUs)"


def _dnn_library_row(torch_info: dict[str, Any]) -> list[Any]:
    if torch_info["hip_version"]:  # a ROCm build runs MIOpen where CUDA's runs cuDNN
        return ["MIOpen", torch_info["miopen_version"] or "none"]
    return ["cuDNN", torch_info["cudnn_version"] or "none"]


def _python_environment(python: dict[str, Any]) -> str:
    installer = python["torch_installer"]
    return python["environment"] + (f", torch installed by {installer}" if installer else "")


def _cpu_features(features: list[str] | None) -> str:
    if features is None:
        return "unknown"
    return " ".join(features) or "none listed"


def _cpu_libraries(torch_info: dict[str, Any]) -> str:
    names = [
        ("BLAS", torch_info["blas"]),
        ("MKL", torch_info["mkl_version"]),
        ("oneDNN", torch_info["onednn_version"]),
        ("OpenMP", torch_info["openmp"]),
    ]
    return ", ".join(f"{name} {value}" for name, value in names if value) or "none listed"


def _cores(cpu: dict[str, Any]) -> str:
    quota = "" if cpu["quota"] is None else f", cgroup CPU quota {cpu['quota']:g}"
    numa = "" if not cpu["numa_nodes"] else f", {cpu['numa_nodes']} NUMA node(s)"
    return f"{cpu['logical_cores']} ({cpu['usable_cores']} usable by this process{quota}){numa}"


def flat_table(report: dict[str, Any]) -> Table:
    """Every value of the report as one `key,value` row (`gpus.0.name`, `packages.numpy`)."""
    return Table(["key", "value"], [[key, value] for key, value in _flatten(report, "")])


def _flatten(value: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return [(prefix, value)]
    if not items:  # keep the key: `gpus` with no GPUs; "" (written `""`), not a missing value
        return [(prefix, "")]
    rows: list[tuple[str, Any]] = []
    for key, item in items:
        rows += _flatten(item, f"{prefix}.{key}" if prefix else str(key))
    return rows


def _gib(value: int | None) -> float | None:
    return None if value is None else round(value / _GIB, 2)
