"""WebDataset shards named by http(s) URL (issue #48): a real local http.server serves the shards
webdataset's ShardWriter writes; read through torchkit's cache they give what the local shards
give, a second run downloads nothing, and every network failure (404, a connection that ends
early, no answer, nobody listening) is one error line naming the URL, leaving no half shard."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from checkpoints import write_convnet_checkpoint
from disks import fill_disk
from image_folders import write_image_folder as write_images
from output_checks import error_line
from processes import dataset_stats, run_json, run_torchkit_in_process
from shards import failing_proxy, serving, shard_downloads, write_shards

CLASSES = "abc"
PATTERN = "shard-{000000..000003}.tar"


# dataset-stats without worker processes: each fork of the test process costs about a tenth of a
# second, and the shards are downloaded in this process anyway. The first test and the folder
# URL's read URL shards through the workers too (`dataset_stats`).
def stats(data: object, *extra: object) -> dict:
    return dataset_stats(data, "--workers", "0", *extra)


def stats_run(*args: object):
    """`dataset-stats ARGS` in this process, without worker processes."""
    return run_torchkit_in_process("dataset-stats", *args, "--workers", "0")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """served/shards (4 ShardWriter shards of 3 classes x 6 8x8 PNGs, classes.txt), served/
    converted (`convert shards` of the same images: 2 shards and manifest.json), a checkpoint."""
    root = tmp_path_factory.mktemp("http-shards")
    images = write_images(root / "images", dict.fromkeys(CLASSES, 6))
    shards = root / "served" / "shards"
    shards.mkdir(parents=True)
    write_shards(str(shards / "shard-%06d.tar"), images, maxcount=5)
    (shards / "classes.txt").write_text("a\nb\nc\n")
    converted = run_torchkit_in_process(
        "convert",
        "shards",
        images,
        root / "served" / "converted",
        "--per-shard",
        "10",
        "--workers",
        "0",
    )
    assert converted.returncode == 0, converted.stderr
    write_convnet_checkpoint(root / "model.pt", in_channels=3, image_size=8, classes=CLASSES)
    return root


@pytest.fixture
def server(world, tmp_path, monkeypatch):
    with serving(world / "served", tmp_path / "cache", monkeypatch) as httpd:
        yield httpd


def cached_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_dataset_stats_over_http_is_that_of_the_local_shards_in_torchkits_cache(
    world, server, tmp_path
):
    local = stats(world / "served" / "shards" / PATTERN)  # the reference, read in this process
    assert dataset_stats(f"{server.url}/shards/{PATTERN}") == local  # through the workers
    assert local["images"] == 18
    # TORCHKIT_CACHE/shards/<16 hex digits>/NAME.tar
    (folder,) = (tmp_path / "cache" / "shards").iterdir()
    assert len(folder.name) == 16
    assert sorted(p.name for p in folder.glob("*.tar")) == [f"shard-00000{i}.tar" for i in range(4)]
    assert (folder / "classes.txt").read_text() == "a\nb\nc\n"


def test_a_second_run_downloads_no_shard(server):
    url = f"{server.url}/shards/{PATTERN}"
    first = stats(url)
    assert len(shard_downloads(server.requests)) == 4
    server.requests.clear()
    assert stats(url) == first
    assert shard_downloads(server.requests) == []  # a HEAD each: sizes match the cache


def test_a_shard_replaced_on_the_server_by_one_of_its_size_is_downloaded_again(
    world, server, tmp_path
):
    """http.server sends no ETag: the cache checked the size alone, and a shard relabelled on
    the server (tar pads it to the same size) was read as the old one. Its Last-Modified says."""
    served = world / "served" / "replaced"
    served.mkdir(exist_ok=True)
    shard = served / "shard-000000.tar"
    old = (world / "served" / "shards" / "shard-000000.tar").read_bytes()
    shard.write_bytes(old)
    url = f"{server.url}/replaced/shard-000000.tar"
    assert [c["images"] for c in stats(url)["classes"]] == [5]
    relabelled = old.replace(b'"label": "a"', b'"label": "b"')
    assert len(relabelled) == len(old) and relabelled != old
    shard.write_bytes(relabelled)
    os.utime(shard, (time.time() + 10, time.time() + 10))  # a later second, without sleeping
    assert [(c["name"], c["images"]) for c in stats(url)["classes"]] == [("b", 5)]


def test_eval_over_http_scores_as_the_local_shards(world, server):
    def metrics(data: object, *workers: str) -> dict:
        found = run_json("eval", world / "model.pt", "--data", data, "--device", "cpu", *workers)
        return {
            k: v
            for k, v in found.items()
            if k not in ("data", "root", "seconds") and "per_s" not in k and "second" not in k
        }

    local = metrics(world / "served" / "shards" / PATTERN, "-j", "0")  # the reference, here
    assert metrics(f"{server.url}/shards/{PATTERN}") == local  # through the loader's worker
    assert local["num_images"] == 18


def test_extract_features_and_predict_over_http_give_the_local_shards_rows(world, server, tmp_path):
    url = f"{server.url}/shards/{PATTERN}"
    for data, out in ((world / "served" / "shards", "local"), (url, "http")):
        result = run_torchkit_in_process(
            "extract-features", world / "model.pt", data, "--out", tmp_path / out,
            "--device", "cpu", "--workers", "0",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    local = (tmp_path / "local" / "index.csv").read_text()
    assert (tmp_path / "http" / "index.csv").read_text() == local
    assert local.splitlines()[1].startswith("0,shard-000000.tar/a_a_0.png,")
    predicted = run_torchkit_in_process(
        "predict", world / "model.pt", url, "--format", "csv", "--device", "cpu", "--workers", "0"
    )
    assert predicted.returncode == 0, predicted.stderr
    assert predicted.stdout.splitlines()[1].startswith("shard-000000.tar/a_a_0.png,")
    assert len(predicted.stdout.splitlines()) == 1 + 18


def test_a_folder_url_reads_the_shards_its_manifest_lists_and_trusts_its_checksums(world, server):
    local = stats(world / "served" / "converted")  # the reference, read in this process
    assert dataset_stats(f"{server.url}/converted/") == local  # through the workers
    assert shard_downloads(server.requests) == [
        "/converted/shard-000000.tar",
        "/converted/shard-000001.tar",
    ]
    server.requests.clear()
    assert stats(f"{server.url}/converted") == local  # in this process: no pool to fork
    # manifest.json's sizes and sha256 say the cache is current: no HEAD, no download
    assert not [path for _, path in server.requests if path.endswith(".tar")]


def test_another_tools_manifest_json_beside_url_shards_is_not_theirs(world, server):
    foreign = world / "served" / "foreign"
    if not foreign.exists():
        shutil.copytree(world / "served" / "shards", foreign)
        (foreign / "manifest.json").write_text('{"name": "a web app", "icons": []}')
    assert stats(f"{server.url}/foreign/{PATTERN}") == stats(world / "served" / "shards")


def test_eval_without_data_reads_the_url_shards_a_run_trained_on(server, tmp_path):
    trained = run_torchkit_in_process(
        "train", "--data", f"{server.url}/shards/{PATTERN}", "--model", "convnet",
        "--image-size", "8", "--epochs", "1", "--batch-size", "4", "--workers", "0",
        "--device", "cpu", "--out", tmp_path / "run", "--quiet",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    split_rows = (tmp_path / "run" / "split.csv").read_text().splitlines()
    assert len(split_rows) == 1 + 18 and split_rows[1].startswith("shard-0000")
    scored = run_torchkit_in_process(
        "eval", tmp_path / "run" / "best.pt", "--device", "cpu", "--format", "json",
        "--workers", "0",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    report = json.loads(scored.stdout)
    assert report["data"] == f"{server.url}/shards/{PATTERN}"
    assert 0 < report["num_images"] < 18  # the val split the run held out


def assert_no_half_shard(tmp_path: Path, name: str) -> None:
    left = cached_files(tmp_path)
    assert name not in left, left
    assert not [n for n in left if n.endswith(".tmp")], left


def test_a_missing_shard_is_one_error_naming_its_url(server, tmp_path):
    result = stats_run(f"{server.url}/shards/shard-{{000000..000004}}.tar")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"{server.url}/shards/shard-000004.tar" in line and "HTTP 404" in line, line
    assert_no_half_shard(tmp_path, "shard-000004.tar")


def test_a_url_list_naming_one_shard_twice_is_one_error_line(server):
    """The URLs of one shard twice (a pattern or a `::` list) read its samples twice from the
    one cached copy: dataset-stats counted 10 images of 5, and train trained on each twice."""
    spec = f"{server.url}/shards/shard-{{000000,000001}}.tar::{server.url}/shards/shard-000000.tar"
    result = stats_run(spec)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"{spec} names shard-000000.tar twice" in line, line
    assert shard_downloads(server.requests) == [
        "/shards/shard-000000.tar",
        "/shards/shard-000001.tar",
    ]


@pytest.mark.parametrize("code", [403, 500])
def test_a_refusal_or_a_server_error_is_one_error_line(server, tmp_path, code):
    url = f"{server.url}/status/{code}/shard-000000.tar"
    result = stats_run(url)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert url in line and f"HTTP {code}" in line, line
    assert_no_half_shard(tmp_path, "shard-000000.tar")


def test_a_url_presigned_for_get_alone_reads_again_from_the_cache(server):
    """S3 refuses the HEAD of a URL presigned for GET (403): the cached shard's check failed
    the second run with "HTTP 403"; it is downloaded again instead."""
    url = f"{server.url}/gets-only/shards/shard-000000.tar?X-Amz-Signature=abc"
    first = stats(url)
    assert stats(url) == first


def test_a_head_answered_503_downloads_the_shard_again(server):
    """A 503 said no server answered for the side files, but one answering a cached shard's
    HEAD with it (S3 slowing requests down) does not make the run fail: the GET decides."""
    url = f"{server.url}/busy-head/shards/shard-000000.tar"
    first = stats(url)
    server.requests.clear()
    assert stats(url) == first
    assert shard_downloads(server.requests) == ["/busy-head/shards/shard-000000.tar"]


def test_a_list_of_presigned_urls_longer_than_a_path_may_be_reads_the_shards(world, server):
    """Each presigned URL carries its own signature (no pattern can name them), and a few
    joined by :: pass the 4,096 bytes of a path: the check of the outputs against the data
    took the list for a file name and stopped with "OSError: File name too long"."""
    query = "X-Amz-Security-Token=" + "T" * 1200 + "&X-Amz-Signature=abc"
    spec = "::".join(f"{server.url}/shards/shard-00000{i}.tar?{query}" for i in range(4))
    assert len(spec) > 4096
    assert stats(spec) == stats(world / "served" / "shards" / PATTERN)


def test_the_cache_check_of_a_redirected_url_downloads_no_shard(server):
    """urllib follows a redirected HEAD with a GET: each run's check of a cached shard began
    its whole download where the server redirects (Hugging Face's `resolve/` URLs do)."""
    url = f"{server.url}/moved/shards/{PATTERN}"
    first = stats(url)
    assert len(shard_downloads(server.requests)) == 8  # the redirect, then the shard
    server.requests.clear()
    assert stats(url) == first
    assert shard_downloads(server.requests) == []
    assert len([path for method, path in server.requests if method == "HEAD"]) == 8


def test_a_url_with_a_space_or_a_non_ascii_letter_reads_as_a_browser_sends_it(
    world, server, tmp_path
):
    """http.client refused both (its error showing the query, a token there); they are sent
    percent-encoded, and the shard keeps its name in the cache."""
    folder = world / "served" / "odd names"
    folder.mkdir(exist_ok=True)
    shutil.copy(world / "served" / "shards" / "shard-000000.tar", folder / "é 1.tar")
    assert stats(f"{server.url}/odd names/é 1.tar?token=x y") == stats(folder / "é 1.tar")
    assert [n for n in cached_files(tmp_path) if n.endswith(".tar")] == ["é 1.tar"]


def test_shards_a_server_sends_gzip_encoded_read_as_the_shards(world, server, tmp_path):
    """A server that gzips a body although asked for none (an S3 object stored gzipped, with
    that Content-Encoding): the encoded bytes were kept as the shard ("a compressed tar", or for
    a folder URL "manifest.json is not JSON"); they are decoded, as curl --compressed does."""
    cut = f"{server.url}/gzip-cut/shards/shard-000000.tar"  # only the encoding says so
    result = stats_run(cut)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert cut in line and "ended early" in line, line
    assert_no_half_shard(tmp_path, "shard-000000.tar")
    assert stats(f"{server.url}/gzip/shards/{PATTERN}") == stats(
        world / "served" / "shards" / PATTERN
    )
    assert stats(f"{server.url}/gzip/converted") == stats(world / "served" / "converted")
    server.requests.clear()
    stats(f"{server.url}/gzip/shards/{PATTERN}")
    assert shard_downloads(server.requests) == []  # a HEAD each: its ETag is the cached one's


def test_a_url_with_credentials_sends_them_as_basic_authorization(world, server):
    """`https://USER:PASSWORD@host/...` (as curl reads it) failed as "the host 127.0.0.1:PORT
    cannot be found": http.client took the credentials for part of the host."""
    host = server.url.removeprefix("http://")
    local = stats(world / "served" / "shards" / PATTERN)
    assert stats(f"http://me:p%20w@{host}/auth/shards/{PATTERN}") == local
    result = stats_run(f"http://me:wrong@{host}/auth/shards/{PATTERN}")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "HTTP 401" in line and "wrong" not in line, line


def test_a_urls_password_and_token_are_in_no_file_or_line_and_a_replay_asks_for_them(
    world, server, tmp_path
):
    """config.json, best.pt and last.pt, train's -o JSON, eval's JSON (metrics.json) and
    extract-features' meta.json recorded `--data` as typed, password and presigned token in
    clear (and eval's notes showed them); they record it with both `***`, and a replay of the
    recorded URL (eval without --data, train --resume) is one line asking for the URL again,
    never a login with `***`. A raw space in a secret is the secret's: it was `*** q7x`."""
    host = server.url.removeprefix("http://")
    data = f"http://me:p%20w@{host}/auth/shards/{PATTERN}?X-Amz-Signature=s3cret q7x&v=1"
    shown = f"http://me:***@{host}/auth/shards/{PATTERN}?X-Amz-Signature=***&v=1"
    run = tmp_path / "run"
    trained = run_torchkit_in_process(
        "train", "--data", data, "--model", "convnet", "--image-size", "8", "--epochs", "1",
        "--batch-size", "4", "--workers", "0", "--device", "cpu", "--out", run,
        "-o", tmp_path / "train.json", "--format", "json",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert json.loads((run / "config.json").read_text())["options"]["data"] == shown
    scored = run_torchkit_in_process(
        "eval", run / "best.pt", "--data", data, "--device", "cpu", "--workers", "0",
        "--format", "json",
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr
    assert json.loads(scored.stdout)["data"] == shown  # metrics.json's dict
    features = run_torchkit_in_process(
        "extract-features",
        run / "best.pt",
        data,
        "--device",
        "cpu",
        "--workers",
        "0",
        "--out",
        tmp_path / "f",
    )
    assert features.returncode == 0, features.stderr
    said = trained.stderr + scored.stdout + scored.stderr + features.stderr
    for file in [p for p in tmp_path.rglob("*") if p.is_file() and "cache" not in p.parts]:
        said += file.read_bytes().decode("latin-1")
    assert "p%20w" not in said and "p w" not in said and "s3cret" not in said and "q7x" not in said
    for replay in (("eval", run / "best.pt", "--device", "cpu"), ("train", "--resume", run)):
        result = run_torchkit_in_process(*replay)
        assert result.returncode == 2, result.stderr
        line = error_line(result.stderr)
        assert f"{shown} is a recorded URL whose password or token was not saved" in line


def test_dataset_stats_names_url_data_as_given_not_by_its_cache_folder(server):
    """dataset-stats' `source` (JSON, and the table's title) was the cache folder the shards
    were read from (TORCHKIT_CACHE/shards/<hash>), a path the user never gave; it is the URL
    as given, its secrets `***`, as eval's `data` records it."""
    host = server.url.removeprefix("http://")
    data = f"http://me:p%20w@{host}/auth/shards/{PATTERN}?X-Amz-Signature=s3cret&v=1"
    shown = f"http://me:***@{host}/auth/shards/{PATTERN}?X-Amz-Signature=***&v=1"
    assert run_json("dataset-stats", data, "--workers", "0")["source"] == shown
    table = stats_run(data)
    assert table.returncode == 0, table.stderr
    assert "s3cret" not in table.stdout and "cache" not in table.stdout


def test_eval_of_url_shards_none_readable_names_the_url_not_the_cache_folder(world, server):
    """eval's 'none of the N images in ... could be read' named the cache folder the shards were
    read from; it names the data as given, as dataset-stats, predict and extract-features do."""
    broken = world / "broken-images"
    for name in CLASSES:
        (broken / name).mkdir(parents=True, exist_ok=True)
        (broken / name / f"{name}_0.png").write_bytes(b"not a png")
    served = world / "served" / "unreadable"
    served.mkdir(exist_ok=True)
    write_shards(str(served / "shard-%06d.tar"), broken, maxcount=5)
    url = f"{server.url}/unreadable/shard-000000.tar?token=s3cret"
    result = run_torchkit_in_process(
        "eval", world / "model.pt", "--data", url, "--device", "cpu", "--workers", "0"
    )
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"none of the 3 images in {server.url}/unreadable/shard-000000.tar?token=***" in line
    assert "s3cret" not in result.stderr


def test_the_cache_folder_of_a_url_is_named_without_its_credentials():
    """The folder's name was a hash of the URL with `USER:PASSWORD@`: a password's hash on
    disk, and another folder (the shards downloaded again) for each password."""
    from torchkit.core.data.sources.http_shards import shard_cache_folder

    plain = shard_cache_folder("https://host/data/")
    assert shard_cache_folder("https://me:secret@host/data") == plain
    assert shard_cache_folder("https://token@host/data") == plain
    assert shard_cache_folder("https://host/other") != plain


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (f"shards/{PATTERN}", ""),
        ("converted", ", or TORCHKIT_CACHE_LIMIT below the room it has"),
    ],
    ids=["downloaded-first", "streamed"],
)
@pytest.mark.parametrize("filled", ["before", "meanwhile"])
def test_a_full_cache_disk_is_one_error_pointing_to_the_caches_settings(
    server, small_tmpfs, monkeypatch, data, hint, filled
):
    """A download into a cache without room said "choose another output": no option of the
    command chooses where the cache is, its settings do. A shard larger than the room is
    refused before its download; one that had room when it began (another program filled the
    disk meanwhile) is the disk's write error."""
    from torchkit.core.data.sources import http_shards

    cache = fill_disk(small_tmpfs(64), leave=12 * 1024)  # the side files fit, no shard
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    if filled == "meanwhile":
        monkeypatch.setattr(http_shards, "_free_bytes", lambda *args: None)
    result = stats_run(f"{server.url}/{data}")
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert "choose another output" not in line, line
    # Whichever shard's download fails first (they are fetched ahead in threads), and either
    # its file or its claim's file on the full disk (`URL into FOLDER`).
    if filled == "meanwhile":
        wanted = (
            r"shard-\d{6}\.tar( into \S+)?: No space left on device \(free some space, or set "
            rf"TORCHKIT_CACHE to a folder with more room{re.escape(hint)}\)$"
        )
        assert re.search(wanted, line), line
    else:
        wanted = (
            r"\.tar: (its Content-Length is|manifest\.json gives it) \d+ bytes, more than the "
            r"cache's disk has room for \(\d+ bytes, keeping \d+ bytes free\) \(free some "
            rf"space, or set TORCHKIT_CACHE to a folder with more room{re.escape(hint)}; "
            r"nothing of it was downloaded\)"
        )
        assert re.search(rf"shard-\d{{6}}{wanted}$", line), line
    left = [p.name for p in cache.rglob("*.tar*")]
    assert not [name for name in left if not name.endswith(".lock")], left


def test_a_dataset_whole_in_a_full_cache_reads(server, small_tmpfs, monkeypatch):
    """Every run wrote the server's side files into the cache again, also unchanged: with the
    cache's disk full, a dataset it held whole was "cannot write .../manifest.json: No space
    left on device"."""
    cache = small_tmpfs(512)
    monkeypatch.setenv("TORCHKIT_CACHE", str(cache))
    url = f"{server.url}/converted"
    first = stats(url)
    fill_disk(cache)
    assert stats(url) == first


def test_a_redirect_loop_is_one_error_line(server, tmp_path):
    result = stats_run(f"{server.url}/loop/shard-000000.tar")
    assert result.returncode == 1
    line = error_line(result.stderr, besides="nothing")  # urllib's reason had three lines
    assert f"{server.url}/loop/" in line and "HTTP 302" in line and "redirects" in line, line
    assert line.endswith(
        "(the server's redirects lead nowhere, in a loop or too many: check the URL)"
    )


def test_an_html_page_served_as_a_side_file_is_no_class_names(world, server):
    """A web app answers a missing classes.txt with a 200 OK HTML page: its lines named the
    classes of shards labelled by `.cls` index alone."""
    import webdataset as wds

    folder = world / "served" / "indexed"
    folder.mkdir(exist_ok=True)
    png = next((world / "images" / "a").iterdir()).read_bytes()
    with wds.TarWriter(str(folder / "shard-000000.tar")) as sink:
        for index in range(6):
            sink.write({"__key__": f"k{index}", "png": png, "cls": index % 3})
    local = stats(folder / "shard-000000.tar")
    assert stats(f"{server.url}/spa/indexed/shard-000000.tar") == local


def test_processes_sharing_the_cache_download_each_shard_once(server):
    from torchkit.core.data.sources.http_shards import fetch_shards

    urls = [f"{server.url}/shards/shard-00000{i}.tar" for i in range(4)]
    found = []
    readers = [threading.Thread(target=lambda: found.append(fetch_shards(urls))) for _ in "ab"]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert len(found) == 2 and found[0] == found[1]
    assert shard_downloads(server.requests) == [f"/shards/shard-00000{i}.tar" for i in range(4)]


def test_a_connection_that_ends_early_leaves_no_shard(server, tmp_path):
    result = stats_run(f"{server.url}/broken/shard-000000.tar")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"{server.url}/broken/shard-000000.tar" in line and "ended early" in line, line
    assert_no_half_shard(tmp_path, "shard-000000.tar")


@pytest.mark.parametrize("lie", ["half", "at a member's end", "no length"])
def test_a_download_cut_short_with_no_http_error_is_refused_and_never_cached(
    world, server, tmp_path, lie
):
    """A Content-Length smaller than the shard (or none, and a connection closed early) ends
    the body early as far as HTTP knows: what arrived was cached and read as "sample ... has no
    image", or as a shard of fewer samples, in every later run too."""
    import tarfile

    shard = world / "served" / "shards" / "shard-000000.tar"
    with tarfile.open(shard) as tar:
        boundary = tar.getmembers()[3].offset  # the header of the 4th member
    size = shard.stat().st_size // 2
    path = {
        "half": f"lying/{size}",
        "at a member's end": f"lying/{boundary}",
        "no length": f"unsized/{size}",
    }[lie]
    url = f"{server.url}/{path}/shards/shard-000000.tar"
    for _ in range(2):  # a second run is refused too: nothing was cached
        result = stats_run(url)
        assert result.returncode == 1, result.stdout
        line = error_line(result.stderr)
        assert f"cannot download {url}: what arrived is truncated" in line, line
        assert "without the end-of-archive marker" in line, line
        assert_no_half_shard(tmp_path, "shard-000000.tar")


def test_a_server_that_never_answers_is_an_error_after_the_timeout(tmp_path, monkeypatch):
    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "TIMEOUT_S", 0.3)
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as silent:  # the kernel accepts the connection; nobody answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/shard-000000.tar"
        started = time.monotonic()
        result = stats_run(url)
        elapsed = time.monotonic() - started
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "127.0.0.1" in line and "no answer within 0.3 s" in line, line
    assert elapsed < 2


