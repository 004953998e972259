"""BM25 (Lucene's variant, as bm25s computes it) for ranking a few hundred demonstrations.

A worker holds this instead of bm25s and numpy: they cost ~15 MiB of every worker's memory to
rank a short list. tests/test_bm25.py checks the scores against bm25s itself.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

# Lucene's English stop words (bm25s' STOPWORDS_EN).
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def stem(word: str) -> str:
    """Plural to singular, enough for "fees"/"fee" and "prerequisites"/"prerequisite"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    return [stem(w) for w in _TOKEN.findall(text.lower()) if w not in STOPWORDS]


class BM25:
    def __init__(self, documents: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self.counts = [Counter(doc) for doc in documents]
        self.lengths = [len(doc) for doc in documents]
        self.average = (sum(self.lengths) / len(documents)) if documents else 0.0
        frequency = Counter(term for doc in self.counts for term in doc)
        n = len(documents)
        self.idf = {t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t, df in frequency.items()}

    def relevance(self, query: Sequence[str]) -> list[float]:
        """Each document's score as a share (0..1) of what a document saying exactly `query`
        would score. Words no document has count against it: a question that shares only
        "team" with a demonstration is not about it."""
        if not query:
            return [0.0] * len(self.counts)
        unseen = math.log(1 + (len(self.counts) + 0.5) / 0.5)  # the idf of a word in none
        counts = Counter(query)
        norm = self.k1 * (1 - self.b + self.b * len(query) / (self.average or 1))
        ideal = sum(self.idf.get(t, unseen) * counts[t] / (counts[t] + norm) for t in query)
        return [min(1.0, score / ideal) for score in self.scores(query)]

    def scores(self, query: Sequence[str]) -> list[float]:
        terms = [t for t in query if t in self.idf]  # a repeated word counts again
        out = []
        for counts, length in zip(self.counts, self.lengths, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / (self.average or 1))
            out.append(
                sum(self.idf[t] * counts[t] / (counts[t] + norm) for t in terms if counts[t])
            )
        return out
