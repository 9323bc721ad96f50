"""Outbrain-format CSVs for the tests, the demo and the benchmarks (Outbrain's data cannot be
downloaded here): the seven files the Wide & Deep preprocessing reads, with their real columns,
realistic cardinalities (about the real data's ratios to the number of displays; ads a little
more numerous, so that some fall under the CTR view thresholds at test sizes) and skew
(power-law popularity of ads, documents, sources, users and places), 2..12 ads per display with
exactly one clicked, geo strings like "US>CA>807", 13 days of timestamps in ms from the Outbrain
epoch, and a few missing geo/platform/source/publisher/publish-time values as in the real files.

A teacher decides the click of each display from features the preprocessing recovers: the quality
of the ad, its advertiser and its campaign (train-split CTRs), topic and category overlap between
the page and the ad's document (TF-IDF similarities) and the ad document's age (days since
published). Its score plus Gumbel noise picks the clicked ad; ranking each eval display's ads by
the score alone gives the teacher's MAP@12 (and its AUC), written to `teacher.json` with the split rule of
`outbrain_rules` (displays the preprocessing drops for a missing geo or platform excluded): the
ceiling a model should approach. The same seed gives the same bytes.

    python -m wide_and_deep.outbrain_synthetic --output DIR --displays N --seed S
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np
import pandas as pd

from recsys.runtime.metrics import exact_auc
from recsys.runtime.safe_io import OutputPathError, atomic_directory
from wide_and_deep.outbrain_rules import (DAY_MS, DEFAULT_SPLIT_SEED, INPUT_FILES, NUM_DAYS, OUTBRAIN_EPOCH_MS,
                                          eval_mask)

NUM_THEMES = 24
NUM_CATEGORIES = 97
NUM_TOPICS = 300
TOPIC_SLOTS = 4
CATEGORY_SLOTS = 2
TEACHER_FILE = "teacher.json"


@dataclass(frozen=True)
class TeacherWeights:
    """How the teacher scores an ad shown on a page (its logit, before the Gumbel noise)."""
    ad: float = 1.0
    advertiser: float = 1.0
    campaign: float = 1.0
    shared_topics: float = 1.2     # per shared topic, up to TOPIC_SLOTS
    shared_category: float = 0.8   # per shared category
    age: float = -0.25             # per log2(1 + days since the ad's document was published)


def _zipf_probabilities(n: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Power-law popularity over n items, ranks randomly assigned to items."""
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return rng.permutation(weights / weights.sum())


def _draw(rng: np.random.Generator, p: np.ndarray, size: int) -> np.ndarray:
    return np.searchsorted(np.cumsum(p), rng.random(size) * p.sum(), side="right").clip(0, len(p) - 1)


