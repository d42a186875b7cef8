"""The results database: every `bench`, `optimize` and `create` run appends its rows to one
SQLite file, which `kernelwright results` queries and the README's tables are generated from.

Where: `path` if given, else $KERNELWRIGHT_RESULTS_DB, else kernelwright-runs/results.db
(relative to the working directory, beside the workflows' other outputs).

Schema (version in the `meta` table; created on first use):
- `runs`: one row per invocation — run_id, source (bench | optimize | create), when it started,
  the command line. `seq` orders runs ("--run latest" is the highest).
- `results`: one row per measurement — run_id, source, tag (optimize: the variant, "v3";
  imported rows: the file), then every column of `harness.BenchRow` under its own name (the
  CSV's schema: one source of truth), then two derived columns: `host_inclusive_ms` (ms_p50
  when the timer included the host's launch cost, as a user's eager loop sees it; NULL for
  GPU-only, interpreter and placeholder timings) and `cpu_us_per_call` (host_ms in µs: the
  CPU's time to issue one call). NaN numbers are stored as NULL, a commit of "unknown" as NULL.
A `BenchRow` field added later becomes a column of an existing database the next time it is
opened (ALTER TABLE ADD COLUMN); a database written by a newer schema version is refused.

A file that is not one of these databases (another SQLite database, or not SQLite at all) is
refused before anything is written into it; a missing or empty (0-byte) file becomes one.

Concurrent appends are safe: each `append` is one `BEGIN IMMEDIATE` transaction (SQLite's
file lock serialises writers; a writer waits up to `TIMEOUT_S` for another to finish).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import shlex
import sqlite3
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta, timezone
from pathlib import Path

from kernelwright.bench.harness import COLUMNS, BenchRow

SCHEMA_VERSION = 1
ENV_VAR = "KERNELWRIGHT_RESULTS_DB"
DEFAULT_PATH = Path("kernelwright-runs") / "results.db"
SOURCES = ("bench", "optimize", "create")
TIMEOUT_S = 60.0

RUN_COLUMNS = ("run_id", "source", "tag")
DERIVED_COLUMNS = ("host_inclusive_ms", "cpu_us_per_call")
_SQL_TYPE = {"float": "REAL", "int": "INTEGER", "str": "TEXT"}
# annotations are strings under `from __future__ import annotations`; accept both forms
_ROW_TYPES = {f.name: getattr(f.type, "__name__", f.type) for f in fields(BenchRow)}


class ResultsDBError(RuntimeError):
    """A results database that is missing, of a newer schema, or asked something it cannot
    answer; the message says what to do."""


def db_path(path: str | Path | None = None) -> Path:
    """The database file: `path`, else $KERNELWRIGHT_RESULTS_DB, else the default."""
    if path is not None and str(path):
        return Path(path)
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


def new_run_id() -> str:
    """A run id, unique and sortable by time: "20261126T074059Z-1a2b3c"."""
    now = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:6]}"


def columns() -> tuple[str, ...]:
    """The `results` table's columns after its id, in order."""
    return RUN_COLUMNS + COLUMNS + DERIVED_COLUMNS


def _q(name: str) -> str:
    return f'"{name}"'  # quoted: "commit" is an SQL keyword


def _column_sql(name: str) -> str:
    if name in RUN_COLUMNS:
        return f"{_q(name)} TEXT NOT NULL DEFAULT ''"
    if name in DERIVED_COLUMNS:
        return f"{_q(name)} REAL"
    return f"{_q(name)} {_SQL_TYPE[_ROW_TYPES[name]]}"


