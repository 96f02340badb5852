"""Transactional validation under the interpreter: each fault class rejected, nothing written.

Every rejected call must set exactly its bit (the one `expected_error_code` computes, too),
leave the pool bit-for-bit unchanged, fill the whole output with NaN, and decode into a
message naming the fault; `raise_for_error` raises KdaMetadataError. A hypothesis fuzz test
checks the device validator against the host reference on random metadata.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdabench.inputs import make_inputs
from kdabench.kernels import (
    Caps,
    KdaMetadataError,
    KernelConfig,
    MetadataFault,
    bind,
    decode_error_code,
    kda_prefill,
    plan,
    run,
)
from kdabench.oracles import assert_close, expected_error_code, recurrent_kda

HEADS, DIM = 1, 64
NUM_SLOTS = 16
DUP = MetadataFault.DUPLICATE_WRITE_SLOT
LENGTHS_BAD = MetadataFault.MALFORMED_LENGTHS
RANGE = MetadataFault.SLOT_OUT_OF_RANGE
OFFSET = MetadataFault.BAD_CHECKPOINT_OFFSET


@functools.cache
def inputs(num_tokens: int):
    return make_inputs([num_tokens], HEADS, DIM, seed=7)


BASE_CHECKPOINTS = {  # capacity: (offsets, slots) per sequence (lengths 20, 17, 5); -1: inactive
    1: ([[1], [8], [4]], [[6], [7], [8]]),
    2: ([[1, 16], [8, 16], [4, 1]], [[6, 7], [8, 9], [10, -1]]),
    4: ([[1, 12, 16, 19], [8, 16, 2, 3], [4, 1, 2, 3]],
        [[6, 7, 8, -1], [9, 10, -1, -1], [11, -1, -1, -1]]),
}


def valid_metadata(capacity: int) -> dict:
    """A valid layout: initial slots 0-2, final slots 3-5, checkpoint slots from 6 on."""
    offsets, slots = BASE_CHECKPOINTS[capacity]
    return {"cu_seqlens": [0, 20, 37, 42], "initial": [0, 1, 2], "final": [3, 4, 5],
            "ck_offsets": [list(row) for row in offsets],
            "ck_slots": [list(row) for row in slots]}


def metadata_tensors(meta: dict, capacity: int, dtype=torch.int32) -> dict:
    def t(values):
        return torch.tensor(values, dtype=dtype)

    offsets, slots = t(meta["ck_offsets"]), t(meta["ck_slots"])
    if capacity == 1:
        offsets, slots = offsets[:, 0].contiguous(), slots[:, 0].contiguous()
    return {"cu_seqlens": t(meta["cu_seqlens"]), "initial_state_indices": t(meta["initial"]),
            "final_state_indices": t(meta["final"]), "checkpoint_offsets": offsets,
            "checkpoint_state_indices": slots}


def random_pool(num_slots: int = NUM_SLOTS, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_slots, HEADS, DIM, DIM, generator=gen)


# The split pipeline (decay, blocks and solve kernels, the state pass without the output, the
# checkpoint and output kernels), at 16-token chunks so that checkpoints fall inside chunks.
SPLIT = KernelConfig(chunk_size=16, block_v=16, pipeline="split")
# The split pipeline solving stage 1 from each chunk's inverse (its own kernel from two
# sub-blocks on, hence 32-token chunks).
SPLIT_INVERSE = KernelConfig(chunk_size=32, block_v=16, pipeline="split", solve="inverse")
# The interior checkpoints formed in the pass (no checkpoint kernel), in each pipeline.
FUSED_IN_PASS = KernelConfig(chunk_size=16, block_v=16, checkpoints="pass")
SPLIT_IN_PASS = KernelConfig(chunk_size=16, block_v=16, pipeline="split", checkpoints="pass")


def call(meta: dict, capacity: int, num_tokens: int = 42, dtype=torch.int32,
         config: KernelConfig | None = None):
    """Run the prefill on `meta` (the functional API, or plan/bind/run under `config`); return
    (result, pool before, pool after)."""
    x = inputs(num_tokens)
    pool = random_pool()
    pool_before = pool.clone()
    metadata = metadata_tensors(meta, capacity, dtype)
    if config is None:
        result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool, **metadata)
    else:
        caps = Caps(device="cpu", num_heads=HEADS, head_dim=DIM, max_tokens=num_tokens,
                    max_seqs=len(meta["cu_seqlens"]) - 1, max_state_slots=NUM_SLOTS,
                    max_checkpoints=capacity)
        result = run(bind(plan(caps, config), x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                          **metadata))
    return result, pool_before, pool


def expected_code(meta: dict, capacity: int, num_tokens: int = 42, num_seqs=None) -> int:
    rows = [row[0] for row in meta["ck_offsets"]] if capacity == 1 else meta["ck_offsets"]
    slots = [row[0] for row in meta["ck_slots"]] if capacity == 1 else meta["ck_slots"]
    live = len(meta["cu_seqlens"]) - 1 if num_seqs is None else num_seqs
    return expected_error_code(meta["cu_seqlens"], live, meta["initial"], meta["final"], rows,
                               slots, NUM_SLOTS, num_tokens)


def assert_rejected(result, pool_before, pool, fault: MetadataFault, reference_code: int):
    code = int(result.error_code)
    assert code == int(fault), f"error code {code} ({decode_error_code(code)}), expected {fault!r}"
    assert reference_code == int(fault), f"expected_error_code says {reference_code}"
    assert torch.equal(pool, pool_before), "a rejected call changed the state pool"
    assert bool(result.o.isnan().all()), "a rejected call left output values that are not NaN"
    for bit in (f for f in MetadataFault if f & fault):  # each fault of a combination
        assert bit.name in decode_error_code(code)
        assert bit.name in result.message()
    with pytest.raises(KdaMetadataError) as caught:
        result.raise_for_error()
    assert caught.value.code == int(fault)


def edited(capacity: int, changes: dict) -> dict:
    """The valid layout with `changes` applied: a new value, or an edit of the old one."""
    meta = valid_metadata(capacity)
    for key, edit in changes.items():
        meta[key] = edit(meta[key]) if callable(edit) else edit
    return meta


def set_at(row: int, column: int | None, value: int):
    """An edit that sets meta[key][row] (or [row][column]) to value."""
    def edit(entries):
        entries = [list(e) if isinstance(e, list) else e for e in entries]
        if column is None:
            entries[row] = value
        else:
            entries[row][column] = value
        return entries
    return edit


@pytest.mark.parametrize("config", [None, SPLIT, SPLIT_INVERSE],
                         ids=["default", "split", "split-inverse"])
@pytest.mark.parametrize("capacity", [1, 2, 4], ids=["C1", "C2", "C4"])
def test_valid_base_metadata_is_accepted(capacity, config):
    """The layout the fault tests edit is valid: each rejection comes from its one edit."""
    meta = valid_metadata(capacity)
    result, pool_before, pool = call(meta, capacity, config=config)
    assert int(result.error_code) == 0, result.message()
    assert expected_code(meta, capacity) == 0
    result.raise_for_error()
    assert not torch.equal(pool, pool_before)
    assert not bool(result.o.isnan().any())


# ---- bit 0: duplicate or conflicting write slots --------------------------------------------


@pytest.mark.parametrize("capacity, changes", [
    (1, {"final": [3, 3, 5]}),
    (2, {"ck_slots": set_at(1, 1, 3)}),  # sequence 1's checkpoint on sequence 0's final slot
    (2, {"ck_slots": set_at(0, 1, 4)}),  # sequence 0's checkpoint on sequence 1's final slot
    (4, {"ck_slots": set_at(0, 1, 3)}),  # a checkpoint on its own sequence's final slot
    (2, {"ck_slots": set_at(0, 1, 6)}),  # both checkpoints of sequence 0 on one slot
    (2, {"ck_slots": set_at(1, 0, 6)}),  # checkpoints of sequences 0 and 1 on one slot
    (1, {"initial": [10, 1, 2], "final": [0, 4, 0]}),  # slot 0, which no sequence reads
], ids=["final-final", "checkpoint-on-earlier-final", "checkpoint-on-later-final",
        "checkpoint-on-own-final", "checkpoints-same-sequence", "checkpoints-across-sequences",
        "final-final-slot0"])
def test_duplicate_write_slot(capacity, changes):
    meta = edited(capacity, changes)
    assert_rejected(*call(meta, capacity), DUP, expected_code(meta, capacity))


@pytest.mark.parametrize("capacity, changes", [
    (1, {"final": [3, 0, 5]}),  # sequence 1 writes its final on sequence 0's initial slot
    (2, {"ck_slots": set_at(0, 0, 2)}),  # a checkpoint on sequence 2's initial slot
], ids=["final-on-other-initial", "checkpoint-on-other-initial"])
def test_write_slot_aliasing_another_sequence_initial_slot(capacity, changes):
    meta = edited(capacity, changes)
    assert_rejected(*call(meta, capacity), DUP, expected_code(meta, capacity))


def test_own_initial_slot_as_final_slot_is_accepted():
    """In-place update (vLLM's usual case): read slot s, write slot s, same sequence."""
    meta = edited(2, {"final": [0, 1, 2]})
    x = inputs(42)
    pool = random_pool()
    pool_before = pool.clone()
    result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                         **metadata_tensors(meta, 2))
    assert int(result.error_code) == 0, result.message()
    assert expected_code(meta, 2) == 0
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=meta["cu_seqlens"],
                        initial_state=pool_before[:3])
    assert_close("states updated in place", ref.final_state, pool[:3], 3e-3)


