"""The nsys SQLite export's tables and the SQL that reads them; every table and column name comes from
tables.yaml beside this module (they drift between nsys versions)."""

from __future__ import annotations

import sqlite3
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from mcp_server.children.contract import MEASURE_RANGE

TABLES_FILE = Path(__file__).with_name("tables.yaml")
OPEN_END = 2**63 - 1  # a push/pop range still open when the capture stopped


class NsysExportError(Exception):
    """The file is not an nsys SQLite export this reader understands; the message says what to do."""


@lru_cache(maxsize=1)
def tables() -> dict[str, Any]:
    """Table and column names of the nsys SQLite export (tables.yaml)."""
    return yaml.safe_load(TABLES_FILE.read_text(encoding="utf-8"))


def decode_global_tid(global_tid: int) -> tuple[int, int]:
    """(pid, tid) of an nsys serialized globalTid."""
    spec = tables()["global_tid"]
    return (global_tid >> spec["pid_shift"]) & spec["pid_mask"], global_tid & spec["tid_mask"]


def quote(identifier: str) -> str:
    """Quote an SQL identifier (names come from tables.yaml, never from user input)."""
    return '"' + identifier.replace('"', '""') + '"'


class Schema:
    """The export's tables and their columns, looked up once."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        self.tables = {row[0] for row in rows}
        self._columns: dict[str, set[str]] = {}

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            rows = self.conn.execute(f"PRAGMA table_info({quote(table)})").fetchall()
            self._columns[table] = {row[1] for row in rows}
        return self._columns[table]

    def require(self, table: str, *columns: str) -> None:
        missing = [c for c in columns if c not in self.columns(table)]
        if missing:
            raise NsysExportError(
                f"{table} has no column(s) {missing} (the reader expects the nsys {tables()['nsys_version']} "
                f"export schema in {TABLES_FILE.name}); re-export with that nsys version or update {TABLES_FILE}"
            )


def launch_subquery(schema: Schema, only: str | None = None) -> str | None:
    """SQL of (corr, thread, api_start): the earliest API call per correlation id over runtime and driver tables.

    `only`: SQL of a set of correlation ids to restrict it to (the same rows for those ids, much less work).
    """
    parts = []
    for api in tables()["launch_apis"]:
        if not schema.has(api["table"]):
            if api.get("optional"):
                continue
            raise NsysExportError(
                f"no {api['table']} table in the export; profile with nsys --trace=cuda so launches are recorded"
            )
        schema.require(api["table"], api["correlation_id"], api["thread"], api["start"])
        where = f" WHERE {quote(api['correlation_id'])} IN ({only})" if only else ""
        parts.append(
            f"SELECT {quote(api['correlation_id'])} AS corr, {quote(api['thread'])} AS thread, "
            f"{quote(api['start'])} AS api_start FROM {quote(api['table'])}{where}"
        )
    if not parts:
        return None
    # SQLite returns the bare column `thread` from the row holding MIN(api_start).
    return f"SELECT corr, thread, MIN(api_start) AS api_start FROM ({' UNION ALL '.join(parts)}) GROUP BY corr"


class NvtxSql:
    """The SQL that reads NVTX push/pop ranges, after checking the table's columns."""

    def __init__(self, schema: Schema) -> None:
        spec, strings = tables()["nvtx"], tables()["strings"]
        self.present = schema.has(spec["table"])
        if not self.present:
            return
        schema.require(spec["table"], spec["start"], spec["end"], spec["event_type"], spec["thread"])
        cols = schema.columns(spec["table"])
        self.has_text = spec["text"] in cols
        self.has_text_id = spec["text_id"] in cols and schema.has(strings["table"])
        if not (self.has_text or self.has_text_id):
            raise NsysExportError(
                f"{spec['table']} has neither {spec['text']} nor {spec['text_id']}; re-export with nsys"
            )
        self.schema, self.spec, self.strings = schema, spec, strings
        self.table = quote(spec["table"])
        self.where = f"n.{quote(spec['event_type'])} = ?"
        self.push_pop = spec["push_pop_event_type"]

    def measure_ranges(self) -> list[tuple[int, int, int]]:
        """(start, end, thread) of the ranges named `operator_profiler::measure`, sorted; open ends as OPEN_END.

        The text of a range is its `text`, else the StringIds value of its `textId` (a registered string).
        """
        spec, strings = self.spec, self.strings
        text, text_id = f"n.{quote(spec['text'])}", f"n.{quote(spec['text_id'])}"
        # range_name(text) == MEASURE_RANGE: the text is the name, or the name followed by `, ` and fields.
        named = "({0} = ? OR substr({0}, 1, ?) = ?)"
        prefix = MEASURE_RANGE + ", "
        match_args = (MEASURE_RANGE, len(prefix), prefix)
        args: tuple[str | int, ...]
        registered = (
            f"{text_id} IN (SELECT {quote(strings['id'])} FROM {quote(strings['table'])} "
            f"WHERE {named.format(quote(strings['value']))})"
        )
        if self.has_text and self.has_text_id:
            match = f"(({text} IS NOT NULL AND {named.format(text)}) OR ({text} IS NULL AND {registered}))"
            args = match_args + match_args
        elif self.has_text_id:
            match, args = registered, match_args
        else:
            match, args = named.format(text), match_args
        sql = (
            f"SELECT n.{quote(spec['start'])}, n.{quote(spec['end'])}, n.{quote(spec['thread'])} FROM {self.table} n "
            f"WHERE {self.where} AND {match}"
        )
        rows = self.schema.conn.execute(sql, (self.push_pop, *args)).fetchall()
        return sorted((start, OPEN_END if end is None else end, thread) for start, end, thread in rows)

    def ranges(self, table_order: bool) -> tuple[sqlite3.Cursor, bool]:
        """(start, end, thread, text, textId) of every push/pop range: by start, then end descending, then table order.

        nsys writes the table in that order: with `table_order` the rows come in table order, unsorted, and the
        second value says that the reader must check the order as they come (see `RangesOutOfOrder`).
        """
        spec = self.spec
        start, end = f"n.{quote(spec['start'])}", f"n.{quote(spec['end'])}"
        text = f"n.{quote(spec['text'])}" if self.has_text else "NULL"
        text_id = f"n.{quote(spec['text_id'])}" if self.has_text_id else "NULL"
        thread = f"n.{quote(spec['thread'])}"
        select = f"SELECT {start}, {end}, {thread}, {text}, {text_id} FROM {self.table} n WHERE {self.where}"
        end_key = f"COALESCE({end}, {OPEN_END})"
        conn = self.schema.conn
        try:
            order = "n.rowid" if table_order else f"{start}, {end_key} DESC, n.rowid"
            return conn.execute(f"{select} ORDER BY {order}", (self.push_pop,)), table_order
        except sqlite3.OperationalError:  # a view: no rowid, no table order, no ties broken by it
            return conn.execute(f"{select} ORDER BY {start}, {end_key} DESC", (self.push_pop,)), False


