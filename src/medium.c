/* medium.c - medium blocks: arenas, TLSF bins, merging, foreign frees, delayed decommit (see medium.h).
 *
 * Who touches what: the owner heap's thread does everything but the foreign free, which validates the
 * chunk's own header, claims it with a CAS on size_flags (setting PENDING, so a second free of the same
 * block fails the CAS) and pushes it onto the arena's thread_free word. size_flags is the one field
 * two threads may write (the owner only ever writes it with a CAS or while the chunk is free), and
 * prev_size, which the owner rewrites when a neighbour changes, is a separate word.
 */
#include "medium.h"

#include "../port/port.h"
#include "config.h"
#include "error.h"
#include "heap.h"
#include "large.h"
#include "libc.h"
#include "options.h"

#define CHUNK_FREE 1u
#define CHUNK_PENDING 2u
#define CHUNK_FLAGS 15u
#define CHUNK_HEADER 16u
#define CHUNK_MIN 32u        /* a header and the two links of a free chunk */
#define SPLIT_MIN 256u       /* a remainder this large is split off */
#define ARENA_DATA 4096u     /* the first chunk starts here; the header lives below */
#define ARENA_KEEP ((size_t)64 << 10) /* committed in steps of this, and kept when an arena is decommitted */
#define CHECK_COOKIE 0x9e3779b97f4a7c15ull

/* The steps of an allocation and of a free (bin_find ... keep_front, claim_for_free ... make_free), each
 * called from one to four places: inlined always, so that each path is one function. Left to the
 * compiler they were ten calls a replacement; inlined, bench/medium.c's 16k-256k row runs 21 % fewer of
 * the allocator's instructions and 10 % faster (bench/results/2026-12-03-medium-inline.md). */
#define STEP static inline __attribute__((always_inline))

typedef struct chunk {
    uint32_t prev_size;
    uint32_t size_flags;
    uint64_t check;
    struct chunk *next_free, *prev_free; /* in a bin while free; next_free in thread_free while pending */
} chunk;
_Static_assert(offsetof(chunk, next_free) == CHUNK_HEADER, "the links are where the block was");

enum { ARENA_USED = 0, ARENA_EMPTY = 1, ARENA_DECOMMITTED = 2 };

typedef struct arena {
    segment seg;            /* owner (next unused): as for a small segment */
    struct arena *next;     /* the owner's arenas */
    struct arena *empty_next, *empty_prev; /* the owner's committed empty arenas */
    size_t committed;       /* bytes committed from the arena's start; stored as an atomic, since
                             * valid_live reads it from any thread */
    uint32_t live;          /* blocks handed out and not yet freed by the owner (pending ones count) */
    uint32_t live_bytes;    /* their usable sizes (chunks less headers); written by the owner alone, read
                             * by the statistics from any thread, so stored as an atomic */
    uint32_t state;
    uint64_t emptied_at;    /* os_clock_ms() when it became empty */
    /* Written by other threads. */
    uintptr_t thread_free __attribute__((aligned(64))); /* chunk * | 1 while queued at the owner */
    struct arena *next_delayed;
} arena;
_Static_assert(sizeof(arena) <= ARENA_DATA, "the header fits below the first chunk");

#define ARENA_FIRST_SIZE ((uint32_t)(SEGMENT_SIZE - ARENA_DATA))

static inline arena *arena_of(const void *p) { return (arena *)segment_of(p); }
static inline uint8_t *arena_end(const arena *a) { return (uint8_t *)a + SEGMENT_SIZE; }
static inline uint32_t csize(const chunk *c) { return load_relaxed(&c->size_flags) & ~CHUNK_FLAGS; }
static inline uint32_t cflags(const chunk *c) { return load_relaxed(&c->size_flags) & CHUNK_FLAGS; }
/* The chunk `offset` bytes from p; a negative offset is passed as its two's complement, so the sum is
 * taken in uintptr_t (a pointer sum would overflow, which C leaves undefined). */
static inline chunk *chunk_at(const void *p, size_t offset) { return (chunk *)((uintptr_t)p + offset); }
static inline uint64_t check_of(const chunk *c, uint32_t size)
{
#if SHARD_HARDENED
    uint64_t cookie = secret_of_process(); /* a program cannot forge what it does not know */
#else
    uint64_t cookie = CHECK_COOKIE;
#endif
    return ((uint64_t)(uintptr_t)c ^ ((uint64_t)size << 40) ^ cookie) | 1;
}
static inline size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The chunk size for a block of n bytes. */
static inline uint32_t chunk_need(size_t n) { return (uint32_t)(round16(n < 16 ? 16 : n) + CHUNK_HEADER); }

