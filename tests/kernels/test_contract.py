"""The kernel contract (kdabench.kernels.contract): the decoded error sentences, the backend
table against the contract's backends, the shape rules, and the package's lazy public names."""

from __future__ import annotations

import pytest

from kdabench import kernels
from kdabench.kernels import contract
from kdabench.kernels.contract import KdaMetadataError, MetadataFault, decode_error_code


def test_every_bit_decodes_to_its_sentence():
    assert decode_error_code(0) == "accepted"
    assert decode_error_code(4) == (
        "metadata rejected (error code 4); the state pool is unchanged and the output is NaN: "
        "SLOT_OUT_OF_RANGE (bit 2): a state slot index lies outside [0, num_slots) and is not "
        "the null index -1")
    every = decode_error_code(sum(MetadataFault) | 0x30)
    assert [f.name for f in MetadataFault if f.name in every] == [
        "DUPLICATE_WRITE_SLOT", "MALFORMED_LENGTHS", "SLOT_OUT_OF_RANGE", "BAD_CHECKPOINT_OFFSET"]
    assert every.endswith("unknown bits 0x30")


def test_the_bits_are_the_four_low_bits():
    assert [int(f) for f in MetadataFault] == [1, 2, 4, 8]


def test_a_negative_code_is_not_accepted():
    """An int32 code with bit 31 set reads as negative: a rejection with an unknown bit."""
    message = decode_error_code(-(2**31) | 2)
    assert message.startswith("metadata rejected (error code -2147483646)")
    assert "MALFORMED_LENGTHS" in message and "unknown bits" in message
    assert KdaMetadataError(-(2**31)).code == -(2**31)


def test_the_contract_values_are_the_designs():
    """docs/DESIGN.md §2: K = V in {64, 128}, capacity 1, 2 or 4, lower_bound in [-5, 0), the
    null slot -1. (A change here changes the contract: the design, the kernels and the oracles
    with it.)"""
    assert contract.HEAD_DIMS == (64, 128)
    assert contract.CAPACITIES == (1, 2, 4)
    assert contract.MIN_LOWER_BOUND == -5.0
    assert contract.NULL_SLOT == -1


# Mutation testing (.ci/mutation): `capacity == 1 and vector` in checkpoint_shape survives as
# `capacity <= 1 and vector`, an equivalent mutant: the two differ only at capacities below 1,
# which the contract has none of (CAPACITIES, checked above) and plan() rejects.
def test_shapes_follow_the_contract():
    assert contract.token_shapes(7, 2, 64)["beta"] == (7, 2)
    assert contract.token_shapes(7, 2, 64)["v"] == (7, 2, 64)
    assert contract.state_pool_shape(3, 2, 64) == (3, 2, 64, 64)
    assert contract.checkpoint_shape(5, 1, vector=True) == (5,)
    assert contract.checkpoint_shape(5, 1, vector=False) == (5, 1)
    assert contract.checkpoint_shape(5, 4, vector=True) == (5, 4)


def test_the_backend_table_serves_the_contracts_backends():
    from kdabench.kernels.api import BACKEND_TABLE

    assert tuple(BACKEND_TABLE) == contract.BACKENDS


@pytest.mark.parametrize("name", kernels.__all__)
def test_every_public_name_loads(name):
    assert getattr(kernels, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kernels.nothing  # noqa: B018
