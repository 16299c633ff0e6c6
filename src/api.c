/* api.c - the public entry points: the C fast paths (their contract and their steps are fast.h's; the
 * NASM twins in asm/fast.asm replace them in the default library, where these are built as api_*_c), the
 * slow paths that dispatch by size and by segment kind, aligned allocation and the rest of the malloc
 * family, the statistics and the checker (the error hook is error.c).
 *
 * The slow paths take anything: medium blocks (16 KB - 1 MB, medium.c) from the heap's arenas, larger
 * ones from large.c (no heap needed), other threads' blocks (one CAS, after the same item test), pages
 * that empty or were full, and pointers that are not blocks of ours, which reach the error hook. Every
 * pointer is checked against the own-segment table or the segment map before anything is read through
 * it, and a small block against its page before anything is written. What stays unseen: a second free
 * of a small item (as in the seed: an item has no room for a mark; the hardened build sees it from the
 * item's encoded link, small.h), from another thread an item the page has not carved yet (that test
 * would read the owner's cache line), and the second of two frees of a thread's large block racing on
 * two threads (its mark changes with a plain store; the hardened build's CAS sees it, large.c). An
 * allocation that fails for want of memory gives back what waits (heap_relieve) and is tried once more.
 *
 * Depends on: heap.h (and through it small.h, medium.h, segment.h), large.h, error.h, fast.h, layout.h
 * (generated), libc.h, port.h, include/shardmm.h, debugmode.h (the public names, API).
 */
#include "../include/shardmm.h"
#include "../port/port.h"
#include "heap.h"
#include "large.h"
#include "error.h"
#include "libc.h"
#include "fast.h"
#include "layout.h"
#include "debugmode.h"

/* The layout asm/fast.asm reads by number (gen/layout.py writes the numbers for both sides). */
#define FIELD_IS(type, field, offset, size) (offsetof(type, field) == (offset) && sizeof(((type *)0)->field) == (size))
_Static_assert(FIELD_IS(page, free, SHARD_L_PAGE_FREE, 8) && FIELD_IS(page, local_free, SHARD_L_PAGE_LOCAL_FREE, 8) &&
                   FIELD_IS(page, used, SHARD_L_PAGE_USED, 4) && FIELD_IS(page, item_bound, SHARD_L_PAGE_ITEM_BOUND, 4) &&
                   FIELD_IS(page, item_mul, SHARD_L_PAGE_ITEM_MUL, 4) &&
                   FIELD_IS(page, block_size, SHARD_L_PAGE_BLOCK_SIZE, 4) &&
                   FIELD_IS(page, shared_divisor, SHARD_L_PAGE_SHARED_DIVISOR, 8) &&
                   FIELD_IS(page, shared_block_size, SHARD_L_PAGE_SHARED_BLOCK_SIZE, 4),
               "struct page differs from gen/layout.py");
_Static_assert(FIELD_IS(segment, secret, SHARD_L_SEGMENT_SECRET, 8), "struct segment differs from gen/layout.py");
_Static_assert(offsetof(heap, direct) == SHARD_L_HEAP_DIRECT && offsetof(heap, own) == SHARD_L_HEAP_OWN &&
                   offsetof(heap, classes) == SHARD_L_HEAP_CLASSES && offsetof(page_list, first) == 0 &&
                   sizeof(page_list) == (size_t)1 << SHARD_L_PAGE_LIST_SHIFT &&
                   FIELD_IS(heap, gather_page, SHARD_L_HEAP_GATHER_PAGE, 8) &&
                   FIELD_IS(heap, gather_head, SHARD_L_HEAP_GATHER_HEAD, 8) &&
                   FIELD_IS(heap, gather_count, SHARD_L_HEAP_GATHER_COUNT, 4),
               "struct heap differs from gen/layout.py");
_Static_assert(SEGMENT_SHIFT == SHARD_L_SEGMENT_SHIFT && PAGE_SHIFT == SHARD_L_PAGE_SHIFT &&
                   PAGE_DESC_SIZE == 1 << SHARD_L_PAGE_DESC_SHIFT && HEAP_OWN_SLOTS == SHARD_L_OWN_SLOTS &&
                   SHARD_DIRECT_MAX == SHARD_L_DIRECT_MAX && SHARD_SMALL_MAX == SHARD_L_SMALL_MAX &&
                   SHARD_GATHER_ITEMS == SHARD_L_GATHER_ITEMS,
               "segment geometry or size limits differ from gen/layout.py");

