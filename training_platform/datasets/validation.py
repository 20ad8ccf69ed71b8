"""Validate a snapshot with a Great Expectations suite before it may feed training.

Great Expectations is imported inside `validate_snapshot` only: the import takes about ten
seconds, and the training worker, which reads snapshots, must not pay for it.

Two frames are validated. The rows frame holds every split's rows plus a `split` column, so
checks that span splits (disjointness by row_id) are ordinary expectations on it. The class
balance frame holds one row per (split, class) with that class's fraction of the split; a class
missing from a split appears with fraction 0, so absence fails the bounds too.

Each source gets the suite that fits it. Every snapshot: its columns, types and row count as in
the manifest, no nulls, features in range, labels in 0..K-1, disjoint splits. Only the built-in
digits sources, balanced by construction, also need every class in every split within bounds: a
text snapshot's next-token labels follow the language (spaces are common, `~` is rare), and a
team's own classes may be as rare as fraud; their own bounds go in `dataset.expectations`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from training_platform.datasets.manifest import LABEL, ROW_ID, SnapshotManifest
from training_platform.datasets.reader import read_split_table
from training_platform.datasets.store import SnapshotRoot, load_manifest
from training_platform.errors import SnapshotError
from training_platform.spec.file_source import FileExpectations

if TYPE_CHECKING:
    import pandas as pd

SPLIT = "split"
BALANCED_SOURCES = ("sklearn_digits", "digits_daily")
"""Sources whose classes are balanced by construction (see the module docstring)."""
CLASS_SHARE_BOUNDS = (0.5, 1.5)
"""Each class's fraction of a split, as multiples of an even share (1 / classes): 5%..15% for ten classes."""
_DETAIL_KEYS = (
    "observed_value",
    "element_count",
    "unexpected_count",
    "unexpected_percent",
    "missing_count",
    "partial_unexpected_list",
    "unexpected_index_list",
    "details",
)
_MAX_LISTED = 10
_VALUE_TYPES = {"string": "str", "binary": "bytes"}
"""Arrow types whose pandas column holds Python objects: GX checks each value's type name."""


@dataclass(frozen=True)
class ExpectationResult:
    """The outcome of one expectation (or one platform check that runs outside GX)."""

    expectation: str
    """GX expectation type, e.g. ``expect_column_values_to_be_between``."""
    column: str | None
    success: bool
    details: dict[str, Any] = field(default_factory=dict)
    """Observed values and a few unexpected ones, JSON-safe."""
    check: str = ""
    """What the expectation means for a snapshot, e.g. ``splits disjoint by row_id``."""

    def __getitem__(self, key: str) -> Any:
        # Lets callers treat a result as the {expectation, column, success, details} record it describes.
        return getattr(self, key)

    @property
    def name(self) -> str:
        return f"{self.expectation}({self.column})" if self.column else self.expectation

    def described(self) -> str:
        """``name [check]: counts, examples``, for a failure's one line."""
        text = self.name + (f" [{self.check}]" if self.check else "")
        details = self.details
        if "unexpected_count" in details:
            text += f": {details['unexpected_count']} of {details.get('element_count', '?')} rows unexpected"
            if details.get("partial_unexpected_list"):
                text += f", e.g. {details['partial_unexpected_list'][:3]}"
        elif "observed_value" in details:
            text += f": observed {details['observed_value']}"
        return text


