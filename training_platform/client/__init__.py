"""`tp` as a client of the platform server (Dagster's GraphQL API): connect, submit, follow, read."""

from training_platform.client.connect import SERVER_URL_ENV, connect
from training_platform.client.graphql import ClientError, DagsterRun, PlatformClient

__all__ = ["SERVER_URL_ENV", "ClientError", "DagsterRun", "PlatformClient", "connect"]
