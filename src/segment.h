/* segment.h - 4 MB segments, the segment map, the OS accounting and the metadata allocator.
 *
 * A segment is 4 MB aligned to 4 MB, a reservation of its own (the port trims the slack it needed for
 * the alignment). It is cut into 64 pages of 64 KB; page 0 holds the descriptors of all pages, 128
 * bytes each, and descriptor 0 is the segment header:
 *
 *   segment + 0        header (owner heap, kind, links)        descriptor 0
 *   segment + 128 * i  descriptor of page i (i = 1..63)        see small.h
 *   segment + 8 KB     unused rest of page 0
 *   segment + 64K * i  the items of page i
 *
 * The segment map answers "what is at this address" in two loads: address bits 32..46 index a top
 * table that locates one table per 4 GB, which holds one kind byte per 4 MB. Anything we never
 * mapped, and any address above 47 bits, answers SEG_NONE. A top entry holds the distance of its
 * table from a static all-zero table rather than a pointer, so the entries of 4 GB ranges without a
 * table (zero, as the top table starts) lead to the zero table: no NULL test on the way.
 *
 * Depends on: sync.h; segment.c also port.h, libc.h, options.h (SHARDMM_VERBOSE's lines).
 */
#ifndef SHARD_SEGMENT_H
#define SHARD_SEGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "sync.h"

#define SEGMENT_SHIFT 22
#define SEGMENT_SIZE ((size_t)1 << SEGMENT_SHIFT)
#define SEGMENT_MASK (SEGMENT_SIZE - 1)
#define PAGE_SHIFT 16
#define PAGE_SIZE ((size_t)1 << PAGE_SHIFT)
#define SEGMENT_PAGES (SEGMENT_SIZE / PAGE_SIZE)
#define PAGE_DESC_SIZE 128
#define SEGMENT_DESC_BYTES (SEGMENT_PAGES * PAGE_DESC_SIZE) /* committed with the segment */

/* Kinds in the segment map, one byte per 4 MB of address space. */
enum seg_kind {
    SEG_NONE = 0,       /* not ours */
    SEG_SMALL = 1,      /* a segment of small-block pages */
    SEG_LARGE = 2,      /* the first 4 MB of a block above 1 MB (large.c); the rest of its reservation is NONE */
    SEG_LARGE_FAR = 3,  /* the first 4 MB of a large block aligned to 4 MB or more, whose header lies below it */
    SEG_MEDIUM = 4      /* an arena of medium blocks (medium.c) */
};

struct heap;

/* Descriptor 0. The owner is written at creation, and again only when the segment changes heaps: while
 * it holds no live block (it becomes spare, and another heap's: below), or with its live blocks, when
 * it goes to the orphans (its thread ended, or every page of it is full) and a heap takes it (small.h).
 * So the "is this block mine" test of a free reads a line that is written at most twice for each time
 * a segment ends up with no use for its heap.
 * `zero` and `pad` are never written: they overlay the fields of a page descriptor that the free paths
 * test (`used`, `item_bound`, `item_mul`, the shared divisor), so a pointer into page 0 looks like one into a page
 * with no items and reaches the error hook. The other fields overlay page fields that no free path
 * reads for a pointer that failed those tests. */
typedef struct segment {
    struct heap *owner;
    struct segment *next;          /* the owner's segments */
    uint8_t zero[16];
    struct segment *next_released; /* in the list of segments waiting for their release (segment_release) */
    size_t released_committed;      /* bytes still committed when it was given up, for the accounting */
    uint64_t secret;                /* hardened builds: the key of its free lists (small.h); else 0 */
    uint32_t committed_whole;       /* 1: the platform committed all of it at its reservation (segment_commit);
                                     * written at creation only */
    uint8_t lent;                   /* small: its pages lent (small.h), in the pool or to a guest heap; kept
                                     * by its owner, which neither moves nor releases it while any are */
    uint8_t pad_line0[3];
    /* line 1, which the owner's slow paths write: not the line of the owner word and the secret, which
     * other threads' frees read */
    uint32_t full_pages;            /* small: its pages out of their class lists as full (small.c) */
    uint16_t spared_left[2];        /* per SEGMENT_LARGE_UNIT of it, the OS pages to carve (small) or the
                                     * commits of 64 KB (medium) there before that unit goes on large pages
                                     * too (segment_spared_commit); 0: it is, or never will; 0xffff (the
                                     * upper): hinted at its first commit */
    struct heap *given_by;          /* small: the heap that gave it to the orphans last (small.h) */
    uint8_t pad[48];
} segment;
_Static_assert(sizeof(segment) == PAGE_DESC_SIZE && offsetof(segment, zero) == 16 && offsetof(segment, secret) == 48 &&
                   offsetof(segment, full_pages) == 64 && offsetof(segment, pad) == 80,
               "the header is descriptor 0, with zero bytes where small.h expects them, and the fields that "
               "change in a line of their own");