def _to_sql(name: str, value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if name == "commit" and value in ("", "unknown"):
        return None
    return value


def _db_values(row: BenchRow) -> dict:
    values = asdict(row)
    host = row.ms_p50 if row.host_inclusive and row.ok else math.nan
    values["host_inclusive_ms"] = host
    values["cpu_us_per_call"] = row.host_ms * 1e3
    return values


# --------------------------------------------------------------------------- the database


_HOW_TO_FILL = (
    "by running `kernelwright bench OP` (bench appends to it, and optimize and create on a GPU), "
    "or load earlier bench CSVs with `kernelwright results import CSV...`"
)


def _tables(con: sqlite3.Connection) -> list[str]:
    """The file's tables; raises sqlite3.DatabaseError for a file that is not SQLite."""
    got = con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
    return [r[0] for r in got if not r[0].startswith("sqlite_")]


def _is_ours(con: sqlite3.Connection, tables: list[str]) -> bool:
    if "meta" not in tables:
        return False
    try:  # another program's `meta` table need not have these columns
        return con.execute("SELECT 1 FROM meta WHERE key='schema_version'").fetchone() is not None
    except sqlite3.DatabaseError:
        return False


def _not_ours(path: Path, why: str) -> ResultsDBError:
    return ResultsDBError(
        f"{path} is not a {why}: kernelwright leaves it as it is. Choose another file with "
        f"--db or ${ENV_VAR}, or remove this one"
    )


class ResultsDB:
    """One SQLite results file. `ResultsDB(path)` creates it on the first append;
    `ResultsDB.existing(path)` refuses a missing or empty one with a sentence saying how to
    fill one; `ResultsDB.writable(path)` checks, before any work, that rows can be appended."""

    def __init__(self, path: str | Path | None = None):
        self.path = db_path(path)

    @classmethod
    def existing(cls, path: str | Path | None = None) -> ResultsDB:
        db = cls(path)
        if db.path.is_dir():  # named as a folder: bench would refuse it as --db too
            raise ResultsDBError(f"{db.path} is a folder: --db takes a file")
        if not db.path.is_file():
            raise ResultsDBError(
                f"no results database at {db.path}. Create one {_HOW_TO_FILL}; another file "
                f"is chosen with --db or ${ENV_VAR}."
            )
        with db._connect() as con:
            if not db._check_file(con):
                raise ResultsDBError(f"{db.path} is empty: no rows yet. Add some {_HOW_TO_FILL}.")
        return db

    @classmethod
    def writable(cls, path: str | Path | None = None) -> ResultsDB:
        """The database rows will be appended to, checked before anything is measured: a
        missing or empty file is fine (the first append makes it a results database); another
        SQLite database, a file that is not SQLite, a newer schema, or a path where no file can
        be made or written raise `ResultsDBError`."""
        db = cls(path)
        if db.path.is_dir():
            raise ResultsDBError(f"{db.path} is a folder: --db takes a file")
        # else the first append fails after the measuring; the nearest existing folder:
        folder = db.path.parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir():
            raise ResultsDBError(f"cannot make {db.path}: {folder} is a file, not a folder")
        for t in (db.path, folder) if db.path.exists() else (folder,):  # SQLite's journal too
            if not os.access(t, os.W_OK):
                raise ResultsDBError(f"cannot write {db.path}: no write permission on {t}")
        if db.path.exists():
            with db._connect() as con:
                db._check_file(con)
        return db

    def _check_file(self, con: sqlite3.Connection) -> bool:
        """False for a file with no tables (new or 0-byte), True for a results database this
        kernelwright reads; `ResultsDBError` for anything else. Writes nothing."""
        try:
            tables = _tables(con)
        except sqlite3.DatabaseError as e:
            raise _not_ours(self.path, f"results database (not an SQLite file: {e})") from None
        if not tables:
            return False
        if not _is_ours(con, tables):
            raise _not_ours(
                self.path,
                f"kernelwright results database (an SQLite database with tables "
                f"{', '.join(tables)})",
            )
        self._check_version(con)
        return True

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(self.path, timeout=TIMEOUT_S, isolation_level=None)
        con.row_factory = sqlite3.Row
        try:
            yield con
        finally:
            con.close()

    def _check_version(self, con: sqlite3.Connection) -> None:
        has_meta = con.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if not has_meta:
            raise ResultsDBError(f"{self.path} is not a kernelwright results database")
        got = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if got is None or int(got[0]) > SCHEMA_VERSION:
            raise ResultsDBError(
                f"{self.path} has results schema version {got[0] if got else '?'}, newer than "
                f"this kernelwright's ({SCHEMA_VERSION}): upgrade kernelwright to read it"
            )

    def _ensure_schema(self, con: sqlite3.Connection) -> None:
        """Inside the caller's write transaction: create what is missing, add new columns."""
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        con.execute(
            "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?), ('created', ?)",
            (str(SCHEMA_VERSION), datetime.now(timezone.utc).isoformat(timespec="seconds")),
        )
        self._check_version(con)
        con.execute(
            "CREATE TABLE IF NOT EXISTS runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            "run_id TEXT NOT NULL UNIQUE, source TEXT NOT NULL, started TEXT NOT NULL, "
            "command TEXT NOT NULL DEFAULT '')"
        )
        cols = ", ".join(_column_sql(c) for c in columns())
        con.execute(
            f"CREATE TABLE IF NOT EXISTS results (id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})"
        )
        have = {r["name"] for r in con.execute("PRAGMA table_info(results)")}
        for c in columns():
            if c not in have:  # a BenchRow field added since this file was made
                con.execute(f"ALTER TABLE results ADD COLUMN {_column_sql(c)}")
        con.execute("CREATE INDEX IF NOT EXISTS results_key ON results (op, shape, mode)")
        con.execute("CREATE INDEX IF NOT EXISTS results_run ON results (run_id)")

    def append(
        self,
        rows: Iterable[BenchRow],
        *,
        source: str,
        run_id: str,
        tag: str = "",
        command: str | None = None,
    ) -> int:
        """Add `rows` under `run_id` in one transaction (the run is registered on its first
        append; later appends of the same run add to it). Returns the number of rows added."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
        rows = list(rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cols = columns()
        names, marks = ", ".join(map(_q, cols)), ", ".join("?" * len(cols))
        sql = f"INSERT INTO results ({names}) VALUES ({marks})"
        cmd = command if command is not None else shlex.join(sys.argv)
        with self._connect() as con:
            try:
                con.execute("BEGIN IMMEDIATE")
            except sqlite3.DatabaseError:
                self._check_file(con)  # raises its ResultsDBError for a file that is not SQLite
                raise
            try:
                self._check_file(con)  # nothing is written into another program's database
                self._ensure_schema(con)
                started = rows[0].timestamp if rows and rows[0].timestamp else _now()
                con.execute(
                    "INSERT OR IGNORE INTO runs (run_id, source, started, command) "
                    "VALUES (?, ?, ?, ?)",
                    (run_id, source, started, cmd),
                )
                for r in rows:
                    values = _db_values(r) | {"run_id": run_id, "source": source, "tag": tag}
                    con.execute(sql, [_to_sql(c, values[c]) for c in cols])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
        return len(rows)

    def has_run(self, run_id: str) -> bool:
        if not self.path.is_file():
            return False
        with self._connect() as con:
            if not self._check_file(con):  # no tables yet
                return False
            got = con.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone()
            return got is not None

    def distinct(self, column: str) -> list[str]:
        if column not in columns():
            raise ValueError(f"no column {column!r}")
        with self._connect() as con:
            c = _q(column)
            got = con.execute(f"SELECT DISTINCT {c} FROM results WHERE {c} IS NOT NULL ORDER BY 1")
            return [str(r[0]) for r in got]

    def runs(self) -> list[dict]:
        """Every run, oldest first, with its row count."""
        with self._connect() as con:
            got = con.execute(
                "SELECT r.seq, r.run_id, r.source, r.started, r.command, COUNT(x.id) AS n_rows "
                "FROM runs r LEFT JOIN results x ON x.run_id = r.run_id "
                "GROUP BY r.run_id ORDER BY r.seq"
            )
            return [dict(r) for r in got]

    def query(self, f: Filters | None = None) -> list[dict]:
        """The rows matching `f`, in the order they were appended (run by run). Unknown filter
        values raise `ResultsDBError` listing the known ones."""
        f = f or Filters()
        where, args = self._where(f)
        sql = (
            "SELECT x.*, r.seq AS run_seq FROM results x JOIN runs r ON r.run_id = x.run_id"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY r.seq, x.id"
        )
        with self._connect() as con:
            return [_from_sql(dict(r)) for r in con.execute(sql, args)]

    def _where(self, f: Filters) -> tuple[list[str], list]:
        where: list[str] = []
        args: list = []
        for col in ("op", "provider", "dtype", "mode", "source"):
            value = getattr(f, col)
            if value is None:
                continue
            known = self.distinct(col)
            if value not in known:
                raise ResultsDBError(
                    f"no rows with {col} {value!r} in {self.path}; known: "
                    + (", ".join(known) or "none")
                )
            where.append(f"x.{col} = ?")
            args.append(value)
        if f.gpu is not None:
            gpus = self.distinct("gpu")
            archs = self.distinct("arch")
            if not any(_gpu_matches(f.gpu, g) for g in gpus) and f.gpu not in archs:
                raise ResultsDBError(
                    f"no rows on a GPU matching {f.gpu!r} in {self.path}; known: "
                    + ", ".join(gpus + archs)
                )
            where.append("(x.arch = ? OR instr(lower(x.gpu), lower(?)) > 0)")
            args += [f.gpu, f.gpu]
        if f.since is not None:
            where.append("x.timestamp >= ?")
            args.append(parse_since(f.since))
        if f.run is not None:
            run_id = self._resolve_run(f.run, where, args)
            where.append("x.run_id = ?")
            args.append(run_id)
        return where, args

    def _resolve_run(self, run: str, where: list[str], args: list) -> str:
        """The run id `run` names: for "latest", the newest run with rows matching the other
        filters; else a run id or a unique prefix of one."""
        with self._connect() as con:
            if run == "latest":
                sql = "SELECT x.run_id FROM results x JOIN runs r ON r.run_id = x.run_id"
                sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.seq DESC"
                got = con.execute(sql + " LIMIT 1", args).fetchone()
                if got is None:
                    raise ResultsDBError(f"no run in {self.path} has rows matching the filters")
                return got[0]
            ids = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY seq")]
        hits = [i for i in ids if i == run] or [i for i in ids if i.startswith(run)]
        if len(hits) != 1:
            why = "no run" if not hits else f"{len(hits)} runs start with"
            raise ResultsDBError(
                f"{why} {run!r} in {self.path}; the latest runs: "
                + ", ".join(ids[-5:][::-1] or ["none"])
                + " (or --run latest)"
            )
        return hits[0]


@dataclass
class Filters:
    """What `ResultsDB.query` selects; None = any. `gpu` matches part of the GPU's name
    (case-insensitive, "h100") or its arch ("sm_90"); `since` is a date/time or an age
    ("7d", "12h", "30m"); `run` is "latest", a run id or a unique prefix of one."""

    op: str | None = None
    provider: str | None = None
    gpu: str | None = None
    dtype: str | None = None
    mode: str | None = None
    source: str | None = None
    run: str | None = None
    since: str | None = None


def _gpu_matches(wanted: str, gpu: str) -> bool:
    return wanted.lower() in gpu.lower()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def parse_since(text: str) -> str:
    """An ISO timestamp (UTC) from a date "YYYY-MM-DD", a time "YYYY-MM-DDTHH:MM" or an age
    "7d"/"12h"/"30m"."""
    age = re.fullmatch(r"(\d+)\s*([dhm])", text.strip())
    if age:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[age.group(2)]
        when = datetime.now(timezone.utc) - timedelta(**{unit: int(age.group(1))})
    else:
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ResultsDBError(
                f"--since {text!r}: give a date or time (YYYY-MM-DD, YYYY-MM-DDTHH:MM) or an "
                "age (7d, 12h, 30m)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def _from_sql(d: dict) -> dict:
    """NULL numbers back to NaN (the rows' convention), NULL text to ""."""
    for k, v in d.items():
        if v is None:
            kind = _ROW_TYPES.get(k, "float" if k in DERIVED_COLUMNS else "str")
            d[k] = math.nan if kind == "float" else ("" if kind == "str" else 0)
    return d


def as_bench_row(d: dict) -> BenchRow:
    """A queried row as a `BenchRow` (for the report's summaries); the run columns drop."""
    return BenchRow(**{c: d[c] for c in COLUMNS})


# --------------------------------------------------------------------------- recording hooks


def record(
    rows: Sequence[BenchRow],
    *,
    source: str,
    run_id: str,
    tag: str = "",
    path: str | Path | None = None,
) -> int:
    """Append a run's rows to the results database (the workflows' one-line hook). Rows with
    placeholder timings (optimize's dry run models times, it does not measure them) are not
    recorded."""
    kept = [r for r in rows if r.timing != "placeholder"]
    if not kept:
        return 0
    return ResultsDB(path).append(kept, source=source, run_id=run_id, tag=tag)


# --------------------------------------------------------------------------- CSV in and out


# the arch of a GPU named in an imported CSV that predates the arch column
_ARCH_BY_GPU = (
    (r"\bg?h[12]00\b", "sm_90"),
    (r"\ba100\b", "sm_80"),
    (r"\bg?b[23]00\b", "sm_100"),
    (r"interpreter", "cpu-interpreter"),
)


def _guess_arch(gpu: str) -> str:
    for pattern, arch in _ARCH_BY_GPU:
        if re.search(pattern, gpu.lower()):
            return arch
    return ""


def _guess_dims(op: str, shape: str) -> str:
    from kernelwright.bench.specs import SPECS

    spec = SPECS.get(op)
    parts = shape.split("x")
    if spec is None or len(parts) != len(spec.dims) or not all(p.isdigit() for p in parts):
        return ""
    return json.dumps({d: int(p) for d, p in zip(spec.dims, parts, strict=True)})


def _parse(name: str, text: str):
    kind = _ROW_TYPES.get(name)
    if kind == "float":
        return float(text) if text not in ("", "nan") else math.nan
    if kind == "int":
        return int(text) if text else 0
    return text


def _parse_cell(path: Path, rec: dict, name: str):
    """`_parse` of one cell (a short row's missing cell: empty); ValueError naming its place."""
    try:
        return _parse(name, rec[name] or "")
    except ValueError:
        kind = "a number" if _ROW_TYPES.get(name) == "float" else "an integer"
        raise ValueError(f"{path}:{rec['_line']}: {name} is {rec[name]!r}, not {kind}") from None


def _missing_columns(header: Sequence[str] | None) -> list[str]:
    """The bench CSV columns `header` lacks (those of every version of the CSV)."""
    return [c for c in COLUMNS[: COLUMNS.index("error") + 1] if c not in (header or ())]


def csv_missing_columns(path: str | Path) -> list[str]:
    """The bench CSV columns the file at `path` lacks: [] for a file `import_csv` reads."""
    try:
        with Path(path).open(newline="") as fh:
            return _missing_columns(csv.DictReader(fh).fieldnames)
    except (UnicodeDecodeError, csv.Error):
        return _missing_columns(None)


@dataclass
class ImportResult:
    path: Path
    rows: int = 0
    runs: int = 0
    skipped: str = ""  # why the file (or its runs) were not imported


def import_csv(db: ResultsDB, path: str | Path, *, source: str = "bench") -> ImportResult:
    """Load a bench CSV (as `report.write_csv` writes it, any earlier prefix of its columns)
    or an export of this database. Rows of one invocation share (gpu, commit, timestamp):
    each such group becomes one run of `source` (a create workflow's CSV: "create"), with an
    id derived from them, so importing a file twice adds nothing the second time. An export
    keeps its runs, sources and tags. A CSV of another schema, or not text, is skipped; a cell
    that is not of its column's type raises ValueError naming it, and nothing is added."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    path = Path(path)
    out = ImportResult(path)
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = _missing_columns(reader.fieldnames)
            if missing:
                out.skipped = f"not a bench CSV: no column {', '.join(missing)}"
                return out
            records = [rec | {"_line": reader.line_num} for rec in reader]  # for its errors
    except (UnicodeDecodeError, csv.Error) as e:
        out.skipped = f"not a bench CSV: {e}"
        return out
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        if "run_id" in rec and rec["run_id"]:
            key = (rec["run_id"], rec.get("source") or "bench", rec.get("tag", ""))
        else:
            ident = "|".join(rec.get(k) or "" for k in ("gpu", "commit", "timestamp"))
            run_id = "csv-" + hashlib.sha1(ident.encode()).hexdigest()[:12]
            key = (run_id, source, f"imported from {path.name}")
        groups.setdefault(key, []).append(rec)
    already = 0
    runs = []  # every row parsed before any is added: a malformed cell adds nothing
    for (run_id, source, tag), recs in groups.items():
        if db.has_run(run_id):
            already += 1
            continue
        rows = []
        for rec in recs:
            row = BenchRow(**{c: _parse_cell(path, rec, c) for c in COLUMNS if c in rec})
            row.arch = row.arch or _guess_arch(row.gpu)
            row.dims = row.dims or _guess_dims(row.op, row.shape)
            rows.append(row)
        runs.append((run_id, source, tag, rows))
    for run_id, source, tag, rows in runs:
        out.rows += db.append(rows, source=source, run_id=run_id, tag=tag, command=str(path))
        out.runs += 1
    if already:
        out.skipped = f"{already} run(s) already imported"
    return out


def write_rows_csv(rows: Iterable[dict], fh) -> None:
    """Queried rows as CSV: every column of the table (the bench CSV's and the run's), NaN
    as an empty cell; `import_csv` reads the file back, runs and tags kept."""
    cols = columns()
    writer = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow(
            {c: ("" if isinstance(r[c], float) and math.isnan(r[c]) else r[c]) for c in cols}
        )
