"""The preprocessing as SQL, written once for both engines: DuckDB and Spark SQL run the same
statements, a `Dialect` filling in the few functions they spell differently. Every value the SQL
produces is an integer (or a string key), so both engines compute the same numbers whatever order
they sum in; the floating-point steps (CTR division, cosine, log and min-max) happen once, in
numpy, in `records.py`.

Each input file is read as whole lines (`raw_<stem>`, one column `text`), split at commas and
checked field by field; a line that is the file's header line is counted as `header`, one with the
wrong number of fields or a field of the wrong form as `malformed`. See `features_doc()` in
`records.py` for what every output column means.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from wide_and_deep import features
from wide_and_deep.outbrain_rules import (ASPECTS, CTR_MIN_VIEWS_AD, CTR_MIN_VIEWS_OTHER, DAY_MS, INPUT_FILES,
                                          LAST_EARLY_DAY, MAX_DAYS_SINCE_PUBLISHED, OUTBRAIN_EPOCH_MS,
                                          RARE_GEO_LIMIT, WEIGHT_SCALE, eval_threshold)

INT = "[0-9]{1,18}"
FLOAT = "[0-9]*[.]?[0-9]+([eE][-+]?[0-9]{1,3})?"
DATETIME = "[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}"
HEADER = "header"
MALFORMED = "malformed"
# the rejection reasons of each file besides header and malformed, in the order they are tested
FILE_REASONS: Dict[str, Tuple[str, ...]] = {
    "clicks_train": ("unknown_display", "display_missing_geo_or_platform", "unknown_ad"),
    "events": ("missing_platform", "missing_geo_location"),
    "documents_meta": ("missing_source_id",),
}
# CTR features: (feature, key column of the joined rows, minimum views exceeded)
CTRS: Tuple[Tuple[str, str, int], ...] = (
    ("pop_ad_id", "ad_id", CTR_MIN_VIEWS_AD),
    ("pop_document_id", "ad_doc", CTR_MIN_VIEWS_AD),
    ("pop_source_id", "ad_source", CTR_MIN_VIEWS_OTHER),
    ("pop_publisher_id", "ad_publisher", CTR_MIN_VIEWS_OTHER),
    ("pop_advertiser_id", "advertiser_id", CTR_MIN_VIEWS_OTHER),
    ("pop_campain_id", "campaign_id", CTR_MIN_VIEWS_OTHER),
)
# count/day features: (feature, raw integer column)
COUNTS: Tuple[Tuple[str, str], ...] = (
    ("doc_views_log_01scaled", "doc_views"),
    ("ad_views_log_01scaled", "ad_views"),
    ("doc_event_days_since_published_log_01scaled", "event_doc_days"),
    ("doc_ad_days_since_published_log_01scaled", "ad_doc_days"),
)
# categorical feature -> the column of the joined rows whose value, modulo the buckets, it is
# (missing: 0); event_platform is platform - 1
CATEGORICAL_SOURCES: Dict[str, str] = {
    "doc_event_id": "event_doc",
    "ad_id": "ad_id",
    "doc_id": "ad_doc",
    "campaign_id": "campaign_id",
    "doc_ad_source_id": "ad_source",
    "doc_event_source_id": "event_source",
    "ad_advertiser": "advertiser_id",
    "event_geo_location": "geo_code",
    "event_country_state": "state_code",
    "doc_ad_publisher_id": "ad_publisher",
    "doc_event_publisher_id": "event_publisher",
    "event_country": "country_code",
    "event_platform": "platform_index",
}
assert set(CATEGORICAL_SOURCES) == set(features.CATEGORICAL_NAMES)


@dataclass(frozen=True)
class Dialect:
    """The functions DuckDB and Spark SQL spell differently."""
    name: str

    def matches(self, expr: str, pattern: str) -> str:
        """`expr` matches the regular expression as a whole."""
        if self.name == "duckdb":
            return f"regexp_full_match({expr}, '{pattern}')"
        return f"({expr} rlike '^({pattern})$')"

    def hex_to_bigint(self, expr: str) -> str:
        """A string of at most 15 hex digits as a BIGINT."""
        if self.name == "duckdb":
            return f"CAST(('0x' || {expr}) AS BIGINT)"
        return f"CAST(conv({expr}, 16, 10) AS BIGINT)"

    def idiv(self, a: str, b: str) -> str:
        """Integer quotient of two non-negative BIGINTs."""
        return f"(({a}) // ({b}))" if self.name == "duckdb" else f"(({a}) div ({b}))"


DUCKDB = Dialect("duckdb")
SPARK = Dialect("spark")


def _pmod(expr: str, buckets: int) -> str:
    return f"(((({expr}) % {buckets}) + {buckets}) % {buckets})"


def _fields(n: int) -> str:
    """The line's fields f1..fn and its field count nf."""
    parts = ", ".join(f"split_part(text, ',', {i}) AS f{i}" for i in range(1, n + 1))
    return f"text, length(text) - length(replace(text, ',', '')) + 1 AS nf, {parts}"


