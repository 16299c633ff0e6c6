/* heap.h - the thread heap: what a thread allocates from, found through the port's heap slot.
 *
 * A heap is created the first time a thread allocates (a free alone creates none) and is never freed:
 * when its thread exits it goes on a stack of free heaps (one 16-byte CAS on the top with a change
 * counter against ABA) and the next new thread takes it, warm, with the pages that still hold live
 * blocks. Pages never change their owner, so the owner recorded in a segment stays valid.
 *
 * Depends on: small.h, medium.h, segment.h, sync.h, port.h.
 */
#ifndef SHARD_HEAP_H
#define SHARD_HEAP_H

#include "medium.h"
#include "small.h"

typedef struct page_list {
    page *first, *last;
} page_list;

typedef struct heap {
    /* The first page of the class of each size up to 2 KB, by (size + 15) >> 4, or the empty page.
     * Only small_set_first() writes it. */
    page *direct[SHARD_DIRECT_COUNT];
    page_list classes[SHARD_CLASS_COUNT]; /* pages with (possibly) free items; refilled ones at the tail */
    page_list free_pages;    /* committed, no class; the oldest first */
    page *cold_pages;        /* not committed (singly linked, ascending addresses first) */
    uint32_t free_count;     /* pages in free_pages */
    segment *segments;
    uint64_t pages_retired;  /* times a page of this heap became free */
    struct heap *next_all;   /* every heap ever made, for statistics */
    struct heap *next_free;  /* in the stack of free heaps */
    /* Medium blocks (medium.c): the bins of all the heap's arenas, the arenas, and the empty ones that
     * are still committed, the most recently emptied first. */
    medium_bins medium;
    struct arena *arenas;
    struct arena *empty_arenas;
    uint32_t empty_arena_count;
    uint32_t medium_ops;     /* counts medium operations: every 256th checks the empty arenas' age */
    /* Pages and arenas queued by foreign frees; written by other threads, so on a line of their own. */
    page *delayed __attribute__((aligned(64)));
    struct arena *delayed_arenas;
} heap;

/* The calling thread's heap, created (or taken from the free stack) if it has none; NULL when out of
 * memory. In a thread whose exit hook has already run (a thread-local destructor that allocates), the
 * heap is only lent: *lent is set to 1, the heap is not stored in the thread's slot, and the caller
 * makes its one allocation and then gives the heap back with heap_give_back. */
heap *heap_get_or_create(int *lent);

/* Puts a heap on the stack of free heaps: at thread exit, and after a lent heap's one use. */
void heap_give_back(heap *h);

/* The first heap of the list of all heaps (statistics walk it; heaps are never freed). */
heap *heap_all(void);

/* Heaps in the stack of free heaps (for statistics: exact when no thread starts or ends meanwhile). */
size_t heap_free_count(void);

#endif
