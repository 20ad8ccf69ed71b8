"""Every rank's RNG states as JSON, for checkpoint formats that store opaque values (DCP items,
DeepSpeed's client state): a pickle there would run whatever a crafted checkpoint holds."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import torch

from training_platform.errors import CheckpointError


def rng_states_to_json(states: list[dict]) -> str:
    """`distributed.rng_state()` of each rank, exactly (every integer and float round-trips)."""
    return json.dumps([_encode(state) for state in states])


def rng_states_from_json(text: str | bytes) -> list[dict]:
    """The states `rng_states_to_json` wrote, ready for `distributed.set_rng_state`."""
    try:
        return [_decode(state) for state in json.loads(text)]
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise CheckpointError(
            f"the checkpoint's RNG states are not the JSON this build writes ({exc}); an older build stored them "
            "pickled, which this build does not unpickle: resume that run with the build that wrote it"
        ) from None


def _encode(state: dict) -> dict[str, Any]:
    version, internal, gauss = state["python"]
    key, keys, pos, has_gauss, cached = state["numpy"]
    encoded = {
        "python": [version, list(internal), gauss],
        "numpy": [key, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _tensor_text(state["torch"]),
    }
    if "cuda" in state:
        encoded["cuda"] = [_tensor_text(tensor) for tensor in state["cuda"]]
    return encoded


def _decode(encoded: dict[str, Any]) -> dict:
    version, internal, gauss = encoded["python"]
    key, keys, pos, has_gauss, cached = encoded["numpy"]
    if not (all(isinstance(v, int) for v in [version, *internal]) and (gauss is None or isinstance(gauss, float))):
        raise ValueError("python state is not integers and a float")
    state = {
        "python": (version, tuple(internal), gauss),
        "numpy": (str(key), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)),
        "torch": _tensor(encoded["torch"]),
    }
    if "cuda" in encoded:
        state["cuda"] = [_tensor(text) for text in encoded["cuda"]]
    return state


def _tensor_text(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode()


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)
