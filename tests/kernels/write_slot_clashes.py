"""Write-slot clashes across the validators' tiles, shared by the Triton and cute GPU tests: 300
sequences at capacity 4 write 1,500 destinations, compared with each other and with the 300
initial slots. Each fault gives one write (kind, sequence, checkpoint) the slot of an entry in
another tile; "in place" (None) makes every sequence's final slot its own initial one, which is
allowed."""

MANY_SEQS = 300
CLASHES = {
    "in place": None,
    "first final = last checkpoint": (("final", 0, 0), ("checkpoint", MANY_SEQS - 1, 3)),
    "first final = last initial": (("final", 0, 0), ("initial", MANY_SEQS - 1, 0)),
    "last checkpoint = first initial": (("checkpoint", MANY_SEQS - 1, 3), ("initial", 0, 0)),
}
