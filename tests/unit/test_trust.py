"""The trust boundary (kbflow.core.trust): every escape a hostile caller tries, refused before anything is read."""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kbflow.convert.scan import scan
from kbflow.core.errors import ConfigError, PermanentError
from kbflow.core.trust import SourcePolicy, SourceRefused, fetch, public_address


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "page.md").write_text("# Page\n\nhello\n")
    secret = tmp_path / "outside" / "credentials"
    secret.parent.mkdir()
    secret.write_text("aws_secret_access_key = q3N8vXr2Lk9Pz7Tb1Wc5Hd4Jf6Mg0Ys8Ua2Ee9Ri\n")
    (tmp_path / "docs-evil").mkdir()  # shares the root's name as a prefix
    (tmp_path / "docs-evil" / "x.md").write_text("x")
    return root, secret


def test_paths_under_a_root_pass_and_every_escape_is_refused(tree, tmp_path):
    root, secret = tree
    policy = SourcePolicy.create([root])
    assert policy.check_path(root / "sub" / "page.md") == (root / "sub" / "page.md").resolve()
    assert policy.check_path("sub/page.md") == (root / "sub" / "page.md").resolve()  # relative: to the root
    assert policy.check_path(root) == root.resolve()
    (root / "link-out").symlink_to(secret)
    (root / "dir-out").symlink_to(secret.parent)
    for escape in (secret, root / ".." / "outside" / "credentials", "../outside/credentials", root / "link-out",
                   root / "dir-out" / "credentials", tmp_path / "docs-evil" / "x.md", "/etc/passwd",
                   root / "sub" / ".." / ".." / "outside"):
        with pytest.raises(SourceRefused, match="outside the folders"):
            policy.check_path(escape)
    with pytest.raises(SourceRefused) as refused:  # a missing file outside: no existence oracle
        policy.check_path(tmp_path / "outside" / "nope")
    assert "outside" in str(refused.value) and "does not exist" not in str(refused.value)
    with pytest.raises(ConfigError, match="does not exist"):
        policy.check_path(root / "nope.md")


def test_without_roots_every_path_is_refused_naming_the_setting(tree):
    root, _ = tree
    with pytest.raises(SourceRefused, match="--root"):
        SourcePolicy.create([]).check_path(root / "sub" / "page.md")
    with pytest.raises(ConfigError, match="does not exist"):
        SourcePolicy.create([root / "missing"])


def test_a_root_is_recognised_by_identity_not_by_spelling(tree, tmp_path):
    root, _ = tree
    alias = tmp_path / "alias"
    alias.symlink_to(root)  # another name for the same folder (as a case-insensitive file system gives)
    policy = SourcePolicy.create([alias])
    assert policy.root_of((root / "sub" / "page.md").resolve()) is not None
    assert policy.root_of((tmp_path / "docs-evil" / "x.md").resolve()) is None


def test_a_folder_walk_does_not_read_a_symlink_that_leads_out_of_the_roots(tree):
    root, secret = tree
    (root / "sub" / "innocent.md").symlink_to(secret)
    (root / "sub" / "inside.md").symlink_to(root / "sub" / "page.md")
    policy = SourcePolicy.create([root])
    found = {source.source_path: source for source in scan([str(root)], "ns", ["*"], [], confine=policy.contains)}
    assert found["docs/sub/innocent.md"].unreadable.startswith("refused")
    assert found["docs/sub/innocent.md"].size == 0  # not hashed: its bytes were never read
    assert found["docs/sub/inside.md"].unreadable is None and found["docs/sub/page.md"].unreadable is None
    unconfined = {s.source_path: s for s in scan([str(root)], "ns", ["*"], [])}  # the CLI user's own walk
    assert unconfined["docs/sub/innocent.md"].unreadable is None


