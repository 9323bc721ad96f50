"""Throughput of the Wide & Deep preprocessing's DuckDB engine against a plain DuckDB job doing the
same joins and aggregates, in the same run (issue 32: the engine >= 0.5x the plain job).

It generates Outbrain-format CSVs once (wide_and_deep/outbrain_synthetic.py, not timed), then times,
alternately and `--repeats` times each, two fresh processes on the wall clock:
  * engine: `python -m wide_and_deep.preprocessing --engine duckdb` end to end: every line checked
    and accounted for, the integer SQL, the numerics in numpy, the 4096-row TFRecords (TensorFlow
    imported for the record framing);
  * plain: one DuckDB script written the obvious way: typed `read_csv` of the seven files, the same
    joins (clicks, events with geo and platform, promoted content, both documents' metadata), the
    seeded split, the train-split CTR and view aggregates, the geo counts, the TF-IDF cosines, log2
    and min-max, written to one parquet file; no line accounting, no records.
Both use `--threads` threads. Lines/s = input lines (all seven files) / seconds; the best run of
each counts. Writes bench/results/wd_preproc.json and prints a table.
Usage: python -m bench.wd_preproc [--displays N] [--repeats R] [--threads T]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from recsys.runtime.cpu_settings import cpu_model_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results", "wd_preproc.json")
GOAL = 0.5

PLAIN_JOB = r"""
import sys, duckdb
src, out, threads = sys.argv[1], sys.argv[2], sys.argv[3]
con = duckdb.connect()
con.execute(f"SET threads = {threads}")
def csv(name):
    return f"read_csv('{src}/{name}.csv', header=true, nullstr=['', '\\N'])"
con.execute(f"CREATE TABLE clicks AS SELECT * FROM {csv('clicks_train')}")
con.execute(f'''CREATE TABLE events AS SELECT *, timestamp // 86400000 AS day,
    CAST(('0x' || substr(md5(concat('0:', display_id, ':', timestamp // 86400000)), 1, 15)) AS BIGINT)
      < CASE WHEN timestamp // 86400000 <= 10 THEN {int(0.2 * 2**60)} ELSE {2**60} END AS is_eval
    FROM {csv('events')} WHERE geo_location IS NOT NULL AND platform IS NOT NULL''')
con.execute(f"CREATE TABLE promoted AS SELECT * FROM {csv('promoted_content')}")
con.execute(f'''CREATE TABLE meta AS SELECT document_id, source_id, publish_time,
    coalesce(publisher_id, max(publisher_id) OVER () + dense_rank() OVER (PARTITION BY publisher_id IS NULL ORDER BY source_id)) AS publisher_id
    FROM {csv('documents_meta')} WHERE source_id IS NOT NULL''')
con.execute('''CREATE TABLE rows AS SELECT c.*, e.document_id AS event_doc, e.timestamp, e.platform, e.geo_location, e.is_eval,
    p.document_id AS ad_doc, p.campaign_id, p.advertiser_id, ma.source_id AS ad_source, ma.publisher_id AS ad_publisher,
    ma.publish_time AS ad_publish, me.source_id AS event_source, me.publisher_id AS event_publisher, me.publish_time AS event_publish
    FROM clicks c JOIN events e USING (display_id) JOIN promoted p USING (ad_id)
    LEFT JOIN meta ma ON ma.document_id = p.document_id LEFT JOIN meta me ON me.document_id = e.document_id''')
for key in ("ad_id", "ad_doc", "ad_source", "ad_publisher", "advertiser_id", "campaign_id"):
    con.execute(f"CREATE TABLE ctr_{key} AS SELECT {key} AS k, count(*) AS views, sum(clicked) AS clicks FROM rows WHERE NOT is_eval GROUP BY 1")
for place, expr in (("geo", "geo_location"), ("state", "substr(geo_location, 1, 5)"), ("country", "substr(geo_location, 1, 2)")):
    con.execute(f"CREATE TABLE n_{place} AS SELECT {expr} AS k, CASE WHEN count(*) >= 10 THEN count(*) ELSE -1 END AS code FROM events GROUP BY 1")
con.execute("CREATE TABLE pairs AS SELECT DISTINCT event_doc, ad_doc FROM rows")
for kind, col in (("categories", "category_id"), ("topics", "topic_id"), ("entities", "entity_id")):
    con.execute(f'''CREATE TABLE w_{kind} AS SELECT a.document_id, a.{col} AS aspect,
        a.confidence_level * ln(ln((SELECT count(DISTINCT document_id) FROM {csv('documents_' + kind)}) / d.df)) AS w
        FROM {csv('documents_' + kind)} a JOIN (SELECT {col}, count(*) AS df FROM {csv('documents_' + kind)} GROUP BY 1) d USING ({col})''')
    con.execute(f"CREATE TABLE n_{kind} AS SELECT document_id, sqrt(sum(w * w)) AS norm FROM w_{kind} GROUP BY 1")
    con.execute(f'''CREATE TABLE s_{kind} AS SELECT p.event_doc, p.ad_doc, sum(we.w * wa.w) / any_value(ne.norm) / any_value(na.norm) AS sim
        FROM pairs p JOIN w_{kind} we ON we.document_id = p.event_doc JOIN w_{kind} wa ON wa.document_id = p.ad_doc AND wa.aspect = we.aspect
        JOIN n_{kind} ne ON ne.document_id = p.event_doc JOIN n_{kind} na ON na.document_id = p.ad_doc GROUP BY 1, 2''')