#if SHARD_DEBUG
static int check_arena(const heap *h, const arena *a);
#define debug_check_arena(h, a, reason) (check_arena(h, a) == 0 ? (void)0 : assert_failed(__FILE__, __LINE__, reason))
#else
#define debug_check_arena(h, a, reason) ((void)0)
#endif

/* ---- bins ---------------------------------------------------------------------------------------- */

/* The two-level mapping (TLSF: Masmano et al.): MEDIUM_SL_COUNT = 2^SL_SHIFT bins per power of two; sizes
 * below LINEAR_MAX in level 0, by LINEAR_MAX / MEDIUM_SL_COUNT bytes; a size whose top bit is b >= 8
 * in level b - FL_OFFSET, so that [256, 512) is level 1. */
#define SL_SHIFT 4
#define LINEAR_MAX 256u
#define LINEAR_SHIFT 4 /* log2(LINEAR_MAX / MEDIUM_SL_COUNT): 16-byte steps */
#define FL_OFFSET 7    /* log2(LINEAR_MAX) - 1 */
_Static_assert(MEDIUM_SL_COUNT == 1 << SL_SHIFT && LINEAR_MAX >> LINEAR_SHIFT == MEDIUM_SL_COUNT &&
                   1u << (FL_OFFSET + 1) == LINEAR_MAX,
               "the mapping's constants agree");
_Static_assert(31 - __builtin_clz(ARENA_FIRST_SIZE) - FL_OFFSET < MEDIUM_FL_COUNT, "the largest chunk has a level");

static inline unsigned bsr32(uint32_t x) { return 31u - (unsigned)__builtin_clz(x); }

/* The bin of a chunk of this size (the bin whose range holds it). */
static inline void mapping_insert(uint32_t size, unsigned *fl, unsigned *sl)
{
    if (size < LINEAR_MAX) {
        *fl = 0;
        *sl = size >> LINEAR_SHIFT;
    } else {
        unsigned b = bsr32(size);
        *fl = b - FL_OFFSET;
        *sl = (size >> (b - SL_SHIFT)) & (MEDIUM_SL_COUNT - 1);
    }
}

/* The first bin whose every chunk is at least size bytes: size rounded up to the start of the next bin. */
static inline void mapping_search(uint32_t size, unsigned *fl, unsigned *sl)
{
    if (size >= LINEAR_MAX)
        size += (1u << (bsr32(size) - SL_SHIFT)) - 1;
    mapping_insert(size, fl, sl);
}

STEP void bin_insert(medium_bins *b, chunk *c, uint32_t size)
{
    unsigned fl, sl;
    mapping_insert(size, &fl, &sl);
    chunk *head = b->bins[fl][sl];
    c->next_free = head;
    c->prev_free = NULL;
    if (head != NULL)
        head->prev_free = c;
    b->bins[fl][sl] = c;
    b->sl_bitmap[fl] |= (uint16_t)(1u << sl);
    b->fl_bitmap |= 1u << fl;
}

/* The chunk of a whole empty arena shares the last bin with remainders of 3.75 MB and more: those are
 * used first, so that empty arenas stay empty and can be decommitted; among the empty arenas the most
 * recently emptied (committed, warm) comes first. So it goes in front of the first whole-arena chunk. */
static void bin_insert_empty_arena(medium_bins *b, chunk *c, uint32_t size)
{
    unsigned fl, sl;
    mapping_insert(size, &fl, &sl);
    chunk *prev = NULL, *next = b->bins[fl][sl];
    while (next != NULL && csize(next) != size) {
        prev = next;
        next = next->next_free;
    }
    if (prev == NULL) {
        bin_insert(b, c, size);
        return;
    }
    c->prev_free = prev;
    c->next_free = next;
    prev->next_free = c;
    if (next != NULL)
        next->prev_free = c;
}

STEP void bin_remove(medium_bins *b, chunk *c, uint32_t size)
{
    unsigned fl, sl;
    mapping_insert(size, &fl, &sl);
    if (c->prev_free != NULL)
        c->prev_free->next_free = c->next_free;
    else
        b->bins[fl][sl] = c->next_free;
    if (c->next_free != NULL)
        c->next_free->prev_free = c->prev_free;
    if (b->bins[fl][sl] == NULL) {
        b->sl_bitmap[fl] &= (uint16_t)~(1u << sl);
        if (b->sl_bitmap[fl] == 0)
            b->fl_bitmap &= ~(1u << fl);
    }
}