def _resolver(address: str):
    def resolve(host, port, type=None):
        return [(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
    return resolve


def test_urls_only_under_an_allowed_prefix_and_never_to_private_hosts():
    policy = SourcePolicy.create([], ["s3://team-docs/", "https://", "http://127.0.0.1:8080/docs/"])
    assert policy.check_url("s3://team-docs/manual/a.pdf").url == "s3://team-docs/manual/a.pdf"
    for refused in ("s3://team-docs-evil/a.pdf", "s3://team-docs/../other/a.pdf", "s3://team-docs/%2e%2e/x",
                    "file:///etc/passwd", "s3://other/", "http://127.0.0.1:8080/docsx/a",
                    "http://127.0.0.1:8080/admin", "https://user:pw@example.com/", "https://exa mple.com/"):
        with pytest.raises(SourceRefused):
            policy.check_url(refused, _resolver("93.184.216.34"))
    assert policy.check_url("https://example.com/a", _resolver("93.184.216.34")).addresses == ("93.184.216.34",)
    for private in ("127.0.0.1", "169.254.169.254", "10.1.2.3", "192.168.0.1", "172.16.0.1", "100.64.0.1",
                    "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "0.0.0.0"):
        with pytest.raises(SourceRefused, match="private"):
            policy.check_url("https://metadata.example/latest", _resolver(private))
        assert not public_address(private)
    # a prefix that names the host allows it, private or not
    assert policy.check_url("http://127.0.0.1:8080/docs/a.html", _resolver("127.0.0.1")).addresses


class _Site(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path.startswith("/docs/hop"):
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.end_headers()
            return
        body = b"x" * 5000 if self.path == "/docs/big.txt" else f"page {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_fetch_checks_every_redirect_hop_and_the_size(site):
    base = f"http://127.0.0.1:{site.server_port}"
    policy = SourcePolicy.create([], [f"{base}/docs/"])
    assert fetch(f"{base}/docs/a.md", policy, 1000).content == b"page /docs/a.md"
    site.redirect_to = "/docs/b.md"  # within the prefix: followed
    assert fetch(f"{base}/docs/hop", policy, 1000).content == b"page /docs/b.md"
    site.redirect_to = "/latest/meta-data.txt"  # out of the prefix on the same host
    with pytest.raises(SourceRefused):
        fetch(f"{base}/docs/hop", policy, 1000)
    site.redirect_to = f"http://localhost:{site.server_port}/docs/x"  # another host name for loopback
    with pytest.raises(SourceRefused):
        fetch(f"{base}/docs/hop", policy, 1000)
    with pytest.raises(PermanentError, match="limit"):
        fetch(f"{base}/docs/big.txt", policy, 1000)
    with pytest.raises(SourceRefused):  # any public host allowed, yet loopback is refused
        fetch(f"{base}/docs/a.md", SourcePolicy.create([], ["http://"]), 1000)


def test_the_policy_refuses_control_characters_and_nul(tree):
    root, _ = tree
    policy = SourcePolicy.create([root], ["https://"])
    with pytest.raises(SourceRefused):
        policy.check_path("sub/page.md\x00.txt")
    with pytest.raises(SourceRefused):
        policy.check_url("https://example.com/a\nb")
    assert os.path.isdir(root)


# -- the same confinement for every door (issue: a file:// prefix followed symlinks that --root refuses) ------------

@pytest.mark.parametrize("door", ["root", "file-prefix", "served-file-prefix"])
def test_a_file_url_prefix_confines_exactly_like_a_root(door, tree, tmp_path):
    """--root DIR, --allow-source file:///DIR/ and deploy.source_roots: [file:///DIR/] are one rule: the real path
    (symlinks, '..') under the folder, and a folder walk that reads no link leading out."""
    from kbflow.config import KbConfig
    from kbflow.ops.deploy import served_policy

    root, secret = tree
    (root / "link-out").symlink_to(secret)
    (root / "dir-out").symlink_to(secret.parent, target_is_directory=True)
    if door == "root":
        policy = SourcePolicy.create([root])
    elif door == "file-prefix":
        policy = SourcePolicy.create([], [f"file://{root}/"])
    else:
        policy = served_policy(KbConfig(deploy={"source_roots": [f"file://{root}/"]}))
    inside = (root / "sub" / "page.md").resolve()
    assert policy.check(f"file://{root}/sub/page.md") == str(inside) == policy.check(str(root / "sub" / "page.md"))
    for escape in (f"file://{root}/link-out", f"file://{root}/dir-out/credentials", f"file://{root}/../outside",
                   str(root / "link-out"), f"file://{secret}"):
        with pytest.raises(SourceRefused, match="outside the folders"):
            policy.check(escape)
    walked = scan([policy.check(f"file://{root}/")], "t", ["*"], [], confine=policy.contains)
    assert {s.source_path: s.unreadable is not None for s in walked} == {"docs/link-out": True,
                                                                          "docs/sub/page.md": False}
    with pytest.raises(SourceRefused, match="names host"):
        policy.check("file://elsewhere/etc/passwd")


def test_a_broken_link_inside_a_root_is_refused_in_the_words_of_an_outside_link(tree, tmp_path):
    """Neither where a link points nor whether its target exists leaks from a confined walk."""
    root, secret = tree
    (root / "out").symlink_to(secret)
    (root / "broken-out").symlink_to(tmp_path / "outside" / "missing")
    (root / "broken-in").symlink_to(root / "missing.md")
    (root / "loop").symlink_to(root / "loop")
    policy = SourcePolicy.create([root])
    walked = {s.source_path: s.unreadable for s in scan([root], "t", ["*"], [], confine=policy.contains)}
    refusals = {walked[f"docs/{name}"] for name in ("out", "broken-out", "broken-in", "loop")}
    assert len(refusals) == 1, refusals  # one sentence for all four
    [sentence] = refusals
    assert "missing" not in sentence and str(tmp_path) not in sentence and "exist" not in sentence


def test_over_long_paths_are_refused_naming_the_limit_not_crashing(tree):
    root, _ = tree
    policy = SourcePolicy.create([root])
    for path in (str(root / ("x" * 300)), "/".join(["deep"] * 1200), "a" * 5000):
        with pytest.raises(SourceRefused, match="longer than a file system allows"):
            policy.check_path(path)


@pytest.mark.parametrize("address", [
    "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1", "64:ff9b:1::c0a8:1",  # NAT64, both prefixes
    "2002:7f00:1::1", "2002:a9fe:a9fe::", "2002:c0a8:101::1",  # 6to4 of loopback, metadata, private
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo to a documentation-range client
    "2001:0:7f00:1:8000:63bf:3fff:fdd2",  # Teredo through a loopback server
    "::127.0.0.1", "::a9fe:a9fe", "::ffff:0:7f00:1", "::ffff:0:a00:1", "::ffff:127.0.0.1", "::ffff:169.254.169.254",
])
def test_every_ipv6_form_that_carries_an_ipv4_address_is_judged_by_it(address):
    assert not public_address(address)


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::1", "2606:4700:4700::1111", "8.8.8.8"])
def test_public_addresses_in_those_forms_stay_public(address):
    assert public_address(address)