ctr = lambda key, n: f"coalesce(CASE WHEN c_{key}.views > {n} THEN c_{key}.clicks / c_{key}.views END, 0)"
scaled = lambda x: f"coalesce((log2(1 + {x}) - min(log2(1 + {x})) OVER ()) / (max(log2(1 + {x})) OVER () - min(log2(1 + {x})) OVER ()), 0)"
days = lambda p: f"CASE WHEN date_diff('day', {p}, to_timestamp((r.timestamp + 1465876799998) / 1000)) BETWEEN 0 AND 3650 THEN date_diff('day', {p}, to_timestamp((r.timestamp + 1465876799998) / 1000)) END"
con.execute(f'''COPY (SELECT r.is_eval, r.clicked AS label, r.display_id, r.event_doc % 300000, r.ad_id % 250000, r.ad_doc % 100000,
    r.campaign_id % 5000, coalesce(r.ad_source, 0) % 4000, coalesce(r.event_source, 0) % 4000, r.advertiser_id % 2500,
    (g.code % 2500 + 2500) % 2500, (s.code % 2000 + 2000) % 2000, coalesce(r.ad_publisher, 0) % 1000, coalesce(r.event_publisher, 0) % 1000,
    (co.code % 300 + 300) % 300, (r.platform - 1) % 4,
    {ctr('ad_id', 5)}, {ctr('ad_doc', 5)}, {ctr('ad_source', 10)}, {ctr('ad_publisher', 10)}, {ctr('advertiser_id', 10)}, {ctr('campaign_id', 10)},
    coalesce(sc.sim, 0), coalesce(st.sim, 0), coalesce(se.sim, 0),
    {scaled('c_ad_doc.views')}, {scaled('c_ad_id.views')}, {scaled(days('r.event_publish'))}, {scaled(days('r.ad_publish'))}
    FROM rows r LEFT JOIN ctr_ad_id c_ad_id ON c_ad_id.k = r.ad_id LEFT JOIN ctr_ad_doc c_ad_doc ON c_ad_doc.k = r.ad_doc
    LEFT JOIN ctr_ad_source c_ad_source ON c_ad_source.k = r.ad_source LEFT JOIN ctr_ad_publisher c_ad_publisher ON c_ad_publisher.k = r.ad_publisher
    LEFT JOIN ctr_advertiser_id c_advertiser_id ON c_advertiser_id.k = r.advertiser_id LEFT JOIN ctr_campaign_id c_campaign_id ON c_campaign_id.k = r.campaign_id
    LEFT JOIN n_geo g ON g.k = r.geo_location LEFT JOIN n_state s ON s.k = substr(r.geo_location, 1, 5) LEFT JOIN n_country co ON co.k = substr(r.geo_location, 1, 2)
    LEFT JOIN s_categories sc ON sc.event_doc = r.event_doc AND sc.ad_doc = r.ad_doc LEFT JOIN s_topics st ON st.event_doc = r.event_doc AND st.ad_doc = r.ad_doc
    LEFT JOIN s_entities se ON se.event_doc = r.event_doc AND se.ad_doc = r.ad_doc
    ORDER BY r.is_eval, r.display_id, r.ad_id) TO '{out}' (FORMAT parquet)''')
"""


def count_lines(folder: str) -> int:
    total = 0
    for name in sorted(os.listdir(folder)):
        if name.endswith(".csv"):
            with open(os.path.join(folder, name), "rb") as f:
                total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    return total


def timed(command: List[str], env: Dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode:
        sys.exit(f"error: {' '.join(command[:4])} failed:\n{result.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--displays", type=int, default=100_000, help="generated displays (about 4.2 click rows each)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    scratch = tempfile.mkdtemp(prefix="wd_preproc_bench_")
    try:
        data = os.path.join(scratch, "csv")
        subprocess.run([python, "-m", "wide_and_deep.outbrain_synthetic", "--output", data, "--displays",
                        str(args.displays), "--seed", "0"], env=env, check=True, capture_output=True)
        lines = count_lines(data)
        runs: Dict[str, List[float]] = {"engine": [], "plain": []}
        for i in range(args.repeats):
            out = os.path.join(scratch, f"out{i}")
            runs["engine"].append(timed([python, "-m", "wide_and_deep.preprocessing", "--input", data, "--output", out,
                                         "--threads", str(args.threads)], env))
            runs["plain"].append(timed([python, "-c", PLAIN_JOB, data, os.path.join(scratch, f"plain{i}.parquet"),
                                        str(args.threads)], env))
            shutil.rmtree(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    best = {name: min(seconds) for name, seconds in runs.items()}
    rate = {name: lines / seconds for name, seconds in best.items()}
    ratio = rate["engine"] / rate["plain"]
    result = {"displays": args.displays, "input_lines": lines, "threads": args.threads, "repeats": args.repeats,
              "seconds": runs, "best_seconds": best, "lines_per_s": rate, "engine_over_plain": ratio,
              "goal": GOAL, "goal_met": ratio >= GOAL, "cpu_model": cpu_model_name(), "machine_cpus": os.cpu_count(),
              "load_average_after": list(os.getloadavg()),
              "command": " ".join(["python", "bench/wd_preproc.py", *sys.argv[1:]])}
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{'job':>7} {'lines':>10} {'best s':>8} {'lines/s':>10}   runs (s)")
    for name in ("engine", "plain"):
        print(f"{name:>7} {lines:>10} {best[name]:>8.2f} {rate[name]:>10,.0f}   "
              + " ".join(f"{s:.2f}" for s in runs[name]))
    print(f"engine / plain: {ratio:.2f}x (goal >= {GOAL}x: {'met' if ratio >= GOAL else 'NOT met'}); "
          f"CPU: {result['cpu_model']}, {args.threads} threads")
    print(f"results: {RESULTS}")


if __name__ == "__main__":
    main()