def _header_test(stem: str) -> str:
    return f"text = '{','.join(INPUT_FILES[stem])}'"


def _opt_int(d: Dialect, field: str) -> str:
    return f"({field} = '' OR {d.matches(field, INT)})"


def _days_from_civil(d: Dialect, y: str, m: str, day: str) -> str:
    """Days since 1970-01-01 of a (proleptic Gregorian) date with year >= 1."""
    yy = f"({y} - CASE WHEN {m} <= 2 THEN 1 ELSE 0 END)"
    era = d.idiv(yy, "400")
    yoe = f"({yy} - {era} * 400)"
    doy = f"({d.idiv(f'153 * (({m} + 9) % 12) + 2', '5')} + {day} - 1)"
    doe = f"({yoe} * 365 + {d.idiv(yoe, '4')} - {d.idiv(yoe, '100')} + {doy})"
    return f"({era} * 146097 + {doe} - 719468)"


def parse_statements(d: Dialect) -> List[Tuple[str, str]]:
    """(table, SELECT) pairs that parse and classify every line of the input files (`raw_<stem>`).
    Each `<stem>_lines` table has a `reject` column (NULL for a line that is used)."""
    s: List[Tuple[str, str]] = []
    s.append(("clicks_train_lines", f"""
        SELECT CASE WHEN {_header_test('clicks_train')} THEN '{HEADER}' WHEN NOT ok THEN '{MALFORMED}' END AS reject,
               CASE WHEN ok THEN TRY_CAST(f1 AS BIGINT) END AS display_id,
               CASE WHEN ok THEN TRY_CAST(f2 AS BIGINT) END AS ad_id,
               CASE WHEN ok THEN TRY_CAST(f3 AS BIGINT) END AS clicked
        FROM (SELECT *, nf = 3 AND {d.matches('f1', INT)} AND {d.matches('f2', INT)} AND {d.matches('f3', '[01]')} AS ok
              FROM (SELECT {_fields(3)} FROM raw_clicks_train) l) t"""))
    missing_platform = "(f5 = '' OR f5 = concat(chr(92), 'N'))"
    s.append(("events_lines", f"""
        SELECT CASE WHEN {_header_test('events')} THEN '{HEADER}' WHEN NOT ok THEN '{MALFORMED}'
                    WHEN {missing_platform} THEN 'missing_platform' WHEN f6 = '' THEN 'missing_geo_location' END AS reject,
               CASE WHEN ok THEN TRY_CAST(f1 AS BIGINT) END AS display_id,
               CASE WHEN ok THEN TRY_CAST(f3 AS BIGINT) END AS event_doc,
               CASE WHEN ok THEN TRY_CAST(f4 AS BIGINT) END AS event_ms,
               CASE WHEN ok AND NOT {missing_platform} THEN TRY_CAST(f5 AS BIGINT) END AS platform,
               f6 AS geo_location
        FROM (SELECT *, nf = 6 AND {d.matches('f1', INT)} AND {d.matches('f3', INT)} AND {d.matches('f4', INT)}
                        AND ({missing_platform} OR {d.matches('f5', INT)}) AS ok
              FROM (SELECT {_fields(6)} FROM raw_events) l) t"""))
    s.append(("promoted_content_lines", f"""
        SELECT CASE WHEN {_header_test('promoted_content')} THEN '{HEADER}' WHEN NOT ok THEN '{MALFORMED}' END AS reject,
               CASE WHEN ok THEN TRY_CAST(f1 AS BIGINT) END AS ad_id,
               CASE WHEN ok THEN TRY_CAST(f2 AS BIGINT) END AS ad_doc,
               CASE WHEN ok THEN TRY_CAST(f3 AS BIGINT) END AS campaign_id,
               CASE WHEN ok THEN TRY_CAST(f4 AS BIGINT) END AS advertiser_id
        FROM (SELECT *, nf = 4 AND {d.matches('f1', INT)} AND {d.matches('f2', INT)} AND {d.matches('f3', INT)}
                        AND {d.matches('f4', INT)} AS ok
              FROM (SELECT {_fields(4)} FROM raw_promoted_content) l) t"""))
    part = {name: f"TRY_CAST(substr(f4, {start}, {length}) AS BIGINT)"
            for name, start, length in (("y", 1, 4), ("mo", 6, 2), ("dd", 9, 2), ("hh", 12, 2), ("mi", 15, 2),
                                        ("ss", 18, 2))}
    date_ok = "(y >= 1 AND mo BETWEEN 1 AND 12 AND dd BETWEEN 1 AND 31 AND hh <= 23 AND mi <= 59 AND ss <= 59)"
    publish_ms = (f"({_days_from_civil(d, 'y', 'mo', 'dd')} * {DAY_MS} + (hh * 3600 + mi * 60 + ss) * 1000 "
                  f"- {OUTBRAIN_EPOCH_MS})")
    s.append(("documents_meta_lines", f"""
        SELECT CASE WHEN {_header_test('documents_meta')} THEN '{HEADER}' WHEN NOT ok THEN '{MALFORMED}'
                    WHEN f2 = '' THEN 'missing_source_id' END AS reject,
               CASE WHEN ok THEN TRY_CAST(f1 AS BIGINT) END AS document_id,
               CASE WHEN ok THEN TRY_CAST(f2 AS BIGINT) END AS source_id,
               CASE WHEN ok THEN TRY_CAST(f3 AS BIGINT) END AS publisher_id,
               CASE WHEN ok AND f4 <> '' THEN {publish_ms} END AS publish_ms
        FROM (SELECT *, nf = 4 AND {d.matches('f1', INT)} AND {_opt_int(d, 'f2')} AND {_opt_int(d, 'f3')}
                        AND (f4 = '' OR ({d.matches('f4', DATETIME)} AND {date_ok})) AS ok
              FROM (SELECT *, {', '.join(f'{v} AS {k}' for k, v in part.items())}
                    FROM (SELECT {_fields(4)} FROM raw_documents_meta) l) p) t"""))
    for _, stem in ASPECTS:
        s.append((f"{stem}_lines", f"""
        SELECT CASE WHEN {_header_test(stem)} THEN '{HEADER}' WHEN NOT ok THEN '{MALFORMED}' END AS reject,
               CASE WHEN ok THEN TRY_CAST(f1 AS BIGINT) END AS document_id,
               CASE WHEN ok THEN f2 END AS aspect,
               CASE WHEN ok THEN confidence END AS confidence
        FROM (SELECT *, nf = 3 AND {d.matches('f1', INT)} AND f2 <> '' AND {d.matches('f3', FLOAT)}
                        AND confidence <= CAST(1 AS DOUBLE) AS ok
              FROM (SELECT *, TRY_CAST(f3 AS DOUBLE) AS confidence
                    FROM (SELECT {_fields(3)} FROM raw_{stem}) l) c) t"""))
    return s


