"""Our BM25 against bm25s, the maintained library it stands in for in the workers."""

from __future__ import annotations

import bm25s
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.library import DEFAULT_LIBRARY, load_file
from worker.library.bm25 import BM25, STOPWORDS, tokenize

QUESTIONS = [
    "What is the total fee for Django Fundamentals and its prerequisite course?",
    "open a ticket: my monitor flickers",
    "is anything filed about email outages?",
    "Can I get my money back after a month?",
    "hello there",
]


def reference(corpus: list[list[str]], query: list[str]) -> list[float]:
    retriever = bm25s.BM25()  # Lucene's variant, k1=1.5, b=0.75: the same defaults as ours
    retriever.index(corpus, show_progress=False)
    docs, scores = retriever.retrieve([query], k=len(corpus), show_progress=False)
    out = [0.0] * len(corpus)
    for doc, score in zip(docs[0], scores[0], strict=True):
        out[int(doc)] = float(score)
    return out


def test_stop_words_are_lucenes():
    from bm25s.stopwords import STOPWORDS_EN

    assert set(STOPWORDS_EN) == STOPWORDS


@pytest.mark.parametrize("question", QUESTIONS)
def test_scores_match_bm25s_on_the_shipped_library(question):
    corpus = [tokenize(d.search_text) for d in load_file(DEFAULT_LIBRARY)]
    query = tokenize(question)
    ours = BM25(corpus).scores(query)
    if not any(t in {w for doc in corpus for w in doc} for t in query):
        assert ours == [0.0] * len(corpus)
        return
    assert ours == pytest.approx(reference(corpus, query), rel=1e-5, abs=1e-6)


words = st.sampled_from(["fee", "course", "ticket", "vpn", "refund", "django", "sql", "open"])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(words, min_size=1, max_size=8), min_size=1, max_size=8),
    st.lists(words, min_size=1, max_size=4),
)
def test_scores_match_bm25s_on_any_corpus(corpus, query):
    if not any(t in {w for doc in corpus for w in doc} for t in query):
        return
    assert BM25(corpus).scores(query) == pytest.approx(reference(corpus, query), rel=1e-5, abs=1e-6)
