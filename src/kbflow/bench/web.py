"""`kbflow bench ingest --web`: the ingest phases with the corpus served as a website on 127.0.0.1 (kbflow.testing.site:
ETags, Last-Modified, 304s, a sitemap of every page) and read through its sitemap: what each phase sends and
downloads (requests, bytes, pages answered 200 and 304), beside what it embeds and how long it takes."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from kbflow import api
from kbflow.bench.common import check_corpus, corpus_dir, peak_rss_mb, phase_row, same_store
from kbflow.bench.results import save
from kbflow.testing.site import SiteState, StaticSite
from kbflow.config import load_config
from kbflow.embed import get_embedder
from kbflow.core.errors import ConfigError
from kbflow.core.storage import location


def _web_phase(name: str, site: StaticSite, namespace: str, config) -> dict:
    site.take_log()
    started = time.perf_counter()
    summary = api.ingest([site.url + "sitemap.xml"], namespace, config)
    wall = time.perf_counter() - started
    served = site.take_log()
    row = phase_row(name, wall, summary, None)
    statuses = Counter(status for _, status, _ in served)
    row["web"] = summary["web"]
    row["server"] = {"requests": len(served), "bytes_sent": sum(size for _, _, size in served),
                     "answers": {str(status): count for status, count in sorted(statuses.items())}}
    return row


def bench_web(corpus: Path, update_to: Path | None, out_file: Path, work_dir: Path | None, config,
              pages: int | None = None, requests_per_second: float = 200.0, concurrency: int = 4) -> dict:
    """Full ingest, re-run and (with ``update_to``) the update and a fresh ingest of the update, each read from the
    local site's sitemap; ``pages``: serve only the first so many HTML pages (by name) of each version. The site is
    local, so the pace is the benchmark's (``requests_per_second``), not a polite default."""
    top = check_corpus(corpus)
    if update_to and check_corpus(update_to, "--update-to") != top:
        raise ConfigError("--update-to's top folder differs from --corpus's: give both versions the same top folder "
                          "name, so that the site serves both at the same addresses")
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-web-"))
    data_dir = location(work / "data")
    base = load_config(config, data_dir=str(data_dir))
    settings = base.model_copy(update={"web": base.web.model_copy(update={
        "requests_per_second": requests_per_second, "concurrency": concurrency})})
    embedder = get_embedder(settings.embedder)
    embedder.embed_documents(["warm up"])  # model load is not charged to the first phase
    source_a = corpus_dir(corpus, work / "corpus-a")
    source_b = corpus_dir(update_to, work / "corpus-b") if update_to else None
    state = SiteState(source_a, base=f"/{top}/")
    state.pages = state.names()[:pages] if pages else None
    with StaticSite(state) as site:
        phases = [_web_phase("full", site, "bench", settings), _web_phase("rerun", site, "bench", settings)]
        if source_b is not None:
            state.folder = source_b
            state.pages = SiteState(source_b).names()[:pages] if pages else None
            phases.append(_web_phase("update", site, "bench", settings))
            phases.append(_web_phase("fresh-of-update", site, "bench-fresh", settings))
    by_name = {phase["phase"]: phase for phase in phases}
    full, rerun = by_name["full"], by_name["rerun"]
    ratios = {"rerun_bytes_over_full": round(rerun["server"]["bytes_sent"] / full["server"]["bytes_sent"], 5),
              "rerun_pages_downloaded": rerun["web"]["downloaded"], "rerun_texts_embedded": rerun["texts_embedded"],
              "rerun_over_full": round(rerun["wall_s"] / full["wall_s"], 4)}
    if source_b is not None:
        update = by_name["update"]
        ratios.update({
            "update_pages_downloaded": update["web"]["downloaded"],
            "update_bytes_over_full": round(update["server"]["bytes_sent"] / full["server"]["bytes_sent"], 4),
            "update_over_full": round(update["wall_s"] / full["wall_s"], 4),
            "update_store_equals_fresh": same_store(config, data_dir, "bench", "bench-fresh", embedder.dimension)})
    result = {"mode": "web", "corpus": str(corpus), "update_to": str(update_to) if update_to else None,
              "pages_served": len(state.names()), "model_id": embedder.model_id, "web": {"requests_per_second": requests_per_second,
                                                     "concurrency": concurrency, "server": "kbflow.testing.site on "
                                                     "127.0.0.1 (strong ETag from the bytes, Last-Modified)"},
              "phases": phases, "ratios": ratios, "peak_rss_mb": round(peak_rss_mb(), 1)}
    return save(result, out_file, None)
