"""Importing this module freezes the importing process's heap: a fork server imports it last, after its preload.

A fork server (a warm standby, the agent's, the code server's) imports torch, MLflow, Dagster... and then forks
each run's processes. A fork's garbage collector, at each full collection, walks every object it inherited
(~570,000 after a standby's preload) and writes to each one's header, copying the heap's pages on the way: 0.3 s of
CPU per full collection in each fork. gc.freeze() moves them to a generation no collection visits, as Python's
documentation of gc.freeze() advises before fork(). What the fork server holds stays alive in it anyway.
"""

from __future__ import annotations

import gc


def freeze() -> None:
    gc.collect()  # what is garbage now is freed, not frozen
    gc.freeze()


freeze()
