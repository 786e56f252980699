"""The lake's tables, generated from the one declaration (forksight.base.tables): the same columns as
the DuckDB tables plus `collector` (which collector wrote the row; a run is (collector, run_id) in the
lake, so two collectors' runs of one name never merge), their partitioning, schema evolution on start
and the Arrow shape an append must have."""
from __future__ import annotations

import pyarrow as pa

from forksight.base.tables import ALERTS, HISTOGRAMS, PROBES, REFERENCE, RUNS, SAMPLES, SCALARS, TOKENS, Table
from forksight.monitor.lake.errors import LakeError

NAMESPACE = "forksight"
COLLECTOR = "collector"            # the one column the lake adds
# rows per Parquet row group of a step table (pyiceberg's default is 1M): with rows in step order,
# a read of one step decodes the few groups whose step range holds it, not the whole file
ROW_GROUP_ROWS = 16_384
ROW_GROUP_PROP = "write.parquet.row-group-limit"
# retention on every table, so a collector left running for months keeps bounded metadata: the committer
# expires snapshots older than the table's max age on its own schedule (an operator may change the property
# per table), and each commit deletes metadata files past the last PREVIOUS_VERSIONS
RETENTION = {"history.expire.max-snapshot-age-ms": str(6 * 3600 * 1000),       # forksight reads the current one
             "history.expire.min-snapshots-to-keep": "1",
             "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "20"}
STEP_BLOCK = 1000                  # steps per partition: a read of a step range touches its blocks only
STEP_TABLES = (SCALARS, TOKENS, SAMPLES, HISTOGRAMS, PROBES, REFERENCE)     # appended from the outbox
STATE_TABLES = (RUNS, ALERTS)                            # overwritten per changed run
LAKE_TABLES = {t.name: t for t in (*STEP_TABLES, *STATE_TABLES)}


def _iceberg_type(arrow: pa.DataType):
    from pyiceberg.types import BooleanType, DoubleType, FloatType, IntegerType, LongType, StringType

    return {pa.string(): StringType(), pa.int64(): LongType(), pa.int32(): IntegerType(),
            pa.float64(): DoubleType(), pa.float32(): FloatType(), pa.bool_(): BooleanType()}[arrow]


def identifier(table: str) -> str:
    return f"{NAMESPACE}.{table}"


def iceberg_schema(spec: Table):
    """The Iceberg schema of one table: `collector`, then the spec's columns; all optional, so a
    column added later is an ordinary schema evolution."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField, StringType

    fields = [NestedField(1, COLLECTOR, StringType(), required=False)]
    fields += [NestedField(i + 2, c.name, _iceberg_type(c.arrow), required=False, doc=c.help)
               for i, c in enumerate(spec.columns)]
    return Schema(*fields)


def partition_spec(spec: Table, schema):
    """collector, then run_id (runs: collector only), then step in blocks of STEP_BLOCK."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform, TruncateTransform

    names = [COLLECTOR] + (["run_id"] if spec is not RUNS else [])
    fields = [PartitionField(schema.find_field(n).field_id, 1000 + i, IdentityTransform(), n)
              for i, n in enumerate(names)]
    if spec in STEP_TABLES:
        fields.append(PartitionField(schema.find_field("step").field_id, 1000 + len(fields),
                                     TruncateTransform(STEP_BLOCK), f"step_{STEP_BLOCK}"))
    return PartitionSpec(*fields)


# a lake column may be wider than the spec's (written by a later forksight, or by another engine)
_WIDER = {(pa.int32(), "long"), (pa.float32(), "double")}


def ensure_table(catalog, spec: Table):
    """Create the table if missing; add the spec's columns the lake lacks; LakeError naming the
    table and column when a lake column's type cannot hold the spec's."""
    schema = iceberg_schema(spec)
    props = ({ROW_GROUP_PROP: str(ROW_GROUP_ROWS)} if spec in STEP_TABLES else {}) | RETENTION
    table = catalog.create_table_if_not_exists(identifier(spec.name), schema=schema,
                                               partition_spec=partition_spec(spec, schema), properties=props)
    unset = {k: v for k, v in props.items() if k not in table.properties}
    if unset:             # a lake created by an older forksight (a value set by an operator stays)
        with table.transaction() as tx:
            tx.set_properties(unset)
    current = {f.name: f for f in table.schema().fields}
    missing = []
    for column in (COLLECTOR, *spec.names):
        want = schema.find_field(column).field_type
        have = current.get(column)
        if have is None:
            missing.append((column, want))
        elif have.field_type != want and (spec.column(column).arrow, str(have.field_type)) not in _WIDER:
            raise LakeError(f"lake table {identifier(spec.name)}: column {column!r} is {have.field_type} in the "
                            f"lake but forksight writes {want}; rename or drop that column in the lake (or "
                            "point --lake-warehouse/--lake-catalog at another lake)")
    if missing:
        with table.update_schema() as update:
            for column, kind in missing:
                update.add_column(column, kind, doc=spec.column(column).help if column != COLLECTOR else None)
    return table


def conform(rows: pa.Table, collector: str, table) -> pa.Table:
    """`rows` (a spec's columns) as the lake table's Arrow schema: `collector` filled, every lake
    column present (null where the spec lacks it), types cast."""
    target = table.schema().as_arrow()
    n = rows.num_rows
    columns = []
    for field in target:
        if field.name == COLLECTOR:
            col = pa.array([collector] * n, pa.string())
        elif field.name in rows.column_names:
            col = rows[field.name]
        else:
            col = pa.nulls(n, field.type)
        columns.append(col.cast(field.type))
    return pa.Table.from_arrays(columns, schema=target)
