"""The damage matrix's cases on Qdrant's local mode (test_damage_matrix.py says what each checks)."""

from tests.flows.test_damage_matrix import make_tests

globals().update(make_tests("qdrant"))
