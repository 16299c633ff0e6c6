/* large.c - blocks above 1 MB: the TEMPORARY plain path (see large.h).
 *
 * Each block is one reservation, aligned to 4 MB inside it so that the segment map can tell its first
 * 4 MB (SEG_LARGE) from the rest (SEG_LARGE_TAIL). A 32-byte header at the start holds a mark, which
 * is LIVE while the block is and FREED after, the committed size and where the reservation starts:
 *
 *   aligned start + 0   mark | usable | reservation | size          header, 32 bytes
 *   aligned start + 32  the block
 *
 * So a block is valid exactly when its address is 32 bytes into a SEG_LARGE granule and the header
 * there carries LIVE: interior pointers and addresses of freed blocks are rejected. Releasing gives
 * the whole reservation back (the map entries are cleared first).
 */
#include "large.h"

#include "../port/port.h"
#include "libc.h"
#include "medium.h"
#include "segment.h"

#define LARGE_HEADER 32
#define LARGE_MARK_LIVE 0x4c41524745ull  /* "LARGE" */
#define LARGE_MARK_FREED 0x46524545ull   /* "FREE" */

typedef struct large_header {
    uint64_t mark;
    size_t usable;       /* committed bytes after the header */
    void *reservation;   /* what port_reserve returned; the span + 4 MB of alignment slack long */
    size_t size;         /* the size asked for (medium or large in the statistics) */
} large_header;
_Static_assert(sizeof(large_header) == LARGE_HEADER, "the block follows a 32-byte header");

static size_t live_medium, live_large; /* atomics; this path makes an OS call per block anyway */

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

static size_t span_of(size_t usable) { return round_up(usable + LARGE_HEADER, SEGMENT_SIZE); }

static void count(size_t size, long delta)
{
    fetch_add_relaxed(size <= SHARD_MEDIUM_MAX ? &live_medium : &live_large, (size_t)delta);
}

void *large_alloc(size_t size)
{
    if (size > ((size_t)1 << 46))
        return NULL; /* beyond any address space we can map; also keeps the sums below from wrapping */
    size_t commit = round_up(size + LARGE_HEADER, PORT_PAGE);
    size_t span = span_of(commit - LARGE_HEADER);
    size_t reserved = span + SEGMENT_SIZE;
    uint8_t *r = os_reserve(reserved);
    if (r == NULL)
        return NULL;
    uint8_t *start = (uint8_t *)round_up((uintptr_t)r, SEGMENT_SIZE);
    if (os_commit(start, commit) != 0) {
        os_release(r, reserved, 0);
        return NULL;
    }
    if (segmap_set((uintptr_t)start, span, SEG_LARGE, SEG_LARGE_TAIL) != 0) {
        segmap_set((uintptr_t)start, span, SEG_NONE, SEG_NONE); /* undo what was set before it failed */
        os_release(r, reserved, commit);
        return NULL;
    }
    large_header *h = (large_header *)start;
    h->usable = commit - LARGE_HEADER;
    h->reservation = r;
    h->size = size;
    store_release(&h->mark, LARGE_MARK_LIVE);
    count(size, 1);
    return start + LARGE_HEADER;
}

static large_header *live_header(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if ((a & SEGMENT_MASK) != LARGE_HEADER || segmap_kind(a) != SEG_LARGE)
        return NULL;
    large_header *h = (large_header *)(a - LARGE_HEADER);
    return load_acquire(&h->mark) == LARGE_MARK_LIVE ? h : NULL;
}

int large_free(void *p)
{
    large_header *h = live_header(p);
    uint64_t live = LARGE_MARK_LIVE;
    if (h == NULL || !cas_acq_rel(&h->mark, &live, LARGE_MARK_FREED))
        return -1;
    uintptr_t start = (uintptr_t)h;
    size_t span = span_of(h->usable);
    count(h->size, -1);
    segmap_set(start, span, SEG_NONE, SEG_NONE);
    os_release(h->reservation, span + SEGMENT_SIZE, h->usable + LARGE_HEADER);
    return 0;
}

size_t large_usable(const void *p)
{
    large_header *h = live_header(p);
    return h ? h->usable : 0;
}

void *large_resize_in_place(void *p, size_t size)
{
    large_header *h = live_header(p);
    if (h == NULL || size > h->usable || size <= 16384 || (size <= SHARD_MEDIUM_MAX) != (h->size <= SHARD_MEDIUM_MAX))
        return NULL;
    h->size = size;
    return p;
}

void large_live_counts(size_t *medium, size_t *large)
{
    *medium = load_relaxed(&live_medium);
    *large = load_relaxed(&live_large);
}