MANY = 70  # more sequences than one block (64) of the device validator


def many_sequences() -> dict:
    """70 sequences of 2-4 tokens, each with a final slot and one checkpoint (capacity 1)."""
    lengths = [2 + n % 3 for n in range(MANY)]
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    return {"cu_seqlens": cu, "initial": [-1] * MANY, "final": list(range(MANY)),
            "ck_offsets": [[1] for _ in range(MANY)],
            "ck_slots": [[MANY + n] for n in range(MANY)]}


def many_call(meta: dict):
    x = inputs(meta["cu_seqlens"][-1])
    pool = random_pool(2 * MANY + 2)
    pool_before = pool.clone()
    result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                         **metadata_tensors(meta, 1))
    return result, pool_before, pool


@pytest.mark.parametrize("slot_of, target", [
    (("final", 67, None), 3),  # final of sequence 67 on the final of sequence 3
    (("ck_slots", 2, 0), 68),  # checkpoint of sequence 2 on the final of sequence 68
    (("ck_slots", 66, 0), MANY + 65),  # two checkpoints in the second block
    (("initial", 68, None), 3),  # the initial slot of sequence 68 (the clash kernel's second
    # tile of initial slots) is the final of sequence 3
], ids=["final-block1-on-final-block0", "checkpoint-block0-on-final-block1",
        "checkpoints-within-block1", "initial-block1-is-final-block0"])
