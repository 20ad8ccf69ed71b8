"""Validators for Kubernetes objects: core kinds with kubernetes-validate (Kubernetes 1.31 schemas,
strict), Kueue and JobSet kinds against their official CRDs in deploy/kubernetes/crds/ (see its README)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

K8S_VERSION = "1.31"
SCHEMAS = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "crds"
CRD_GROUPS = {"kueue.x-k8s.io": "kueue", "jobset.x-k8s.io": "jobset"}


def _strict(schema: Any) -> Any:
    """The API server's strict field validation: an object schema with `properties` and no
    `additionalProperties` or preserve-unknown-fields rejects unknown fields."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


@functools.cache
def crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    folder = SCHEMAS / CRD_GROUPS[group]
    for path in folder.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            for served in crd["spec"]["versions"]:
                if served["name"] == version and served.get("served", True):
                    return _strict(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
            raise AssertionError(f"CRD {kind}.{group} in {path} does not serve version {version}")
    raise AssertionError(f"no CRD for {kind}.{group} in {folder}")


def validate_object(obj: dict[str, Any]) -> None:
    """Raise if `obj` would be refused by a 1.31 API server with Kueue/JobSet CRDs installed."""
    group, _, version = obj["apiVersion"].rpartition("/")
    if group in CRD_GROUPS:
        jsonschema.Draft7Validator(crd_schema(group, obj["kind"], version)).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.fixture
def validate_k8s() -> Callable[[dict[str, Any]], None]:
    return validate_object
