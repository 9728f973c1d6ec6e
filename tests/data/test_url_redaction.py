"""The one form a URL is written or shown in (`core.io.redaction`): its password and the values
of its secret parameters `***`, everything else kept; a local path never touched."""

from __future__ import annotations

import json

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process

from torchkit.core.io.redaction import (
    has_redacted_secret,
    is_secret_name,
    list_parts,
    redact_url,
    redact_urls,
)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://me:p%40ss@host/d/x.tar", "https://me:***@host/d/x.tar"),
        ("https://ghp_token@host/x.tar", "https://***@host/x.tar"),  # a token as the user
        ("https://me:a@b@host/x.tar", "https://me:***@host/x.tar"),  # to the last @, as urllib
        ("https://me:a:b%3Ac@host/x.tar", "https://me:***@host/x.tar"),  # a `:` in the password
        ("https://me:a/b@host/x.tar", "https://me:***@host/x.tar"),  # not a port: a password
        ("https://me:a#b@host/x.tar?sig=s", "https://me:***@host/x.tar?sig=***"),
        ("https://host:80/a@b/x.tar", "https://host:80/a@b/x.tar"),
        (
            "https://b.s3.amazonaws.com/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential=AK%2F1"
            "&X-Amz-Security-Token=t&X-Amz-Signature=f00",
            "https://b.s3.amazonaws.com/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Credential=***"
            "&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        (
            "https://a.blob.core.windows.net/c/x.tar?sv=2022-11-02&se=2030&sp=r&sig=ab%3D",
            "https://a.blob.core.windows.net/c/x.tar?sv=2022-11-02&se=2030&sp=r&sig=***",
        ),
        (
            "https://h/x.tar?token=t&page=2#access_token=z",
            "https://h/x.tar?token=***&page=2#access_token=***",
        ),
        (
            "https://h/a.tar::https://u:p@h/b.tar?key=k",
            "https://h/a.tar::https://u:***@h/b.tar?key=***",
        ),
        ("https://[::1]:8000/x.tar?v=1", "https://[::1]:8000/x.tar?v=1"),
        ("https://[::1]:8000/x.tar?key=k", "https://[::1]:8000/x.tar?key=***"),
        ("https:/h/x.tar?token=t", "https:/h/x.tar?token=***"),  # as --data reads it
        ("s3://b/x.tar?X-Amz-Signature=f", "s3://b/x.tar?X-Amz-Signature=***"),
        ("flowers/", "flowers/"),
    ],
)
def test_a_urls_secrets_are_replaced_and_the_rest_kept(url, shown):
    for redact in (redact_url, redact_urls):
        assert redact(url) == shown
        assert redact(shown) == shown
    assert has_redacted_secret(shown) == (shown != url)


@pytest.mark.parametrize(
    ("spec", "parts"),
    [
        ("https://h/a.tar?token=a::b", ["https://h/a.tar?token=a::b"]),  # the query's own
        ("https://h/a.tar#access_token=a::b", ["https://h/a.tar#access_token=a::b"]),
        ("https://me:pa::ss@h/a.tar", ["https://me:pa::ss@h/a.tar"]),  # the password's
        ("https://[::1]:8000/a.tar", ["https://[::1]:8000/a.tar"]),  # the host's
        ("https://h/a.tar?sig=x::https://h/b.tar", ["https://h/a.tar?sig=x", "https://h/b.tar"]),
        ("https://h/a.tar::b.tar", ["https://h/a.tar", "b.tar"]),  # a path after a path
        ("a.tar::b.tar::https://h/c.tar", ["a.tar", "b.tar", "https://h/c.tar"]),
        ("pipe:curl https://h/a?key=k::b", ["pipe:curl https://h/a?key=k::b"]),
    ],
)
def test_a_double_colon_joins_a_list_only_outside_what_a_url_holds(spec, parts):
    """The `::` list is read once for the reader and for redaction: in a URL's query or
    credentials it is the URL's, and the reader took it for a join ("joins URLs and a path on
    disk (b)", the rest of the token shown)."""
    assert list_parts(spec) == parts
    assert "::".join(list_parts(spec)) == spec


@pytest.mark.parametrize(
    "path", ["data/train?token=x", "x?sig=1&key=2", "./a#access_token=z", "me:pw@host/x"]
)
def test_a_local_path_named_like_a_query_is_kept_exactly(path):
    """A file or folder may be named `x?token=abc` (a legal name): it was saved and shown as
    `x?token=***`, so a resume looked for a folder that is not there."""
    assert redact_url(path) == path
    assert redact_urls(f"Note: reading {path}: 3 images") == f"Note: reading {path}: 3 images"
    assert not has_redacted_secret(path)


