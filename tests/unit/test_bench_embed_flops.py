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


def test_the_attention_softmax_is_timed_per_layer_in_the_engines_batches():
    from kbflow.bench.embed import softmax_seconds

    short = softmax_seconds((1, 384, 1536), [16] * 8)
    long = softmax_seconds((1, 384, 1536), [256] * 8)  # 256 times the scores
    assert 0 < short < long
    assert softmax_seconds((12, 384, 1536), [256] * 8) > 4 * long  # twelve layers, each its own softmax