def port_nobody_listens_on() -> int:
    """A local port that was bound and closed again: connecting to it is refused."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return closed.getsockname()[1]


def test_nobody_listening_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    port = port_nobody_listens_on()
    result = stats_run(f"http://127.0.0.1:{port}/s-000000.tar")
    assert result.returncode == 1
    assert "refused the connection" in error_line(result.stderr)


def test_a_proxy_nobody_listens_on_is_named_not_the_server(tmp_path, monkeypatch):
    """Through http_proxy, a refused connection is the proxy's: the error said the server
    refused it ("example.invalid refused the connection"), sending the user to the wrong host."""
    from torchkit.core.data.sources import http_shards

    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    port = port_nobody_listens_on()
    monkeypatch.setenv("http_proxy", f"http://me:secret@127.0.0.1:{port}")
    monkeypatch.setattr(http_shards, "_OPENER", None)  # built again with the proxy
    result = stats_run("http://example.invalid/s-000000.tar")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"the proxy 127.0.0.1:{port} refused the connection" in line, line
    assert "http_proxy" in line and "secret" not in line, line


def test_an_ipv6_host_is_no_list_of_urls(tmp_path, monkeypatch):
    """The `::` of `http://[::1]:PORT/...` was read as a `::` list's: "joins URLs and a path on
    disk (1]:PORT/...)"."""
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    try:
        with socket.socket(socket.AF_INET6) as closed:
            closed.bind(("::1", 0))
            port = closed.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback")
    result = stats_run(f"http://[::1]:{port}/s-000000.tar")
    assert result.returncode == 1
    assert f"[::1]:{port} refused the connection" in error_line(result.stderr)