def test_duplicate_write_slot_across_validator_blocks(slot_of, target):
    meta = many_sequences()
    key, row, column = slot_of
    meta = {**meta, key: set_at(row, column, target)(meta[key])}
    result = many_call(meta)
    assert_rejected(*result, DUP, many_expected_code(meta))


def many_expected_code(meta: dict) -> int:
    return expected_error_code(meta["cu_seqlens"], MANY, meta["initial"], meta["final"],
                               [r[0] for r in meta["ck_offsets"]],
                               [r[0] for r in meta["ck_slots"]], 2 * MANY + 2,
                               meta["cu_seqlens"][-1])


# The clash kernel's tile counts (kda_clash_kernel): one sequence (a single write tile, whose
# clash is within itself) and 64 sequences at capacity 1, whose 128 writes fill exactly two
# tiles, so the initial slots' tile is the grid's last row (a write-tile count one too large
# would push it off the grid).
@pytest.mark.parametrize("count, fault", [
    (1, (("ck_slots", 0, 0), ("final", 0, None))),
    (64, (("final", 5, None), ("initial", 60, None))),
], ids=["one-sequence-checkpoint-on-own-final", "two-full-tiles-final-on-other-initial"])
def test_duplicate_write_slot_at_tile_counts(count, fault):
    lengths = [2 + n % 3 for n in range(count)]
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    meta = {"cu_seqlens": cu, "initial": [2 * count + n for n in range(count)],
            "final": list(range(count)), "ck_offsets": [[1] for _ in range(count)],
            "ck_slots": [[count + n] for n in range(count)]}
    (dst, i, c), (src, j, d) = fault
    source = meta[src][j] if d is None else meta[src][j][d]
    meta = {**meta, dst: set_at(i, c, source)(meta[dst])}
    num_slots = 3 * count
    x = inputs(cu[-1])
    pool = random_pool(num_slots)
    pool_before = pool.clone()
    result = kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                         **metadata_tensors(meta, 1))
    reference = expected_error_code(cu, count, meta["initial"], meta["final"],
                                    [r[0] for r in meta["ck_offsets"]],
                                    [r[0] for r in meta["ck_slots"]], num_slots, cu[-1])
    assert_rejected(result, pool_before, pool, DUP, reference)


@pytest.mark.parametrize("row, offset", [(64, 0), (69, 2 + 69 % 3)],
                         ids=["offset-0-first-of-block1", "offset-eq-len-last-sequence"])