/* A free chunk of at least size bytes, or NULL: two bit scans, no search. */
STEP chunk *bin_find(const medium_bins *b, uint32_t size)
{
    unsigned fl, sl;
    mapping_search(size, &fl, &sl);
    if (fl >= MEDIUM_FL_COUNT)
        return NULL;
    uint32_t sl_map = b->sl_bitmap[fl] & (~0u << sl);
    if (sl_map == 0) {
        uint32_t fl_map = fl + 1 < 32 ? b->fl_bitmap & (~0u << (fl + 1)) : 0;
        if (fl_map == 0)
            return NULL;
        fl = (unsigned)__builtin_ctz(fl_map);
        sl_map = b->sl_bitmap[fl];
    }
    return b->bins[fl][(unsigned)__builtin_ctz(sl_map)];
}

/* ---- arenas -------------------------------------------------------------------------------------- */

static void empty_list_remove(heap *h, arena *a)
{
    if (a->empty_prev != NULL)
        a->empty_prev->empty_next = a->empty_next;
    else
        h->empty_arenas = a->empty_next;
    if (a->empty_next != NULL)
        a->empty_next->empty_prev = a->empty_prev;
    a->empty_next = a->empty_prev = NULL;
    h->empty_arena_count--;
}

/* Empty arenas beyond the `keep` most recent ones give back their memory: once empty for the delay, or
 * at once with `now` UINT64_MAX. */
static void trim_arenas(heap *h, uint64_t now, unsigned keep)
{
    arena *a = h->empty_arenas;
    for (unsigned i = 0; i < keep && a != NULL; i++)
        a = a->empty_next;
    while (a != NULL) {
        arena *next = a->empty_next;
        if (now == UINT64_MAX || now - a->emptied_at >= options_values.decommit_delay_ms) {
            /* committed goes down first: another thread's test of a bogus pointer reads it before
             * the header (this narrows that window on Windows, where decommitted memory faults). */
            size_t was = a->committed;
            store_release(&a->committed, ARENA_KEEP);
            if (was == ARENA_KEEP || os_decommit((uint8_t *)a + ARENA_KEEP, was - ARENA_KEEP) == 0) {
                heap_uncharge(h, was - ARENA_KEEP);
                a->state = ARENA_DECOMMITTED;
                empty_list_remove(h, a);
            } else {
                store_relaxed(&a->committed, was);
            }
        }
        a = next;
    }
}

/* Empty arenas beyond the most recent one give back their memory once empty for the delay. */
static void medium_trim(heap *h)
{
    if (h->empty_arena_count >= 2)
        trim_arenas(h, os_clock_ms(), 1);
}

void medium_keep(heap *h, unsigned keep)
{
    if (h->empty_arena_count > keep)
        trim_arenas(h, UINT64_MAX, keep);
}

unsigned medium_release_empty(heap *h, int spare)
{
    spare = spare && !h->created; /* a created heap's memory is charged to it: it keeps to its own */
    unsigned spared = 0;
    arena **link = &h->arenas;
    for (arena *a = *link; a != NULL; a = *link) {
        if (a->live != 0) {
            link = &a->next;
            continue;
        }
        /* Empty: one free chunk of all its space, in the bins (medium.h), and no foreign free pending
         * (a pending chunk counts as live). */
        bin_remove(&h->medium, chunk_at(a, ARENA_DATA), ARENA_FIRST_SIZE);
        if (a->state == ARENA_EMPTY)
            empty_list_remove(h, a);
        store_release(link, a->next); /* statistics walk the list (segment_walk_begin) */
        heap_uncharge(h, a->committed);
        if (spare && segment_spare_put(&a->seg, SEG_MEDIUM, a->committed))
            spared++;
        else
            segment_release(&a->seg, a->committed);
    }
    return spared;
}

int medium_spared_along(const heap *h)
{
    return h->arenas != NULL && (h->arenas_made > 1 || segment_spared_along(&h->arenas->seg, SEG_MEDIUM));
}

void medium_spared_grown(heap *h)
{
    for (arena *a = h->arenas; a != NULL; a = a->next)
        segment_spared_grown(&a->seg, SEG_MEDIUM);
}

void medium_release_all(heap *h)
{
    arena *a = h->arenas;
    store_release(&h->arenas, (arena *)NULL); /* statistics walk the list (segment_walk_begin) */
    while (a != NULL) {
        arena *next = a->next;
        heap_uncharge(h, a->committed);
        segment_release(&a->seg, a->committed);
        a = next;
    }
}

/* a is empty since `now`: the most recently emptied of h's empty arenas. */
static void empty_list_push(heap *h, arena *a, uint64_t now)
{
    a->state = ARENA_EMPTY;
    a->emptied_at = now;
    a->empty_prev = NULL;
    a->empty_next = h->empty_arenas;
    if (h->empty_arenas != NULL)
        h->empty_arenas->empty_prev = a;
    h->empty_arenas = a;
    h->empty_arena_count++;
}