@pytest.mark.parametrize(
    ("folder", "manifest", "message"),
    [
        ("nul-url", None, "names no shard file"),
        ("nul-name", json.dumps({"shards": [{"name": "a\0.tar"}]}), "that is not a file name"),
        ("deep", "[" * 100_000, "manifest.json is not JSON"),
    ],
    ids=["nul-in-url", "nul-in-manifest", "deep-manifest"],
)
def test_a_hostile_shard_name_or_manifest_is_one_error_line(
    world, server, folder, manifest, message
):
    # A NUL in a name was "Error: ValueError: embedded null byte", a manifest nested deeper
    # than Python's stack "Error: RecursionError".
    served = world / "served" / folder
    served.mkdir(exist_ok=True)
    if manifest is not None:
        (served / "manifest.json").write_text(manifest)
    url = f"{server.url}/{folder}/" + ("a%00b.tar" if manifest is None else "")
    result = stats_run(url)
    assert result.returncode == 1, result.stderr
    assert message in error_line(result.stderr)


@pytest.mark.parametrize("seconds", ["inf", "1e300", "0", "nan", "soon", "1_0", "３"])
def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(server, seconds, monkeypatch):
    # inf and 1e300 overflowed the socket module: "Error: OverflowError", exit 1.
    monkeypatch.setenv("TORCHKIT_HTTP_TIMEOUT", seconds)
    result = stats_run(f"{server.url}/shards/{PATTERN}")
    assert result.returncode == 2, result.stderr
    assert f"TORCHKIT_HTTP_TIMEOUT={seconds} is not a number of seconds" in error_line(
        result.stderr
    )


