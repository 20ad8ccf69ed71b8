"""Turn a failed job's log into the one line a user needs: the exception their code raised."""

from __future__ import annotations

import re

# torchrun prefixes each rank's traceback lines with "[rankN]: "; srun and plain runs do not.
_EXCEPTION_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)\b:?.*)$")


def last_exception(log: str) -> str | None:
    """The last `SomeError: message` line of a Python traceback in the log, without rank prefixes."""
    found = None
    for line in log.splitlines():
        match = _EXCEPTION_LINE.match(line.strip())
        if match and not match.group(1).startswith(("torch.distributed.elastic", "ChildFailedError")):
            found = match.group(1).strip()
    return found
