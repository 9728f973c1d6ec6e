"""URLs with their secrets replaced by `***`: the one form in which torchkit writes or shows a
URL (config.json, checkpoints, metrics, meta.json, --print-config, messages, tables).

A secret is the password of `USER:PASSWORD@` (a user given alone, as a token is, `***@`
whole), and the value of a query or fragment parameter that names a signature, token, key or
credential: `X-Amz-Signature`, `X-Amz-Credential`, `X-Amz-Security-Token`, Azure SAS `sig`,
`token`, `access_token`, `key`... Everything else is kept, so a recorded URL still says what
data it was; a URL recorded so cannot be read again without its secret (`has_redacted_secret`).
"""

from __future__ import annotations

import re

REDACTED = "***"

# `scheme://USERINFO@`: USERINFO runs to the last `@` before the host's end (as urllib reads it).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)([^/?#\s]*)@")
# `?NAME=VALUE`, `&NAME=VALUE`, `#NAME=VALUE` (OAuth puts access_token in the fragment); the
# punctuation a message puts after a URL (`URL: why`, `(URL)`) is not the value's.
_PARAMETER = re.compile(r"([?&#])([^=&#\s?]+)=([^&#\s]*?)(?=[:;,.)\]'\"]*(?:[&#\s]|$))")
_SECRET_NAME = re.compile(
    r"(?i)^(?:sig|key|auth|.*(?:token|secret|passw(?:or)?d|credential|signature|"
    r"api[-_]?key|access[-_]?key).*)$"
)


def redact_urls(text: str) -> str:
    """`text` (a URL, a `::` list of them, or a message naming some) with every URL's secrets
    replaced by `***`."""
    text = _USERINFO.sub(_redacted_userinfo, text)
    return _PARAMETER.sub(_redacted_parameter, text)


def has_redacted_secret(text: str) -> bool:
    """Whether a URL in `text` carries a secret `redact_urls` replaced: a recorded URL that
    would log in with `***`."""
    for match in _USERINFO.finditer(text):
        user, colon, password = match.group(2).partition(":")
        if (password if colon else user) == REDACTED:
            return True
    return any(
        _SECRET_NAME.match(match.group(2)) and match.group(3) == REDACTED
        for match in _PARAMETER.finditer(text)
    )


def _redacted_userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match.group(1), match.group(2)
    if not userinfo:
        return match.group(0)
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{user}:{REDACTED}@" if colon else f"{scheme}{REDACTED}@"


def _redacted_parameter(match: re.Match[str]) -> str:
    mark, name, value = match.groups()
    if not value or not _SECRET_NAME.match(name):
        return match.group(0)
    return f"{mark}{name}={REDACTED}"