def test_the_cache_folder_follows_torchkit_cache_then_xdg(monkeypatch, tmp_path):
    from torchkit.core.data.sources.http_shards import cache_folder

    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "mine"))
    assert cache_folder() == tmp_path / "mine"
    monkeypatch.delenv("TORCHKIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "torchkit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_folder() == Path.home() / ".cache" / "torchkit"


def test_a_double_colon_in_a_token_or_password_is_the_urls_not_a_list_join(world, server):
    """`URL?token=a::b` and `http://me:pa::ss@HOST/...` were split as `::` lists: "joins URLs
    and a path on disk (b)", the error showing the rest of the token or password. A `::` in a
    URL's query or credentials is the URL's; one before another URL still joins two."""
    first, second = (f"{server.url}/shards/shard-00000{n}.tar" for n in (0, 1))
    assert stats(f"{first}?token=a::b") == stats(world / "served" / "shards" / "shard-000000.tar")
    assert ("GET", "/shards/shard-000000.tar?token=a::b") in server.requests
    both = stats(f"{first}?sig=x::y::{second}?sig=z")
    assert both == stats(world / "served" / "shards" / "shard-{000000..000001}.tar")
    host = server.url.removeprefix("http://")
    result = stats_run(f"http://me:pa::ss@{host}/auth/shards/x.tar")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "HTTP 401" in line and "me:***@" in line and "ss@" not in line, line


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{url}/converted::{url}/shards/", "{url}/converted names no .tar shard: a :: list"),
        ("{url}/images.csv", "{url}/images.csv names no .tar shard, and no manifest.json"),
    ],
    ids=["two-folder-urls", "csv-url"],
)
def test_a_url_that_names_no_shard_is_one_error_line_showing_it_whole(server, spec, message):
    # Both were "dataset not found: http:/127.0.0.1:PORT/..." (the URL made a Path: one slash lost).
    result = stats_run(spec.format(url=server.url))
    assert result.returncode == 1, result.stderr
    assert message.format(url=server.url) in error_line(result.stderr)


