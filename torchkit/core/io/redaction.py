"""URLs with their secrets replaced by `***`: the one form in which torchkit writes or shows a
URL (config.json, checkpoints, metrics, meta.json, --print-config, messages, tables).

Only URLs are touched: a `scheme://` (`https://`, `s3://` ...), or `https:/host` as `--data`
reads it. A local path is kept exactly, also one named like a query (`data/x?token=1`), so a
recorded run reads the same files again.

A secret is the password of `USER:PASSWORD@` (a user given alone, as a token is, `***@`
whole), and the value of a query or fragment parameter whose name is a secret's
(`is_secret_name`). Everything else is kept, so a recorded URL still says what data it was; a
URL recorded so cannot be read again without its secret (`has_redacted_secret`).

Where a URL ends: a saved value (`redact_url`: `--data`, SRC) is a URL to its very end, a raw
space in a secret included; in free text (`redact_urls`: a message, a table cell) a URL ends at
whitespace, the punctuation a sentence puts after it (`URL: why`, `(URL)`) not its own.
"""

from __future__ import annotations

import re

REDACTED = "***"

_SCHEME = r"[a-z][a-z0-9+.\-]*://|https?:/"
_URL_START = re.compile(rf"(?i)(?:{_SCHEME})")
_URL_IN_TEXT = re.compile(rf"(?i)\b(?:{_SCHEME})\S*")
_TRAILING_PUNCTUATION = ":;,.)]'\""
_AUTHORITY_END = re.compile(r"[/?#]")
_PARAMETERS_START = re.compile(r"[?#]")  # where a URL's query or fragment begins
_NOT_A_PORT = re.compile(r"^[^\[\]]*:(?!\d*$)")  # `HOST:80` and `[::1]` are not
# `?NAME=VALUE`, `&NAME=VALUE`, `#NAME=VALUE` (OAuth puts access_token in the fragment).
_PARAMETER = re.compile(r"([?&#])([^=&#?]+)=([^&#]*)")
# The words of a parameter's name: split at `-`, `_`, `.` ... and where a lowercase letter
# meets an uppercase one (`sessionToken`, `AWSAccessKeyId`).
_CASE_CHANGE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")
_SECRET_WORD = re.compile(
    r".*(?:token|secret|passw|credential|signature).*|.*(?:key|sig)"
    r"|auth|authori[sz]ation|bearer|cookie|pwd|jwt"
)


def is_secret_name(name: str) -> bool:
    """Whether a URL parameter named `name` holds a secret: one of its words (above) contains
    token, secret, passw(or)d, credential or signature, ends in key or sig (`key`, `apikey`,
    `Key-Pair-Id`, `sig`, `auth_sig`), or is auth, authorization, bearer, cookie, pwd or jwt.
    Also the test of an environment variable's name (`NCCL_PASSWD`). Not secrets, so kept: `Policy`,
    `Expires`, `X-Amz-SignedHeaders`, `max-keys`, Azure SAS's `sv`, `se`, `sp`..."""
    words = _NOT_ALNUM.split(_CASE_CHANGE.sub("_", name).lower())
    return any(_SECRET_WORD.fullmatch(word) for word in words)


def redact_url(value: str) -> str:
    """`value` as a whole (`--data`, SRC: a URL, a `::` list of them, or a local path) as it is
    saved: each URL's secrets `***` to the URL's very end (a raw space in a token included); a
    local path exactly as given (a URL inside another value, `pipe:curl URL`, as in free text)."""
    return "::".join(
        _redacted_url(part) if _URL_START.match(part) else redact_urls(part)
        for part in list_parts(value)
    )