def test_train_records_a_local_path_named_like_a_query_as_given():
    """config.json and the checkpoints (`--print-config` prints that record) said
    `imgs?token=***`: `train --resume` then stopped at "dataset not found: imgs?token=***", and
    `eval RUN/best.pt` read a folder of that name where there was one."""
    printed = run_torchkit_in_process("train", "--data", "imgs?token=abc", "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["data"] == "imgs?token=abc"


@pytest.mark.parametrize(
    "name",
    [
        "token", "access_token", "X-Amz-Security-Token", "session_token", "sessionToken",
        "secret", "client_secret", "password", "passwd", "pwd", "auth", "jwt",
        "X-Amz-Signature", "X-Goog-Signature", "Signature", "sig", "auth_sig",
        "X-Amz-Credential", "X-Goog-Credential", "key", "api_key", "apikey", "x-api-key",
        "AWSAccessKeyId", "Key-Pair-Id", "subscription-key", "authorization", "Bearer", "cookie",
    ],
)  # fmt: skip
def test_a_parameter_named_as_a_secret_is_redacted(name):
    assert is_secret_name(name)
    assert redact_urls(f"https://h/x.tar?v=1&{name}=s3cret") == f"https://h/x.tar?v=1&{name}=***"


@pytest.mark.parametrize(
    "name",
    [
        "v", "page", "se", "sp", "sv", "sr", "Expires", "Policy", "X-Amz-Algorithm",
        "X-Amz-Date", "X-Amz-SignedHeaders", "max-keys", "keyword", "design", "signal",
    ],
)  # fmt: skip
def test_a_parameter_that_holds_no_secret_is_kept(name):
    assert not is_secret_name(name)
    assert redact_urls(f"https://h/x.tar?{name}=1") == f"https://h/x.tar?{name}=1"


def test_a_saved_url_is_redacted_to_its_end_a_shown_one_to_its_first_space():
    """A raw space in a secret (`--data 'https://h/x?token=ab cd'`, sent as `ab%20cd`) left
    `token=*** cd` in saved records. A saved value is the URL whole; in a message a URL ends
    at whitespace, as terminals and log viewers read it."""
    url = "https://me:p w@h/x.tar?token=ab cd&v=1#access_token=y z"
    assert redact_url(url) == "https://me:***@h/x.tar?token=***&v=1#access_token=***"
    assert has_redacted_secret(redact_url(url))
    assert redact_urls("see https://h/x.tar?token=ab cd") == "see https://h/x.tar?token=*** cd"
    assert (
        redact_url("pipe:curl -s https://h/x.tar?sig=1") == "pipe:curl -s https://h/x.tar?sig=***"
    )


def test_a_raw_slash_or_hash_in_a_password_is_one_error_showing_none_of_it():
    """urllib reads `https://me:q7/w0rd@host` as the host `me` with the port `q7`: the error
    showed `https://me:q7/w0rd@...` and urllib's "nonnumeric port: 'q7'"."""
    for data in ("https://me:q7/w0rd@127.0.0.1:9/x.tar", "https://me:q7#w0rd@127.0.0.1:9/x.tar"):
        result = run_torchkit_in_process("dataset-stats", data)
        assert result.returncode == 2, result.stderr
        line = error_line(result.stderr)
        assert line.startswith("Error: https://me:***@127.0.0.1:9/x.tar cannot be read"), line
        assert "q7" not in result.stderr and "w0rd" not in result.stderr


def test_the_notes_naming_a_models_outputs_by_the_data_name_the_url_whole():
    """predict's and eval's notes on a model without class names quoted IMAGES as typed: the
    shown line cut the URL at the raw space in its token."""
    from torchkit.core.inference.class_names import output_names_from_data

    data = "https://h/x.tar?token=ab cd"
    for outputs in (None, 2):
        _, note = output_names_from_data(["b", "a", "10"], outputs, data)
        assert "https://h/x.tar?token=*** " in note and "cd" not in note, note


def test_extract_features_error_on_no_readable_image_names_the_url_whole():
    """Its error quoted IMAGES as typed: the shown line cut the URL at the raw space in its
    token."""
    from types import SimpleNamespace

    from torchkit.core.features.extract import _finish
    from torchkit.core.io.errors import InputError

    store = SimpleNamespace(progress=SimpleNamespace(rows=0))
    request = SimpleNamespace(images="https://h/x.tar?token=ab cd")
    with pytest.raises(InputError) as raised:
        _finish(store, request, [1, 2], None, {}, [], "")
    assert "https://h/x.tar?token=*** could" in raised.value.message, raised.value.message


def test_urls_inside_a_message_are_redacted_and_the_message_kept():
    message = "cannot download https://me:pw@h/x.tar?sig=abc: HTTP 401 (check https://h/?a=b)"
    assert redact_urls(message) == (
        "cannot download https://me:***@h/x.tar?sig=***: HTTP 401 (check https://h/?a=b)"
    )


def test_every_line_the_cli_shows_is_redacted():
    """Error, Warning and Note lines and table cells go through `shown_text`: a URL a message
    or a library's error quotes whole loses its secrets there too."""
    from torchkit.cli.console import shown_text

    assert shown_text("see https://me:pw@h/x.tar\n") == "see https://me:***@h/x.tar\\n"


def test_a_double_colon_in_a_token_names_no_local_shard_as_an_input(tmp_path, monkeypatch):
    """The overlap check of outputs against inputs read the `::` list on its own: the end of
    a token (`?token=x::b.tar`) named the local file b.tar as an input."""
    from torchkit.core.data.sources.inputs import _named_shards

    monkeypatch.chdir(tmp_path)
    (tmp_path / "b.tar").write_bytes(b"")
    assert _named_shards("https://h/a.tar?token=x::b.tar", "--data") == []
    assert [str(i.path) for i in _named_shards("https://h/a.tar::b.tar", "--data")] == ["b.tar"]