def _geo_pool(rng: np.random.Generator) -> tuple:
    """Geo strings ("US>CA>807", "GB>H9", "SG") and their power-law probabilities (US about 80%)."""
    places, weights = [], []
    states = [chr(65 + i // 26) + chr(65 + i % 26) for i in rng.choice(26 * 26, 50, replace=False)]
    for s, state in enumerate(states):
        for d in range(1 + s % 4):
            places.append(f"US>{state}>{500 + 7 * s + d}")
            weights.append(0.8 / (s + 1) / (d + 1))
    countries = ["CA", "GB", "AU", "IN", "DE", "FR", "SG", "PH", "ZA", "NZ", "IE", "MX", "BR", "NL", "JP"]
    for c, country in enumerate(countries):
        places.append(country)
        weights.append(0.1 / (c + 1))
        for r in range(c % 3):
            places.append(f"{country}>{r + 1:02d}")
            weights.append(0.05 / (c + 1) / (r + 1))
    w = np.array(weights)
    return np.array(places, dtype=object), w / w.sum()


def _slots(rng: np.random.Generator, themes: np.ndarray, per_theme: int, total: int, slots: int,
           present: np.ndarray) -> np.ndarray:
    """Each item's aspect ids [n, slots] (-1: none): mostly from its theme's pool, some anywhere;
    at least one for a present item."""
    n = len(themes)
    counts = np.where(present, rng.integers(1, slots + 1, n), 0)
    own = (themes[:, None] * per_theme + rng.integers(0, per_theme, (n, slots))) % total
    anywhere = rng.integers(0, total, (n, slots))
    ids = np.where(rng.random((n, slots)) < 0.8, own, anywhere)
    ids = np.where(np.arange(slots)[None, :] < counts[:, None], ids, -1)
    ids.sort(axis=1)
    dup = np.zeros_like(ids, dtype=bool)
    dup[:, 1:] = (ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] >= 0)
    return np.where(dup, -1, ids)


def _aspect_frame(rng: np.random.Generator, doc_ids: np.ndarray, slots: np.ndarray, names: np.ndarray,
                  column: str) -> pd.DataFrame:
    rows, cols = np.nonzero(slots >= 0)
    confidence = np.round(rng.uniform(0.05, 1.0, len(rows)), 6)
    return pd.DataFrame({"document_id": doc_ids[rows], column: names[slots[rows, cols]],
                         "confidence_level": confidence})


def _shared(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row, how many non-negative ids two slot arrays [n, k] have in common."""
    return ((a[:, :, None] == b[:, None, :]) & (a[:, :, None] >= 0)).sum(axis=(1, 2))


def _distinct_ads(rng: np.random.Generator, display: np.ndarray, draw, rounds: int = 20) -> np.ndarray:
    """One ad index per row, no ad twice in a display (rows of a display are consecutive)."""
    ads = draw(len(display))
    for _ in range(rounds):
        order = np.lexsort((ads, display))
        same = np.zeros(len(ads), dtype=bool)
        same[order[1:]] = (display[order[1:]] == display[order[:-1]]) & (ads[order[1:]] == ads[order[:-1]])
        if not same.any():
            break
        ads[same] = draw(int(same.sum()))
    return ads


def _map_at_12(display: np.ndarray, score: np.ndarray, clicked: np.ndarray) -> float:
    """MAP@12 of ranking each display's rows by `score` (descending), one clicked row per display."""
    order = np.lexsort((-score, display))
    d, c = display[order], clicked[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
    position = np.arange(len(d)) - np.repeat(starts, np.diff(np.r_[starts, len(d)]))
    hits = position[c == 1]
    return float(np.where(hits < 12, 1.0 / (hits + 1), 0.0).mean()) if len(hits) else float("nan")


def generate(output: str, displays: int, seed: int, split_seed: int = DEFAULT_SPLIT_SEED,
             weights: TeacherWeights = TeacherWeights()) -> Dict[str, object]:
    """Write the seven CSVs and teacher.json into a new folder `output` (built beside it, renamed in).
    Returns the teacher summary."""
    if displays < 1:
        raise ValueError(f"--displays must be at least 1, got {displays}")
    rng = np.random.default_rng(seed)
    n_docs = max(60, int(displays * 0.18))
    n_sources = max(12, n_docs // 200)
    n_publishers = max(6, min(1300, n_sources // 10 + 5))
    n_advertisers = max(12, int(displays * 0.00026))
    n_campaigns = max(n_advertisers, int(displays * 0.002))
    n_ads = max(40, int(displays * 0.06))
    n_users = max(10, int(displays * 0.85))
    n_entities = max(20, n_docs // 2)

    # documents: ids spread over a range about 1.5x their number (real ids have gaps)
    doc_ids = np.sort(rng.choice(int(n_docs * 1.5) + 10, n_docs, replace=False)) + 1
    doc_theme = rng.integers(0, NUM_THEMES, n_docs)
    doc_source = _draw(rng, _zipf_probabilities(n_sources, 1.1, rng), n_docs)
    source_ids = rng.choice(n_sources * 3, n_sources, replace=False) + 1
    source_publisher = rng.integers(1, n_publishers + 1, n_sources)
    source_publisher_missing = rng.random(n_sources) < 0.05
    publish_age_days = np.floor(rng.exponential(120.0, n_docs)).astype(np.int64)
    publish_hour = rng.integers(0, 24, n_docs)
    publish_missing = rng.random(n_docs) < 0.1
    base = datetime.datetime(2016, 6, 14)
    publish_text = np.array(["" if m else (base - datetime.timedelta(days=int(a), hours=-int(h))).strftime(
        "%Y-%m-%d %H:%M:%S") for a, h, m in zip(publish_age_days, publish_hour, publish_missing)], dtype=object)
    meta = pd.DataFrame({
        "document_id": doc_ids,
        "source_id": pd.array(source_ids[doc_source], dtype="Int64"),
        "publisher_id": pd.array(np.where(source_publisher_missing[doc_source], -1,
                                          source_publisher[doc_source]), dtype="Int64"),
        "publish_time": publish_text})
    meta.loc[meta["publisher_id"] == -1, "publisher_id"] = pd.NA
    meta.loc[rng.random(n_docs) < 0.003, "source_id"] = pd.NA

    topics = _slots(rng, doc_theme, 12, NUM_TOPICS, TOPIC_SLOTS, rng.random(n_docs) < 0.9)
    categories = _slots(rng, doc_theme, 4, NUM_CATEGORIES, CATEGORY_SLOTS, rng.random(n_docs) < 0.95)
    entities = _slots(rng, rng.integers(0, n_entities, n_docs), 1, n_entities, 3, rng.random(n_docs) < 0.7)
    category_names = np.array([str(1000 + 100 * (i // 10) + i % 10) for i in range(NUM_CATEGORIES)], dtype=object)
    topic_names = np.array([str(i) for i in range(NUM_TOPICS)], dtype=object)
    entity_names = np.array([f"{x:016x}{y:016x}" for x, y in rng.integers(0, 1 << 62, (n_entities, 2))], dtype=object)

    # ads: campaign -> advertiser; landing documents drawn by popularity
    campaign_advertiser = _draw(rng, _zipf_probabilities(n_advertisers, 1.0, rng), n_campaigns)
    ad_campaign = _draw(rng, _zipf_probabilities(n_campaigns, 1.0, rng), n_ads)
    ad_doc = _draw(rng, _zipf_probabilities(n_docs, 1.05, rng), n_ads)
    ad_ids = rng.permutation(n_ads) + 1
    campaign_ids = rng.permutation(n_campaigns) + 1
    advertiser_ids = rng.permutation(n_advertisers) + 1
    promoted = pd.DataFrame({"ad_id": ad_ids, "document_id": doc_ids[ad_doc],
                             "campaign_id": campaign_ids[ad_campaign],
                             "advertiser_id": advertiser_ids[campaign_advertiser[ad_campaign]]})
    quality_ad = rng.normal(0.0, 0.6, n_ads)
    quality_campaign = rng.normal(0.0, 0.4, n_campaigns)
    quality_advertiser = rng.normal(0.0, 0.5, n_advertisers)

    # displays: ids in time order, one event each
    display_ids = np.arange(1, displays + 1)
    timestamps = np.sort(rng.integers(0, NUM_DAYS * DAY_MS, displays))
    page_doc = _draw(rng, _zipf_probabilities(n_docs, 1.1, rng), displays)
    platform = rng.choice(np.array(["1", "2", "3"], dtype=object), displays, p=[0.4, 0.45, 0.15])
    platform[rng.random(displays) < 0.0005] = "\\N"
    geo_places, geo_p = _geo_pool(rng)
    geo = geo_places[_draw(rng, geo_p, displays)]
    geo[rng.random(displays) < 0.001] = ""
    users = _draw(rng, _zipf_probabilities(n_users, 0.6, rng), displays)
    user_names = np.array([f"{x:014x}" for x in rng.integers(0, 1 << 56, n_users)], dtype=object)
    events = pd.DataFrame({"display_id": display_ids, "uuid": user_names[users], "document_id": doc_ids[page_doc],
                           "timestamp": timestamps, "platform": platform, "geo_location": geo})

    # ads per display: 2..12, most 3..6; a fifth drawn from the page's theme
    per_display = np.minimum(12, 2 + rng.poisson(2.2, displays))
    row_display = np.repeat(np.arange(displays), per_display)
    ad_p = _zipf_probabilities(n_ads, 1.2, rng)
    by_theme = np.argsort(doc_theme[ad_doc], kind="stable")
    theme_start = np.searchsorted(doc_theme[ad_doc][by_theme], np.arange(NUM_THEMES + 1))
    row_theme = doc_theme[page_doc[row_display]]

    theme_sizes = (theme_start[1:] - theme_start[:-1])[row_theme]

    def draw_ads(n: int) -> np.ndarray:
        """Ads for the first n rows (all of them: a first draw) or n redrawn rows (by popularity)."""
        popular = _draw(rng, ad_p, n)
        if n != len(row_display):
            return popular
        offset = (rng.random(n) ** 2 * theme_sizes).astype(np.int64)  # skewed too
        themed = by_theme[np.minimum(theme_start[row_theme] + offset, n_ads - 1)]
        return np.where((rng.random(n) < 0.2) & (theme_sizes > 0), themed, popular)

    row_ad = _distinct_ads(rng, row_display, draw_ads)
    keep = np.ones(len(row_ad), dtype=bool)
    order = np.lexsort((row_ad, row_display))
    keep[order[1:]] = ~((row_display[order[1:]] == row_display[order[:-1]]) & (row_ad[order[1:]] == row_ad[order[:-1]]))
    row_display, row_ad = row_display[keep], row_ad[keep]

    # the teacher
    event_day_ms = timestamps[row_display] + OUTBRAIN_EPOCH_MS
    ad_doc_rows = ad_doc[row_ad]
    publish_ms = (np.datetime64("2016-06-14", "ms").astype(np.int64)
                  - publish_age_days[ad_doc_rows] * DAY_MS + publish_hour[ad_doc_rows] * 3_600_000)
    age_days = np.clip((event_day_ms - publish_ms) // DAY_MS, 0, None)
    age_term = np.where(publish_missing[ad_doc_rows], 0.0, np.log2(1.0 + age_days))
    page_rows = page_doc[row_display]
    score = (weights.ad * quality_ad[row_ad] + weights.campaign * quality_campaign[ad_campaign[row_ad]]
             + weights.advertiser * quality_advertiser[campaign_advertiser[ad_campaign[row_ad]]]
             + weights.shared_topics * _shared(topics[page_rows], topics[ad_doc_rows])
             + weights.shared_category * _shared(categories[page_rows], categories[ad_doc_rows])
             + weights.age * age_term)
    noisy = score + rng.gumbel(0.0, 1.0, len(score))
    order = np.lexsort((-noisy, row_display))
    first = np.r_[True, row_display[order][1:] != row_display[order][:-1]]
    clicked = np.zeros(len(score), dtype=np.int64)
    clicked[order[first]] = 1
    clicks = pd.DataFrame({"display_id": display_ids[row_display], "ad_id": ad_ids[row_ad], "clicked": clicked})

    days = timestamps // DAY_MS
    kept = (geo != "") & (platform != "\\N")
    in_eval = eval_mask(split_seed, display_ids, days) & kept
    eval_rows = in_eval[row_display]
    teacher = {"map_at_12_eval": _map_at_12(row_display[eval_rows], score[eval_rows], clicked[eval_rows]),
               "auc_eval": exact_auc(clicked[eval_rows], score[eval_rows]),
               "map_at_12_train": _map_at_12(row_display[~eval_rows & kept[row_display]],
                                             score[~eval_rows & kept[row_display]],
                                             clicked[~eval_rows & kept[row_display]]),
               "eval_displays": int(in_eval.sum()), "train_displays": int((kept & ~in_eval).sum()),
               "split_seed": split_seed, "seed": seed, "displays": displays, "click_rows": int(len(clicks)),
               "weights": weights.__dict__,
               "cardinalities": {"documents": n_docs, "sources": n_sources, "publishers": n_publishers,
                                 "advertisers": n_advertisers, "campaigns": n_campaigns, "ads": n_ads,
                                 "users": n_users, "entities": n_entities}}

    frames = {"clicks_train": clicks, "events": events, "promoted_content": promoted, "documents_meta": meta,
              "documents_categories": _aspect_frame(rng, doc_ids, categories, category_names, "category_id"),
              "documents_topics": _aspect_frame(rng, doc_ids, topics, topic_names, "topic_id"),
              "documents_entities": _aspect_frame(rng, doc_ids, entities, entity_names, "entity_id")}
    with atomic_directory(output) as folder:
        for name, frame in frames.items():
            assert tuple(frame.columns) == INPUT_FILES[name]
            frame.to_csv(os.path.join(folder, f"{name}.csv"), index=False, na_rep="", float_format="%.6g")
        with open(os.path.join(folder, TEACHER_FILE), "w") as f:
            json.dump(teacher, f, indent=1, sort_keys=True)
            f.write("\n")
    return teacher


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="new folder for the CSVs and teacher.json")
    parser.add_argument("--displays", type=int, default=200_000, help="number of displays (about 4.2 ads each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split_seed", type=int, default=DEFAULT_SPLIT_SEED,
                        help="the preprocessing's --seed, for the teacher's eval MAP@12")
    args = parser.parse_args(argv)
    try:
        teacher = generate(args.output, args.displays, args.seed, args.split_seed)
    except (OutputPathError, ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{teacher['click_rows']} click rows, {args.displays} displays written to {args.output}; "
          f"teacher MAP@12 on eval: {teacher['map_at_12_eval']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
