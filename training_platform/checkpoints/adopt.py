"""Sign the checkpoints written before manifests were signed, each once it is checked.

    python -m training_platform.checkpoints.adopt STORE_URI [RUN_ID ...]   # every run when none given

Run it once after upgrading, with the deployment's key (``TP_CHECKPOINT_SIGNING_KEY``, or the
platform home's key file), on a store that nobody but the deployment could write to until then:
signing says that the deployment vouches for what it signs. A manifest is signed only when its
sha256 matches and every chunk it names verifies against its hash; the others are listed with
the reason and left unsigned (so they are not restored).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from training_platform.checkpoints.layout import manifest_key
from training_platform.checkpoints.reader import ChunkReader
from training_platform.checkpoints.store import CheckpointStore, open_store
from training_platform.errors import CheckpointError


@dataclass
class Adopted:
    signed: list[int] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)


def adopt_unsigned(store: CheckpointStore, run_id: str) -> Adopted:
    """Sign the run's unsigned manifests whose content and chunks verify; returns what was done."""
    adopted = Adopted()
    for manifest in store.list(run_id):
        if manifest.signature:
            continue
        try:
            store.check_content(manifest)
            reader = ChunkReader(store.tiers_for(manifest))
            for ref in manifest.chunks:  # one at a time: a large checkpoint is not held in memory
                reader.read(ref)
        except CheckpointError as exc:
            adopted.refused[manifest.step] = str(exc)
            continue
        tier = store.cold if manifest.tier == "cold" and store.cold is not None else store.storage
        signed = store.signer.seal(manifest.model_copy(update={"uri": "", "tier": "hot"}))
        tier.put(manifest_key(run_id, manifest.step), signed.model_dump_json(indent=1).encode())
        adopted.signed.append(manifest.step)
    return adopted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training_platform.checkpoints.adopt", description=__doc__)
    parser.add_argument("store_uri", help="the checkpoint store: a local path or s3://bucket/prefix")
    parser.add_argument("run_ids", nargs="*", help="runs to adopt (default: every run in the store)")
    args = parser.parse_args(argv)
    store = open_store(args.store_uri)
    refused = 0
    for run_id in args.run_ids or store.run_ids():
        adopted = adopt_unsigned(store, run_id)
        print(f"{run_id}: signed steps {adopted.signed or 'none'}")
        for step, reason in adopted.refused.items():
            print(f"{run_id}: step {step} left unsigned: {reason}")
        refused += len(adopted.refused)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