void medium_empty_keep(heap *h, unsigned keep)
{
    uint64_t now = os_clock_ms();
    mem_zero(&h->medium, sizeof h->medium);
    h->empty_arenas = NULL;
    h->empty_arena_count = 0;
    store_relaxed(&h->delayed_arenas, (arena *)NULL);
    /* Each arena one free chunk again, the first listed the most recently emptied one. */
    for (arena *a = h->arenas; a != NULL; a = a->next) {
        chunk *c = chunk_at(a, ARENA_DATA);
        c->prev_size = 0;
        c->size_flags = ARENA_FIRST_SIZE | CHUNK_FREE;
        c->check = 0;
        bin_insert(&h->medium, c, ARENA_FIRST_SIZE);
        store_relaxed(&a->live, 0u);
        store_relaxed(&a->live_bytes, 0u);
        store_relaxed(&a->thread_free, (uintptr_t)0);
        a->next_delayed = NULL;
        if (a->state == ARENA_DECOMMITTED)
            continue;
        empty_list_push(h, a, now); /* the delay counts from here, as for an arena its last block left */
    }
    medium_keep(h, keep);
    arena **link = &h->arenas; /* the decommitted ones go whole */
    for (arena *a = *link; a != NULL; a = *link) {
        if (a->state != ARENA_DECOMMITTED) {
            link = &a->next;
            continue;
        }
        bin_remove(&h->medium, chunk_at(a, ARENA_DATA), ARENA_FIRST_SIZE);
        store_release(link, a->next);
        heap_uncharge(h, a->committed);
        segment_release(&a->seg, a->committed);
    }
}

static void arena_emptied(heap *h, arena *a)
{
    empty_list_push(h, a, os_clock_ms());
    medium_trim(h);
}

static void arena_used(heap *h, arena *a)
{
    if (a->state == ARENA_EMPTY)
        empty_list_remove(h, a);
    a->state = ARENA_USED;
}

/* A new arena for h: a spare one (segment.h), its memory as committed as it was left, else a fresh one. */
static int arena_new(heap *h)
{
    size_t committed = ARENA_KEEP;
    arena *a = h->created ? NULL : (arena *)segment_spare_take(SEG_MEDIUM, 0, &committed);
    if (a != NULL) {
        store_release(&a->seg.owner, h);
    } else {
        if (heap_charge(h, ARENA_KEEP) != 0)
            return -1;
        size_t large_from = segment_large_from(h->arenas_made++ == 0, h->created);
        large_cache_shed(SEGMENT_SIZE);
        a = (arena *)segment_create(h, SEG_MEDIUM, ARENA_KEEP, large_from);
        if (a == NULL) {
            heap_uncharge(h, ARENA_KEEP);
            return -1;
        }
    }
    store_relaxed(&a->committed, committed);
    chunk *c = chunk_at(a, ARENA_DATA);
    c->prev_size = 0;
    c->size_flags = ARENA_FIRST_SIZE | CHUNK_FREE;
    c->check = 0;
    bin_insert(&h->medium, c, ARENA_FIRST_SIZE);
    store_release(&a->next, h->arenas); /* statistics walk the list from other threads */
    store_release(&h->arenas, a);
    arena_emptied(h, a); /* empty until its first block: the most recent empty arena */
    return 0;
}

/* Commits the arena up to offset end (rounded up to 64 KB). 0 or -1. */
STEP int ensure_committed(arena *a, size_t end)
{
    if (end <= a->committed)
        return 0;
    size_t to = (end + ARENA_KEEP - 1) & ~(ARENA_KEEP - 1);
    heap *h = a->seg.owner;
    if (heap_charge(h, to - a->committed) != 0)
        return -1;
    if (segment_commit(&a->seg, (uint8_t *)a + a->committed, to - a->committed) != 0) {
        heap_uncharge(h, to - a->committed);
        return -1;
    }
    if (unlikely(segment_spared(&a->seg)) && segment_spared_commit(&a->seg, SEG_MEDIUM, a->committed, to))
        small_spared_grown(h);
    store_relaxed(&a->committed, to);
    return 0;
}

/* ---- chunks -------------------------------------------------------------------------------------- */

/* a's live bytes (usable sizes) gain `add` and lose `sub`: a live chunk that changes from one size to
 * another changes them by the difference (its header stays). */
static inline void live_bytes_change(arena *a, uint32_t add, uint32_t sub)
{
    store_relaxed(&a->live_bytes, a->live_bytes + add - sub);
}
/* A chunk of `size` bytes becomes live, or stops being live: its usable size, its header not. */
static inline void chunk_in(arena *a, uint32_t size) { live_bytes_change(a, size - CHUNK_HEADER, 0); }
static inline void chunk_out(arena *a, uint32_t size) { live_bytes_change(a, 0, size - CHUNK_HEADER); }

