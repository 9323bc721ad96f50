"""The Outbrain data contract shared by the generator and the preprocessing engines: the input files
and their columns, the train/eval split rule, the thresholds of the reference's V1 Spark pipeline
(reference §9). Written once; the SQL of both engines and the generator's teacher read it from here.

Split rule (reference §6, made deterministic): a display's day is `timestamp // DAY_MS` (the
timestamp is in ms from the Outbrain epoch); its key is the first 15 hex digits of
`md5("<seed>:<display_id>:<day>")` read as an integer in [0, 2**60); the display goes to eval iff
key < threshold(day), threshold = int(fraction * 2**60) with fraction 0.2 for days 0..10 and 1.0 from
day 11 on. Spark's `sample(seed 0)` is random; this rule gives every engine, and the generator's
teacher, the same split. A display has one event, so it lies wholly in one split.
"""
from __future__ import annotations

import hashlib
from typing import Dict, Sequence, Tuple

import numpy as np

# file stem -> its columns, in the order of the real files' headers
INPUT_FILES: Dict[str, Tuple[str, ...]] = {
    "clicks_train": ("display_id", "ad_id", "clicked"),
    "events": ("display_id", "uuid", "document_id", "timestamp", "platform", "geo_location"),
    "promoted_content": ("ad_id", "document_id", "campaign_id", "advertiser_id"),
    "documents_meta": ("document_id", "source_id", "publisher_id", "publish_time"),
    "documents_categories": ("document_id", "category_id", "confidence_level"),
    "documents_topics": ("document_id", "topic_id", "confidence_level"),
    "documents_entities": ("document_id", "entity_id", "confidence_level"),
}
# the aspect files of the TF-IDF similarities: (feature suffix, file stem)
ASPECTS: Tuple[Tuple[str, str], ...] = (("categories", "documents_categories"),
                                        ("topics", "documents_topics"),
                                        ("entities", "documents_entities"))

DAY_MS = 86_400_000
NUM_DAYS = 13
# 2016-06-14 04:00:00 UTC less 2 ms: timestamp 0 of events.csv, in ms since the Unix epoch
OUTBRAIN_EPOCH_MS = 1_465_876_799_998
KEY_RANGE = 1 << 60
EVAL_FRACTION_EARLY = 0.2   # days 0..LAST_EARLY_DAY
LAST_EARLY_DAY = 10         # days after it: all displays go to eval
DEFAULT_SPLIT_SEED = 0
# CTR = clicks / views of the train split, kept when views exceed these
CTR_MIN_VIEWS_AD = 5        # ad, ad document
CTR_MIN_VIEWS_OTHER = 10    # source, publisher, advertiser, campaign
RARE_GEO_LIMIT = 10         # a country / state / geo seen fewer times is "rare" (-1)
MAX_DAYS_SINCE_PUBLISHED = 3650
# quantum of the TF-IDF weights: the engines sum integer multiples of 2**-24 (exact, any order)
WEIGHT_SCALE = 1 << 24


def eval_threshold(day: int) -> int:
    """Keys below this integer put a display of `day` in eval."""
    fraction = EVAL_FRACTION_EARLY if day <= LAST_EARLY_DAY else 1.0
    return int(fraction * KEY_RANGE)


def split_key(seed: int, display_id: int, day: int) -> int:
    """The split key of one display (see the module docstring)."""
    digest = hashlib.md5(f"{seed}:{display_id}:{day}".encode()).hexdigest()
    return int(digest[:15], 16)


def eval_mask(seed: int, display_ids: Sequence[int], days: Sequence[int]) -> np.ndarray:
    """True for the displays that go to eval (one md5 per display)."""
    keys = np.array([split_key(seed, int(d), int(day)) for d, day in zip(display_ids, days)], dtype=np.int64)
    early = eval_threshold(0)
    late = eval_threshold(LAST_EARLY_DAY + 1)
    return keys < np.where(np.asarray(days) <= LAST_EARLY_DAY, early, late)