/* ---- malloc -------------------------------------------------------------------------------------- */

/* A small or medium block for a thread without a heap in its slot: its first allocation, or one made
 * after its exit hook ran, with a heap lent for this one block. */
static __attribute__((noinline)) void *malloc_without_heap(size_t size)
{
    int lent = 0;
    heap *h = heap_get_or_create(&lent);
    if (h == NULL)
        return NULL;
    void *p = size > SHARD_SMALL_MAX ? medium_alloc(h, size)
                                     : small_alloc_slow(h, class_by_size16[(size + 15) >> 4]);
    if (lent)
        heap_retire(h); /* a thread past its exit hook: the heap goes back after this one block, as at exit */
    return p;
}

/* The C fast paths carry the public names in the pure-C library, and api_<name>_c beside the NASM ones
 * (internal names never share the public prefix: fast.h); in the full-debug build the names debugmode.c
 * wraps (debugmode.h's API). */
#if SHARD_ASM
#define FAST_PATH(name) api_##name##_c
#else
#define FAST_PATH(name) API(name)
#endif

/* NULL for want of memory or an impossible size; the caller also learns it the C library's way. */
static __attribute__((noinline, cold)) void *out_of_memory(void)
{
    os_out_of_memory();
    return NULL;
}

static inline void *or_out_of_memory(void *p) { return likely(p != NULL) ? p : out_of_memory(); }

/* Whether p's kind in the map is a large block's. */
static inline int kind_large(unsigned kind) { return kind == SEG_LARGE || kind == SEG_LARGE_FAR; }

/* Large blocks need no heap, but the process's start-up (the fork hooks) comes first all the same, and
 * a thread's first allocation makes its heap, which keeps its spare (large.c). Without one (no memory
 * for it, or a thread past its exit hook, whose heap is only lent) the block comes from the cache. */
static void large_heap(void)
{
    heap_started();
    if (unlikely(heap_mine() == NULL)) {
        int lent = 0;
        heap *h = heap_get_or_create(&lent);
        if (h != NULL && lent)
            heap_retire(h);
    }
}

static void *large_any(size_t size, size_t align, int zero)
{
    large_heap();
    return large_alloc_aligned(size, align, zero);
}

static void *malloc_any(size_t size)
{
    if (size > SHARD_MEDIUM_MAX)
        return large_any(size, 16, 0);
    heap *h = heap_mine();
    if (unlikely(h == NULL))
        return malloc_without_heap(size);
    if (size > SHARD_SMALL_MAX)
        return medium_alloc(h, size);
    unsigned cls = class_by_size16[(size + 15) >> 4];
    page *pg = h->classes[cls].first;
    if (pg != NULL && pg->free != NULL)
        return page_pop(pg);
    return small_alloc_slow(h, cls);
}

/* A size that some address space could hold (above it no allocation is tried twice). */
#define SIZE_POSSIBLE ((size_t)1 << 46)

/* p, or when p is NULL for want of memory: everything that waits goes back (heap_relieve) and the caller
 * tries once more. */
static inline int worth_retry(const void *p, size_t size)
{
    return unlikely(p == NULL) && size < SIZE_POSSIBLE && heap_relieve();
}

void *api_malloc_slow(size_t size)
{
    void *p = malloc_any(size);
    if (worth_retry(p, size))
        p = malloc_any(size);
    return or_out_of_memory(p);
}

void *api_malloc_dry(size_t size, heap *h, page *pg)
{
    void *p = small_alloc_slow(h, pg->cls);
    return likely(p != NULL) ? p : api_malloc_slow(size);
}

void *FAST_PATH(malloc)(size_t size)
{
    heap *h = fast_heap();
    page *pg;
    if (likely(size <= SHARD_DIRECT_MAX))
        pg = h->direct[(size + 15) >> 4];
    else if (size <= SHARD_SMALL_MAX)
        pg = h->classes[class_by_size16[(size + 15) >> 4]].first;
    else
        return api_malloc_slow(size);
    if (likely(pg != NULL && page_ready(pg)))
        return page_pop(pg);
    return pg != NULL && pg != &small_empty_page ? api_malloc_dry(size, h, pg) : api_malloc_slow(size);
}

/* calloc's slow part: sizes above 2 KB, a page that needs the slow path; a tail call from shard_calloc,
 * so that its fast path needs no stack frame. */
