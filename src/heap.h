/* heap.h - the thread heap: what a thread allocates from, found through the port's heap slot.
 *
 * A heap is created the first time a thread allocates (a free creates none but takes the waiting heap it
 * frees into, heap_claim, or one to gather its frees in if that heap has a thread, heap_for_frees) and
 * is never freed:
 * when its thread exits it goes on a stack of free heaps (one 16-byte CAS on the top with a change
 * counter against ABA) and the next new thread takes it, warm, with the pages that still hold live
 * blocks, unless its segments with live blocks went to the orphans for any thread (small.h). Heaps are
 * never freed, so the owner recorded in a segment is always a heap, if not always the same. heap.c has
 * the life of a heap: start-up and its re-entrancy, exit, the reserve, the heaps of threads that exited
 * without a hook, and fork.
 *
 * Depends on: small.h, medium.h, segment.h, sync.h, libc.h, port.h; heap.c also large.h (the cache's
 * expiry at thread exit, memory pressure), error.h and options.h (read at start-up; the reserve's delay).
 */
#ifndef SHARD_HEAP_H
#define SHARD_HEAP_H

#include "../port/port.h"
#include "libc.h"
#include "medium.h"
#include "small.h"

struct shard_heap;

#define HEAP_OWN_SLOTS ((size_t)1 << (32 - SEGMENT_SHIFT)) /* by address bits 22..31 */

typedef struct page_list {
    page *first, *last;
} page_list;