/* Sets the prev_size of the chunk after c (size bytes long), if there is one. */
static inline void set_next_prev(const arena *a, chunk *c, uint32_t size)
{
    chunk *next = chunk_at(c, size);
    if ((uint8_t *)next < arena_end(a))
        next->prev_size = size;
}

/* Turns the size bytes at c (no longer in use) into a free chunk, merged with free neighbours, in the
 * bins. The previous chunk is looked at only when with_prev. */
STEP void make_free(heap *h, arena *a, chunk *c, uint32_t size, int with_prev)
{
    c->check = 0; /* a header merged into the chunk before it must not look live any more */
    if (with_prev && c->prev_size != 0) {
        chunk *prev = chunk_at(c, -(size_t)c->prev_size);
        if (cflags(prev) == CHUNK_FREE) {
            uint32_t psize = csize(prev);
            bin_remove(&h->medium, prev, psize);
            c = prev;
            size += psize;
        }
    }
    chunk *next = chunk_at(c, size);
    if ((uint8_t *)next < arena_end(a) && cflags(next) == CHUNK_FREE) {
        uint32_t nsize = csize(next);
        bin_remove(&h->medium, next, nsize);
        size += nsize;
    }
    store_relaxed(&c->size_flags, size | CHUNK_FREE);
    c->check = 0;
    set_next_prev(a, c, size);
    if (size == ARENA_FIRST_SIZE)
        bin_insert_empty_arena(&h->medium, c, size); /* behind any remainder of its bin */
    else
        bin_insert(&h->medium, c, size);
}

/* Returns the live chunk c (flags already cleared of the caller's claim) to the arena. */
STEP void release_chunk(heap *h, arena *a, chunk *c)
{
    chunk_out(a, csize(c));
    make_free(h, a, c, csize(c), 1);
    if (--a->live == 0)
        arena_emptied(h, a);
    debug_check_arena(h, a, "arena inconsistent after a free");
}

void medium_drain_delayed(heap *h)
{
    arena *a = exchange_acq_rel(&h->delayed_arenas, NULL);
    while (a != NULL) {
        arena *next = a->next_delayed; /* before the exchange: then the arena may be queued again */
        uintptr_t w = exchange_acq_rel(&a->thread_free, 0);
        for (chunk *c = (chunk *)(w & ~(uintptr_t)1); c != NULL;) {
            chunk *after = c->next_free; /* make_free rewrites the links */
            store_relaxed(&c->size_flags, csize(c)); /* PENDING off: a live chunk being released */
            release_chunk(h, a, c);
            c = after;
        }
        a = next;
    }
}

/* Whether p can be a live block: inside an arena's chunk area, aligned, with a header that says so.
 * Reads only p's own header (other threads call it while the owner changes the neighbours). */
STEP int valid_live(const arena *a, const void *p, uint32_t *size)
{
    uintptr_t off = (uintptr_t)p - (uintptr_t)a;
    /* The header must be committed: on Windows an uncommitted one faults (a bogus pointer). */
    if ((off & 15) != 0 || off < ARENA_DATA + CHUNK_HEADER || off > load_relaxed(&a->committed))
        return 0;
    const chunk *c = chunk_at(p, -(size_t)CHUNK_HEADER);
    uint32_t sf = load_relaxed(&c->size_flags), s = sf & ~CHUNK_FLAGS;
    if ((sf & CHUNK_FLAGS) != 0 || s < CHUNK_MIN || off - CHUNK_HEADER + s > SEGMENT_SIZE ||
        load_relaxed(&c->check) != check_of(c, s))
        return 0;
    *size = s;
    return 1;
}

size_t medium_usable(const void *p)
{
    uint32_t s;
    return valid_live(arena_of(p), p, &s) ? s - CHUNK_HEADER : 0;
}

/* Commits what handing out the first need of the total bytes at c writes: the whole chunk, or the front
 * and, when the rest is split off, the rest's header and links (bin_insert writes them). 0 or -1. */
STEP int commit_for(arena *a, const chunk *c, uint32_t need, uint32_t total)
{
    size_t start = (size_t)((const uint8_t *)c - (const uint8_t *)a);
    return ensure_committed(a, start + (total - need >= SPLIT_MIN ? need + CHUNK_MIN : total));
}

/* Makes c (total bytes, out of the bins, committed by commit_for) a live chunk of need bytes, the rest
 * split off into the bins when it is SPLIT_MIN or more, else kept. Returns c's size. */