#define SEGMAP_TOP_BITS 15      /* address bits 32..46 */
#define SEGMAP_LEAF_BYTES 1024  /* 4 GB / 4 MB */

extern uintptr_t segmap_top[(size_t)1 << SEGMAP_TOP_BITS]; /* table address - segmap_zero_leaf */
extern const uint8_t segmap_zero_leaf[SEGMAP_LEAF_BYTES];

/* The kind of the 4 MB that holds address a. */
static inline unsigned segmap_kind(uintptr_t a)
{
    uintptr_t hi = a >> 32;
    if (unlikely(hi >= ((uintptr_t)1 << SEGMAP_TOP_BITS)))
        return SEG_NONE;
    /* In uintptr_t, as segmap_set computes it: the table lies outside the zero table's bounds. */
    const uint8_t *leaf = (const uint8_t *)((uintptr_t)segmap_zero_leaf + load_relaxed(&segmap_top[hi]));
    return load_relaxed(&leaf[(a >> SEGMENT_SHIFT) & (SEGMAP_LEAF_BYTES - 1)]);
}

static inline segment *segment_of(const void *p) { return (segment *)((uintptr_t)p & ~(uintptr_t)SEGMENT_MASK); }

/* Mark [start, start+size) (4 MB aligned) as first / rest in the map. 0, or -1 out of memory. */
int segmap_set(uintptr_t start, size_t size, unsigned first, unsigned rest);

/* A new segment of the given kind owned by heap, its first `commit` bytes committed and zero (for small
 * segments the page descriptors), on the platform's large pages from offset `large_from` on
 * (segment_large_from; SEGMENT_LARGE_NONE: a plain reservation committed piece by piece); NULL out of
 * memory. */
segment *segment_create(struct heap *owner, unsigned kind, size_t commit, size_t large_from);

/* Large pages for small and medium memory (SHARDMM_HUGE_PAGES, options.h; the design is in docs/design.md,
 * "Huge pages"): the offset of a new segment or arena from which the platform may back it with large
 * pages (port_caps.reserve_large_pages), or SEGMENT_LARGE_NONE for none. The units below that offset are
 * spared: on small pages until the heap fills them (segment_spared_commit). `first`: the heap's first
 * of the kind since its thread took it (heap.h: segments_made, arenas_made), which in the default mode
 * is spared whole (SEGMENT_SIZE: a large-page reservation with no unit hinted yet), or its first unit
 * only where the platform cannot collapse a unit later; `created`: an embedder's heap, which the
 * default mode leaves on small pages (its limit counts what is committed). None while shard_set_limit
 * bounds the process's memory. */
#define SEGMENT_LARGE_UNIT ((size_t)2 << 20)
#define SEGMENT_LARGE_NONE SIZE_MAX
size_t segment_large_from(int first, uint32_t created);

/* A heap that grows through a spared SEGMENT_LARGE_UNIT of its first segment or arena is not the small
 * heap that sparing was for: once it has used SHARD_SPARED_SMALL bytes of a small segment's unit (the OS
 * pages that carving reached in its pages since their commit, `touched` in each: pages serve one class
 * each and carve 4 KB at a time, so a unit can be committed whole with a fifth of it touched) or made
 * SHARD_SPARED_MEDIUM commits of 64 KB in an arena's (which commits from its start, for blocks that are
 * used whole), that unit goes on large pages as well (port_caps.collapse_large_pages, which the Linux
 * port weighs against what it saves), with what it holds; the faults of the rest of it and the TLB misses
 * of all of it are saved. The upper unit follows the lower one's verdict: where the lower one went on
 * large pages before the upper was used, the upper is hinted at its first commit (its first touch then
 * takes a large page, with no copy); where the platform passed the lower one over, the upper stays on
 * small pages until it fills in turn, unless the heap is well into the other kind by then
 * (segment_spared_upper_early).
 * segment_spared_commit: called by the owner after it committed [from, to) of seg (of `kind`; offsets,
 * in 64 KB pieces), which is still spared (segment_spared); segment_spared_touch: after its carving
 * reached `pages` more OS pages of the page at offset `at` of seg (small). Each says 1 when a unit
 * filled. */
int segment_spared_commit(segment *seg, unsigned kind, size_t from, size_t to);
int segment_spared_touch(segment *seg, size_t at, size_t pages);
/* [p, p+size) of seg, committed and about to be written, made resident at once
 * (port_caps.populate) if it lies in a spared unit still on small pages (neither gone nor waiting for its
 * hint): 1 when asked. */
