"""Find and hide secrets by what they are, not only by the name of the variable that holds them.

A value counts as secret when the environment holds it under a secret-looking name
(`HF_TOKEN=...`), when it is the password of a URL (`https://user:pass@host`, whatever variable
holds it: `MLFLOW_TRACKING_URI` passed the old name-only filter), or when it follows a secret-looking
key or flag (`--api-key=...`, `password: ...`, `?token=...`). `Redactor.text` replaces every such
value with `***`; `Redactor.first_secret` says where one is, for refusing it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

MASK = "***"
# Names of variables, keys and flags whose values are secrets: a whole word of the name, so that
# `--max-tokens 512` is not one, and neither is a base64 blob that happens to contain "auth".
_SECRET_NAME = re.compile(
    r"(^|[-_.])(secrets?|passw(or)?d|credentials?|api-?key|apikey|access-key|private-key|signature|webhook"
    r"|dsn|token|auth|authorization)($|[-_.])",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):(?P<password>[^/\s@]+)@")
# `key=value`, `key: value` (YAML, logs), `?key=value&` (URLs); a scheme's `://` is no separator.
_KEY_VALUE = re.compile(r"(?P<key>[A-Za-z0-9_.-]+)(?P<sep>=|:[ \t]+)(?P<value>[^\s&,;'\"}]+)")
_PATTERNS = (
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key ids
    re.compile(r"(?<=Bearer )[A-Za-z0-9._~+/-]+=*"),
    re.compile(r"hooks\.slack\.com/services/[^\s'\"]+"),
)
MIN_LENGTH = 6  # a shorter "secret" (`1`, `true`) would mask half of any text and protect nothing


def is_secret_name(name: str) -> bool:
    """`MY_API_TOKEN`, `--hf-token`, `aws_secret_access_key`, `X-Amz-Signature`: yes; `--max-tokens`: no."""
    return bool(_SECRET_NAME.search(name.replace("_", "-").lstrip("-")))


def secret_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """The secrets an environment holds: values of secret-named variables and passwords of URLs."""
    environ = os.environ if environ is None else environ
    found = set()
    for name, value in environ.items():
        if is_secret_name(name) and len(value) >= MIN_LENGTH:
            found.add(value)
        found.update(m["password"] for m in _URL_PASSWORD.finditer(value) if len(m["password"]) >= MIN_LENGTH)
    return found


class Redactor:
    """Masks the secrets of an environment (default: this process's) and anything shaped like one."""

    def __init__(self, extra: Iterable[str] = (), environ: Mapping[str, str] | None = None):
        known = {value for value in extra if len(value) >= MIN_LENGTH} | secret_values(environ)
        self.values = sorted(known, key=len, reverse=True)  # the longest first: no half-masked secret

    def text(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, MASK)
        for pattern in _PATTERNS:
            text = pattern.sub(MASK, text)
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
        return _KEY_VALUE.sub(lambda m: m[0] if not is_secret_name(m["key"]) else m["key"] + m["sep"] + MASK, text)

    def args(self, args: Iterable[str]) -> list[str]:
        """Command-line arguments, masked; the value after a secret flag (`--token VALUE`) too."""
        out: list[str] = []
        for arg in args:
            secret_flag = bool(out) and out[-1].startswith("-") and "=" not in out[-1] and is_secret_name(out[-1])
            out.append(MASK if secret_flag else self.text(arg))
        return out

    def first_secret(self, text: str) -> str | None:
        """What kind of secret `text` holds (never the secret itself), or None."""
        if any(value in text for value in self.values):
            return "the value of a secret environment variable"
        if _URL_PASSWORD.search(text):
            return "a password in a URL (user:password@)"
        if self.text(text) != text:
            return "a secret-looking key, token or webhook"
        return None


def redact(text: str) -> str:
    """`text` with this process's secrets and anything shaped like one masked."""
    return Redactor().text(text)