def test_bad_checkpoint_offset_in_second_validator_block(row, offset):
    meta = many_sequences()
    meta = {**meta, "ck_offsets": set_at(row, 0, offset)(meta["ck_offsets"])}
    assert_rejected(*many_call(meta), OFFSET, many_expected_code(meta))


def test_many_sequences_accepted():
    """The control for the test above."""
    result, pool_before, pool = many_call(many_sequences())
    assert int(result.error_code) == 0, result.message()
    changed = [s for s in range(pool.shape[0]) if not torch.equal(pool[s], pool_before[s])]
    assert changed == list(range(2 * MANY)), "every final and checkpoint slot, nothing else"


SPARE = 2 * MANY  # the first of the two slots the 70-sequence set leaves spare
CU = many_sequences()["cu_seqlens"]


@pytest.mark.parametrize("entries, fault", [
    ({"initial": {3: SPARE + 9, 67: SPARE + 9}}, RANGE),
    ({"ck_offsets": {3: [0], 67: [0]}}, OFFSET),
    # sequences 3 and 67 of -1 tokens (their checkpoints at offset 1 fall outside them too)
    ({"cu_seqlens": {4: CU[3] - 1, 68: CU[67] - 1}}, LENGTHS_BAD | OFFSET),
    # sequence 1 writes sequence 0's initial slot, sequence 33 sequence 64's: one lane pair of
    # the validator's clash matrix, in the first and then the second block of 64
    ({"initial": {0: SPARE, 64: SPARE + 1}, "final": {1: SPARE, 33: SPARE + 1}}, DUP),
], ids=["slots", "offsets", "lengths", "aliases"])
def test_one_fault_in_both_validator_blocks(entries, fault):
    """A second finding of a fault keeps its bit set: the validator gathers each rule's
    failures lane by lane over its blocks of 64 sequences, so each case puts them in one lane
    of both blocks (sequences 3 and 67), where a toggled flag would clear."""
    meta = many_sequences()
    for key, values in entries.items():
        meta[key] = [values.get(n, e) for n, e in enumerate(meta[key])]
    assert_rejected(*many_call(meta), fault, many_expected_code(meta))


# ---- chunk offsets: the first global chunk of each sequence, for the prefill ------------------

CHUNK_LENGTHS = [0, 1, 15, 16, 17, 31, 32, 33]  # about multiples of a 16-token chunk