int segment_populate(segment *seg, void *p, size_t size);
static inline int segment_spared(const segment *seg)
{
    return (seg->spared_left[0] | seg->spared_left[1]) != 0;
}

/* The owner of seg (small) has committed every page it has and makes a segment more: each unit of seg
 * still spared goes on large pages now, touched or not, as a unit did at its 31st commit until
 * 2026-12-04. Heaps that grow (alloc-test, the mixed churn, the ring) commit their first segment well
 * before they have touched it, and take the rest of it soon after; by the touches alone, their faults
 * there and the 4 KB pages' TLB misses cost the mixed churn at 2 threads 10 % and the ring at 8 threads
 * 15 % (bench/results/2026-12-04-spared-touch.md). 1 when one went. */
int segment_spared_outgrown(segment *seg, unsigned kind);

/* The owner of seg (a small segment or a medium arena, `kind`) just filled a spared unit of the other
 * kind: each spared unit of seg goes on large pages too if the heap has gone at least a quarter of the
 * way there (SHARD_SPARED_SMALL or SHARD_SPARED_MEDIUM): a heap that has grown through one unit and well
 * into the other is not small either. One with little of the other kind (a thread's one medium buffer
 * of 600 KB and a few small blocks) keeps that unit on small pages. On bench/shapes.c's strings (8
 * threads) this saved 37 % of the faults (bench/results/2026-12-03-whole-commits.md). */
void segment_spared_grown(segment *seg, unsigned kind);

/* Whether the owner of seg (of `kind`) has gone a quarter of the way through seg's lower spared unit, as
 * segment_spared_grown asks, or past it (the unit went on large pages, or was never spared). */
int segment_spared_along(const segment *seg, unsigned kind);

/* The owner of seg (of `kind`) commits a page of seg's upper unit while it has gone a quarter of the
 * way through its spared unit of the other kind (segment_spared_along): if the upper unit is untouched
 * still, it is hinted at this commit, as after the lower one's collapse, whatever became of that. A heap
 * that has committed one whole unit and a quarter of the other kind's is growing (as in
 * segment_spared_grown), and the untouched unit takes its large page at its first touch, with neither the
 * 4 KB faults nor a collapse (whose wait for every other CPU's page lists took 0.3-8 ms a call on the
 * AMD host: bench/results/2026-12-05-start-cost-amd.md). */
void segment_spared_upper_early(segment *seg, unsigned kind);

/* Commit [addr, addr+size) inside seg, as os_commit: 0, or -1 with nothing changed. Where the platform
 * committed the segment whole at its reservation (the large-page kind, PORT_LARGE_RESERVE_COMMITTED),
 * only the accounting and the limit: no call to the platform. */
int segment_commit(const segment *seg, void *addr, size_t size);

/* Give a segment of ours back to the OS, `committed` bytes of it still committed: its map entry goes at
 * once, its reservation when no statistics walk (below) can still be looking at it. The caller has taken
 * it out of every list first. */
void segment_release(segment *seg, size_t committed);

/* Spare segments: empty small segments and empty medium arenas that a thread heap gave up as its
 * thread ended, kept with their memory committed for whichever thread heap next needs a segment of that
 * kind, so that a generation of threads reuses what the last one faulted in (a heap's own reserve serves
 * only the thread that takes that heap; these serve any). At most SHARD_SPARE_SEGMENTS wait, each for
 * the reserve's delay (SHARDMM_DELAY_MS); then, or at once on shard_collect and under memory pressure,
 * they are released. A spare segment has no owner (a free into it finds none and reaches the error hook)
 * and is in no heap's list; its map entry keeps its kind. The pool is one small table under a spin lock,
 * touched only on thread exit and when a heap would reserve a new segment or commit a fresh page.
 *   segment_spare_put: 1 when seg (no block live, out of every list, `committed` bytes committed: the
 *     page descriptors and free pages, or the arena's committed prefix) was taken in; 0 when the pool is
 *     full or held by another thread's fork, and the caller releases it as before.
 *   segment_spare_take: the most recently put segment of the kind with at least `least` bytes
 *     committed, owned by nobody, or NULL; *committed gets what was committed. */
int segment_spare_put(segment *seg, unsigned kind, size_t committed);
segment *segment_spare_take(unsigned kind, size_t least, size_t *committed);
/* Release the spare segments put `delay` ms or more before `now` (UINT64_MAX: all); the time the next
 * one is due, or 0 when none waits. */
