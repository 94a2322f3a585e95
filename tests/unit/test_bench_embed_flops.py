"""`kbflow bench embed`'s arithmetic: the operations an encoder runs for the tokens it was given."""

from kbflow.bench.embed import SHAPES, encoder_flops, matmul_probe


def test_encoder_flops_count_projections_ffn_and_attention_per_layer():
    layers, hidden, ffn = SHAPES["e5"]
    assert (layers, hidden, ffn) == (12, 384, 1536)  # multilingual-e5-small
    one = encoder_flops((1, 384, 1536), [10])
    assert one == 2 * 10 * (4 * 384 * 384 + 2 * 384 * 1536) + 4 * 10 * 10 * 384
    assert encoder_flops(SHAPES["e5"], [10, 10]) == 2 * 12 * one  # per text, per layer
    assert encoder_flops((1, 384, 1536), [20]) > 2 * one  # attention grows with the square of the length
    assert SHAPES["minilm-fp32-torch"][0] == 6


def test_the_matmul_probe_reports_a_rate():
    probe = matmul_probe(repeats=2)
    assert probe["gflops"] > 0 and probe["shape"] == [2048, 384, 1536]


def test_the_int8_probe_runs_an_int8_product(monkeypatch):
    import torch

    seen = []
    real = torch._int_mm

    def recording(left, right):
        seen.append((left.dtype, right.dtype))
        return real(left, right)

    monkeypatch.setattr(torch, "_int_mm", recording)
    probe = matmul_probe(repeats=2, dtype="int8")
    assert probe["dtype"] == "int8" and probe["gflops"] > 0
    assert seen == [(torch.int8, torch.int8)] * 3  # the warm-up and two timed products, each in int8


def test_the_int8_backend_is_measured_against_the_int8_probe():
    from kbflow.bench.embed import PROBE_DTYPES

    assert PROBE_DTYPES["e5-int8"] == "int8" and PROBE_DTYPES["e5-bf16"] == "bf16"
    assert "e5" not in PROBE_DTYPES  # fp32 models against the fp32 probe


def test_the_attention_softmax_is_timed_per_layer_in_the_engines_batches(monkeypatch):
    """Which softmaxes are timed and how the time is scaled, checked on their shapes and a stepping clock: a timing
    comparison would fail on a loaded machine (the softmaxes take milliseconds)."""
    import torch

    import kbflow.bench.embed as bench
    from kbflow.embed.e5 import batches

    shapes = []
    real = torch.softmax
    monkeypatch.setattr(torch, "softmax", lambda scores, dim: shapes.append(tuple(scores.shape)) or real(scores, dim))
    ticks = iter(range(0, 1000, 5))  # every reading of the clock 5 s after the one before
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(ticks))
    counts = [16] * 3 + [256] * 2
    assert bench.softmax_seconds((12, 384, 1536), counts) == 12 * 5  # one timed pass, times the layers
    expected = [(len(batch) * 12, width, width) for batch, width in batches(counts)]
    assert shapes == expected[:2] + expected  # warm-up, then every batch of the engine's padded to its width
    assert bench.softmax_seconds((1, 384, 1536), counts) == 5