@dataclass(frozen=True)
class ValidationReport:
    snapshot_id: str
    success: bool
    results: list[ExpectationResult]

    @property
    def failures(self) -> list[ExpectationResult]:
        return [result for result in self.results if not result.success]

    def summary(self) -> str:
        """One line: how many expectations passed, and which failed (what each checks, its counts, examples)."""
        head = f"snapshot {self.snapshot_id[:12]}"
        if self.success:
            return f"{head}: all {len(self.results)} expectations passed"
        failed = "; ".join(result.described() for result in self.failures)
        return f"{head}: {len(self.failures)} of {len(self.results)} expectations failed: {failed}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate_snapshot(
    root: SnapshotRoot, snapshot_id: str, own_files: tuple[pd.DataFrame, FileExpectations] | None = None
) -> ValidationReport:
    """Run the snapshot suite; a snapshot whose shards do not verify fails without reaching GX.

    `own_files`: the rows of a file source as its files hold them, and the spec's expectations on them,
    checked in the same suite run (names as in the files: the label before it became class ids, keys).
    """
    manifest = load_manifest(root, snapshot_id)
    try:
        rows = rows_frame(root, manifest)
    except SnapshotError as exc:
        # A damaged snapshot is a failed check, not a crash: the asset check must report it.
        result = ExpectationResult("shards_match_manifest", None, False, {"error": str(exc)}, "shards verify")
        return ValidationReport(snapshot_id, False, [result])

    import great_expectations as gx  # lazy: see the module docstring
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    # Per-metric progress bars would flood Dagster's captured logs; the report is the output.
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name=f"snapshot_{snapshot_id[:12]}")
    frames = {"rows": (rows, _row_expectations(manifest))}
    if manifest.source in BALANCED_SOURCES:
        frames["class_balance"] = (class_balance_frame(rows, manifest), _balance_expectations(manifest))
    if own_files is not None:
        frames["files"] = (own_files[0], file_expectations(own_files[1]))
    results: list[ExpectationResult] = []
    for name, (frame, expectations) in frames.items():
        batch = source.add_dataframe_asset(name=name).add_batch_definition_whole_dataframe(name)
        suite = context.suites.add(gx.ExpectationSuite(name=f"snapshot_{name}", expectations=expectations))
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=f"snapshot_{name}", data=batch, suite=suite)
        )
        # Verdicts alone first; only a frame with a failure is validated again for the counts and examples that
        # name what broke. A passing digits snapshot: 2.5-2.8 s of CPU with SUMMARY throughout, 1.2-1.4 s this way.
        outcome = definition.run(batch_parameters={"dataframe": frame}, result_format="BOOLEAN_ONLY")
        if not outcome.success:
            outcome = definition.run(batch_parameters={"dataframe": frame}, result_format="SUMMARY")
        results.extend(_to_result(item) for item in outcome.results)
    return ValidationReport(snapshot_id, all(result.success for result in results), results)


def rows_frame(root: SnapshotRoot, manifest: SnapshotManifest) -> pd.DataFrame:
    """Every split's rows in one frame, with the split's name in a `split` column."""
    import pandas as pd  # lazy, like GX: readers of snapshots never need pandas

    frames = []
    for split in manifest.split_names:
        frame = read_split_table(root, manifest, split).to_pandas()
        frame[SPLIT] = split
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def class_balance_frame(rows: pd.DataFrame, manifest: SnapshotManifest) -> pd.DataFrame:
    """One row per (split, class): the class's fraction of its split, 0 where the class is absent."""
    import pandas as pd

    counts = pd.crosstab(rows[SPLIT], rows[LABEL])
    # Expected classes are added explicitly so that a missing class shows as a 0 fraction.
    labels = sorted(set(range(manifest.num_classes)) | set(counts.columns))
    counts = counts.reindex(index=manifest.split_names, columns=labels, fill_value=0)
    fractions = counts.div(counts.sum(axis=1).clip(lower=1), axis=0)
    frame = fractions.stack().rename("fraction").reset_index()
    frame.columns = [SPLIT, LABEL, "fraction"]
    return frame


def _row_expectations(manifest: SnapshotManifest) -> list:
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    classes = list(range(manifest.num_classes))
    expectations = [
        gxe.ExpectTableColumnsToMatchOrderedList(
            column_list=[*manifest.schema, SPLIT], meta={"check": "columns exactly as in the manifest"}
        ),
        gxe.ExpectTableRowCountToEqual(
            value=manifest.total_rows, meta={"check": "row count as in the manifest"}
        ),
    ]
    for column, type_name in manifest.schema.items():
        expectations.append(gxe.ExpectColumnValuesToNotBeNull(column=column, meta={"check": "no nulls"}))
        expectations.append(
            gxe.ExpectColumnValuesToBeOfType(
                column=column, type_=_VALUE_TYPES.get(type_name, type_name), meta={"check": "type as in the manifest"}
            )
        )
    for column in manifest.feature_columns:
        expectations.append(
            gxe.ExpectColumnValuesToBeBetween(
                column=column,
                min_value=manifest.feature_min,
                max_value=manifest.feature_max,
                meta={"check": f"feature values in {manifest.feature_min}..{manifest.feature_max}"},
            )
        )
    expectations += [
        gxe.ExpectColumnValuesToBeInSet(
            column=LABEL, value_set=classes, meta={"check": f"label in 0..{manifest.num_classes - 1}"}
        ),
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=[SPLIT, ROW_ID], meta={"check": "row_id unique within each split"}
        ),
        # Across the combined frame, a unique row_id means no row sits in two splits.
        gxe.ExpectColumnValuesToBeUnique(column=ROW_ID, meta={"check": "splits disjoint by row_id"}),
    ]
    for split in manifest.split_names if manifest.source in BALANCED_SOURCES else ():
        expectations.append(
            gxe.ExpectColumnDistinctValuesToContainSet(
                column=LABEL,
                value_set=classes,
                row_condition=Column(SPLIT) == split,
                meta={"check": f"every class present in split {split}"},
            )
        )
    return expectations


