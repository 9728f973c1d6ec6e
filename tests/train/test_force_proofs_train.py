"""`train --force` over a run folder: the TensorBoard event files and the --profile-steps
table and trace a run wrote are proven its own by their content (`core.io.output_proofs`) and
replaced on a re-run; a file of the user's under those names is refused (in
tests/cli/test_force_keeps_users_files.py). Before, these were judged by name alone."""

from __future__ import annotations

from pathlib import Path

from format_files import chrome_trace, tensorboard_events
from image_folders import write_image_folder
from processes import run_torchkit_in_process

from torchkit.core.io.folder_contents import foreign_entries
from torchkit.core.io.output_proofs import is_chrome_trace, is_tensorboard_events
from torchkit.core.io.outputs import MARKER, WRITTEN_JOURNAL
from torchkit.core.train.outputs import RUN_OUTPUTS

TRAIN = [
    *("train", "--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"),
    *("--data", "ds", "--val-split", "0.5", "--epochs", "1", "--out", "run"),
    *("--tensorboard", "--profile-steps", "1"),
]


def test_a_run_with_tensorboard_and_a_profile_is_replaced_by_force(tmp_path: Path):
    write_image_folder(tmp_path / "ds", {"a": 4, "b": 4})
    for again in ([], ["--force"]):
        done = run_torchkit_in_process(*TRAIN, *again, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    (events,) = (run / "tensorboard").iterdir()
    assert events.name.startswith("events.out.tfevents.") and is_tensorboard_events(events)
    assert (run / "profile" / "epoch-1.txt").is_file()
    assert is_chrome_trace(run / "profile" / "epoch-1.json")
    assert foreign_entries(run, RUN_OUTPUTS, top_level=(MARKER, WRITTEN_JOURNAL)) == []


def test_the_proofs_take_the_formats_and_only_them(tmp_path: Path):
    """The stand-ins the tests write are what the proofs accept; an empty event file (a writer
    killed before its first record) is the run's, bytes of another format are not."""
    cases = {
        "events": (is_tensorboard_events, tensorboard_events(), True),
        "empty": (is_tensorboard_events, b"", True),
        "cut": (is_tensorboard_events, tensorboard_events()[:20], False),
        "csv": (is_tensorboard_events, b"step,loss\n1,2\n", False),
        "trace": (is_chrome_trace, chrome_trace(), True),
        "other json": (is_chrome_trace, b'{"traceEvents": []}', False),
        "bom trace": (is_chrome_trace, b"\xef\xbb\xbf" + chrome_trace(), True),
    }
    for name, (proof, data, expected) in cases.items():
        (tmp_path / name).write_bytes(data)
        assert proof(tmp_path / name) is expected, name


def test_a_trace_of_a_torch_without_kineto_is_the_runs(tmp_path: Path):
    """Where torch has no Kineto, `export_chrome_trace` writes the autograd profiler's events
    as a JSON array (EventList's exporter, the reference here): a run's trace all the same, so
    --force replaces the run folder; a JSON array of the user's is still refused."""
    from torch.autograd.profiler_util import EventList, FunctionEvent

    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    trace = run / "profile" / "epoch-1.json"
    add = FunctionEvent(id=0, name="aten::add", thread=1, start_us=0, end_us=5, trace_name="add")
    for events in ([add], []):  # a profile's events, or none
        EventList(events).export_chrome_trace(str(trace))
        assert foreign_entries(run, RUN_OUTPUTS, top_level=(MARKER,)) == [], trace.read_text()
    trace.write_bytes(b'[{"id": 1}, {"id": 2}]')
    assert foreign_entries(run, RUN_OUTPUTS, top_level=(MARKER,)) == ["profile/epoch-1.json"]
