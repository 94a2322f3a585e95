"""Credentials stay out of the knowledge base: each converted file's text is scanned before it is stored, as the
file says it (the converters' Markdown escapes undone, ``scan_text``), and so is every source's name (a file
name, a URL, an archive member: ``check_name_secrets``; a name is only ever shown redacted).

The rules are the regular expressions of detect-secrets' pattern plugins (Yelp, Apache-2.0): private key blocks,
cloud access keys and service tokens (AWS, Azure storage, GitHub, GitLab, Slack, Stripe, OpenAI, PyPI, npm, ...),
plus an AWS secret access key assigned in a credentials or config file. Its entropy, keyword, URL-password and IP
plugins are not used: they fire on the examples every manual is full of. A hit is a ``SecretFound`` naming the
file, the rule and the line number, never the secret; the file is not stored, and the run goes on. Obvious
placeholders (``AKIAIOSFODNN7EXAMPLE``, ``xxxx``) are not hits.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from functools import lru_cache

from kbflow.core.errors import ConversionError

# detect-secrets' plugins whose rules are precise enough to hold a document back (class names in its package)
PLUGINS = (
    "artifactory.ArtifactoryDetector", "aws.AWSKeyDetector", "azure_storage_key.AzureStorageKeyDetector",
    "discord.DiscordBotTokenDetector", "github_token.GitHubTokenDetector", "gitlab_token.GitLabTokenDetector",
    "mailchimp.MailchimpDetector", "npm.NpmDetector", "openai.OpenAIDetector", "private_key.PrivateKeyDetector",
    "pypi_token.PypiTokenDetector", "sendgrid.SendGridDetector", "slack.SlackDetector",
    "square_oauth.SquareOAuthDetector", "stripe.StripeDetector", "telegram_token.TelegramBotTokenDetector",
    "twilio.TwilioKeyDetector",
)
# an AWS secret key assigned without quotes, as in ~/.aws/credentials (detect-secrets wants quotes)
EXTRA_RULES = (("AWS Secret Access Key", re.compile(
    r"aws_secret_access_key\s*[=:]\s*['\"]?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])", re.IGNORECASE)),)
PLACEHOLDER = re.compile(r"EXAMPLE|example|(.)\1{7,}|YOUR_|your_|<[^>]*>|\*{4,}")
KEY_BODY = re.compile(r"[A-Za-z0-9+/=]{40,}")  # a real private key block has base64 lines after its header


class SecretFound(ConversionError):
    """A file holds what looks like a credential; it is not stored."""


@dataclass(frozen=True)
class Finding:
    rule: str
    line: int


@lru_cache(maxsize=1)
def rules() -> tuple[tuple[str, re.Pattern], ...]:
    """(rule name, pattern) of every plugin in ``PLUGINS``, then ``EXTRA_RULES``."""
    import importlib

    found: list[tuple[str, re.Pattern]] = []
    for dotted in PLUGINS:
        module, name = dotted.rsplit(".", 1)
        plugin = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        found.extend((plugin.secret_type, pattern) for pattern in plugin.denylist)
    return tuple(found) + EXTRA_RULES


# a Markdown backslash escape (CommonMark: any ASCII punctuation), which converters write into text that held
# the character plainly: ``ghp\_…`` in the Markdown of an HTML page, a DOCX or an XLSX is ``ghp_…`` in the file
MARKDOWN_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")


def scan_text(markdown: str) -> str:
    """The text a document holds, as the scan must read it: its Markdown with the converters' backslash escapes
    undone (line numbers are kept)."""
    return MARKDOWN_ESCAPE.sub(r"\1", markdown)


def secret_matches(text: str):
    """(rule, match) of every credential-looking match in ``text``, placeholders left out."""
    for rule, pattern in rules():
        for match in pattern.finditer(text):
            value = match.group(match.lastindex or 0)
            if PLACEHOLDER.search(value):
                continue
            if rule == "Private Key" and not KEY_BODY.search(text, match.end(), match.end() + 400):
                continue  # a header quoted in prose, not a key
            yield rule, match


def find_secrets(text: str) -> list[Finding]:
    """Every credential-looking match in ``text``: rule and 1-based line, in text order, one per rule and line."""
    findings: dict[tuple[str, int], Finding] = {}
    for rule, match in secret_matches(text):
        line = text.count("\n", 0, match.start()) + 1
        findings.setdefault((rule, line), Finding(rule, line))
    return sorted(findings.values(), key=lambda finding: (finding.line, finding.rule))


def redact(text: str) -> tuple[str, list[str]]:
    """(``text`` with each credential-looking match replaced by ``[redacted]``, the rules that matched): a name
    that holds a secret is stored, logged and reported only in this form."""
    spans = sorted({(match.start(), match.end(), rule) for rule, match in secret_matches(text)})
    out, end, found = [], 0, []
    for start, stop, rule in spans:
        if start < end:
            continue  # overlapping matches of two rules: the first one covers it
        out += [text[end:start], "[redacted]"]
        end = stop
        found.append(rule)
    return "".join(out) + text[end:], sorted(set(found))


def check_name_secrets(name: str, allow: list[str]) -> None:
    """Raise ``SecretFound`` for a file name, URL or archive member name that holds a credential (the message
    shows it redacted), unless it matches an ``allow`` glob."""
    if any(fnmatch.fnmatch(name, pattern) for pattern in allow):
        return
    redacted, found = redact(name)
    if found:
        raise SecretFound(name_refusal(redacted, found))


def name_refusal(redacted: str, rules_found: list[str]) -> str:
    return f"{redacted}: {name_reason(rules_found)}"


def name_reason(rules_found: list[str]) -> str:
    return (f"its name looks like it holds credentials ({', '.join(rules_found)}); it was not read or stored. "
            "Rename it, or list it in convert.secret_scan_allow if this is intended")


def check_secrets(text: str, source_path: str, allow: list[str]) -> None:
    """Raise ``SecretFound`` for a text with a credential in it, unless ``source_path`` matches an ``allow`` glob."""
    if any(fnmatch.fnmatch(source_path, pattern) for pattern in allow):
        return
    findings = find_secrets(text)
    if not findings:
        return
    where = ", ".join(f"{finding.rule} on line {finding.line}" for finding in findings[:5])
    more = f" and {len(findings) - 5} more" if len(findings) > 5 else ""
    raise SecretFound(f"{source_path}: looks like it holds credentials ({where}{more}); it was not stored. Remove "
                      "the secret from the file, or list the file in convert.secret_scan_allow if this is "
                      "intended (convert.secret_scan: false turns the scan off)")