static __attribute__((noinline)) void *calloc_slow(size_t total)
{
    if (total > SHARD_MEDIUM_MAX) {
        void *p = large_any(total, 16, 1); /* zeroes only what a cached block had committed */
        if (worth_retry(p, total))
            p = large_any(total, 16, 1);
        return or_out_of_memory(p);
    }
    void *p = api_malloc_slow(total);
    if (p != NULL)
        mem_zero_block(p, total);
    return p;
}

/* Up to 2 KB the malloc fast path is inlined here (no call to the asm entry, no frame); the rest goes
 * through calloc_slow. */
void *API(calloc)(size_t count, size_t size)
{
    size_t total;
    if (unlikely(__builtin_mul_overflow(count, size, &total)))
        return out_of_memory();
    if (likely(total <= SHARD_DIRECT_MAX)) {
        page *pg = fast_heap()->direct[(total + 15) >> 4];
        if (likely(page_ready(pg))) {
            void *p = page_pop(pg);
            mem_zero_block(p, total);
            return p;
        }
    }
    return calloc_slow(total);
}

/* ---- free ---------------------------------------------------------------------------------------- */

/* Whether p lies in a small segment of h (heap_none owns none); nothing is read through p. */
static inline int own_small(const heap *h, const void *p)
{
    return h->own[(uint32_t)(uintptr_t)p >> SEGMENT_SHIFT] == ((uintptr_t)p & ~(uintptr_t)SEGMENT_MASK);
}

/* The calling thread's heap when it owns the arena of p (a medium block's), else NULL. */
static inline heap *owner_heap(const void *p)
{
    heap *h = heap_mine();
    return h != NULL && load_relaxed(&segment_of(p)->owner) == h ? h : NULL; /* it changes (small.h) */
}

void api_free_slow(void *p)
{
    if (p == NULL)
        return;
    unsigned kind = segmap_kind((uintptr_t)p);
    heap *h = heap_mine();
    if (h == NULL && (kind == SEG_SMALL || kind == SEG_MEDIUM)) {
        /* NULL: a spare segment */
        heap *owner = kind == SEG_SMALL ? page_user(page_of(p)) : load_relaxed(&segment_of(p)->owner);
        if (owner != NULL) {
            h = heap_claim(owner); /* the heap of an ended thread whose blocks this thread frees: its own */
            /* A running heap's small block: a heap to gather this thread's frees in (small.c). */
            if (h == NULL && kind == SEG_SMALL && !SHARD_HARDENED && heap_has_thread(owner))
                h = heap_for_frees();
        }
    }
    if (kind == SEG_SMALL) {
        page *pg = page_of(p);
        /* A page another heap's segment lent to h (small.h), whose own-segment test failed */
        if (h != NULL && unlikely(load_relaxed(&pg->lend) == LEND_GUEST) && load_relaxed(&pg->guest_of) == h) {
            small_free_guest(h, pg, p);
            return;
        }
        /* h's segment, or one h gave to the orphans, which is h's again from this free on */
        if (h != NULL && (load_relaxed(&segment_of(p)->owner) == h || small_take_back(h, segment_of(p)) == 0)) {
            small_free_local_slow(h, pg, p); /* tests the item; takes the ordinary case too */
            return;
        }
        /* Another thread's block. Both lines it writes, the descriptor's foreign line (read first by
         * the test, then changed by the CAS) and the item's link, are fetched for writing at once:
         * a read would fetch them shared from the owner's core, and the write would then have to ask
         * again for sole ownership. Harmless when p is not an item (a prefetch never faults). */
        prefetch_write(&pg->thread_free); /* needless when the free is gathered, which is cheap */
        prefetch_write(p);
        if (small_valid_foreign(pg, p))
            small_free_foreign(h, pg, p);
        else
            error_invalid_pointer(SHARD_ERROR_INVALID_FREE, p);
        return;
    }
    if (kind == SEG_MEDIUM) {
        if (h != NULL && load_relaxed(&segment_of(p)->owner) == h) /* it changes (small.h) */
            medium_free_local(h, p);
        else
            medium_free_foreign(p);
        return;
    }
    if (!kind_large(kind) || large_free(p) != 0)
        error_invalid_pointer(SHARD_ERROR_INVALID_FREE, p);
}