def test_a_folder_url_with_a_dot_in_its_name_reads_as_the_folder(world, server):
    # `.../converted.v2` was "dataset not found: http:/..." (a dot made it no folder).
    dotted = world / "served" / "converted.v2"
    if not dotted.exists():
        shutil.copytree(world / "served" / "converted", dotted)
    found = stats(f"{server.url}/converted.v2")
    assert found["images"] == stats(world / "served" / "converted")["images"] == 18


@pytest.mark.parametrize("data", [f"shards/{PATTERN}", "converted"], ids=["checked", "manifest"])
def test_a_cached_dataset_reads_unchecked_with_a_warning_while_its_server_cannot_be_reached(
    world, tmp_path, monkeypatch, data
):
    """Every run asks the server for manifest.json (and checks each shard by HEAD): with the
    server down, a dataset whole in the cache was "cannot download .../manifest.json", so a node
    without network could not read data it holds. A server that answers is still obeyed."""
    served = tmp_path / "served"
    shutil.copytree(world / "served" / "shards", served / "shards")
    shutil.copytree(world / "served" / "converted", served / "converted")
    with serving(served, tmp_path / "cache", monkeypatch) as httpd:
        url, port = f"{httpd.url}/{data}", httpd.server_address[1]
        first = stats(url)
    result = stats_run(url, "--format", "json")  # server down
    assert result.returncode == 0, result.stderr
    assert {k: v for k, v in json.loads(result.stdout).items() if k != "source"} == first
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert f"cannot reach {httpd.url}/{data.split('/')[0]}/manifest.json" in warning, warning
    assert "refused the connection; using the shards cached in" in warning, warning
    assert "unchecked" in warning, warning
    shutil.rmtree(served)  # the server answers again, 404: its data is gone
    with serving(tmp_path / "empty", tmp_path / "cache", monkeypatch, port=port) as httpd:
        gone = stats_run(url)
    assert gone.returncode == 1, gone.stderr
    line = error_line(gone.stderr)
    assert "HTTP 404" in line or "no manifest.json lies there" in line, line
    assert "Warning:" not in gone.stderr


