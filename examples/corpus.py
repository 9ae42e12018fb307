"""The demo's data, generated (nothing is downloaded): a corpus of short texts to embed
every night, and an evaluation set of sentence pairs (a sentence, and the same
sentence with its words reordered and one word swapped for a synonym).

Deterministic for a seed: every demo run embeds the same texts.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBJECTS = ["the market", "a river", "the engine", "our model", "the city", "a storm", "the team",
            "a small shop", "the network", "the old bridge", "a night train", "the library"]
VERBS = ["reports", "shows", "loses", "gains", "needs", "builds", "opens", "closes", "tracks", "moves"]
OBJECTS = ["record prices", "quiet growth", "heavy traffic", "fresh data", "new customers", "lower costs",
           "strong signals", "late deliveries", "clean water", "rapid change", "green energy", "long queues"]
TAILS = ["this morning", "after the rain", "in the north", "for the third week", "despite the delay",
         "near the station", "before the holiday", "at midnight", "", ""]
SYNONYMS = {"reports": "announces", "shows": "displays", "loses": "drops", "gains": "wins",
            "needs": "requires", "builds": "constructs", "opens": "starts", "closes": "ends",
            "tracks": "follows", "moves": "shifts"}


def sentence(rng: random.Random) -> str:
    parts = [rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(TAILS)]
    return " ".join(p for p in parts if p)


def write_corpus(path: Path, n: int, seed: int = 7) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for k in range(n):
            f.write(json.dumps({"k": k, "text": sentence(rng)}) + "\n")
    return path


def write_eval_pairs(path: Path, n: int, seed: int = 11) -> Path:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for k in range(n):
            a = sentence(rng)
            words = [SYNONYMS.get(w, w) for w in a.split()]
            other = sentence(rng)
            f.write(json.dumps({"k": k, "a": a, "b": " ".join(words), "other": other}) + "\n")
    return path
