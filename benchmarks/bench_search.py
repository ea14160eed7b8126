"""The search environment's retrieval: index and query time of the BM25 retriever on a synthetic corpus.

Builds a fictional world with ``--passages`` passages (one per person and organisation, as the search environment's
corpus; :func:`agentic_rl.data.world.passages`), indexes it with :class:`agentic_rl.agent.retrieval.Retriever`
(``bm25s``) and runs ``--queries`` name queries, as the search tool receives them. Prints the index time, the mean
and 95th-percentile query time, and the share of queries whose top passage is the named entity's own.

Other retrievers side by side (``--also``, each when installed; none is a dependency of the project):
``tantivy`` (a Rust search library with Python bindings, a platform-specific wheel; an in-memory index, the same
words as the query's terms) and ``rank-bm25`` (pure Python, one score per passage per query). ``pyserini`` is not
measured: it runs Lucene through a Java 21 runtime and requires packages that conflict with the project's (it needs
``openai>=2.12``; the project's tests pin ``openai<2``).

Run it::

    python benchmarks/bench_search.py
    python benchmarks/bench_search.py --passages 10000 --queries 2000 --top-k 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def corpus(n_passages: int, seed: int) -> list[dict]:
    """About ``n_passages`` passages of one world: people and organisations in the proportions the sizes allow."""
    from agentic_rl.data.world import make_world, passages

    n_orgs = max(1, min(400, n_passages // 20))
    world = make_world(f"bench:{seed}", n_people=max(2, n_passages - n_orgs), n_places=max(1, min(399, n_orgs)),
                       n_orgs=n_orgs)
    return passages(world)


def bench_bm25s(texts: list[dict], queries: list[str], top_k: int) -> dict:
    from agentic_rl.agent.retrieval import Retriever

    start = time.perf_counter()
    retriever = Retriever(texts)
    index_s = time.perf_counter() - start
    times, hits = [], 0
    for query in queries:
        start = time.perf_counter()
        found = retriever.search(query, top_k)
        times.append(time.perf_counter() - start)
        hits += bool(found) and found[0]["title"] == query
    return {"index_s": index_s, "times": times, "hits": hits}


def bench_rank_bm25(texts: list[dict], queries: list[str], top_k: int) -> dict:
    from rank_bm25 import BM25Okapi

    from agentic_rl.agent.retrieval import words

    start = time.perf_counter()
    index = BM25Okapi([words(f"{p['title']} {p['text']}") for p in texts])
    index_s = time.perf_counter() - start
    times, hits = [], 0
    for query in queries:
        start = time.perf_counter()
        scores = index.get_scores(words(query))
        best = max(range(len(texts)), key=scores.__getitem__)
        times.append(time.perf_counter() - start)
        hits += texts[best]["title"] == query
    return {"index_s": index_s, "times": times, "hits": hits}


def bench_tantivy(texts: list[dict], queries: list[str], top_k: int) -> dict:
    import tantivy

    start = time.perf_counter()
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("title", stored=True)
    builder.add_text_field("body")
    index = tantivy.Index(builder.build())  # in memory
    writer = index.writer()
    for passage in texts:
        writer.add_document(tantivy.Document(title=passage["title"], body=f"{passage['title']} {passage['text']}"))
    writer.commit()
    index.reload()
    index_s = time.perf_counter() - start
    searcher = index.searcher()
    times, hits = [], 0
    for query in queries:
        start = time.perf_counter()
        parsed = index.parse_query(" ".join(f'"{w}"' for w in query.split()), ["body"])
        found = searcher.search(parsed, top_k).hits
        top = searcher.doc(found[0][1])["title"][0] if found else None
        times.append(time.perf_counter() - start)
        hits += top == query
    return {"index_s": index_s, "times": times, "hits": hits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=10_000, help="passages in the corpus (default 10000)")
    parser.add_argument("--queries", type=int, default=1000, help="name queries to time (default 1000)")
    parser.add_argument("--top-k", type=int, default=1, help="passages returned per query (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--also", default="", help="more retrievers to time, comma-separated: rank-bm25, tantivy")
    args = parser.parse_args(argv)

    texts = corpus(args.passages, args.seed)
    rng = random.Random(args.seed)
    queries = [rng.choice(texts)["title"] for _ in range(args.queries)]
    methods = {"bm25s": bench_bm25s}
    also = {"rank-bm25": bench_rank_bm25, "tantivy": bench_tantivy}
    for name in filter(None, args.also.split(",")):
        if name not in also:
            parser.error(f"--also takes {', '.join(also)}; got {name!r}")
        methods[name] = also[name]
    print(f"corpus: {len(texts)} passages, {sum(len(p['text']) for p in texts) / len(texts):.0f} characters each on "
          f"average; {len(queries)} name queries, top {args.top_k}")
    print(f"{'retriever':<12} {'index s':>8} {'query ms (mean)':>16} {'query ms (p95)':>15} {'own passage first':>18}")
    for name, bench in methods.items():
        result = bench(texts, queries, args.top_k)
        times = sorted(result["times"])
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        print(f"{name:<12} {result['index_s']:>8.2f} {1000 * statistics.fmean(times):>16.3f} {1000 * p95:>15.3f} "
              f"{result['hits'] / len(queries):>18.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
