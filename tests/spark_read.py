"""Run by the Spark venv's python (make lake-spark): PySpark in local mode reads the Parquet data files
given as JSON {table: [path, ...]} on argv[1] and prints {table: {"count": n, "rows": [...]}} as JSON,
each table's rows without the lake's `collector` column. No forksight import: Spark sees files only."""
from __future__ import annotations

import json
import sys


def main() -> int:
    from pyspark.sql import SparkSession

    wanted = json.loads(sys.argv[1])
    spark = (SparkSession.builder.master("local[1]").appName("forksight-lake-read")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out = {}
    try:
        for name, paths in wanted.items():
            # mergeSchema: a file written before a column was added to the lake lacks it (null there)
            frame = spark.read.option("mergeSchema", "true").parquet(*paths).drop("collector")
            out[name] = {"count": frame.count(), "rows": [r.asDict() for r in frame.collect()]}
    finally:
        spark.stop()
    print("SPARK-JSON " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
