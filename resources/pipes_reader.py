"""A Dagster Pipes message reader that tails a JSON-lines file and hands over only complete lines.

The stock `PipesFileMessageReader` can read a line the worker is still writing; the JSON error then
ends its reader thread and every later message (metrics, the final materialization) is lost. Seen
here under load. This reader keeps a partial line until its newline arrives.
"""

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from dagster_pipes import PipesDefaultMessageWriter


class PipesJsonLinesReader(dg.PipesMessageReader):
    def __init__(self, path: str | Path, poll_seconds: float = 0.05, keep_existing: bool = False):
        self.path = Path(path)
        self.poll_seconds = poll_seconds
        self.keep_existing = keep_existing  # a job taken over wrote messages before: read them too

    @contextmanager
    def read_messages(self, handler) -> Iterator[dict]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not (self.keep_existing and self.path.is_file()):
            self.path.write_text("")
        finished = threading.Event()
        thread = threading.Thread(target=self._tail, args=(handler, finished), daemon=True)
        thread.start()
        try:
            yield {
                PipesDefaultMessageWriter.FILE_PATH_KEY: str(self.path),
                PipesDefaultMessageWriter.INCLUDE_STDIO_IN_MESSAGES_KEY: False,
            }
        finally:
            finished.set()
            thread.join()

    def _tail(self, handler, finished: threading.Event) -> None:
        pending = ""
        with open(self.path, encoding="utf-8") as stream:
            while True:
                piece = stream.readline()
                if piece:
                    pending += piece
                    if pending.endswith("\n"):
                        self._handle(handler, pending)
                        pending = ""
                elif finished.is_set():
                    break
                else:
                    time.sleep(self.poll_seconds)
        if pending.strip():
            self._handle(handler, pending)  # a last line the worker never ended

    @staticmethod
    def _handle(handler, line: str) -> None:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            return  # a line torn by a killed worker carries nothing to act on
        handler.handle_message(message)

    def no_messages_debug_text(self) -> str:
        return f"Attempted to read Pipes messages from {self.path}; see the worker's log in the run directory."