@pytest.mark.parametrize("count", [len(CHUNK_LENGTHS), MANY], ids=["one-block", "two-blocks"])
def test_chunk_offsets(count):
    """chunk_offsets[n] = the chunks of the sequences before n (ceil(len / 16) each, an empty
    sequence none), chunk_offsets[N] their total; only the validation runs."""
    from kdabench.kernels.triton import launch

    lengths = [CHUNK_LENGTHS[n % len(CHUNK_LENGTHS)] for n in range(count)]
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    x = inputs(cu[-1])
    caps = Caps(device="cpu", num_heads=HEADS, head_dim=DIM, max_tokens=cu[-1], max_seqs=count,
                max_state_slots=1, max_checkpoints=1)
    null = [-1] * count
    binding = bind(plan(caps, KernelConfig(chunk_size=16)), x.q, x.k, x.v, x.g, x.beta,
                   state_pool=random_pool(1), **metadata_tensors(
                       {"cu_seqlens": cu, "initial": null, "final": null,
                        "ck_offsets": [[0]] * count, "ck_slots": [[-1]] * count}, 1))
    launch.validate(binding)
    expected = [0]
    for length in lengths:
        expected.append(expected[-1] + -(-length // 16))
    assert int(binding.plan.error_code) == 0
    assert binding.plan.workspaces["chunk_offsets"].tolist() == expected


# ---- bit 1: malformed lengths -----------------------------------------------------------------


@pytest.mark.parametrize("capacity, changes", [
    (1, {"cu_seqlens": [0, 20, 18, 42]}),
    (2, {"cu_seqlens": [0, 20, 20, 17]}),
    (1, {"cu_seqlens": [0, 20, 19, 42]}),  # a length of -1
], ids=["decreasing-middle", "decreasing-last", "decreasing-by-one"])
def test_non_monotone_cu_seqlens(capacity, changes):
    meta = edited(capacity, changes)
    for n in range(3):  # checkpoints of negative-length sequences would add bit 3
        meta["ck_slots"][n] = [-1] * capacity
    assert_rejected(*call(meta, capacity), LENGTHS_BAD, expected_code(meta, capacity))


@pytest.mark.parametrize("cu_seqlens", [[1, 20, 37, 42], [-1, 20, 37, 42], [1, 20, 37, 43]],
                         ids=["at-1", "at-minus-1", "at-1-and-ending-past-the-tokens"])
def test_cu_seqlens_not_starting_at_zero(cu_seqlens):
    meta = edited(2, {"cu_seqlens": cu_seqlens})
    assert_rejected(*call(meta, 2), LENGTHS_BAD, expected_code(meta, 2))


@pytest.mark.parametrize("num_tokens", [41, 30], ids=["one-past", "far-past"])
def test_tokens_beyond_capacity(num_tokens):
    """cu_seqlens ends at 42, q holds fewer tokens."""
    meta = edited(2, {"cu_seqlens": [0, 20, 37, 42]})
    result = call(meta, 2, num_tokens=num_tokens)
    assert_rejected(*result, LENGTHS_BAD, expected_code(meta, 2, num_tokens=num_tokens))


def planned_call(meta: dict, capacity: int, num_seqs: int):
    x = inputs(42)
    caps = Caps(device="cpu", num_heads=HEADS, head_dim=DIM, max_tokens=42, max_seqs=3,
                max_state_slots=NUM_SLOTS, max_checkpoints=capacity)
    pool = random_pool()
    pool_before = pool.clone()
    binding = bind(plan(caps), x.q, x.k, x.v, x.g, x.beta, state_pool=pool, num_seqs=num_seqs,
                   **metadata_tensors(meta, capacity))
    return run(binding), pool_before, pool


@pytest.mark.parametrize("num_seqs", [0, 4, -1], ids=["zero", "above-capacity", "negative"])
def test_live_sequence_count_outside_capacity(num_seqs):
    meta = valid_metadata(2)
    result = planned_call(meta, 2, num_seqs)
    assert_rejected(*result, LENGTHS_BAD, expected_code(meta, 2, num_seqs=num_seqs))


def test_duplicate_write_slot_below_capacity():
    """Two live sequences of a three-sequence capacity share a final slot: the clash check
    runs whatever the live count, not only at capacity."""
    meta = edited(2, {"final": [3, 3, 5]})
    result = planned_call(meta, 2, num_seqs=2)
    assert_rejected(*result, DUP, expected_code(meta, 2, num_seqs=2))


def test_live_sequence_count_inside_capacity_ignores_dead_entries():
    """Entries past num_seqs are not examined, however wrong they are."""
    meta = edited(2, {"cu_seqlens": [0, 20, 10, 99], "final": [3, 99, 3], "initial": [0, -7, 2]})
    result, _, _ = planned_call(meta, 2, num_seqs=1)
    assert int(result.error_code) == 0, result.message()
    assert expected_code(meta, 2, num_seqs=1) == 0


# ---- bit 2: slot out of range -----------------------------------------------------------------


@pytest.mark.parametrize("capacity, changes", [
    (1, {"final": set_at(1, None, NUM_SLOTS)}),
    (1, {"initial": set_at(0, None, NUM_SLOTS + 100)}),
    (2, {"ck_slots": set_at(2, 0, NUM_SLOTS)}),
    (1, {"final": set_at(2, None, -2)}),
    (2, {"initial": set_at(1, None, -5)}),
    (4, {"ck_slots": set_at(0, 2, -3)}),
    (1, {"final": set_at(0, None, 2**31 - 1)}),
    (1, {"initial": set_at(0, None, NUM_SLOTS)}),
    (2, {"ck_slots": set_at(2, 0, NUM_SLOTS + 5)}),
    (1, {"initial": set_at(1, None, NUM_SLOTS), "final": set_at(1, None, -2)}),
    (1, {"initial": set_at(0, None, NUM_SLOTS), "ck_slots": set_at(0, 0, NUM_SLOTS)}),
], ids=["final-eq-num-slots", "initial-past-end", "checkpoint-eq-num-slots", "final-minus2",
        "initial-minus5", "checkpoint-minus3", "final-int32-max", "initial-eq-num-slots",
        "checkpoint-past-end", "initial-past-end-final-minus2", "initial-and-checkpoint"])
def test_slot_out_of_range(capacity, changes):
    meta = edited(capacity, changes)
    assert_rejected(*call(meta, capacity), RANGE, expected_code(meta, capacity))


def test_slot_out_of_range_with_int64_indices():
    """An int64 slot past 2^32 must not wrap into range."""
    meta = edited(1, {"final": set_at(0, None, 2**32 + 3)})
    result = call(meta, 1, dtype=torch.int64)
    assert_rejected(*result, RANGE, expected_code(meta, 1))


# ---- bit 3: bad checkpoint offsets ------------------------------------------------------------


@pytest.mark.parametrize("capacity, changes", [
    (1, {"ck_offsets": set_at(1, 0, 0)}),
    (2, {"ck_offsets": set_at(0, 1, 20)}),  # == len of sequence 0
    (1, {"ck_offsets": set_at(2, 0, 5)}),  # == len of sequence 2
    (2, {"ck_offsets": set_at(0, 1, 1000)}),
    (1, {"ck_offsets": set_at(0, 0, -4)}),
    (2, {"ck_offsets": set_at(0, 1, 1)}),  # [1, 1]: duplicate offsets
    (2, {"ck_offsets": set_at(1, 1, 7)}),  # [8, 7]: decreasing
    (4, {"ck_offsets": set_at(0, 2, 5)}),  # [1, 12, 5]: not increasing
    (1, {"cu_seqlens": [0, 20, 20, 42], "ck_offsets": set_at(1, 0, 0)}),  # 0 in an empty one
], ids=["offset-0", "offset-eq-len", "offset-eq-len-short", "offset-far-past", "offset-negative",
        "duplicate-offsets", "decreasing-offsets", "not-increasing-third",
        "offset-0-empty-sequence"])
def test_bad_checkpoint_offset(capacity, changes):
    meta = edited(capacity, changes)
    assert_rejected(*call(meta, capacity), OFFSET, expected_code(meta, capacity))


@pytest.mark.parametrize("capacity, changes, fault", [
    (2, {"ck_slots": set_at(1, 1, 3)}, DUP),
    (1, {"final": [3, 0, 5]}, DUP),
    (1, {"cu_seqlens": [0, 20, 18, 42], "ck_slots": [[-1]] * 3}, LENGTHS_BAD),
    (4, {"ck_slots": set_at(0, 1, NUM_SLOTS)}, RANGE),
    (4, {"ck_offsets": set_at(0, 2, 5)}, OFFSET),
], ids=["duplicate-write", "write-on-other-initial", "lengths", "slot-range", "offset"])
@pytest.mark.parametrize("config", [SPLIT, SPLIT_INVERSE, FUSED_IN_PASS, SPLIT_IN_PASS],
                         ids=["split", "split-inverse", "fused-in-pass", "split-in-pass"])
def test_split_pipeline_rejects_each_fault_class(capacity, changes, fault, config):
    """The split pipeline's kernels (with either solve of stage 1), and either pipeline with the
    checkpoints formed in the pass, honour the error code as the default ones do: each fault
    class leaves the pool bit for bit unchanged and the whole output NaN."""
    meta = edited(capacity, changes)
    assert_rejected(*call(meta, capacity, config=config), fault, expected_code(meta, capacity))


def test_only_the_null_index_makes_a_checkpoint_inactive():
    """Checkpoint slot -2 is out of range and still active: its offset (0) is judged too."""
    meta = edited(1, {"ck_slots": set_at(2, 0, -2), "ck_offsets": set_at(2, 0, 0)})
    assert_rejected(*call(meta, 1), RANGE | OFFSET, expected_code(meta, 1))


def test_inactive_entries_with_garbage_offsets_are_accepted():
    """Entries with slot -1 are skipped, whatever their offsets (and wherever they sit)."""
    meta = edited(4, {"ck_offsets": [[0, 16, 19, -9], [8, 999, 16, 0], [4, 0, 0, 0]],
                      "ck_slots": [[-1, 6, 7, -1], [8, -1, 9, -1], [10, -1, -1, -1]]})
    result, _, _ = call(meta, 4)
    assert int(result.error_code) == 0, result.message()
    assert expected_code(meta, 4) == 0


@pytest.mark.parametrize("offset, slot, fault", [
    (19, NUM_SLOTS, RANGE),
    (19, 4, DUP),  # sequence 1's final slot
    (19, 9, DUP),  # the slot of sequence 1's first checkpoint
    (19, 1, DUP),  # sequence 1's initial slot
    (20, 15, OFFSET),  # offset == len
    (14, 15, OFFSET),  # below the third offset (16)
    (16, 15, OFFSET),  # equal to the third offset
], ids=["slot-eq-num-slots", "slot-on-other-final", "slot-on-other-checkpoint",
        "slot-on-other-initial", "offset-eq-len", "offset-below-third", "offset-eq-third"])
def test_invalid_fourth_destination(offset, slot, fault):
    """Capacity 4: sequence 0 has three valid checkpoints (1, 12, 16) and a bad fourth."""
    meta = valid_metadata(4)
    meta["ck_offsets"][0][3], meta["ck_slots"][0][3] = offset, slot
    assert_rejected(*call(meta, 4), fault, expected_code(meta, 4))


def test_valid_fourth_destination_is_accepted():
    """The control for the test above: offset 19 into spare slot 15 goes through."""
    meta = valid_metadata(4)
    meta["ck_offsets"][0][3], meta["ck_slots"][0][3] = 19, 15
    result, pool_before, pool = call(meta, 4)
    assert int(result.error_code) == 0, result.message()
    assert expected_code(meta, 4) == 0
    assert not torch.equal(pool[15], pool_before[15])


# ---- fuzz: the device validator against the host reference ------------------------------------

FUZZ_TOKENS = 48
FUZZ_SLOTS = 8


MUTATIONS = ["cu", "num_seqs", "slot", "offset", "alias", "duplicate"]


@st.composite
def metadata_sets(draw):
    """Small valid metadata sets, most of them then broken by one to three random mutations."""
    capacity = draw(st.sampled_from([1, 2, 4]))
    n = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, 16), min_size=n, max_size=n))
    cu = [0]
    for length in lengths:
        cu.append(cu[-1] + length)
    slots = draw(st.permutations(range(FUZZ_SLOTS)))
    null = st.integers(0, 3).map(lambda i: i == 0)  # -1 a quarter of the time
    initial = [-1 if draw(null) else slots[i] for i in range(n)]
    final = [-1 if draw(null) else slots[n + i] for i in range(n)]
    spare = list(slots[2 * n:])
    ck_offsets, ck_slots = [], []
    for length in lengths:
        row_offsets, row_slots = [], []
        previous = 0
        for _ in range(capacity):
            if previous + 1 <= length - 1 and spare and not draw(null):
                previous = draw(st.integers(previous + 1, length - 1))
                row_offsets.append(previous)
                row_slots.append(spare.pop())
            else:
                row_offsets.append(draw(st.integers(-1, length + 1)))
                row_slots.append(-1)
        ck_offsets.append(row_offsets)
        ck_slots.append(row_slots)
    num_seqs = n
    meta = {"cu_seqlens": cu, "initial": initial, "final": final, "ck_offsets": ck_offsets,
            "ck_slots": ck_slots}
    for _ in range(draw(st.sampled_from([1, 2, 1, 3, 0, 1]))):
        kind = draw(st.sampled_from(MUTATIONS))
        n_at = draw(st.integers(0, n - 1))
        if kind == "cu":
            at = draw(st.integers(0, n))
            meta["cu_seqlens"][at] = draw(st.integers(-2, FUZZ_TOKENS + 3))
        elif kind == "num_seqs":
            num_seqs = draw(st.sampled_from([0, n + 1, max(n - 1, 1)]))
        elif kind == "slot":
            key = draw(st.sampled_from(["initial", "final", "ck_slots"]))
            value = draw(st.sampled_from([-3, -2, FUZZ_SLOTS, FUZZ_SLOTS + 1, *range(FUZZ_SLOTS)]))
            if key == "ck_slots":
                meta[key][n_at][draw(st.integers(0, capacity - 1))] = value
            else:
                meta[key][n_at] = value
        elif kind == "offset":
            c = draw(st.integers(0, capacity - 1))
            meta["ck_offsets"][n_at][c] = draw(st.integers(-1, lengths[n_at] + 1))
        elif kind == "alias":  # a final slot onto some initial slot
            meta["final"][n_at] = meta["initial"][draw(st.integers(0, n - 1))]
        else:  # a checkpoint slot onto some final slot
            c = draw(st.integers(0, capacity - 1))
            meta["ck_slots"][n_at][c] = meta["final"][draw(st.integers(0, n - 1))]
    return meta, capacity, num_seqs


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=metadata_sets())
def test_fuzz_device_validator_matches_host_reference(case):
    meta, capacity, num_seqs = case
    n = len(meta["cu_seqlens"]) - 1
    expected = expected_error_code(
        meta["cu_seqlens"], num_seqs, meta["initial"], meta["final"],
        [row[0] for row in meta["ck_offsets"]] if capacity == 1 else meta["ck_offsets"],
        [row[0] for row in meta["ck_slots"]] if capacity == 1 else meta["ck_slots"],
        FUZZ_SLOTS, FUZZ_TOKENS,
    )
    x = inputs(FUZZ_TOKENS)
    caps = Caps(device="cpu", num_heads=HEADS, head_dim=DIM, max_tokens=FUZZ_TOKENS,
                max_seqs=n, max_state_slots=FUZZ_SLOTS, max_checkpoints=capacity)
    pool = random_pool(FUZZ_SLOTS)
    pool_before = pool.clone()
    binding = bind(plan(caps), x.q, x.k, x.v, x.g, x.beta, state_pool=pool, num_seqs=num_seqs,
                   **metadata_tensors(meta, capacity))
    binding.out.zero_()
    result = run(binding)
    code = int(result.error_code)
    assert code == expected, (
        f"device validator says {code} ({decode_error_code(code)}), "
        f"host reference {expected} ({decode_error_code(expected)})")
    if code:
        assert torch.equal(pool, pool_before), "a rejected call changed the state pool"
        assert bool(result.o.isnan().all())
    else:
        live = meta["final"][:num_seqs] + [s for row in meta["ck_slots"][:num_seqs] for s in row]
        changed = {s for s in range(FUZZ_SLOTS) if not torch.equal(pool[s], pool_before[s])}
        assert changed <= {s for s in live if s >= 0}, f"slots {changed} written, asked {live}"
        assert not math.isnan(float(result.o[: meta["cu_seqlens"][num_seqs]].float().sum()))


