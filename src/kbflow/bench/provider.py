"""`kbflow bench embed --provider dashscope|openai`: embedding through the real engine against a remote provider
that throttles and fails, by default kbflow's local stand-in (``kbflow.testing.fake_services``) with an allowance of
``--allowance-rps`` requests per second and periodic faults (``--faults 4:429,6:500,9:slow``), or any endpoint
given with ``--base-url`` (key from ``--api-key-env``).

Per concurrency level (``flow.max_workers``: embed calls in flight), a fresh ingest of the same pages: texts/s
achieved by the embed stage against the allowance (requests/s x texts per request), requests sent, requests
wasted (answered with an error, then retried), whether every chunk was stored, and whether any text was paid for
twice (the stand-in counts what it served).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import yaml

from kbflow import api
from kbflow.bench.results import save
from kbflow.testing.fake_services import FakeServices
from kbflow.bench.common import corpus_dir
from kbflow.core.errors import ConfigError

FAKE_KEY_ENV = "KBFLOW_BENCH_FAKE_KEY"
PROVIDERS = {"dashscope": ("text-embedding-v4", "/api/v1"), "openai": ("bge-m3", "/v1")}


def parse_faults(spec: str) -> dict[int, str]:
    """'4:429,6:500,9:slow' -> {4: '429', 6: '500', 9: 'slow'}; '' -> no faults."""
    faults = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        period, _, behaviour = item.partition(":")
        if not period.isdigit() or int(period) < 2 or behaviour not in ("429", "500", "503", "slow"):
            raise ConfigError(f"--faults item {item!r}: write N:BEHAVIOUR, N >= 2, BEHAVIOUR one of 429, 500, 503, slow")
        faults[int(period)] = behaviour
    return faults


def _pages(corpus: Path, pages: int, work: Path) -> Path:
    root = corpus_dir(corpus, work / "corpus")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".html", ".htm", ".md", ".txt"))[:pages]
    if not files:
        raise ConfigError(f"--corpus {str(corpus)!r} holds no .html/.md/.txt pages")
    target = work / "pages" / "pages"
    target.mkdir(parents=True)
    for path in files:
        shutil.copy(path, target / path.name)
    return target


def bench_provider(provider: str, corpus: Path, pages: int, out_file: Path, concurrency: list[int],
                   base_url: str | None = None, api_key_env: str | None = None, faults: str = "4:429,6:500,9:slow",
                   allowance_rps: float = 5.0, timeout_s: float = 2.0, work_dir: Path | None = None) -> dict:
    if provider not in PROVIDERS:
        raise ConfigError(f"--provider {provider!r}: use one of {sorted(PROVIDERS)}")
    if base_url and not api_key_env:
        raise ConfigError("--base-url needs --api-key-env, the environment variable holding that endpoint's key")
    if not concurrency or min(concurrency) < 1:
        raise ConfigError("--concurrency takes positive numbers of embed calls in flight")
    periodic = parse_faults(faults)
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-provider-"))
    work.mkdir(parents=True, exist_ok=True)
    source = _pages(corpus, pages, work)
    model, api_path = PROVIDERS[provider]
    runs = []
    for level in concurrency:
        fake = None if base_url else FakeServices(key="sk-bench-fake", max_batch=10, slow_s=timeout_s * 1.5,
                                                  every=periodic, requests_per_second=allowance_rps)
        if fake is not None:
            fake.__enter__()
            os.environ[FAKE_KEY_ENV] = fake.key
        try:
            if fake is None:  # no fake services only when a base URL was given
                url = base_url
            else:
                url = base_url or fake.url + api_path
            config = work / f"config-{level}.yaml"
            embedder = {"backend": provider, "model": model, "dimension": 64 if fake else None, "task_batch": 40,
                        "connection": {"base_url": url, "api_key_env": api_key_env or FAKE_KEY_ENV,
                                       "timeout_s": timeout_s}}
            if provider == "openai":
                embedder["max_batch"] = 10
            config.write_text(yaml.safe_dump({"data_dir": str(work / f"data-{level}"), "embedder": embedder,
                                              "flow": {"max_workers": level, "orchestrator": "direct"},
                                              "chunking": {"chunk_tokens": 256}}), encoding="utf-8")
            summary = api.ingest([str(source)], config=config)
            stage_s = summary["seconds"]["embed"]
            sent = summary.get("embedding", {})
            row = {"concurrency": level, "documents": summary["documents"]["new"],
                   "chunks": summary["chunks"]["total"], "stored": summary["store"]["count"],
                   "failures": len(summary["failures"]), "texts_embedded": summary["chunks"]["embedded"],
                   "embed_stage_s": stage_s, "texts_per_s": round(summary["chunks"]["embedded"] / stage_s, 2)
                   if stage_s else None, "requests_sent": sent.get("requests_sent"),
                   "requests_retried": sent.get("retries")}
            if fake is not None:
                statuses = [request["status"] for request in fake.requests]
                row.update(allowance_texts_per_s=allowance_rps * fake.max_batch,
                           requests_wasted=sum(1 for status in statuses if status != 200),
                           answered={str(code): statuses.count(code) for code in sorted(set(statuses))},
                           texts_paid_twice=sum(1 for count in fake.served.values() if count > 1))
                row["share_of_allowance"] = round(row["texts_per_s"] / row["allowance_texts_per_s"], 3) \
                    if row["texts_per_s"] else None
            runs.append(row)
        finally:
            if fake is not None:
                fake.__exit__()
    result = {"provider": provider, "base_url": base_url or "kbflow.testing.fake_services (local)", "pages": pages,
              "faults": faults if not base_url else None, "allowance_rps": allowance_rps if not base_url else None,
              "timeout_s": timeout_s, "runs": runs}
    return save(result, out_file, _plot)


def _plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    levels = [str(run["concurrency"]) for run in runs]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    axes[0].bar(levels, [run["texts_per_s"] or 0 for run in runs], color="tab:blue", label="achieved")
    if runs and "allowance_texts_per_s" in runs[0]:
        axes[0].axhline(runs[0]["allowance_texts_per_s"], color="grey", linestyle="--", label="allowance")
    axes[0].set_xlabel("embed calls in flight")
    axes[0].set_title("texts/s through the embed stage")
    axes[0].legend(fontsize=8)
    axes[1].bar(levels, [run["requests_sent"] or 0 for run in runs], color="tab:green", label="requests sent")
    axes[1].bar(levels, [run.get("requests_wasted", run["requests_retried"] or 0) for run in runs], color="tab:red",
                label="answered with an error")
    axes[1].set_xlabel("embed calls in flight")
    axes[1].set_title("requests")
    axes[1].legend(fontsize=8)
    figure.suptitle(f"{result['provider']} against {result['base_url']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