typedef struct heap {
    /* The first page of the class of each size up to 2 KB, by (size + 15) >> 4, or the empty page.
     * Only small.c's sync_direct() writes it. */
    page *direct[SHARD_DIRECT_COUNT];
    /* The heap's small segments by address bits 22..31, for the free and realloc fast paths: p is in an
     * own small segment when own[(uint32_t)p >> 22] == p & ~SEGMENT_MASK; one load, where the segment
     * map and the owner would take four. A segment whose entry is taken (one 4 GB apart, rare) is not
     * entered, and its blocks take the slow path. Entry 0 holds 1, no segment's address: a pointer below
     * 4 MB (NULL) must not match an empty entry. Written when the heap makes or takes a segment, and
     * cleared (or given to another of its segments in that slot) when a segment leaves the heap. */
    uintptr_t own[HEAP_OWN_SLOTS];
    page_list classes[SHARD_CLASS_COUNT]; /* pages with (possibly) free items; refilled ones at the tail */
    /* Its thread's frees into one page of another heap, gathered to go in one push (small.c, gathered
     * frees): the page (a run's head; NULL: none), the list's ends and length; the page of its last
     * foreign free and how many in a row went there (gathering starts at SHARD_GATHER_AFTER). On one
     * line, which every foreign free of its thread reads, the fast paths too (gen/layout.py: right after
     * classes[], at an offset that no option moves). */
    page *gather_page __attribute__((aligned(64)));
    page *gather_last;
    block *gather_head, *gather_tail;
    uint32_t gather_count, gather_run;
    page_list free_pages;    /* committed, no class; the oldest first */
    page_list cold_pages;    /* not committed; a new segment's in the order of the heap's colour */
    uint32_t free_count;     /* pages in free_pages */
    uint32_t guests;         /* pages lent to it by other heaps' segments (small.h: lent pages) */
    page_list guest_full;    /* those of them out of their class lists as full */
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
    uint64_t retired_at;     /* os_clock_ms() when it last went onto the stack of free heaps */
    uint32_t reserve_held;   /* 1 while it waits in the stack with a reserve (heap.c) */
    uint32_t thread_done;    /* 1 while it waits since a shard_thread_done: no free takes it (heap_claim) */
    uint32_t forwards;       /* 1 once it gave segments to the orphans (small.h): its drains look at
                              * each page's owner */
    uint32_t sweep_wait;     /* slow paths that need a page and skip the walk of the lazy pages (small.c) */
    uint32_t drains;         /* times it took its `delayed` list; a relaxed atomic, which the release of
                              * a loose page reads (small.h) */
    /* Small segments and medium arenas made since its thread took it: the first of each kind keeps its
     * 2 MB units on small pages (segment.h's segment_large_from) until the heap fills the lower one
     * (segment_spared_commit). */
    uint32_t segments_made, arenas_made;
    /* The colour of the small segments it makes, its number among the heaps made modulo
     * SHARD_SEGMENT_COLOURS (config.h; small.c's page_in_turn): heaps made one after another, for threads
     * that start together, hand out their first pages at different offsets. */
    uint32_t colour;
    /* A thread heap's pages that went full last, the one of its page-full count `fulls` at index
     * fulls % SHARD_LOOSE_AFTER: a page still full when its entry comes round again goes loose
     * (small.h). Entries are cleared when their segment leaves the heap; others may be out of date.
     * Read and written only on slow paths: here, behind what the others use more often. */
    uint32_t fulls;
    page *full_ring[SHARD_LOOSE_AFTER];
    /* The next pages to go full that take no place in full_ring: its thread took loose pages back by
     * frees of its own lately, SHARD_LOOSE_SKIP for each, SHARD_LOOSE_SKIP_MAX at most (small.h). Reset
     * when a thread takes the heap. */
    uint32_t loose_skip;
    uint32_t large_colour;   /* the turn of its thread's next large block's colour (large.c) */
    /* The large block its thread freed last, kept for its next large allocation (large.c: the spare):
     * the header's address | its committed bytes / PORT_PAGE, 0 when none. An atomic word: other threads
     * take it too (a trim, memory pressure, the heap's retirement, a look that finds it waited). */
    uintptr_t large_spare;
    uintptr_t spare_seen;    /* large_spare at the last look for spares that waited (large.c) */
    /* The handshake by which its thread empties large_spare without a locked instruction (large.c,
     * spare_own): 1 while its thread is doing so, and how many other threads are about to take it. */
    uint32_t spare_busy, spare_claims;
    /* What its thread's spare took off the large blocks' live counts less what it gave back (large.c),
     * two's complement; written by that thread alone, summed by large_live_counts. */
    size_t spare_blocks, spare_bytes;
    /* Pages and arenas queued by foreign frees; written by other threads, so on a line of their own,
     * with the owner word, which those frees read (heap.c: generation << 32 | the thread's number,
     * 0 while no thread has the heap, PORT_THREAD_NONE for a parent's thread's heap in a fork child). */
    page *delayed __attribute__((aligned(64)));
    struct arena *delayed_arenas;
    uint64_t owner;
    /* A heap an embedder created (shard_heap_create; engine.c), 0 for a thread heap: then what it holds
     * committed is counted (written by other threads too: a large block's free), against its limit. */
    uint32_t created;
    uint32_t limit_hit;     /* an allocation of its owner found the limit in the way (engine.c retries) */
    size_t charged;         /* committed bytes of its pages, arenas and large blocks; atomic */
    size_t charged_peak;
    size_t limit;           /* 0: none */
    size_t large_count, large_bytes; /* its live large blocks and their usable bytes; atomic */
    int (*on_limit)(void *arg, struct shard_heap *heap, size_t size);
    void *on_limit_arg;
    struct heap *next_created; /* in the list of destroyed heaps, for reuse, or of those put off (engine.c) */
} heap;

/* Count bytes committed for h (a created heap's; nothing for a thread heap): -1, nothing counted and
 * h->limit_hit set, when that would pass its limit. */
int heap_charge_created(heap *h, size_t bytes);
static inline int heap_charge(heap *h, size_t bytes) { return unlikely(h->created) ? heap_charge_created(h, bytes) : 0; }
static inline void heap_uncharge(heap *h, size_t bytes)
{
    if (unlikely(h->created))
        fetch_add_relaxed(&h->charged, -bytes);
}

/* The calling thread's heap, created (or taken from the free stack) if it has none; NULL when out of
 * memory. In a thread whose exit hook has already run (a thread-local destructor that allocates), the
 * heap is only lent: *lent is set to 1, the heap is not stored in the thread's slot, and the caller
 * makes its one allocation and then gives the heap back with heap_retire. */
