"""Rewrite a pypaimon-written table's manifests in Paimon 0.9's layout.

Paimon 0.9 wrote a data file's metadata with 16 fields (its
``DataFileMeta09Serializer``: no ``_VALUE_STATS_COLS``, ``_EXTERNAL_PATH``,
``_FIRST_ROW_ID``, ``_WRITE_COLS``), and manifest-list entries without the
bucket, level and row-id ranges. Rewriting a table written by pypaimon that
way gives a table laid out as 0.9 wrote it, with the same rows.
"""

from __future__ import annotations

import copy
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro

__all__ = ["DATA_FILE_09_FIELDS", "rewrite_as_paimon_09"]

DATA_FILE_09_FIELDS = (
    "_FILE_NAME", "_FILE_SIZE", "_ROW_COUNT", "_MIN_KEY", "_MAX_KEY", "_KEY_STATS",
    "_VALUE_STATS", "_MIN_SEQUENCE_NUMBER", "_MAX_SEQUENCE_NUMBER", "_SCHEMA_ID", "_LEVEL",
    "_EXTRA_FILES", "_CREATION_TIME", "_DELETE_ROW_COUNT", "_EMBEDDED_FILE_INDEX",
    "_FILE_SOURCE",
)
MANIFEST_FILE_09_FIELDS = (
    "_VERSION", "_FILE_NAME", "_FILE_SIZE", "_NUM_ADDED_FILES", "_NUM_DELETED_FILES",
    "_PARTITION_STATS", "_SCHEMA_ID",
)


def _read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        schema = copy.deepcopy(reader.writer_schema)
        codec = reader.codec
        records = list(reader)
    assert isinstance(schema, dict)
    return schema, records, codec


def _write(path: Path, schema: dict[str, Any], records: list[dict[str, Any]], codec: str) -> int:
    buf = BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(schema), records, codec=codec)
    data = buf.getvalue()
    path.write_bytes(data)
    return len(data)


def _only(schema: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    schema["fields"] = [f for f in schema["fields"] if f["name"] in names]
    assert [f["name"] for f in schema["fields"]] == list(names), schema["fields"]
    return schema


def _all_null_stats(fields: list[Any]) -> dict[str, Any]:
    """Value stats over every column, each unknown (what 0.9 held with
    its stats mode off): 0.9 had no way to say "stats of no column"."""
    from pypaimon.table.row.generic_row import GenericRow, GenericRowSerializer

    row = GenericRowSerializer.to_bytes(GenericRow([None] * len(fields), fields))
    return {"_MIN_VALUES": row, "_MAX_VALUES": row, "_NULL_COUNTS": [None] * len(fields)}


def rewrite_as_paimon_09(table: Any) -> int:
    """Rewrite every manifest and manifest list of the pypaimon ``table``
    in 0.9's layout; returns the number of data-file entries."""
    manifest_dir = Path(str(table.table_path)) / "manifest"
    no_stats = _all_null_stats(list(table.fields))
    sizes: dict[str, int] = {}
    entries = 0
    for path in sorted(manifest_dir.glob("manifest-*")):
        if path.name.startswith("manifest-list-"):
            continue
        schema, records, codec = _read(path)
        file_schema = next(f for f in schema["fields"] if f["name"] == "_FILE")["type"]
        _only(file_schema, DATA_FILE_09_FIELDS)
        for record in records:
            cols = record["_FILE"].get("_VALUE_STATS_COLS")
            if cols is not None:  # stats of some columns only: 0.9 cannot say so
                assert cols == [], f"{path.name}: value stats of {cols} only"
                record["_FILE"]["_VALUE_STATS"] = no_stats
            record["_FILE"] = {k: record["_FILE"][k] for k in DATA_FILE_09_FIELDS}
        sizes[path.name] = _write(path, schema, records, codec)
        entries += len(records)
    for path in sorted(manifest_dir.glob("manifest-list-*")):
        schema, records, codec = _read(path)
        _only(schema, MANIFEST_FILE_09_FIELDS)
        rewritten = []
        for record in records:
            record = {k: record[k] for k in MANIFEST_FILE_09_FIELDS}
            record["_FILE_SIZE"] = sizes.get(record["_FILE_NAME"], record["_FILE_SIZE"])
            rewritten.append(record)
        _write(path, schema, rewritten, codec)
    return entries
