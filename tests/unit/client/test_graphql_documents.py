"""Every GraphQL document `tp` and the server manager send is valid against the Dagster webserver's own schema
(dagster-graphql, the pinned version): a field renamed or removed upstream fails here, not in a user's shell."""

from __future__ import annotations

import pytest
from graphql import parse, validate

from training_platform.client import graphql
from training_platform.server import local as server

DOCUMENTS = {
    f"{module.__name__}.{name}": value
    for module in (graphql, server)
    for name, value in vars(module).items()
    if name.startswith("_") and isinstance(value, str) and value.lstrip().startswith(("query", "mutation", "{ "))
}


def test_the_documents_are_found():
    assert len(DOCUMENTS) >= 12, sorted(DOCUMENTS)


@pytest.fixture(scope="module")
def schema():
    from dagster_graphql.schema import create_schema  # 1.8 s: imported by the worker that runs these tests only

    return create_schema().graphql_schema


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_a_document_validates_against_the_webservers_schema(schema, name):
    errors = validate(schema, parse(DOCUMENTS[name]))
    assert not errors, [error.message for error in errors]