heap *heap_get_or_create(int *lent);

/* A new heap owned by `thread` (PORT_THREAD_NONE: a created heap's, engine.c), in the list of all heaps;
 * NULL out of memory. */
heap *heap_new(uint32_t thread);

/* The heap a thread without one sees in the fast paths: every page-per-size entry leads to the empty
 * page, it owns no segment and no class has pages, so each fast path fails over to its slow path, which
 * asks heap_mine() (NULL then). */
extern heap heap_none;

/* The heap slot (port.h: SHARD_SLOT says where it lives). A slot of the core's own (TLS, GLOBAL) starts
 * as &heap_none and holds it while its thread has no heap, so the fast paths read it without a NULL
 * test; a slot of the platform's (TEB, FUNCTION) reads NULL then, and fast_heap() substitutes heap_none.
 * heap_slot_store (heap.c) writes it. */
#if SHARD_SLOT == PORT_SLOT_TLS
/* Defined in heap.c, or in asm/fast.asm where the NASM fast paths are built (NASM can reach a TLS
 * variable only if it defines it itself). */
extern __thread heap *heap_slot __attribute__((tls_model("initial-exec")));
static inline heap *slot_load(void) { return heap_slot; }
#define SLOT_HOLDS_HEAP_NONE 1
#elif SHARD_SLOT == PORT_SLOT_GLOBAL
extern heap *heap_slot;
static inline heap *slot_load(void) { return heap_slot; }
#define SLOT_HOLDS_HEAP_NONE 1
#elif SHARD_SLOT == PORT_SLOT_TEB
static inline heap *slot_load(void) { return port_heap_slot(); }
#define SLOT_HOLDS_HEAP_NONE 0
#else
static inline heap *slot_load(void) { return *(heap **)port_heap_slot_address(); }
#define SLOT_HOLDS_HEAP_NONE 0
#endif

/* The calling thread's heap, NULL while it has none. */
static inline heap *heap_mine(void)
{
    heap *h = slot_load();
#if SLOT_HOLDS_HEAP_NONE
    return h != &heap_none ? h : NULL;
#else
    return h;
#endif
}

/* The calling thread's heap for a fast path: its own, or heap_none. */
static inline heap *fast_heap(void)
{
    heap *h = slot_load();
#if SLOT_HOLDS_HEAP_NONE
    return h;
#else
    return h != NULL ? h : &heap_none;
#endif
}

/* Enter a new small segment in h's own-segment table (when its entry is free). */
static inline void heap_own_segment(heap *h, segment *seg)
{
    uint32_t i = (uint32_t)(uintptr_t)seg >> SEGMENT_SHIFT;
    if (h->own[i] == 0)
        h->own[i] = (uintptr_t)seg;
}

/* b, an item of h->gather_page, joins h's gathered list (small.c, gathered frees): the list's length now,
 * which the caller pushes at SHARD_GATHER_ITEMS. */
static inline uint32_t heap_gather_link(heap *h, block *b)
{
    link_set(b, h->gather_head);
    h->gather_head = b;
    uint32_t n = h->gather_count + 1;
    store_relaxed(&h->gather_count, n); /* read by other threads' statistics */
    return n;
}

/* Start-up, once per process (heap.c has the rule of what may run inside it): the options, the fork
 * hooks and the thread-exit hook. The first allocation of any kind calls it; heap_started() is one load after that. */
void heap_start(void);
extern uint32_t heap_start_done;
static inline void heap_started(void)
{
    if (unlikely(load_acquire(&heap_start_done) == 0))
        heap_start();
}

/* The end of a thread's use of its heap (thread exit, shard_thread_done, a lent heap's one use): take in
 * what other threads freed into it, keep the reserve, return the rest, and onto the stack. */
void heap_retire(heap *h);

/* The end of the calling thread's use of its heap (shard_thread_done): as at thread exit, the heap keeps
 * its reserve and goes onto the stack; the thread takes a heap again if it allocates again. */
void heap_thread_done(void);

/* The thread's number in an owner word: 0 while no thread has the heap. */
#define OWNER_THREAD(w) ((uint32_t)(w))

