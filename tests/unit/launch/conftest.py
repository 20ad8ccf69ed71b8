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
def _crds(group: str) -> dict[str, dict[str, Any]]:
    """The group's CRDs by kind, each file parsed once a session (with libyaml where PyYAML has it): the pure-Python
    parser took seconds over Kueue's folder (its Workload CRD is 1.4 MB), once for each kind looked up."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crds = [yaml.load(path.read_text(), Loader=loader) for path in sorted((SCHEMAS / CRD_GROUPS[group]).glob("*.yaml"))]
    return {crd["spec"]["names"]["kind"]: crd for crd in crds if crd["spec"]["group"] == group}


@functools.cache
def crd_validator(group: str, kind: str, version: str) -> jsonschema.Draft7Validator:
    crd = _crds(group).get(kind)
    if crd is None:
        raise AssertionError(f"no CRD for {kind}.{group} in {SCHEMAS / CRD_GROUPS[group]}")
    for served in crd["spec"]["versions"]:
        if served["name"] == version and served.get("served", True):
            return jsonschema.Draft7Validator(_strict(copy.deepcopy(served["schema"]["openAPIV3Schema"])))
    raise AssertionError(f"CRD {kind}.{group} does not serve version {version}")


def validate_object(obj: dict[str, Any]) -> None:
    """Raise if `obj` would be refused by a 1.31 API server with Kueue/JobSet CRDs installed."""
    group, _, version = obj["apiVersion"].rpartition("/")
    if group in CRD_GROUPS:
        crd_validator(group, obj["kind"], version).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.fixture
def validate_k8s() -> Callable[[dict[str, Any]], None]:
    return validate_object