void FAST_PATH(free)(void *p)
{
    heap *h = fast_heap();
    if (likely(own_small(h, p))) {
        page *pg = page_of(p);
        block *b = p;
        if (likely(page_has_item(pg, b)) && likely(small_free_fast(pg, b)))
            return;
        small_free_local_slow(h, pg, b); /* the rest, or not an item (reported there) */
        return;
    }
#if !SHARD_HARDENED
    /* Another heap's block in the page whose frees this thread gathers (small.c, gathered frees): onto
     * the list, as gather_free does, without the slow path's look-ups. That page is an item's, out in
     * the list, so it stays a page of its class meanwhile; heap_none gathers nothing. */
    page *gp = h->gather_page;
    if (gp != NULL && page_of(p) == gp && small_valid_foreign(gp, p) &&
        likely(h->gather_count + 1 < SHARD_GATHER_ITEMS)) {
        heap_gather_link(h, (block *)p);
        return;
    }
#endif
    api_free_slow(p);
}

/* ---- realloc ------------------------------------------------------------------------------------- */

size_t api_usable(const void *p)
{
    unsigned kind = segmap_kind((uintptr_t)p);
    if (kind == SEG_SMALL && page_has_item_any_thread(page_of(p), p))
        return small_looks_free(page_of(p), p) ? 0 : page_of(p)->block_size; /* freed: hardened only */
    return kind == SEG_MEDIUM ? medium_usable(p) : kind_large(kind) ? large_usable(p) : 0;
}

size_t api_usable_or_report(const void *p, int error)
{
    size_t n = api_usable(p);
    if (SHARD_HARDENED && n == 0 && error == SHARD_ERROR_INVALID_REALLOC && segmap_kind((uintptr_t)p) == SEG_SMALL &&
        page_has_item_any_thread(page_of(p), p))
        error = SHARD_ERROR_DOUBLE_FREE; /* an item of its page, but free */
    if (n == 0)
        error_invalid_pointer(error, (void *)p);
    return n;
}

/* Whether size keeps a block of pg's class in place: within the class and not below a quarter of it. */
static inline int small_size_stays(const page *pg, size_t size)
{
    size_t bsize = pg->block_size;
    return size <= bsize && size >= bsize >> 2;
}

/* Whether p, in a small segment of the calling thread, is an item of its page that keeps its place when
 * resized to size. */
static inline int small_stays(const void *p, size_t size)
{
    const page *pg = page_of(p);
    return small_size_stays(pg, size) && page_has_item(pg, p) && !small_looks_free(pg, p);
}

/* The same for p in any thread's small segment. */
static inline int small_stays_any_thread(const void *p, size_t size)
{
    const page *pg = page_of(p);
    return small_size_stays(pg, size) && page_has_item_any_thread(pg, p) && !small_looks_free(pg, p);
}

/* p resized to size where it lies: a small block within its class (small_stays), a medium block of the
 * calling thread's arenas (only the owner changes its chunks), a large block within its reservation; NULL
 * when it must move. */
static void *resize_in_place(void *p, unsigned kind, size_t size)
{
    heap *h;
    if (kind == SEG_SMALL)
        return small_stays_any_thread(p, size) ? p : NULL;
    if (kind == SEG_MEDIUM)
        return (h = owner_heap(p)) != NULL ? medium_resize_in_place(h, p, size) : NULL;
    return kind_large(kind) ? large_resize_in_place(p, size) : NULL;
}

/* p, of `old` usable bytes and of the given kind, moved to a new block of size bytes (size > 0) that has
 * room to grow; NULL, p untouched, out of memory. */
static __attribute__((noinline)) void *realloc_move(void *p, unsigned kind, size_t old, size_t size)
{
    size_t target = size;
    void *q;
    if (size > old && size > SHARD_MEDIUM_MAX && size < ((size_t)1 << 60)) {
        /* Large blocks grow with 1/16 of headroom (on top of their reservation's own), so that a buffer
         * grown step by step moves no more often than it doubles. Where the OS can, a large block's pages
         * move to the new reservation without a copy. */
        target = size + size / 16;
        if (kind_large(kind) && (q = large_move(p, target)) != NULL)
            return q;
    } else if (size > old && size <= SHARD_MEDIUM_MAX) {
        /* A block that moves to grow gets room for at least half as much again plus 32 bytes when the
         * new size is small (without the 32, a short string appended a character at a time would move on
         * every class step), a quarter more when it is medium, within the range of the new size. The
         * headroom is measured from the old size: a caller that grows its buffer geometrically itself
         * (doubling) already asks for more than that and gets what it asks, not a half or a quarter
         * again on top, which would only be held and never used. */
        int small = size <= SHARD_SMALL_MAX;
        size_t limit = small ? SHARD_SMALL_MAX : SHARD_MEDIUM_MAX;
        target = small ? old + old / 2 + 32 : old + old / 4;
        if (target < size)
            target = size;
        if (target > limit)
            target = limit;
    }
    q = NULL;
    if (target > size && size > SHARD_MEDIUM_MAX && !kind_large(kind)) { /* grows: large.c's earned tails */
        large_heap();
        q = large_alloc_grown(target);
    }
    if (q == NULL)
        q = API(malloc)(target);
    if (q == NULL && target != size)
        q = API(malloc)(size); /* short of memory: without the headroom it may still fit */
    if (q == NULL)
        return NULL;
    mem_copy_block(q, p, old < size ? old : size);
    API(free)(p);
    return q;
}