def test_an_uncached_dataset_of_a_server_that_cannot_be_reached_is_its_network_error(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    port = port_nobody_listens_on()
    result = stats_run(f"http://127.0.0.1:{port}/converted/")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"cannot download http://127.0.0.1:{port}/converted/manifest.json" in line, line
    assert "refused the connection" in line and "Warning:" not in result.stderr


def test_a_folder_url_whose_cache_lacks_manifest_json_is_the_network_error_without_a_warning(
    world, tmp_path, monkeypatch
):
    """A folder URL reads the shards its manifest.json lists: with that file gone from the
    cache, the server down was 'Warning: ... using the shards cached ... unchecked' and then
    the error that the manifest cannot be downloaded; now the error alone."""
    served = tmp_path / "served"
    shutil.copytree(world / "served" / "converted", served / "converted")
    with serving(served, tmp_path / "cache", monkeypatch) as httpd:
        url = f"{httpd.url}/converted"
        stats(url)
    (manifest,) = (tmp_path / "cache").rglob("manifest.json")
    manifest.unlink()  # the shards stay
    result = stats_run(url)  # server down
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert f"cannot download {url}/manifest.json" in line and "refused the connection" in line
    assert "Warning:" not in result.stderr, result.stderr


def test_a_proxys_gateway_status_reads_the_cache_unchecked_naming_it(world, tmp_path, monkeypatch):
    """Behind a proxy, a server that cannot be reached answers through it: 502 Bad Gateway, 504
    Gateway Timeout, or 503 (squid's for a host it cannot connect to or resolve, a load
    balancer's with no server behind it). Read as the server's answer, they made a cached
    dataset an error; now they read as no answer, naming the status, and so does a proxy's 407
    (it wants a login: its hint was that of any status). A 500 is the server's own failure: an
    error, as ever."""
    served = tmp_path / "served"
    shutil.copytree(world / "served" / "converted", served / "converted")
    with serving(served, tmp_path / "cache", monkeypatch) as httpd:
        url = f"{httpd.url}/converted"
        first = stats(url)
    for status in (502, 503, 504, 500, 407):
        with failing_proxy(status, monkeypatch) as proxy:
            cached = stats_run(url, "--format", "json")
            uncached = stats_run(f"{httpd.url}/other/")
        assert proxy.requests[0] == ("GET", f"{url}/manifest.json")
        assert uncached.returncode == 1, uncached.stdout
        line = error_line(uncached.stderr)
        assert f"cannot download {httpd.url}/other/manifest.json: HTTP {status} " in line, line
        assert "Warning:" not in uncached.stderr, uncached.stderr
        if status == 407:  # the proxy wants a login, which its URL gives
            assert "put USER:PASSWORD@ before its host in http_proxy" in line, line
        if status == 500:
            assert cached.returncode == 1, cached.stdout
            assert f"{url}/manifest.json: HTTP {status} " in error_line(cached.stderr)
            continue
        assert cached.returncode == 0, cached.stderr
        assert {k: v for k, v in json.loads(cached.stdout).items() if k != "source"} == first
        (warning,) = [line for line in cached.stderr.splitlines() if line.startswith("Warning:")]
        assert f"cannot reach {url}/manifest.json: HTTP {status} " in warning, warning
        assert "unchecked" in warning, warning


def test_an_https_proxys_status_reads_as_an_http_proxys(tmp_path, monkeypatch):
    """An https URL goes through the proxy's tunnel (CONNECT), whose refusal urllib raises as
    "Tunnel connection failed: 407 ...": an unreachable server still (a cache is used
    unchecked), but the hint was to check the URL and the network; now the status is said as
    an http URL's is, with its hint."""
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    url = "https://example.invalid/data/shard-000000.tar"
    for status, words in (
        (407, "put USER:PASSWORD@ before its host in https_proxy"),
        (502, "no server answered"),
        (403, "the proxy refuses to connect to the server"),
    ):
        with failing_proxy(status, monkeypatch) as proxy:
            result = stats_run(url)
        assert proxy.requests[0] == ("CONNECT", "example.invalid:443")
        assert result.returncode == 1
        line = error_line(result.stderr)
        assert "manifest.json: HTTP " + str(status) in line and words in line, line


def test_a_folder_urls_manifest_is_parsed_once_a_run(world, tmp_path, monkeypatch):
    """A streamed folder's manifest.json lists every sample (millions of them in a large
    dataset): it was parsed three times a run, where the side files were fetched, where its
    shards were listed and where their samples were; with the server down, as many times."""
    served = tmp_path / "served"
    shutil.copytree(world / "served" / "converted", served / "converted")
    manifest = (served / "converted" / "manifest.json").read_bytes()
    parsed = []
    real_loads = json.loads

    def loads(data, *args, **kwargs):
        if data in (manifest, manifest.decode()):
            parsed.append(1)
        return real_loads(data, *args, **kwargs)

    with serving(served, tmp_path / "cache", monkeypatch) as httpd:
        url = f"{httpd.url}/converted"
        monkeypatch.setattr(json, "loads", loads)
        first = stats(url)
        assert len(parsed) == 1
    parsed.clear()
    result = stats_run(url, "--format", "json")  # server down
    assert result.returncode == 0, result.stderr
    assert "unchecked" in result.stderr, result.stderr
    assert len(parsed) == 1
    assert {k: v for k, v in real_loads(result.stdout).items() if k != "source"} == first


def test_downloading_shards_lists_the_cache_folder_once_not_once_a_shard(server, monkeypatch):
    """Each download listed the whole cache folder for a killed download's temporary file: the
    first read of 4,000 shards took 58 s where 1,000 took 4 s. atomic_write already removes a
    dead writer's temporaries, from one listing of the folder."""
    from torchkit.core.data.sources import http_shards

    folder = str(http_shards.shard_cache_folder(f"{server.url}/shards"))
    listed = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def scandir(path="."):
        listed.append(os.fspath(path))
        return real_scandir(path)

    def listdir(path="."):
        listed.append(os.fspath(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    paths = http_shards.fetch_shards([f"{server.url}/shards/shard-00000{i}.tar" for i in range(4)])
    assert all(Path(path).is_file() for path in paths)
    assert listed.count(folder) <= 1, listed


def test_a_cache_on_a_read_only_disk_reads_while_its_server_cannot_be_reached(
    world, tmp_path, monkeypatch, bind_view
):
    """A node without network reading a cache shared read-only: each cached shard's check made
    its lock file, 'Error: OSError: [Errno 30] Read-only file system: .../.shard-000000.tar.lock'.
    A cached shard needs no lock where there is nothing to download; a shard the cache lacks is
    one error naming it and the read-only cache."""
    import subprocess

    served = tmp_path / "served"
    shutil.copytree(world / "served" / "shards", served / "shards")
    with serving(served, tmp_path / "cache", monkeypatch) as httpd:
        url = f"{httpd.url}/shards/{PATTERN}"
        first = stats(url)
    view = bind_view(tmp_path / "cache")
    if subprocess.run(["mount", "-o", "remount,ro,bind", view], capture_output=True).returncode:
        pytest.skip("cannot mount read-only here")
    monkeypatch.setenv("TORCHKIT_CACHE", str(view))
    result = stats_run(url, "--format", "json")  # server down
    assert result.returncode == 0, result.stderr
    assert {k: v for k, v in json.loads(result.stdout).items() if k != "source"} == first
    assert "unchecked" in result.stderr, result.stderr
    more = stats_run(url.replace("003}", "004}"))
    assert more.returncode == 1
    line = error_line(more.stderr)
    assert f"cannot download {url[: url.index('{')]}000004.tar into {view}/shards/" in line, line
    assert "Read-only file system" in line and "TORCHKIT_CACHE" in line, line


def test_a_wait_for_another_processs_download_of_a_shard_says_so(server, monkeypatch):
    """A process stopped with Ctrl-Z while it downloads a shard holds the shard's lock: the
    other runs waited for ever without a word. After LOCK_WAIT_WARNING_S one warning names the
    shard (and the wait goes on: here the lock is let go once the warning is seen)."""
    import fcntl
    import logging

    from torchkit.core.data.sources import http_shards

    monkeypatch.setattr(http_shards, "LOCK_WAIT_WARNING_S", 0.0)
    url = f"{server.url}/shards/shard-000000.tar"
    folder = http_shards.shard_cache_folder(f"{server.url}/shards")
    folder.mkdir(parents=True)
    held = os.open(folder / ".shard-000000.tar.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    seen = []

    class LetGo(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())
            if len(seen) == 1:
                os.close(held)  # the other process ends: its lock goes with it

    handler = LetGo(logging.WARNING)
    logging.getLogger("torchkit").addHandler(handler)
    try:
        (path,) = http_shards.fetch_shards([url])
    finally:
        logging.getLogger("torchkit").removeHandler(handler)
    assert Path(path).is_file()
    (message,) = seen
    assert message.startswith(f"waiting for another torchkit process downloading {url} "), message
    assert "Ctrl-Z" in message, message


@pytest.mark.parametrize(
    "data", ["shards/shard-{000000..000002}.tar", "converted"], ids=["checked", "manifest"]
)
def test_a_read_only_cache_reads_what_it_holds_current_while_its_server_answers(
    server, tmp_path, monkeypatch, bind_view, data
):
    """A cache shared read-only was read with its server down, but with the server up each
    cached shard's check took its lock file: 'cannot write .../.shard-000000.tar.lock:
    Read-only file system'. One rule: a shard the cache holds current needs no lock, the server
    reachable or not; one it lacks is one error naming it and the read-only cache."""
    import subprocess

    url = f"{server.url}/{data}"
    first = stats(url)
    view = bind_view(tmp_path / "cache")
    if subprocess.run(["mount", "-o", "remount,ro,bind", view], capture_output=True).returncode:
        pytest.skip("cannot mount read-only here")
    monkeypatch.setenv("TORCHKIT_CACHE", str(view))
    server.requests.clear()
    result = stats_run(url, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert {k: v for k, v in json.loads(result.stdout).items() if k != "source"} == first
    assert "Warning:" not in result.stderr, result.stderr
    assert server.requests and shard_downloads(server.requests) == []  # asked, not fetched
    if data == "converted":  # a shard gone from the cache: the stream fetches it when read
        next((tmp_path / "cache").rglob("shard-000001.tar")).unlink()
    else:  # one more shard than the cache holds
        url = f"{server.url}/shards/{PATTERN}"
    missing = stats_run(url)
    assert missing.returncode == 1, missing.stderr
    line = error_line(missing.stderr)
    assert f"{server.url}/{data.split('/')[0]}/shard-00000" in line, line
    assert "Read-only file system" in line and str(view) in line, line
    assert "TORCHKIT_CACHE" in line and ".lock" not in line, line


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({}, "the server, or the proxy {proxy} that http_proxy names, refuses it"),
        ({"Via": "1.1 squid"}, "the server, or the proxy {proxy} that http_proxy names"),
        ({"Proxy-Status": "gw; error=http_request_denied"}, "the proxy {proxy} refuses to ask"),
        ({"X-Squid-Error": "ERR_ACCESS_DENIED 0"}, "the proxy {proxy} refuses to ask the server"),
        ({"Proxy-Status": "gw; received-status=403"}, "(the server refuses it: check the URL"),
    ],
    ids=["no-sign", "via", "proxy-status-error", "squid-error", "proxy-status-received"],
)
def test_a_403_through_a_proxy_is_the_proxys_only_where_it_says_so(
    tmp_path, monkeypatch, headers, said
):
    """Through http_proxy a 403 said "the server refuses it", also the proxy's own refusal (a
    rule of the proxy's: another host to fix). It is the proxy's where the answer says so
    (RFC 9209's Proxy-Status error, squid's X-Squid-Error: no server answered, as a refused
    CONNECT), the server's where the proxy says it passed the server's on, and where nothing
    tells (a Via is added to the server's answers too) both are named."""
    monkeypatch.setenv("TORCHKIT_CACHE", str(tmp_path / "cache"))
    url = "http://example.invalid/data/shard-000000.tar"
    with failing_proxy(403, monkeypatch, headers) as proxy:
        result = stats_run(url)
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "HTTP 403" in line and said.format(proxy=proxy.url.removeprefix("http://")) in line, line


def test_a_403_without_a_proxy_is_the_servers(server):
    result = stats_run(f"{server.url}/status/403/shard-000000.tar")
    assert result.returncode == 1
    line = error_line(result.stderr)
    assert "HTTP 403" in line and "(the server refuses it: check the URL" in line, line
