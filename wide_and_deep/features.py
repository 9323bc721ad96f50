"""The Wide & Deep feature contract (reference V1, §3 and §6): names, hash buckets, embedding widths,
TFRecord keys and dtypes. Written once; the preprocessing, the data generator, the reader and the
model all read it from here.

Every categorical feeds both parts (a 1-wide table in the wide part, an embedding in the deep
part); every numeric goes raw into both. `display_id` groups rows for MAP@12 and is never a model
input. Records are pre-batched: each tf.train.Example holds PREBATCH_SIZE rows, every feature one
list of that many values (int64 for the label, display_id and categoricals, float32 numerics).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

PREBATCH_SIZE = 4096
LABEL_KEY = "label"
DISPLAY_ID_KEY = "display_id"

# (name, hash buckets, embedding width as in the reference code; campaign_id is 128 there, 64 in its README)
CATEGORICAL_FEATURES: Tuple[Tuple[str, int, int], ...] = (
    ("doc_event_id", 300000, 128),
    ("ad_id", 250000, 128),
    ("doc_id", 100000, 128),
    ("campaign_id", 5000, 128),
    ("doc_ad_source_id", 4000, 64),
    ("doc_event_source_id", 4000, 64),
    ("ad_advertiser", 2500, 64),
    ("event_geo_location", 2500, 64),
    ("event_country_state", 2000, 64),
    ("doc_ad_publisher_id", 1000, 64),
    ("doc_event_publisher_id", 1000, 64),
    ("event_country", 300, 64),
    ("event_platform", 4, 16),
)

NUMERIC_FEATURES: Tuple[str, ...] = (
    "pop_document_id",
    "pop_publisher_id",
    "pop_source_id",
    "pop_ad_id",
    "pop_advertiser_id",
    "pop_campain_id",  # sic: the reference's key
    "doc_event_doc_ad_sim_categories",
    "doc_event_doc_ad_sim_topics",
    "doc_event_doc_ad_sim_entities",
    "doc_views_log_01scaled",
    "ad_views_log_01scaled",
    "doc_event_days_since_published_log_01scaled",
    "doc_ad_days_since_published_log_01scaled",
)

CATEGORICAL_NAMES: Tuple[str, ...] = tuple(name for name, _, _ in CATEGORICAL_FEATURES)
BUCKETS: Dict[str, int] = {name: buckets for name, buckets, _ in CATEGORICAL_FEATURES}
EMBEDDING_DIMS: Dict[str, int] = {name: dim for name, _, dim in CATEGORICAL_FEATURES}


def deep_input_order() -> List[str]:
    """The deep part concatenates its inputs in alphabetical order of the feature names (§4)."""
    return sorted(CATEGORICAL_NAMES + NUMERIC_FEATURES)


def record_keys() -> Dict[str, str]:
    """Every key of a training record and its dtype ('int64' or 'float32')."""
    keys = {LABEL_KEY: "int64", DISPLAY_ID_KEY: "int64"}
    keys.update({name: "int64" for name in CATEGORICAL_NAMES})
    keys.update({name: "float32" for name in NUMERIC_FEATURES})
    return keys