static __attribute__((noinline)) void *realloc_generic(void *p, size_t size)
{
    size_t old = api_usable_or_report(p, SHARD_ERROR_INVALID_REALLOC);
    if (old == 0)
        return NULL;
    unsigned kind = segmap_kind((uintptr_t)p);
    if (size == 0) {
        API(free)(p);
        return NULL;
    }
    void *q = resize_in_place(p, kind, size);
    return q != NULL ? q : realloc_move(p, kind, old, size);
}

/* Past the fast path: NULL (a malloc, as half of bench/app.c's json reallocs are), then a small block
 * of any thread tested once (through the segment map) and moved at once when it must, then the rest. */
void *api_realloc_slow(void *p, size_t size)
{
    if (p == NULL)
        return API(malloc)(size);
    if (segmap_kind((uintptr_t)p) == SEG_SMALL) {
        const page *pg = page_of(p);
        if (likely(page_has_item_any_thread(pg, p) && !small_looks_free(pg, p))) {
            if (small_size_stays(pg, size))
                return p;
            if (likely(size != 0))
                return realloc_move(p, SEG_SMALL, pg->block_size, size);
        }
    }
    return realloc_generic(p, size);
}

void *FAST_PATH(realloc)(void *p, size_t size)
{
    if (likely(own_small(fast_heap(), p) && small_stays(p, size)))
        return p;
    return api_realloc_slow(p, size);
}

/* ---- aligned allocation and the rest of the malloc family ------------------------------------------ */

static inline int power_of_two(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* The smallest small class that holds size bytes and is a multiple of align (16 < align <= 16 KB): its
 * items lie at multiples of its size from a 64 KB boundary, so all are aligned. Class 16384 always is. */
static unsigned aligned_class(size_t size, size_t align)
{
    unsigned cls = class_by_size16[((size > align ? size : align) + 15) >> 4];
    while (class_size[cls] % align != 0)
        cls++;
    return cls;
}

/* A medium block at a multiple of align, from the calling thread's heap (lent, as malloc_without_heap
 * does, to a thread past its exit hook). */
static void *medium_aligned(size_t size, size_t align)
{
    int lent = 0;
    heap *h = heap_mine();
    if (h == NULL && (h = heap_get_or_create(&lent)) == NULL)
        return NULL;
    void *p = medium_alloc_aligned(h, size, align);
    if (lent)
        heap_retire(h);
    return p;
}

/* Up to 2 MB a medium block holds any alignment in its arena; beyond that, and above 1 MB, a large one. */
static void *aligned_any(size_t size, size_t align)
{
    if (size <= SHARD_MEDIUM_MAX && align <= SHARD_MEDIUM_ALIGN_MAX)
        return medium_aligned(size, align);
    return large_any(size, align, 0);
}

void *API(malloc_aligned)(size_t size, size_t align)
{
    if (!power_of_two(align))
        return NULL;
    if (align <= 16)
        return API(malloc)(size);
    if (size <= SHARD_SMALL_MAX && align <= SHARD_SMALL_MAX)
        return API(malloc)(class_size[aligned_class(size, align)]); /* that size takes exactly that class */
    void *p = aligned_any(size, align);
    if (worth_retry(p, size > align ? size : align)) /* an alignment no address space holds: no second try */
        p = aligned_any(size, align);
    return or_out_of_memory(p);
}

void *API(realloc_aligned)(void *p, size_t size, size_t align)
{
    if (p == NULL)
        return API(malloc_aligned)(size, align);
    if (!power_of_two(align))
        return NULL;
    if (align <= 16)
        return API(realloc)(p, size);
    size_t old = api_usable_or_report(p, SHARD_ERROR_INVALID_REALLOC);
    if (old == 0)
        return NULL;
    if (size == 0) {
        API(free)(p);
        return NULL;
    }
    if (((uintptr_t)p & (align - 1)) == 0) { /* in place keeps the alignment */
        void *q = resize_in_place(p, segmap_kind((uintptr_t)p), size);
        if (q != NULL)
            return q;
    }
    void *q = API(malloc_aligned)(size, align);
    if (q == NULL)
        return NULL;
    mem_copy(q, p, old < size ? old : size);
    API(free)(p);
    return q;
}

void *API(reallocarray)(void *p, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total))
        return out_of_memory();
    return API(realloc)(p, total);
}