/* The calling thread, which has no heap, frees a block of `want`'s: when want waits in a stack of free
 * heaps, the thread takes it as its own (the reason: heap.c), and it is the thread's heap from here on;
 * else NULL, nothing changed. Its first test is inline: every free of a thread without a heap into a heap
 * that a thread runs (xmalloc's consumers) fails there; heap_claim_unowned() does the rest. */
heap *heap_claim_unowned(heap *want);
static inline heap *heap_claim(heap *want)
{
    return OWNER_THREAD(load_relaxed(&want->owner)) == 0 ? heap_claim_unowned(want) : NULL;
}

/* Whether h is a thread heap that a thread runs now (not an embedder's, not one that waits). */
static inline int heap_has_thread(const heap *h)
{
    return !h->created && OWNER_THREAD(load_relaxed(&h->owner)) != 0;
}

/* The calling thread, which has no heap, frees a small block of a heap that a thread runs: a heap of its
 * own, in which it gathers its frees (small.c, gathered frees): as a new thread takes one, one without a
 * reserve first, and emptied of all it held; NULL when there is none to have (out of memory, or the
 * thread is past its exit hook). */
heap *heap_for_frees(void);

/* The stack's heaps are trimmed at heap_reserve_due (os_clock_ms(); 0: nothing due): the reserves of
 * exited threads expire, and blocks other threads freed into those heaps are taken in. Slow paths and
 * thread exits call heap_reserve_tick(): one load while nothing is due. */
extern uint64_t heap_reserve_due;
void heap_reserve_expire(uint64_t due);
static inline void heap_reserve_tick(void)
{
    uint64_t due = load_relaxed(&heap_reserve_due);
    if (unlikely(due != 0))
        heap_reserve_expire(due);
}

/* A foreign free queued a page or an arena at h for the first time since h last took its queue in
 * (small.c, medium.c). When no thread has h, the memory freed into it must not wait for a thread that
 * may never come: this arranges for the stack to be trimmed soon. */
void heap_foreign_queued(heap *h);

/* Arm the trim of the stack (and of destroyed created heaps' reserves, engine.c) for `due`. */
void heap_arm_reserve_due(uint64_t due);
/* engine.c: destroyed created heaps give back the reserve they kept once it has waited the delay (all
 * of them with now UINT64_MAX); returns when the next one is due, 0 for none. */
uint64_t created_reserve_expire(uint64_t now);
/* Take (1) or give back (0) the lock of the destroyed created heaps around a fork (held as SPIN_FORK). */
void created_lock_for_fork(int take);

/* shard_collect's part: the calling thread's free pages and empty arenas beyond what it keeps, and
 * everything the heaps in the stack hold but live blocks, go back now. */
void heap_collect(void);

/* Out of memory or address space: give back everything that waits - the calling thread's free pages,
 * empty arenas and empty segments, the heaps in the stack's, the large-block cache - and take back the
 * heaps of threads that exited without a hook. 1 when anything went back to the OS (then the failed
 * allocation is worth a second try). */
int heap_relieve(void);

/* Problems in a heap's pages, lists, counts and arenas (reported through report_error); 0 when it is
 * consistent. Only for a heap no thread is using, or the calling thread's own. */
int heap_check(heap *h);
/* heap_check of every heap in the stack of free heaps (taken whole meanwhile). */
int heap_check_stack(void);
/* The live small and medium blocks of every heap in the stack of free heaps, to v (the stack taken whole
 * meanwhile: a thread that starts waits for it rather than make a heap). */
void heap_visit_stack(visitor *v);

#if SHARD_DEBUG
#define debug_check_heap(h, reason) (heap_check(h) == 0 ? (void)0 : assert_failed(__FILE__, __LINE__, reason))
#else
#define debug_check_heap(h, reason) ((void)0)
#endif

/* The first heap of the list of all heaps (statistics walk it; heaps are never freed). */
heap *heap_all(void);

/* Heaps in the stack of free heaps (for statistics: exact when no thread starts or ends meanwhile). */
size_t heap_free_count(void);

#endif