# Mutation testing (.ci/mutation, kernels/NOTES.md): the mutants of kernels/triton/validate.py
# that these tests leave alive are equivalent, or killed by a test outside the mutation's
# command. The whole run of 2026-12-07 (395 mutants, 354 killed, 41 alive) left two real gaps
# in kda_clash_kernel, which test_duplicate_write_slot_below_capacity (the live-count test's
# `num_seqs <= meta_capacity` -> `==`) and the initial-slot case of
# test_duplicate_write_slot_across_validator_blocks (`b < write_tiles` -> `!=`, which skips
# the initial slots' tiles after the first) now kill; an earlier partial run's two, the
# write-tile count's `- 1` -> `+ 1` and `num_seqs >= 1` -> `>= 2`, are killed by
# test_duplicate_write_slot_at_tile_counts. The equivalent ones in kda_clash_kernel:
# - `num_seqs >= 1` -> `>= 0`: no live sequence, no writes, nothing compared.
# - `a0 < num_writes` -> `<=` or `!=`: a tile from num_writes on holds only null slots.
# - the write-tile count's `- 1` -> `- 2`: one tile fewer only when the last holds one write,
#   whose clashes with earlier tiles program (last, b) still finds; the initial slots' tiles
#   then start a row earlier, and the grid (sized by the capacity) still reaches the last.
# - `wa != wb` -> `wa > wb` or `<`: programs (a, b) and (b, a) both run, so each pair is found
#   once.
# - `> 0` -> `!= 0` after the clash max, and `axis=0` -> another axis: as below.
# The 2026-12-05 survivors:
# - `@triton.jit` removed from `_write_slot`: the interpreter calls a plain Python function
#   alike; the compiler refuses it ("Unsupported function referenced"), which
#   tests/kernels/test_triton_compile.py catches (it compiles every kernel, too slow a command
#   for each mutant).
# - `axis=0` -> `axis=-1` (each bit's max, the chunks' cumsum and sum): every operand is 1-D.
# - `> 0` -> `!= 0` after each bit's max: a max of 0/1 flags is never negative.
# - `_write_slot`: `j == 0` -> `j >= 0` or `j <= 0` (the final's load mask, the final/checkpoint
#   choice), `j > 0` -> `j != 0`: j = w % (1 + CK) is never negative, and a final loaded for
#   j > 0 is discarded by the choice.
# - `|` -> `^` between two conditions that never hold together: `num_seqs < 1` and
#   `num_seqs > meta_capacity` (bind() requires cu_seqlens of 2 entries or more, so the capacity
#   is at least 1); `x < NULL` and `x >= num_slots` for an initial, final or checkpoint slot.
# - `err | BIT` -> `err ^ BIT` where err cannot hold the bit yet: the lengths bit of the live
#   count and of cu_seqlens' ends (err is still 0 there), the range, offset and duplicate bits
#   (each set once).
# - `other=0` -> `1` or `-1` for bos, eos and the checkpoint offsets: the masked lanes are dead
#   sequences, masked again wherever their values are used (live, cmask).
# - `tl.maximum(seqlen, 0)` -> `tl.maximum(seqlen, -1)`: (-1 + CHUNK - 1) // CHUNK is 0 too.
# - `rck < CK` -> `rck <= CK` or `rck != CK`: rck = arange(0, CK) is below CK throughout.
# - `unordered | (active & outside)` -> `^`: where both hold at (i, j), the flag at (i, i) (never
#   an ordered pair: `earlier` is strict) still carries checkpoint i's outside offset.