enum { EINVAL_ = 22, ENOMEM_ = 12, PAGE_BYTES = 4096 }; /* the same numbers on Linux and in Windows's CRT */

int API(posix_memalign)(void **out, size_t align, size_t size)
{
    if (!power_of_two(align) || align % sizeof(void *) != 0)
        return EINVAL_;
    void *p = API(malloc_aligned)(size, align);
    if (p == NULL)
        return ENOMEM_;
    *out = p;
    return 0;
}

void *API(memalign)(size_t align, size_t size)
{
    if (align > SIZE_MAX / 2 + 1) { /* glibc: no power of two holds it */
        os_invalid_argument();
        return NULL;
    }
    size_t a = 16;
    while (a < align) /* glibc: below 16 is 16, and any other is rounded up to a power of two */
        a <<= 1;
    return API(malloc_aligned)(size, a);
}

void *API(aligned_alloc)(size_t align, size_t size) { return API(memalign)(align, size); }

void *API(valloc)(size_t size) { return API(malloc_aligned)(size, PAGE_BYTES); }

void *API(pvalloc)(size_t size)
{
    if (size > SIZE_MAX - PAGE_BYTES)
        return out_of_memory();
    size_t rounded = (size + PAGE_BYTES - 1) & ~(size_t)(PAGE_BYTES - 1);
    return API(malloc_aligned)(rounded ? rounded : PAGE_BYTES, PAGE_BYTES);
}

size_t API(usable_size)(const void *p)
{
    if (p == NULL)
        return 0;
    return api_usable_or_report(p, SHARD_ERROR_INVALID_SIZE_QUERY);
}

/* ---- statistics and checks ----------------------------------------------------------------------- */

void shard_get_stats(shard_stats *out)
{
    os_totals t;
    os_get_totals(&t);
    mem_zero(out, sizeof *out);
    out->reserved = t.reserved;
    out->committed = t.committed;
    out->committed_peak = t.committed_peak;
    out->os_calls = t.calls;
#if SHARD_COUNTERS
    out->atomic_ops = load_relaxed(&sync_atomic_ops);
    out->lock_acquisitions = load_relaxed(&sync_lock_acquisitions);
#endif
    large_live_counts(&out->live_large, &out->live_large_bytes, &out->live_large_committed);
    large_cache_counts(&out->large_cached, &out->large_cached_bytes);
    segment_spare_counts(&out->spare_segments, &out->spare_bytes);
    out->heaps_free = heap_free_count();
    medium_counts mc = {0, 0, 0, 0, 0};
    small_counts sc = {0, 0, 0, 0, 0, 0};
    segment_walk_begin(); /* other threads may release segments and arenas meanwhile (segment.h) */
    for (heap *h = heap_all(); h != NULL; h = h->next_all) {
        out->heaps++;
        medium_count(h, &mc);
        small_count(h, &sc);
    }
    small_orphan_count(&sc, &out->orphan_segments);
    segment_walk_end();
    out->live_small = sc.live;
    out->live_small_bytes = sc.live_bytes;
    out->small_pages_used = sc.used;
    out->small_pages_free = sc.free;
    out->small_pages_decommitted = sc.decommitted;
    out->small_pages_retired = sc.retired;
    out->live_medium = mc.live;
    out->live_medium_bytes = mc.live_bytes;
    out->medium_arenas = mc.arenas;
    out->medium_arenas_empty = mc.empty;
    out->medium_arenas_decommitted = mc.decommitted;
#if SHARD_FULL_DEBUG
    debugmode_stats(out);
#endif
}

int API(check)(void)
{
    int problems = large_check() + heap_check_stack();
    heap *h = heap_mine();
    return h != NULL ? problems + heap_check(h) : problems;
}

void shard_thread_done(void) { heap_thread_done(); }

void shard_collect(void)
{
    heap_collect();
    large_cache_release_all();
}

size_t shard_set_limit(size_t bytes) { return os_set_limit(bytes); }