# an event line that parsed (used, or dropped for a missing platform or geo)
VALID_EVENT = f"(reject IS NULL OR reject NOT IN ('{HEADER}', '{MALFORMED}'))"
# (file stem, key columns, which lines) whose keys must be unique: a repeat is refused
UNIQUE_KEYS: Tuple[Tuple[str, str, str], ...] = (
    ("events", "display_id", VALID_EVENT),
    ("promoted_content", "ad_id", "reject IS NULL"),
    ("documents_meta", "document_id", "reject IS NULL"),
) + tuple((stem, "document_id, aspect", "reject IS NULL") for _, stem in ASPECTS)


def duplicate_sql(stem: str, keys: str, where: str) -> str:
    """The smallest key repeated among those lines of a file, and how many times it occurs."""
    return (f"SELECT {keys}, count(*) AS n FROM {stem}_lines WHERE {where} GROUP BY {keys} "
            f"HAVING count(*) > 1 ORDER BY {keys} LIMIT 1")


def aspect_frequency_sql(stem: str) -> str:
    """(aspect, documents with it) of an aspect file, and the number of documents in the file."""
    return (f"SELECT aspect, count(*) AS df, (SELECT count(DISTINCT document_id) FROM {stem}_lines "
            f"WHERE reject IS NULL) AS n FROM {stem}_lines WHERE reject IS NULL GROUP BY aspect")


