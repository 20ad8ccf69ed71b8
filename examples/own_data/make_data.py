"""Write this example's data: scikit-learn's bundled wine measurements as a folder of Parquet files.

Stands in for a team's own export (a warehouse dump, a Spark job's output): three part files, one column per
measurement and a `cultivar` label as text. Run it again and nothing changes: the files are rewritten with
the same bytes, so the snapshot is the same.

    python examples/own_data/make_data.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.datasets import load_wine  # bundled with scikit-learn: nothing is downloaded

OUT = Path(__file__).resolve().parent / "data"
PARTS = 3


def main() -> None:
    wine = load_wine(as_frame=True)
    frame = wine.frame.rename(columns={"od280/od315_of_diluted_wines": "od280_od315"})
    frame["cultivar"] = np.array(["barolo", "grignolino", "barbera"])[frame.pop("target")]
    table = pa.Table.from_pandas(frame, preserve_index=False)
    OUT.mkdir(exist_ok=True)
    for index, rows in enumerate(np.array_split(np.arange(table.num_rows), PARTS)):
        pq.write_table(table.take(pa.array(rows)), OUT / f"part-{index}.parquet")
    print(f"wrote {table.num_rows} rows in {PARTS} files to {OUT}")


if __name__ == "__main__":
    main()
