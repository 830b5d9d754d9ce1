"""Memory for the arrays a decoded token streams through once: on 2 MiB pages where the
system gives them.

Read from 4 KiB pages, a matrix costs an address translation (a TLB miss and a page walk)
every 4 KiB, and the hardware prefetchers stop at each page's end. Linux backs anonymous
memory with 2 MiB pages ("transparent huge pages") where a program asks for them with
madvise(MADV_HUGEPAGE) (the mode many distributions ship; "always" needs no asking). numpy
asks for arrays of 4 MiB or more, but from wherever malloc put them, so a matrix's first
and last 2 MiB stay on small pages, and smaller arrays get none. docs/llama.md ("Weights in
memory") has the figures.
"""
import mmap

import numpy as np

HUGE_PAGE = 2 << 20


def huge_page_bytes(nbytes):
    """A zeroed, writable uint8 array of nbytes starting on a 2 MiB boundary, in anonymous
    memory that the system is asked to back with 2 MiB pages (Linux: MADV_HUGEPAGE; the
    system decides, and gives 4 KiB pages where it has no 2 MiB page free or huge pages
    are off). Elsewhere (no madvise, no such advice), plain zeroed memory. The array keeps
    its mapping alive; memory is taken as it is first written, not here."""
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"huge_page_bytes: nbytes must be >= 0, got {nbytes}")
    if nbytes == 0 or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(nbytes, np.uint8)
    # private (a shared anonymous mapping is shmem, whose huge pages are a separate
    # setting), one huge page longer than asked so that a 2 MiB boundary lies inside
    size = (nbytes + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE + HUGE_PAGE
    try:
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return np.zeros(nbytes, np.uint8)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:      # a kernel without transparent huge pages: small pages, still good memory
        pass
    whole = np.frombuffer(mapping, np.uint8)
    start = -whole.ctypes.data % HUGE_PAGE
    return whole[start:start + nbytes]