STEP uint32_t keep_front(heap *h, arena *a, chunk *c, uint32_t need, uint32_t total)
{
    if (total - need >= SPLIT_MIN) {
        chunk *rest = chunk_at(c, need);
        rest->prev_size = need;
        store_relaxed(&rest->size_flags, (total - need) | CHUNK_FREE);
        rest->check = 0;
        set_next_prev(a, rest, total - need);
        bin_insert(&h->medium, rest, total - need);
    } else {
        need = total;
        set_next_prev(a, c, total);
    }
    store_relaxed(&c->size_flags, need);
    c->check = check_of(c, need);
    return need;
}

/* Hands out c (free, out of the bins) for a chunk of need bytes, splitting the rest off. The block, or
 * NULL (c back in the bins) when the memory cannot be committed. */
static void *take(heap *h, arena *a, chunk *c, uint32_t have, uint32_t need)
{
    if (commit_for(a, c, need, have) != 0) {
        bin_insert(&h->medium, c, have);
        return NULL;
    }
    chunk_in(a, keep_front(h, a, c, need, have));
    if (a->live++ == 0)
        arena_used(h, a);
    debug_check_arena(h, a, "arena inconsistent after an allocation");
    return (uint8_t *)c + CHUNK_HEADER;
}

/* Every 256th medium operation of a heap with empty arenas beyond the one kept looks at their age, so
 * that a thread that keeps working inside its other arenas still gives them back. */
static inline void maybe_trim(heap *h)
{
    if (unlikely(h->empty_arena_count >= 2) && (++h->medium_ops & 255u) == 0)
        medium_trim(h);
}

/* The start of every allocation: the slow-path duties, then a free chunk of at least size bytes, out of
 * the bins (*have: its size), from a new arena if none fits; NULL out of memory. */
STEP chunk *find_chunk(heap *h, uint32_t size, uint32_t *have)
{
    heap_reserve_tick();
    if (unlikely(load_relaxed(&h->delayed_arenas) != NULL))
        medium_drain_delayed(h);
    maybe_trim(h);
    chunk *c = bin_find(&h->medium, size);
    if (c == NULL) {
        medium_trim(h);
        if (arena_new(h) != 0)
            return NULL;
        c = bin_find(&h->medium, size);
        shard_assert(c != NULL, "a new arena holds any medium block");
    }
    *have = csize(c);
    bin_remove(&h->medium, c, *have);
    return c;
}

void *medium_alloc(heap *h, size_t size)
{
    uint32_t need = chunk_need(size), have;
    chunk *c = find_chunk(h, need, &have);
    return c != NULL ? take(h, arena_of(c), c, have, need) : NULL;
}

void *medium_alloc_aligned(heap *h, size_t size, size_t align)
{
    /* A chunk with room for the block at an aligned address and, in front of it, a free chunk of at
     * least CHUNK_MIN (or none). */
    uint32_t need = chunk_need(size), have;
    chunk *c = find_chunk(h, need + (uint32_t)align + CHUNK_MIN, &have);
    if (c == NULL)
        return NULL;
    arena *a = arena_of(c);
    uintptr_t block = (uintptr_t)c + CHUNK_HEADER, at = (block + align - 1) & ~(uintptr_t)(align - 1);
    if (at != block && at - block < CHUNK_MIN)
        at += align;
    uint32_t front = (uint32_t)(at - block);
    chunk *d = chunk_at(c, front);
    if (commit_for(a, d, need, have - front) != 0) { /* commits from the arena's committed end on: c too */
        bin_insert(&h->medium, c, have);
        return NULL;
    }
    if (front != 0) { /* the front goes back to the bins as a free chunk of its own */
        store_relaxed(&d->size_flags, have - front); /* not free: make_free must not merge it */
        make_free(h, a, c, front, 0); /* sets d's prev_size; c's neighbour before it is not free: c was */
        have -= front;
    }
    chunk_in(a, keep_front(h, a, d, need, have));
    if (a->live++ == 0)
        arena_used(h, a);
    debug_check_arena(h, a, "arena inconsistent after an aligned allocation");
    return (uint8_t *)d + CHUNK_HEADER;
}

/* The chunk of p, claimed for a free (PENDING set), or NULL after the error hook when p is not a live
 * block. The claim is a CAS, so that of two frees of one block racing on two threads one loses. */
STEP chunk *claim_for_free(arena *a, void *p, uint32_t *size)
{
    chunk *c = chunk_at(p, -(size_t)CHUNK_HEADER);
    if (!valid_live(a, p, size) ||
        !counted(__atomic_compare_exchange_n(&c->size_flags, size, *size | CHUNK_PENDING, false, __ATOMIC_RELAXED,
                                             __ATOMIC_RELAXED))) {
        error_invalid_pointer(SHARD_ERROR_INVALID_FREE, p);
        return NULL;
    }
    return c;
}

