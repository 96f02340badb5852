"""Metadata of the cute GPU test `test_checkpoints_at_chunk_edges` (K128-H8-ragged-precomputed-C4:
lengths 700, 1, 64, 333; initial slots 0-3, final 4-7, checkpoints from 8), shared with the CPU
test that proves the metadata oracle accepts it."""

LENGTHS = [700, 1, 64, 333]
# on 16-token chunk boundaries, one token either side of one, one token before a sequence's end;
# the one-token sequence has none (its slots are -1)
OFFSETS = [[16, 32, 33, 699], [1, 1, 1, 1], [15, 16, 17, 63], [47, 48, 320, 332]]
SLOTS = [[8 + 4 * m + c if m != 1 else -1 for c in range(4)] for m in range(4)]
NUM_SLOTS = 24