def list_parts(value: str) -> list[str]:
    """The parts of a `::` list (webdataset's: `--data`, SRC), the one reading of it. A `::`
    joins two parts where a URL starts after it; elsewhere only outside a URL or in its path,
    never in what a URL holds of its own: its host and `USER:PASSWORD@` (`https://[::1]:8000/`,
    a password `pa::ss`), its query and fragment (`?token=a::b`). Read as a join, the rest of
    a token was shown as "a path on disk"."""
    parts: list[str] = []
    start = 0
    join = value.find("::")
    while join != -1:
        if _URL_START.match(value, join + 2) or not _in_own_text(value[start:join]):
            parts.append(value[start:join])
            start = join + 2
        join = value.find("::", join + 2)
    parts.append(value[start:])
    return parts


def _in_own_text(part: str) -> bool:
    """Whether the end of `part` lies in the host, `USER:PASSWORD@`, query or fragment of the
    URL it ends in (the URL it is, or one inside it, `pipe:curl URL`, running to its end)."""
    url = part if _URL_START.match(part) else None
    if url is None:
        found = [m for m in _URL_IN_TEXT.finditer(part) if m.end() == len(part)]
        url = found[-1].group(0) if found else None
    if url is None:
        return False
    rest = url[_URL_START.match(url).end() :]
    return "/" not in rest or _PARAMETERS_START.search(rest) is not None


def redact_urls(text: str) -> str:
    """`text` (a message, a table cell) with every URL in it redacted (`redact_url`); a URL
    ends at whitespace, the punctuation after it kept as the message's."""
    return _URL_IN_TEXT.sub(_redacted_in_text, text)


def has_redacted_secret(value: str) -> bool:
    """Whether a URL in `value` (a whole `--data`) carries a secret `redact_url` replaced: a
    recorded URL that would log in with `***`."""
    for part in list_parts(value):
        start = _URL_START.match(part)
        if start is None:
            continue
        authority, tail = _split_authority(part[start.end() :])
        userinfo, at, _ = authority.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if at and (password if colon else user) == REDACTED:
            return True
        if any(
            secret == REDACTED and is_secret_name(name)
            for _, name, secret in _PARAMETER.findall(_parameters(tail))
        ):
            return True
    return False


def _redacted_in_text(match: re.Match[str]) -> str:
    url = match.group(0)
    kept = url.rstrip(_TRAILING_PUNCTUATION)
    return redact_url(kept) + url[len(kept) :]


def _redacted_url(url: str) -> str:
    scheme = _URL_START.match(url)
    assert scheme is not None
    authority, tail = _split_authority(url[scheme.end() :])
    userinfo, at, host = authority.rpartition("@")  # the last `@`, as urllib reads it
    if at:
        user, colon, _ = userinfo.partition(":")
        authority = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    path = tail[: len(tail) - len(_parameters(tail))]
    parameters = _PARAMETER.sub(_redacted_parameter, _parameters(tail))
    return f"{scheme.group(0)}{authority}{path}{parameters}"


def _split_authority(rest: str) -> tuple[str, str]:
    """`USERINFO@HOST:PORT` and what follows it (`/path?query#fragment`), as urllib splits; but
    a `USER:PASS` cut at a raw `/`, `?` or `#` in PASS (urllib reads `:PASS` as a port, which no
    valid URL has) runs to the last `@`."""
    end = _AUTHORITY_END.search(rest)
    if end is None:
        return rest, ""
    authority = rest[: end.start()]
    at = rest.rfind("@")
    if at > end.start() and "@" not in authority and _NOT_A_PORT.search(authority):
        end = _AUTHORITY_END.search(rest, at)
        if end is None:
            return rest, ""
    return rest[: end.start()], rest[end.start() :]


def _parameters(tail: str) -> str:
    """The query and fragment of a URL's `tail`: from its first `?` or `#` on."""
    start = _PARAMETERS_START.search(tail)
    return "" if start is None else tail[start.start() :]


def _redacted_parameter(match: re.Match[str]) -> str:
    mark, name, value = match.groups()
    if not value or not is_secret_name(name):
        return match.group(0)
    return f"{mark}{name}={REDACTED}"
