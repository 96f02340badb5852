"""The garbage collector's clock: collections it sees, and none once removed."""

import gc

from kdabench.serve.gc_clock import GcClock


def test_counts_collections_while_installed():
    clock = GcClock()
    clock.install()
    try:
        gc.collect()
        gc.collect()
        total_ms, collections = clock.reading()
        assert collections >= 2 and total_ms > 0
    finally:
        clock.remove()
    gc.collect()
    assert clock.reading() == (total_ms, collections)
    clock.remove()  # a second removal is harmless