void medium_free_local(heap *h, void *p)
{
    if (unlikely(load_relaxed(&h->delayed_arenas) != NULL))
        medium_drain_delayed(h);
    maybe_trim(h);
    arena *a = arena_of(p);
    uint32_t size;
    chunk *c = claim_for_free(a, p, &size);
    if (c == NULL)
        return;
    store_relaxed(&c->size_flags, size);
    c->check = 0;
    release_chunk(h, a, c);
}

void medium_free_foreign(void *p)
{
    arena *a = arena_of(p);
    uint32_t size;
    chunk *c = claim_for_free(a, p, &size);
    if (c == NULL)
        return;
    uintptr_t old = load_relaxed(&a->thread_free);
    do {
        c->next_free = (chunk *)(old & ~(uintptr_t)1);
    } while (!cas_acq_rel(&a->thread_free, &old, (uintptr_t)c | 1));
    if (old & 1)
        return; /* the arena is queued at its owner already */
    /* Acquire as in small_free_foreign: the owner read next_delayed before its exchange left the 0 that
     * this CAS found. */
    heap *owner = a->seg.owner;
    arena *head = load_relaxed(&owner->delayed_arenas);
    do {
        a->next_delayed = head;
    } while (!cas_release(&owner->delayed_arenas, &head, a));
    heap_foreign_queued(owner);
}

void *medium_resize_in_place(heap *h, void *p, size_t size)
{
    if (unlikely(load_relaxed(&h->delayed_arenas) != NULL))
        medium_drain_delayed(h);
    if (size > SHARD_MEDIUM_MAX)
        return NULL; /* a large block now: it moves */
    arena *a = arena_of(p);
    chunk *c = chunk_at(p, -(size_t)CHUNK_HEADER);
    uint32_t have = csize(c), need = chunk_need(size);
    if (need <= have) {
        if (have - need >= SPLIT_MIN) { /* the tail goes back; it merges with a free chunk after it */
            chunk *tail = chunk_at(c, need);
            tail->prev_size = need;
            store_relaxed(&c->size_flags, need);
            c->check = check_of(c, need);
            live_bytes_change(a, 0, have - need);
            make_free(h, a, tail, have - need, 0);
            debug_check_arena(h, a, "arena inconsistent after shrinking a block");
        }
        return p;
    }
    chunk *next = chunk_at(c, have);
    if ((uint8_t *)next >= arena_end(a) || cflags(next) != CHUNK_FREE || have + csize(next) < need)
        return NULL;
    uint32_t total = have + csize(next);
    if (commit_for(a, c, need, total) != 0)
        return NULL;
    bin_remove(&h->medium, next, csize(next));
    live_bytes_change(a, keep_front(h, a, c, need, total), have);
    debug_check_arena(h, a, "arena inconsistent after growing a block");
    return p;
}

/* ---- statistics and checker ---------------------------------------------------------------------- */

void medium_count(heap *h, medium_counts *out)
{
    for (arena *a = load_acquire(&h->arenas); a != NULL; a = load_acquire(&a->next)) {
        uint32_t state = load_relaxed(&a->state), live = load_relaxed(&a->live);
        out->arenas++;
        out->live += live;
        out->live_bytes += load_relaxed(&a->live_bytes);
        out->empty += live == 0;
        out->decommitted += state == ARENA_DECOMMITTED;
    }
}

void medium_visit(heap *h, visitor *v)
{
    for (arena *a = h->arenas; a != NULL && !v->stop; a = a->next) {
        if (a->live == 0)
            continue;
        uint8_t *p = (uint8_t *)a + ARENA_DATA;
        while (p < arena_end(a)) {
            chunk *c = (chunk *)p;
            uint32_t s = csize(c);
            if (s < CHUNK_MIN || (size_t)(p - (uint8_t *)a) + CHUNK_HEADER > a->committed)
                break; /* a broken chain is shard_check's to report, not the walk's to follow */
            if (cflags(c) == 0 && visit_block(v, p + CHUNK_HEADER, s - CHUNK_HEADER, VISIT_MEDIUM))
                return;
            p += s;
        }
    }
}

/* Walks the chunks of one arena: sizes chain to its end, prev_size agrees, no two free chunks are
 * adjacent, headers lie in committed memory, live chunks carry their check, free ones are in the bin
 * their size maps to (that bin's bitmap bits set), and the live count, the live bytes and the state agree. */