def kernel_sql(schema: Schema, launches: str | None) -> str:
    """Window-candidate kernel rows in launch order, with StringIds references (not values) for the names."""
    spec = tables()["kernel"]
    cols = schema.columns(spec["table"])
    name_col = next((c for c in spec["name"] if c in cols), None)
    if name_col is None:
        raise NsysExportError(f"{spec['table']} has none of the name columns {spec['name']}; re-export with nsys")
    schema.require(
        spec["table"], spec["start"], spec["end"], spec["device_id"], spec["stream_id"], spec["correlation_id"],
        *spec["grid"], *spec["block"], spec["registers_per_thread"], *spec["shared_memory"],
    )
    k = {key: f"k.{quote(spec[key])}" for key in ("start", "end", "device_id", "stream_id", "correlation_id")}
    mangled = f"k.{quote(spec['mangled_name'])}" if spec["mangled_name"] in cols else "NULL"
    select = [
        k["start"], k["end"], k["device_id"], k["stream_id"], k["correlation_id"], f"k.{quote(name_col)}", mangled,
        *(f"k.{quote(c)}" for c in spec["grid"]), *(f"k.{quote(c)}" for c in spec["block"]),
        f"k.{quote(spec['registers_per_thread'])}", " + ".join(f"k.{quote(c)}" for c in spec["shared_memory"]),
        "l.thread" if launches else "NULL", "l.api_start" if launches else "NULL",
        f"k.{quote(spec['graph_node_id'])}" if spec["graph_node_id"] in cols else "NULL",
    ]
    sql = f"SELECT {', '.join(select)} FROM {quote(spec['table'])} k "
    if launches:
        sql += f"LEFT JOIN ({launches}) l ON l.corr = {k['correlation_id']} "
        return sql + f"ORDER BY COALESCE(l.api_start, {k['start']}), {k['start']}, {k['correlation_id']}"
    return sql + f"ORDER BY {k['start']}, {k['correlation_id']}"


class Strings:
    """StringIds values by id, looked up on first use (an export may hold millions of strings; kernels use few)."""

    def __init__(self, schema: Schema) -> None:
        strings = tables()["strings"]
        self.sql = f"SELECT {quote(strings['value'])} FROM {quote(strings['table'])} WHERE {quote(strings['id'])} = ?"
        self.conn = schema.conn
        self.values: dict[Any, str | None] = {None: None}

    def __getitem__(self, sid: Any) -> str | None:
        try:
            return self.values[sid]
        except KeyError:
            row = self.conn.execute(self.sql, (sid,)).fetchone()
            value = self.values[sid] = None if row is None else row[0]
            return value


