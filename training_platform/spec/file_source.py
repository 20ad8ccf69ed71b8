"""What a spec says about a file source: which columns play which role, and how rows split.

Pydantic only (no pyarrow), so the spec can import it for free; the builder is `datasets/files.py`.
"""

from __future__ import annotations

import glob
import math
from pathlib import PurePosixPath
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
"""Data file types by extension."""
SPLIT_SEED = 20240101
DEFAULT_FRACTIONS = {"train": 0.70, "validation": 0.15, "test": 0.15}
RESERVED_COLUMNS = ("row_id", "label", "split", "text", "image")
"""Names a snapshot gives its own columns; a source column may not take one as a feature."""
SplitName = Literal["train", "validation", "test"]


def is_file_uri(value: str) -> bool:
    """Whether a dataset.source names files (a path, a glob, file:// or s3://) rather than a built-in source."""
    return (
        value.startswith(("s3://", "file://", "/", ".", "~"))
        or "/" in value
        or PurePosixPath(value).suffix.lower() in FORMATS
        or glob.has_magic(value)
    )


def check_file_uri(value: str) -> str:
    """The URI, or a ValueError naming what is wrong with it."""
    if value.startswith("s3://") and not urlparse(value).netloc:
        raise ValueError(f"{value!r} names no bucket; write s3://bucket/prefix")
    if "://" in value and not value.startswith(("s3://", "file://")):
        raise ValueError(f"{value!r}: only local paths, file:// and s3:// are supported")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileColumns(_Strict):
    """Columns by role: the snapshot renames the label to `label`; features keep their names, in this order."""

    label: str = Field(description="the column of class labels (integers from 0, or strings: sorted into 0..K-1)")
    features: list[str] | None = Field(
        None, description="feature columns (numeric); default: every numeric column but the label, split and key"
    )
    text: str | None = Field(None, description="a column of text (strings), kept as the snapshot's `text`")
    image: str | None = Field(
        None,
        description="a column of encoded images (bytes, e.g. PNG or JPEG) or of their files' paths (relative to the "
        "source's folder; read into the snapshot), kept as the snapshot's `image`",
    )

    @field_validator("features")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            repeated = sorted({name for name in value if value.count(name) > 1})
            if repeated:
                raise ValueError(f"dataset.columns.features names {', '.join(repeated)} more than once")
        return value

    @model_validator(mode="after")
    def _one_role_each(self) -> FileColumns:
        if self.features == [] and self.text is None and self.image is None:
            raise ValueError("dataset.columns.features is empty; list at least one column or leave it out")
        roles = {"label": self.label, "text": self.text, "image": self.image}
        named = [(role, column) for role, column in roles.items() if column is not None]
        for role, column in named:
            others = [other for other, name in named if name == column and other != role]
            if others:
                raise ValueError(f"dataset.columns: column {column!r} is both the {role} and the {others[0]}")
            if column in (self.features or []):
                raise ValueError(f"dataset.columns: column {column!r} is the {role}; take it out of features")
        return self


class FileSplit(_Strict):
    """An existing split column, or fractions assigned by a stable hash of a key column (or of the row's position)."""

    column: str | None = Field(None, description="a column whose values are train, validation or test")
    fractions: dict[SplitName, float] = Field(
        default_factory=lambda: dict(DEFAULT_FRACTIONS), description="each split's share of the rows; sum to 1"
    )
    key: str | None = Field(
        None, description="the column whose value decides a row's split (an id); default: the row's position"
    )
    seed: int = Field(SPLIT_SEED, ge=0, description="seed of the split's hash")

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, value: dict[str, float]) -> dict[str, float]:
        if any(not 0 < share < 1 for share in value.values()):
            raise ValueError("every split fraction must be between 0 and 1 (exclusive); leave a split out instead")
        if not math.isclose(sum(value.values()), 1.0, abs_tol=1e-9):
            raise ValueError(f"split fractions sum to {sum(value.values()):g}; make them sum to 1")
        if "train" not in value:
            raise ValueError("split fractions need a train share")
        return value

    @model_validator(mode="after")
    def _column_or_key(self) -> FileSplit:
        if self.column is not None and self.key is not None:
            raise ValueError("dataset.split: set either column (an existing split) or key (a hash's input), not both")
        return self


class ColumnExpectation(_Strict):
    """What one column of your files must hold; each set field is one expectation in the blocking check."""

    type: str | None = Field(None, description="its Arrow type as the files hold it, e.g. int64, double, string")
    not_null: bool = Field(False, description="no empty values")
    min: float | None = Field(None, description="smallest allowed value")
    max: float | None = Field(None, description="largest allowed value")
    values: list[str | int | float | bool] | None = Field(None, min_length=1, description="the allowed values")
    unique: bool = Field(False, description="no value twice (a key)")

    @field_validator("type")
    @classmethod
    def _arrow_type(cls, value: str | None) -> str | None:
        if value is not None:
            import pyarrow as pa  # only for a spec that declares types

            try:
                pa.type_for_alias(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an Arrow type name; use e.g. int64, double, string, bool") from None
        return value

    @model_validator(mode="after")
    def _bounds(self) -> ColumnExpectation:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) is above max ({self.max:g}); swap them")
        return self


class RowCount(_Strict):
    min: int | None = Field(None, ge=0, description="fewest rows across the files")
    max: int | None = Field(None, ge=0, description="most rows across the files")


class FileExpectations(_Strict):
    """Expectations on your files' own columns (names as in the files), checked with the snapshot's own suite."""

    rows: RowCount | None = Field(None, description="bounds on the number of rows")
    columns: dict[str, ColumnExpectation] = Field(default_factory=dict, description="column name -> what it holds")
