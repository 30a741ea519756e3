"""logger=csv: the run's scalars as a table for pandas, and its options and final figures as one row.

metrics.csv is wide, as Lightning's CSVLogger writes it and as `pandas.read_csv` then `df.plot(x="step")`
want it: a `step` column, then a column per tag in the order the tags first came, one row per
logged step, a cell left empty where a tag was not logged at that step. A tag that first comes after
rows were written (validation's, at the end of the first epoch) rewrites the file with the wider
header; that happens once per tag, in the first epoch. (A long file, `step,tag,value`, would never
rewrite, but pandas would have to pivot it before the first plot.)

hparams.csv is one header and one row, so that a sweep's concatenate into its table:
`pd.concat(map(pd.read_csv, Path("multirun/...").glob("*/hparams.csv")))`.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from config.schema import LoggerConfig, RunConfig

Row = dict[str, float]


class CsvLogger:
    takes_images = False

    def __init__(self, cfg: LoggerConfig, job: RunConfig) -> None:
        self.path = job.run_dir / "metrics.csv"
        self.hparams_path = job.run_dir / "hparams.csv"
        self.columns: list[str] = ["step"]
        self.rows: list[Row] = []
        if self.path.exists():  # a resumed run: its rows so far
            self.columns, self.rows = _read(self.path)
        self._resumed = bool(self.rows)
        self._file = self.path.open("w", newline="")
        self._last_row_at = 0  # where the last row starts in the file
        self._rewrite()

    def log_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """A step's values; several calls at one step fill one row. A resumed run's first step
        drops the rows from that step on, which the run logs again from its checkpoint: the file
        reads as an unbroken run's."""
        if not values:
            return
        values = {tag: float(value) for tag, value in values.items()}
        new_tags = [tag for tag in values if tag not in self.columns]
        self.columns += new_tags
        rewound, self._resumed = self._resumed, False
        if rewound:
            self.rows = [row for row in self.rows if row["step"] < step]
        same_step = bool(self.rows) and self.rows[-1]["step"] == step
        if same_step:
            self.rows[-1].update(values)
        else:
            self.rows.append({"step": step, **values})
        if new_tags or rewound:
            self._rewrite()
        elif same_step:
            self._rewrite_last()
        else:
            self._append()

    def log_image(self, step: int, tag: str, hwc: np.ndarray) -> None:
        """A table holds no images."""

    def log_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
        row = {**hparams, **metrics}
        with self.hparams_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(row)
            writer.writerow(_cell(value) for value in row.values())

    def close(self) -> None:
        self._file.close()

    def _line(self, row: Row) -> str:
        out = io.StringIO()
        csv.writer(out).writerow(row.get(column, "") for column in self.columns)
        return out.getvalue()

    def _rewrite(self) -> None:
        self._file.seek(0)
        self._file.truncate()
        self._file.write(self._line({column: column for column in self.columns}))  # the header
        self._file.flush()
        for row in self.rows:
            self._append(row)

    def _append(self, row: Row | None = None) -> None:
        self._last_row_at = self._file.tell()
        self._file.write(self._line(self.rows[-1] if row is None else row))
        self._file.flush()  # a killed run keeps every row it logged

    def _rewrite_last(self) -> None:
        self._file.seek(self._last_row_at)
        self._file.truncate()
        self._append()


def _read(path: Path) -> tuple[list[str], list[Row]]:
    """The header and rows of a metrics.csv this logger wrote; a last line cut off by a kill is dropped."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines.pop()
    table = list(csv.reader(lines))
    if not table:
        return ["step"], []
    columns = table[0]
    rows = [{c: float(v) for c, v in zip(columns, cells) if v != ""} for cells in table[1:]]
    return columns, [{**row, "step": int(row["step"])} for row in rows]


def _cell(value: Any) -> Any:
    """A value as pandas reads it back: numbers and strings as they are, lists and dicts as JSON."""
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, (list, tuple, dict)) else value