uint64_t segment_spare_expire(uint64_t now, uint32_t delay);
void segment_spare_counts(size_t *segments, size_t *bytes); /* for the statistics */
void segment_spare_lock_for_fork(int take);

/* Other threads walk the heaps' lists of segments and arenas for the statistics (shard_get_stats), while
 * their owners may release them: a walk is bracketed by these two, and a segment given up meanwhile
 * stays mapped until no walk that began before its unlinking is still going. */
void segment_walk_begin(void);
void segment_walk_end(void);
/* In the child of a fork: the walks of the parent's other threads are not going on there. */
void segment_after_fork(void);

/* A walk over live blocks (shard_visit, walk.c): small.c, medium.c and large.c each report theirs through
 * visit_block, which calls the user's function (shardmm.h's shard_visit_fn) and counts. */
enum visit_kind { VISIT_SMALL = 1, VISIT_MEDIUM = 2, VISIT_LARGE = 3 }; /* shardmm.h's SHARD_BLOCK_* */

typedef struct visitor {
    int (*fn)(void *arg, void *block, size_t usable, int kind);
    void *arg;
    size_t count;
    int stop; /* the function asked to stop */
} visitor;

/* Report one live block; 1 when the walk is to stop. */
static inline int visit_block(visitor *v, void *block, size_t usable, int kind)
{
    v->count++;
    if (v->fn(v->arg, block, usable, kind) != 0)
        v->stop = 1;
    return v->stop;
}

/* The platform's calls with the process's accounting (stats), through port.h. os_commit also keeps the
 * committed total within the limit that shard_set_limit set (os_set_limit; SIZE_MAX: none), refusing a
 * commit that would pass it as the platform refuses one it cannot back. With SHARDMM_VERBOSE a refused
 * reservation or commit (by the platform or by the limit) is told on the error channel (options.h). */
void *os_reserve(size_t size, size_t align);
/* os_reserve for a large block: the platform's pools first (port.h: reserve_pooled). */
void *os_reserve_block(size_t size, size_t align);
int os_commit(void *addr, size_t size);
int os_decommit(void *addr, size_t size);
/* committed: how much of the reservation was committed (for the accounting). */
int os_release(void *addr, size_t size, size_t committed);
size_t os_set_limit(size_t bytes);

/* port_caps.move_release: the moved pages stay committed, the source reservation goes, and with it
 * `dropped` committed bytes outside [from, from + size) (for the accounting). -1 (nothing done) on a
 * platform that cannot move pages (os_can_move() is 0). */
int os_move_release(void *reservation, size_t reservation_size, void *from, size_t size, void *to, size_t dropped);
int os_can_move(void);
int os_has_large_pages(void); /* whether port_caps.hint_large_pages is there */
int os_can_release_part(void);

/* The optional capabilities of port_caps, each with what the core does without it (port.h). */
void os_hint_large_pages(void *addr, size_t size); /* nothing */
size_t os_resident_pages(void *addr, size_t size); /* SIZE_MAX: cannot tell */
int os_counts_resident(void);                      /* whether port_caps.resident_pages is there */
size_t os_address_space_limit(void);               /* SIZE_MAX */
uint64_t os_clock_ms(void);                        /* a count of the calls, from 1 */
uint32_t os_thread_id(void);                       /* 1, for every thread */
int os_thread_alive(uint32_t id);                  /* 1 */
uintptr_t os_thread_tag(void);                     /* 1 for every thread (no fork hooks then) */
int os_fence_all_threads(void);                    /* -1: not done */
void os_out_of_memory(void);                       /* nothing */
void os_invalid_argument(void);                    /* nothing */

typedef struct os_totals {
    size_t reserved, committed, committed_peak, calls;
} os_totals;
void os_get_totals(os_totals *out);

/* A fresh secret for the hardened build: 64 bits from a generator seeded once from the time stamp
 * counter, the port's clock and addresses that ASLR places (not a cryptographic source: it keeps a
 * program's own bugs and blind writes from forging a link or a header, not a reader of our memory).
 * Bits 48..63 are never 0 nor all ones, so that neither a small number nor a pointer nor a negative
 * number XOR the secret looks like a link (small.h). */
uint64_t secret_new(void);
/* The process's secret, made once: what seals medium and large headers in the hardened build. */
extern uint64_t secret_process;
uint64_t secret_of_process(void);

/* Zeroed memory for the allocator's own structures (heaps, map tables); never freed. NULL when out of
 * memory. size <= 64 KB; the result is aligned to 64 bytes. */
void *meta_alloc(size_t size);
/* Take (1) or give back (0) the metadata allocator's lock around a fork (heap.c's fork hooks). */
void meta_lock_for_fork(int take);

#endif
