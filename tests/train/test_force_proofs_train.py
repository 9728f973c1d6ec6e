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
from torchkit.core.io.output_paths import MARKER, WRITTEN_JOURNAL
from torchkit.core.io.output_proofs import is_chrome_trace, is_tensorboard_events
from torchkit.core.train.outputs import RUN_OUTPUTS

TRAIN = [
    *("train", "--model", "convnet", "--image-size", "8", "--batch-size", "4", "--workers", "0"),
    *("--data", "ds", "--val-split", "0.5", "--epochs", "1", "--out", "run"),
    *("--tensorboard", "--profile-steps", "1"),
]


def test_a_run_with_tensorboard_and_a_profile_is_replaced_by_force(tmp_path: Path):
    """Also where its event file was cut inside its first record (a full disk): --force
    refused the run's own folder ("holds run/tensorboard/events.out.tfevents... that torchkit
    did not write"), so that the run could not be made again."""
    write_image_folder(tmp_path / "ds", {"a": 4, "b": 4})
    for again in ([], ["--force"]):
        done = run_torchkit_in_process(*TRAIN, *again, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        (events,) = (tmp_path / "run" / "tensorboard").iterdir()
        if not again:
            events.write_bytes(events.read_bytes()[:30])  # past its length, in its Event
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
        "cut, not TFRecord's CRC": (is_tensorboard_events, tensorboard_events()[:20], False),
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


def test_an_event_file_cut_anywhere_in_its_first_record_is_the_runs(tmp_path: Path):
    """TensorBoard's own writer's first record (the reference), cut after each of its bytes
    (a full disk, a writer killed as it wrote it), is an event file; a file that only begins
    like one is not: another length, its CRC not the length's, another first field, a
    file_version that is not TensorBoard's."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(tmp_path / "log")
    writer.close()
    (written,) = (tmp_path / "log").iterdir()
    record = written.read_bytes()
    cut = tmp_path / "events.out.tfevents.1.h"
    for length in range(len(record) + 1):
        cut.write_bytes(record[:length])
        assert is_tensorboard_events(cut), length
    not_events = {
        "a text": b"a\n",
        "a CSV": b"step,loss\n1,2\n",
        "zeros": bytes(40),
        "a length of two bytes": b"\x00\x01" + record[2:30],
        "the CRC of another length": bytes([record[0] + 1]) + record[1:30],
        "a first field that is no wall_time": record[:12] + b"\x0a" + record[13:30],
        "another file_version": record[:23] + b"brain.Other" + record[34:40],
    }
    for name, data in not_events.items():
        cut.write_bytes(data)
        assert not is_tensorboard_events(cut), name