def _balance_expectations(manifest: SnapshotManifest) -> list:
    import great_expectations.expectations as gxe

    low, high = (bound / manifest.num_classes for bound in CLASS_SHARE_BOUNDS)
    return [
        gxe.ExpectColumnValuesToBeBetween(
            column="fraction",
            min_value=low,
            max_value=high,
            meta={"check": f"each class {low:.0%}..{high:.0%} of its split"},
        ),
        gxe.ExpectTableRowCountToBeBetween(
            max_value=len(manifest.split_names) * manifest.num_classes,
            meta={"check": "no classes beyond num_classes"},
        ),
    ]


def file_expectations(declared: FileExpectations) -> list:
    """The spec's expectations on its own files, as GX expectations on their rows."""
    import great_expectations.expectations as gxe
    import pyarrow as pa

    mark = "(dataset.expectations)"
    expectations = []
    if declared.rows is not None:
        low, high = declared.rows.min, declared.rows.max
        expectations.append(
            gxe.ExpectTableRowCountToBeBetween(
                min_value=low, max_value=high, meta={"check": f"rows {low or 0}..{high or 'any'} {mark}"}
            )
        )
    for column, want in declared.columns.items():
        expectations.append(gxe.ExpectColumnToExist(column=column, meta={"check": f"{column} is a column {mark}"}))
        if want.type is not None:
            # The files' Arrow type, as the pandas dtype the rows frame gives it (string -> str, double -> float64).
            dtype = str(pa.array([], type=pa.type_for_alias(want.type)).to_pandas().dtype)
            expectations.append(
                gxe.ExpectColumnValuesToBeOfType(
                    column=column, type_=dtype, meta={"check": f"{column} is {want.type} {mark}"}
                )
            )
        if want.not_null:
            expectations.append(
                gxe.ExpectColumnValuesToNotBeNull(column=column, meta={"check": f"{column} has no empty values {mark}"})
            )
        if want.min is not None or want.max is not None:
            shown = f"{'' if want.min is None else f'{want.min:g}'}..{'' if want.max is None else f'{want.max:g}'}"
            expectations.append(
                gxe.ExpectColumnValuesToBeBetween(
                    column=column, min_value=want.min, max_value=want.max, meta={"check": f"{column} in {shown} {mark}"}
                )
            )
        if want.values is not None:
            expectations.append(
                gxe.ExpectColumnValuesToBeInSet(
                    column=column, value_set=want.values, meta={"check": f"{column} one of {want.values} {mark}"}
                )
            )
        if want.unique:
            expectations.append(
                gxe.ExpectColumnValuesToBeUnique(column=column, meta={"check": f"{column} has no value twice {mark}"})
            )
    return expectations


def _to_result(item: Any) -> ExpectationResult:
    config = item.expectation_config
    raw = item.result or {}
    details = {key: raw[key] for key in _DETAIL_KEYS if key in raw}
    for key in ("partial_unexpected_list", "unexpected_index_list"):
        if key in details:
            details[key] = details[key][:_MAX_LISTED]
    if item.exception_info and item.exception_info.get("raised_exception"):
        details["exception"] = item.exception_info.get("exception_message")
    row_condition = config.kwargs.get("row_condition")
    if row_condition:
        details["row_condition"] = str(row_condition)
    return ExpectationResult(
        expectation=config.type,
        column=_column_of(config.type, config.kwargs),
        success=bool(item.success),
        # Round-trip through JSON so numpy scalars become plain values fit for Dagster metadata.
        details=json.loads(json.dumps(details, default=str)),
        check=(config.meta or {}).get("check", ""),
    )


def _column_of(expectation: str, kwargs: dict[str, Any]) -> str | None:
    """The column an expectation is about; table-level ones (whose column_list is the schema) have none."""
    if expectation.startswith("expect_table_"):
        return None
    columns = kwargs.get("column_list")
    return kwargs.get("column") or (",".join(columns) if columns else None)