static int check_arena(const heap *h, const arena *a)
{
    int bad = 0;
    uint32_t prev_size = 0, live = 0, live_bytes = 0, prev_free = 0;
    const uint8_t *p = (const uint8_t *)a + ARENA_DATA;
    while (p < arena_end(a)) {
        const chunk *c = (const chunk *)p;
        uint32_t sf = load_relaxed(&c->size_flags), s = sf & ~CHUNK_FLAGS, f = sf & CHUNK_FLAGS;
        int broken = insist((size_t)(p - (const uint8_t *)a) + (f == CHUNK_FREE ? CHUNK_MIN : CHUNK_HEADER) <=
                                a->committed, "medium: a chunk header lies beyond the committed memory at", c) ||
                     insist(s >= CHUNK_MIN && (s & 15) == 0 && s <= (size_t)(arena_end(a) - p),
                            "medium: a chunk's size is not a multiple of 16 within its arena at", c) ||
                     insist(c->prev_size == prev_size, "medium: prev_size differs from the chunk before at", c);
        if (broken)
            return bad + 1; /* the chain is broken: nothing further can be trusted */
        if (f == CHUNK_FREE) {
            unsigned fl, sl;
            mapping_insert(s, &fl, &sl);
            bad += insist(!prev_free, "medium: free chunks should have merged at", c);
            bad += insist((h->medium.sl_bitmap[fl] & (1u << sl)) && (h->medium.fl_bitmap & (1u << fl)),
                          "medium: a free chunk's bin is not marked in the bitmaps at", c);
            bad += insist(c->prev_free == NULL ? h->medium.bins[fl][sl] == c : c->prev_free->next_free == c,
                          "medium: a free chunk is not linked from the bin its size maps to at", c);
            bad += insist(c->next_free == NULL || c->next_free->prev_free == c,
                          "medium: a free chunk's next does not link back at", c);
            prev_free = 1;
        } else {
            bad += insist(f == 0 || f == CHUNK_PENDING, "medium: a chunk has unknown flags at", c);
            bad += insist(c->check == check_of(c, s), "medium: a live chunk's check word is wrong at", c);
            if (f == 0 || f == CHUNK_PENDING) {
                live++;
                live_bytes += s - CHUNK_HEADER;
            }
            prev_free = 0;
        }
        prev_size = s;
        p += s;
    }
    bad += insist(p == arena_end(a), "medium: the chunks do not end at the arena's end:", a);
    bad += insist(live == a->live, "medium: the live count differs from the live chunks in arena", a);
    bad += insist(live_bytes == load_relaxed(&a->live_bytes),
                  "medium: the live bytes differ from the live chunks' in arena", a);
    bad += insist((live == 0) == (a->state != ARENA_USED), "medium: an arena's state differs from its live count:", a);
    return bad;
}

int medium_check(heap *h)
{
    int bad = 0;
    size_t free_in_arenas = 0, free_in_bins = 0, empty = 0;
    for (arena *a = h->arenas; a != NULL; a = a->next) {
        bad += insist(a->seg.owner == h && segmap_kind((uintptr_t)a) == SEG_MEDIUM,
                      "medium: an arena with a wrong owner or map entry:", a);
        bad += check_arena(h, a);
        for (const uint8_t *p = (const uint8_t *)a + ARENA_DATA; p < arena_end(a);) {
            const chunk *c = (const chunk *)p;
            uint32_t s = csize(c);
            if (s < CHUNK_MIN)
                break;
            free_in_arenas += cflags(c) == CHUNK_FREE;
            p += s;
        }
    }
    for (unsigned fl = 0; fl < MEDIUM_FL_COUNT; fl++) {
        bad += insist(((h->medium.fl_bitmap >> fl) & 1u) == (h->medium.sl_bitmap[fl] != 0),
                      "medium: the first-level bitmap differs from the second level's, level", fl);
        for (unsigned sl = 0; sl < MEDIUM_SL_COUNT; sl++) {
            bad += insist(((h->medium.sl_bitmap[fl] >> sl) & 1u) == (h->medium.bins[fl][sl] != NULL),
                          "medium: a bin's bitmap bit differs from its list, bin", fl * MEDIUM_SL_COUNT + sl);
            for (const chunk *c = h->medium.bins[fl][sl]; c != NULL && free_in_bins <= free_in_arenas;
                 c = c->next_free) {
                unsigned f2, s2;
                mapping_insert(csize(c), &f2, &s2);
                bad += insist(f2 == fl && s2 == sl && cflags(c) == CHUNK_FREE && arena_of(c)->seg.owner == h,
                              "medium: a chunk in a bin is not free, not the heap's, or of another bin's size:", c);
                free_in_bins++;
            }
        }
    }
    bad += insist(free_in_bins == free_in_arenas, "medium: free chunks in the bins differ from those in the arenas:",
                  free_in_bins);
    for (arena *a = h->empty_arenas; a != NULL; a = a->empty_next) {
        bad += insist(a->state == ARENA_EMPTY, "medium: an arena in the empty list is not empty:", a);
        empty++;
    }
    bad += insist(empty == h->empty_arena_count, "medium: the empty arena count differs from its list:", empty);
    return bad;
}