def join_statements(d: Dialect, seed: int) -> List[Tuple[str, str]]:
    """(table, SELECT) pairs from the parsed lines and the `idf_<stem>` tables (aspect, idf) to
    `output_rows`: one row per used click line, integer columns only, and `row_reject`, which
    classifies every click line (NULL when it is used)."""
    s: List[Tuple[str, str]] = []
    key = d.hex_to_bigint("substr(md5(concat(CAST(" + str(int(seed)) + " AS STRING), ':', CAST(display_id AS STRING), "
                          "':', CAST(day AS STRING))), 1, 15)")
    s.append(("events_kept", f"""
        SELECT display_id, event_doc, event_ms, platform, geo_location, substr(geo_location, 1, 2) AS country,
               substr(geo_location, 1, 5) AS state, day, split_key,
               split_key < CASE WHEN day <= {LAST_EARLY_DAY} THEN {eval_threshold(0)}
                                ELSE {eval_threshold(LAST_EARLY_DAY + 1)} END AS is_eval
        FROM (SELECT *, {key} AS split_key FROM (SELECT *, {d.idiv('event_ms', str(DAY_MS))} AS day
                                                 FROM events_lines WHERE reject IS NULL) e) k"""))
    for place in ("geo_location", "country", "state"):
        s.append((f"{place}_counts", f"""
        SELECT {place} AS place, CASE WHEN count(*) >= {RARE_GEO_LIMIT} THEN count(*) ELSE -1 END AS code
        FROM events_kept GROUP BY {place}"""))
    s.append(("meta_clean", """
        SELECT document_id, source_id, publish_ms,
               coalesce(publisher_id, (SELECT coalesce(max(publisher_id), 0) FROM documents_meta_lines
                                       WHERE reject IS NULL)
                                      + dense_rank() OVER (PARTITION BY publisher_id IS NULL ORDER BY source_id))
                   AS publisher_id
        FROM documents_meta_lines WHERE reject IS NULL"""))
    s.append(("click_rows", f"""
        SELECT c.display_id, c.ad_id, c.clicked,
               CASE WHEN v.display_id IS NULL THEN 'unknown_display'
                    WHEN e.display_id IS NULL THEN 'display_missing_geo_or_platform'
                    WHEN p.ad_id IS NULL THEN 'unknown_ad' END AS row_reject,
               e.event_doc, e.event_ms, e.platform - 1 AS platform_index, e.day, e.split_key, e.is_eval,
               g.code AS geo_code, gs.code AS state_code, gc.code AS country_code,
               p.ad_doc, p.campaign_id, p.advertiser_id,
               ma.source_id AS ad_source, ma.publisher_id AS ad_publisher, ma.publish_ms AS ad_publish_ms,
               me.source_id AS event_source, me.publisher_id AS event_publisher, me.publish_ms AS event_publish_ms
        FROM (SELECT * FROM clicks_train_lines WHERE reject IS NULL) c
        LEFT JOIN (SELECT display_id FROM events_lines WHERE {VALID_EVENT}) v
               ON v.display_id = c.display_id
        LEFT JOIN events_kept e ON e.display_id = c.display_id
        LEFT JOIN promoted_content_lines p ON p.ad_id = c.ad_id AND p.reject IS NULL
        LEFT JOIN geo_location_counts g ON g.place = e.geo_location
        LEFT JOIN state_counts gs ON gs.place = e.state
        LEFT JOIN country_counts gc ON gc.place = e.country
        LEFT JOIN meta_clean ma ON ma.document_id = p.ad_doc
        LEFT JOIN meta_clean me ON me.document_id = e.event_doc"""))
    s.append(("joined", "SELECT * FROM click_rows WHERE row_reject IS NULL"))
    for feature, column, minimum in CTRS:
        s.append((f"ctr_{feature}", f"""
        SELECT {column} AS k, count(*) AS views, CAST(sum(clicked) AS BIGINT) AS clicks FROM joined
        WHERE NOT is_eval AND {column} IS NOT NULL GROUP BY {column}"""))
    s.append(("pairs", "SELECT DISTINCT event_doc, ad_doc FROM joined"))
    for kind, stem in ASPECTS:
        s.append((f"weights_{kind}", f"""
        SELECT l.document_id, l.aspect,
               CAST(floor(l.confidence * i.idf * CAST({WEIGHT_SCALE} AS DOUBLE) + CAST(0.5 AS DOUBLE)) AS BIGINT) AS qw
        FROM {stem}_lines l JOIN idf_{stem} i ON i.aspect = l.aspect WHERE l.reject IS NULL"""))
        s.append((f"norms_{kind}", f"""
        SELECT document_id, CAST(sum(qw * qw) AS BIGINT) AS norm,
               max(CASE WHEN qw IS NULL THEN 1 ELSE 0 END) AS undefined
        FROM weights_{kind} GROUP BY document_id"""))
        s.append((f"dots_{kind}", f"""
        SELECT p.event_doc, p.ad_doc, CAST(sum(we.qw * wa.qw) AS BIGINT) AS dot
        FROM pairs p JOIN weights_{kind} we ON we.document_id = p.event_doc
        JOIN weights_{kind} wa ON wa.document_id = p.ad_doc AND wa.aspect = we.aspect
        GROUP BY p.event_doc, p.ad_doc"""))
    days = {}
    for side in ("event", "ad"):
        diff = f"(j.event_ms - j.{side}_publish_ms)"
        days[side] = (f"CASE WHEN j.{side}_publish_ms IS NOT NULL AND {diff} >= 0 "
                      f"AND {d.idiv(diff, str(DAY_MS))} <= {MAX_DAYS_SINCE_PUBLISHED} THEN {d.idiv(diff, str(DAY_MS))} END")
    columns = ["CAST(j.is_eval AS INT) AS is_eval", "j.split_key", "j.clicked AS label", "j.display_id",
               "j.ad_id AS ad_id_raw"]
    columns += [f"{_pmod(f'coalesce(j.{source}, 0)', features.BUCKETS[name])} AS {name}"
                for name, source in CATEGORICAL_SOURCES.items()]
    joins = []
    for feature, column, minimum in CTRS:
        t = f"t_{feature}"
        joins.append(f"LEFT JOIN ctr_{feature} {t} ON {t}.k = j.{column}")
        columns.append(f"CASE WHEN {t}.views > {minimum} THEN {t}.clicks END AS {feature}_clicks")
        columns.append(f"CASE WHEN {t}.views > {minimum} THEN {t}.views END AS {feature}_views")
    columns += ["t_pop_document_id.views AS doc_views", "t_pop_ad_id.views AS ad_views",
                f"{days['event']} AS event_doc_days", f"{days['ad']} AS ad_doc_days"]
    for kind, _ in ASPECTS:
        ne, na, dk = f"ne_{kind}", f"na_{kind}", f"dk_{kind}"
        joins += [f"LEFT JOIN norms_{kind} {ne} ON {ne}.document_id = j.event_doc",
                  f"LEFT JOIN norms_{kind} {na} ON {na}.document_id = j.ad_doc",
                  f"LEFT JOIN dots_{kind} {dk} ON {dk}.event_doc = j.event_doc AND {dk}.ad_doc = j.ad_doc"]
        defined = f"{ne}.undefined = 0 AND {na}.undefined = 0"
        columns += [f"CASE WHEN {defined} THEN coalesce({dk}.dot, 0) END AS sim_{kind}_dot",
                    f"CASE WHEN {defined} THEN {ne}.norm END AS sim_{kind}_event_norm",
                    f"CASE WHEN {defined} THEN {na}.norm END AS sim_{kind}_ad_norm"]
    s.append(("output_rows", "SELECT " + ",\n  ".join(columns) + "\nFROM joined j\n" + "\n".join(joins)))
    return s


