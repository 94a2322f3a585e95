"""Web sources against a real HTTP server on 127.0.0.1 (kbflow.testing.site: ETags, Last-Modified, 304s) serving
pages of the real PostgreSQL manual, 15.18 and then 15.20 (the release tarballs in the workplace's shared corpora):
a sitemap kept in step with conditional requests, failures that keep the stored version, robots.txt, redirects
off the site, and a crawl."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from kbflow import api
from kbflow.testing.site import SiteState, StaticSite
from kbflow.config import WebConfig, load_config
from kbflow.convert.web import _links, save_state, scan_web, source_path_of
from kbflow.state.snapshots import read_table
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CountingEmbedder

CORPORA = Path(__file__).resolve().parents[3] / "shared" / "corpora"
if not CORPORA.is_dir():
    CORPORA = Path("/work/shared/corpora")
TUTORIAL = ["tutorial.html", "tutorial-start.html", "tutorial-install.html", "tutorial-arch.html",
            "tutorial-createdb.html", "tutorial-sql.html", "tutorial-sql-intro.html", "tutorial-concepts.html",
            "tutorial-table.html", "tutorial-update.html", "tutorial-delete.html", "tutorial-advanced.html",
            "tutorial-advanced-intro.html", "tutorial-views.html", "tutorial-fk.html", "tutorial-conclusion.html"]
# pages whose text changed between 15.18 and 15.20 (every other page changed only in its version line), and one
# page that did not change at all
CHANGED = ["default-roles.html", "sql-do.html", "limits.html", "textsearch-limitations.html"]
PAGES = TUTORIAL + CHANGED + ["legalnotice.html"]


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    """PAGES of both releases, each in a folder named docs (a local ingest of it gives paths docs/<page>)."""
    found = {}
    for release in ("15.18", "15.20"):
        tarball = CORPORA / f"postgresql-{release}-html.tar.xz"
        if not tarball.is_file():
            pytest.skip(f"{tarball} is not here")
        target = tmp_path_factory.mktemp(release) / "docs"
        target.mkdir()
        with tarfile.open(tarball) as archive:
            for member in archive.getmembers():
                if Path(member.name).name in PAGES and member.isfile():
                    (target / Path(member.name).name).write_bytes(archive.extractfile(member).read())
        assert sorted(path.name for path in target.iterdir()) == sorted(PAGES)
        found[release] = target
    return found


@pytest.fixture
def counting(monkeypatch, real_embedder):
    """Every ingest in the test embeds through this counter (the suite's MiniLM)."""
    import kbflow.engine.ingest

    counter = CountingEmbedder(real_embedder)
    monkeypatch.setattr(kbflow.engine.ingest, "get_embedder", lambda config: counter)
    return counter


def store_of(data_dir: Path) -> LanceStore:
    return LanceStore(data_dir / "lancedb", "default", 384)


def _config(data_dir: Path, **web):
    return load_config(None, data_dir=str(data_dir), flow={"orchestrator": "direct"},
                       web={"requests_per_second": 100, "concurrency": 4, **web})


def _pages(site: StaticSite, status: int) -> set[str]:
    """Page names the site answered with ``status`` since its log was last taken."""
    return {path.rsplit("/", 1)[-1] for path, answered, _ in site.take_log()
            if answered == status and path.endswith(".html")}


def _contents(data_dir: Path) -> list[tuple]:
    """The store's chunks by page name (web and local source paths differ only before the page's name)."""
    rows = store_of(data_dir).rows(["source_path", "ordinal", "text", "embed_sha256"]).to_pylist()
    return sorted((row["source_path"].rsplit("/", 1)[-1], row["ordinal"], row["text"], row["embed_sha256"])
                  for row in rows)


def test_a_sitemap_is_kept_in_step_with_conditional_requests(releases, tmp_path, counting):
    state = SiteState(releases["15.18"], pages=list(PAGES))
    data = tmp_path / "data"
    with StaticSite(state) as site:
        source = [site.url + "sitemap.xml"]
        first = api.ingest(source, config=_config(data))
        assert first["documents"]["new"] == len(PAGES) and first["documents"]["failed"] == 0
        assert first["web"]["downloaded"] == len(PAGES) and _pages(site, 200) == set(PAGES)
        assert _contents(data) == _contents_of_local(releases["15.18"], tmp_path / "local-15.18")

        counting.texts_embedded = 0
        again = api.ingest(source, config=_config(data))
        assert again["web"]["downloaded"] == 0 and again["web"]["not_modified"] == len(PAGES)
        assert again["web"]["bytes"] < 5000  # the sitemap itself
        assert _pages(site, 304) == set(PAGES)
        assert again["documents"]["unchanged"] == len(PAGES) and counting.texts_embedded == 0

        state.folder = releases["15.20"]  # the site publishes the next release
        differ = {name for name in PAGES
                  if (releases["15.18"] / name).read_bytes() != (releases["15.20"] / name).read_bytes()}
        assert "legalnotice.html" not in differ and set(CHANGED) <= differ
        update = api.ingest(source, config=_config(data))
        assert _pages(site, 200) == differ and update["web"]["downloaded"] == len(differ)
        assert update["web"]["not_modified"] == len(PAGES) - len(differ) and update["documents"]["failed"] == 0
        assert _contents(data) == _contents_of_local(releases["15.20"], tmp_path / "local-15.20")

        state.pages.remove("tutorial-views.html")  # gone from the sitemap
        gone = api.ingest(source, config=_config(data))
        assert gone["documents"]["removed"] == 1 and gone["web"]["downloaded"] == 0
        assert "tutorial-views.html" not in {row[0] for row in _contents(data)}
        assert len(list((data / "web" / "default" / "pages").iterdir())) == len(PAGES) - 1


def _contents_of_local(folder: Path, data_dir: Path) -> list[tuple]:
    summary = api.ingest([str(folder)], config=_config(data_dir))
    assert summary["documents"]["failed"] == 0
    return _contents(data_dir)


def test_a_page_that_fails_keeps_its_stored_version(releases, tmp_path, counting):
    pages = ["tutorial-sql.html", "sql-do.html", "limits.html", "legalnotice.html"]
    state = SiteState(releases["15.18"], pages=list(pages))
    data = tmp_path / "data"
    with StaticSite(state) as site:
        source = [site.url + "sitemap.xml"]
        api.ingest(source, config=_config(data))
        before = _contents(data)
        state.folder, state.status = releases["15.20"], {"sql-do.html": 503}
        failed = api.ingest(source, config=_config(data))
        assert failed["documents"]["failed"] == 1 and failed["web"]["failed"] == 1
        failure = read_table(data / "runs" / "default" / failed["run_id"] / "failures.parquet").to_pylist()
        assert "sql-do.html" in failure[0]["source_path"] and "503" in failure[0]["message"]
        after = _contents(data)
        assert [row for row in after if row[0] == "sql-do.html"] == \
            [row for row in before if row[0] == "sql-do.html"]  # kept, not removed
        assert [row for row in after if row[0] == "limits.html"] != \
            [row for row in before if row[0] == "limits.html"]  # the others moved on

        state.status = {}  # the server is back: the page is downloaded again (its stored validators are 15.18's)
        site.take_log()
        healed = api.ingest(source, config=_config(data))
        assert healed["documents"]["failed"] == 0 and _pages(site, 200) == {"sql-do.html"}
    local = tmp_path / "local" / "docs"
    local.mkdir(parents=True)
    for name in pages:
        shutil.copy(releases["15.20"] / name, local / name)
    assert _contents(data) == _contents_of_local(local, tmp_path / "local-data")


def test_a_page_answering_404_is_removed_and_an_unreadable_sitemap_removes_nothing(releases, tmp_path, counting):
    pages = ["tutorial-sql.html", "sql-do.html", "limits.html", "legalnotice.html"]
    state = SiteState(releases["15.18"], pages=list(pages))
    data = tmp_path / "data"
    with StaticSite(state) as site:
        source = [site.url + "sitemap.xml"]
        api.ingest(source, config=_config(data))
        stored = _contents(data)
        state.status = {"sitemap.xml": 503}  # out of sight: kept as it is, and the run says why
        blind = api.ingest(source, config=_config(data))
        assert blind["documents"]["removed"] == 0 and _contents(data) == stored
        failure = read_table(data / "runs" / "default" / blind["run_id"] / "failures.parquet").to_pylist()
        assert [f["error_type"] for f in failure] == ["UnreadableFolder"] and "503" in failure[0]["message"]
        state.status = {"sql-do.html": 404}  # still in the sitemap, but gone
        gone = api.ingest(source, config=_config(data))
        assert gone["documents"]["removed"] == 1 and gone["web"]["gone"] == 1 and gone["documents"]["failed"] == 0
        assert _contents(data) == [row for row in stored if row[0] != "sql-do.html"]


def test_a_lost_download_is_fetched_again_not_answered_304(releases, tmp_path, counting):
    """Validators are sent only for a saved body that still has their hash: a converter change that re-converts
    every page then finds every body, even after the download folder was lost."""
    state = SiteState(releases["15.18"], pages=["tutorial-sql.html", "sql-do.html"])
    data = tmp_path / "data"
    with StaticSite(state) as site:
        source = [site.url + "sitemap.xml"]
        api.ingest(source, config=_config(data))
        shutil.rmtree(data / "web" / "default" / "pages")
        config = _config(data).model_copy(update={"convert": _config(data).convert.model_copy(
            update={"max_line_chars": 9000})})
        site.take_log()
        again = api.ingest(source, config=config)
        assert again["documents"]["changed"] == 2 and again["documents"]["failed"] == 0
        assert _pages(site, 200) == {"tutorial-sql.html", "sql-do.html"}


def test_robots_txt_is_honoured_and_a_redirect_off_the_site_is_not_followed(releases, tmp_path, counting):
    elsewhere_state = SiteState(releases["15.18"], pages=["tutorial-start.html"])
    pages = ["tutorial-sql.html", "tutorial-start.html", "sql-do.html"]
    state = SiteState(releases["15.18"], pages=pages, robots="User-agent: *\nDisallow: /docs/sql-do.html\n")
    data = tmp_path / "data"
    with StaticSite(state) as site, StaticSite(elsewhere_state) as elsewhere:
        state.redirects = {"tutorial-start.html": elsewhere.url + "tutorial-start.html"}  # another port: another site
        summary = api.ingest([site.url + "sitemap.xml"], config=_config(data))
        requested = {path.rsplit("/", 1)[-1] for path, _, _ in site.take_log()}
        assert elsewhere.take_log() == []  # nothing was asked of the other site
    assert "sql-do.html" not in requested and summary["web"]["disallowed"] == 1
    assert {row[0] for row in _contents(data)} == {"tutorial-sql.html"}
    failure = read_table(data / "runs" / "default" / summary["run_id"] / "failures.parquet").to_pylist()
    assert len(failure) == 1 and "tutorial-start.html" in failure[0]["source_path"]
    assert "redirects outside the source's folder" in failure[0]["message"]


def test_a_crawl_follows_links_within_its_folder_and_a_304_page_still_gives_its_links(releases, tmp_path, counting):
    state = SiteState(releases["15.18"], pages=list(PAGES))
    data = tmp_path / "data"
    with StaticSite(state) as site:
        source = [site.url + "tutorial.html"]
        first = api.ingest(source, config=_config(data, max_depth=1))
        crawled = {row[0] for row in _contents(data)}
        assert crawled == set(TUTORIAL)  # linked from the start page; the other pages are served but not linked
        assert first["documents"]["failed"] == 0
        again = api.ingest(source, config=_config(data, max_depth=1))
        assert again["web"]["downloaded"] == 0 and again["documents"]["unchanged"] == len(TUTORIAL)
        assert again["documents"]["removed"] == 0


def test_crawl_limits_fragments_and_queries(releases, tmp_path):
    state = SiteState(releases["15.18"], pages=list(PAGES))
    with StaticSite(state) as site:
        config = WebConfig(requests_per_second=100, max_depth=0)
        alone = scan_web([site.url + "tutorial.html"], "ns", config, tmp_path / "a", save=False)
        assert [s.source_path.rsplit("/", 1)[-1] for s in alone.sources] == ["tutorial.html"]
        capped = scan_web([site.url + "tutorial.html"], "ns", WebConfig(requests_per_second=100, max_pages=5),
                          tmp_path / "b", save=False)
        assert len(capped.sources) == 5
    page = b'<html><head><base href="/docs/15/"></head><body><a href="sql.html#top">x</a> <a href="#s">s</a>' \
           b'<a href="../16/a.html?x=1">y</a> <a href="mailto:a@b.c">m</a> <a href="https://other.example/">o</a>' \
           b'<a href="two words.html">w</a>'
    assert _links(page, "http://h/docs/15/sub/page.html") == [
        "http://h/docs/15/sql.html", "http://h/docs/15/", "http://h/docs/16/a.html?x=1", "https://other.example/",
        "http://h/docs/15/two%20words.html"]
    assert source_path_of("http://h:8080/docs/") == "h:8080/docs/index.html"


def test_a_sitemap_lastmod_that_did_not_move_saves_the_request(releases, tmp_path):
    state = SiteState(releases["15.18"], pages=["tutorial-sql.html", "sql-do.html"], lastmod=True)
    folder = tmp_path / "web"
    with StaticSite(state) as site:
        first = scan_web([site.url + "sitemap.xml"], "ns", WebConfig(), folder)
        save_state(folder, first)
        site.take_log()
        again = scan_web([site.url + "sitemap.xml"], "ns", WebConfig(), folder)
        assert again.counts["lastmod_unchanged"] == 2
        assert [path for path, _, _ in site.take_log() if path.endswith(".html")] == []  # not even a 304
        assert [s.source_sha256 for s in again.sources] == [s.source_sha256 for s in first.sources]
        again = scan_web([site.url + "sitemap.xml"], "ns", WebConfig(use_lastmod=False), folder)
        assert again.counts["not_modified"] == 2


def test_a_304_to_a_page_never_stored_fails_that_page_only(releases, tmp_path):
    """A server answering 304 to an unconditional request (nothing stored, so no validators were sent) leaves no
    version to keep: that page fails, with the reason, and the rest of the site is read (it used to stop the whole
    scan with a TypeError, found by the type checker)."""
    state = SiteState(releases["15.18"], pages=["tutorial-sql.html", "sql-do.html"])
    with StaticSite(state) as site:
        state.status = {"sql-do.html": 304}
        scan = scan_web([site.url + "sitemap.xml"], "ns", WebConfig(requests_per_second=100), tmp_path / "web",
                        save=False)
    assert scan.counts["failed"] == 1 and not scan.unreadable
    by_name = {source.source_path.rsplit("/", 1)[-1]: source for source in scan.sources}
    assert not by_name["tutorial-sql.html"].unreadable
    assert "304 Not Modified" in by_name["sql-do.html"].unreadable


def test_every_door_that_fetches_names_a_body_by_one_content_type_map():
    """A configured web source and MCP's add_document convert a fetched body by the same map (the formats registry's content types):
    its content type, else its URL's extension, else each door's default (a site's page reads as HTML; a URL an
    agent sends, as text)."""
    from kbflow.convert.web import suffix_for

    assert suffix_for("https://x.test/a", "application/json; charset=utf-8", ".html") == ".json"
    assert suffix_for("https://x.test/report.PDF", "application/octet-stream", ".txt") == ".pdf"
    assert suffix_for("https://x.test/page", "", ".html") == ".html"
    assert suffix_for("https://x.test/page", "", ".txt") == ".txt"
    assert suffix_for("https://x.test/a.b c", "", ".txt") == ".txt"  # not an extension
    assert suffix_for("https://x.test/notes.md", "text/html", ".txt") == ".html"  # the server's type wins