def output_columns() -> List[str]:
    """The columns the engines write per split (those `records.py` reads), in this order."""
    names = [features.LABEL_KEY, features.DISPLAY_ID_KEY] + list(features.CATEGORICAL_NAMES)
    for feature, _, _ in CTRS:
        names += [f"{feature}_clicks", f"{feature}_views"]
    names += [column for _, column in COUNTS]
    for kind, _ in ASPECTS:
        names += [f"sim_{kind}_dot", f"sim_{kind}_event_norm", f"sim_{kind}_ad_norm"]
    return names


def split_sql(is_eval: bool) -> str:
    """SELECT of one split's output columns, ordered (see `output_sql`)."""
    order = "display_id, ad_id_raw, label" if is_eval else "split_key, display_id, ad_id_raw, label"
    cols = ", ".join(f"CAST({c} AS BIGINT) AS {c}" for c in output_columns())
    return f"SELECT {cols} FROM output_rows WHERE is_eval = {int(is_eval)} ORDER BY {order}"


def count_bounds_sql() -> str:
    """Minimum and maximum of each raw count/day column over both splits."""
    return "SELECT " + ", ".join(f"min({c}), max({c})" for _, c in COUNTS) + " FROM output_rows"


def accounting_sql(stem: str) -> str:
    """(reason, lines) of one input file; reason NULL: used."""
    return f"SELECT reject, count(*) FROM {stem}_lines GROUP BY reject"


def click_accounting_sql() -> str:
    """(reason or split, rows) of the click lines that parsed."""
    return ("SELECT CASE WHEN row_reject IS NOT NULL THEN row_reject WHEN is_eval THEN 'eval' ELSE 'train' END, "
            "count(*) FROM click_rows GROUP BY 1")


def display_accounting_sql() -> str:
    """(split, displays, displays without a clicked ad) of the used click rows: MAP@12 scores a display
    by its clicked ad, so those without one are left out of it, and the summary says how many."""
    return ("SELECT CASE WHEN is_eval THEN 'eval' ELSE 'train' END, count(*), "
            "sum(CASE WHEN clicks = 0 THEN 1 ELSE 0 END) "
            "FROM (SELECT display_id, is_eval, max(clicked) AS clicks FROM joined GROUP BY display_id, is_eval) d "
            "GROUP BY 1")
