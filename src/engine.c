/* engine.c - heaps an embedder owns (shard_heap_create): a scripting engine's instance, a request, a
 * sandbox. Their blocks come from pages and arenas of their own, within an optional limit, and all go at
 * once when the heap is destroyed or reset.
 *
 * A created heap is a `heap` like a thread's (heap.h), with `created` set: the same small pages, medium
 * arenas and free paths, so its blocks take the thread heap's fast paths through shard_heap_malloc and
 * shard_heap_free (no atomic operation, no lock), and other threads free them as they free another
 * thread's blocks (shard_free: the segment's owner is the heap, the free goes onto its queues, which the
 * heap's next slow path takes in). No thread's slot holds it; the caller serializes its use, as Lua,
 * Duktape and mruby do, and may hand it from thread to thread. Its owner word names no thread
 * (PORT_THREAD_NONE), so it is never taken for a dead thread's heap, and a foreign free into it arms no
 * trim of the stack of free heaps.
 *
 * The limit: the heap counts what it holds committed (`charged`) where its pages, arenas and large
 * blocks are committed and given back (small.c, medium.c, large.c through heap_charge/heap_uncharge); a
 * commit that would pass the limit is refused before the OS is asked, so the allocation gives NULL and
 * nothing else changes. Before that NULL reaches the caller, the heap gives back its own free pages and
 * empty arenas and tries again, then asks the embedder's on_limit callback, and tries once more if it
 * says so. Large blocks of a created heap name the heap in their header (large.c) so that a free from
 * any thread takes their memory off its count.
 *
 * Destroy and reset end every block without looking at one: pages become free and arenas one free chunk
 * again, page by page and arena by arena, large blocks are freed; then all but a small reserve goes back
 * (CREATED_RESERVE_* below): time in proportion to the heap's segments, arenas and large blocks. The
 * heap structure itself is never unmapped (statistics walk every heap ever made, heap.h); a destroyed
 * heap waits in a list, with its reserve for the delay, for the next shard_heap_create.
 *
 * Depends on: shardmm.h (the API), fast.h (api_usable_or_report), heap.h, small.h, medium.h, large.h,
 * segment.h, libc.h, sync.h, debugmode.h (the public names, API).
 */
#include "../include/shardmm.h"
#include "debugmode.h"
#include "fast.h"
#include "heap.h"
#include "large.h"
#include "options.h"

/* Destroyed heaps, for reuse, the most recently destroyed first (under their lock); `warm` of them keep
 * a reserve (below). A destroy that finds the lock held by another thread's fork does not wait for it
 * (heap.c, "Fork"), nor empty the heap then: the fork holds the lock of the walk that finds the heap's
 * large blocks too, which would stay live and counted. It pushes the heap onto `deferred`, without the
 * lock, and arms the reserves' clock; whoever takes the lock next (a create, a destroy, the clock's
 * expiry, shard_collect) destroys it then. */
static struct {
    spinlock lock;
    heap *first;
    unsigned warm;
    heap *deferred; /* linked by next_created; atomic */
} destroyed;

/* What a destroyed or reset heap keeps committed for the next engine, as a thread keeps the pages it
 * freed for its next blocks: a short-lived engine on a fresh heap would otherwise fault in every page it
 * touches. With a reserve of 2 MB, bench/engines.py's mruby table script took 78,000 page faults per 10
 * runs against 11,700 on the thread heap, and was 7 % slower; Lua's closures 48,000 against 2,100. So a
 * destroyed heap keeps what it had, up to 64 MB of small pages and 8 arenas, for the reserve's delay
 * (SHARDMM_DELAY_MS) and then gives it back; at most CREATED_RESERVE_HEAPS destroyed heaps keep one, the
 * rest give back everything at once; shard_collect and running out of memory give it back at once. */
#define CREATED_RESERVE_PAGES 1024
#define CREATED_RESERVE_ARENAS 8
#define CREATED_RESERVE_HEAPS 4

static inline heap *created_heap_of(shard_heap *sh) { return (heap *)sh; }

int heap_charge_created(heap *h, size_t bytes)
{
    size_t now = counted(__atomic_add_fetch(&h->charged, bytes, __ATOMIC_RELAXED));
    size_t limit = load_relaxed(&h->limit);
    if (limit != 0 && now > limit) {
        fetch_add_relaxed(&h->charged, -bytes);
        store_relaxed(&h->limit_hit, 1u);
        return -1;
    }
    size_t peak = load_relaxed(&h->charged_peak);
    while (now > peak && !counted(__atomic_compare_exchange_n(&h->charged_peak, &peak, now, true, __ATOMIC_RELAXED,
                                                              __ATOMIC_RELAXED))) {
    }
    return 0;
}

/* The heap as a fresh one: no page, arena or block; its identity, options and count of retired pages
 * (statistics since start) kept. */
static void created_clear(heap *h)
{
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++)
        h->direct[i] = &small_empty_page;
    mem_zero(h->own, sizeof h->own);
    h->own[0] = 1;
    mem_zero(h->classes, sizeof h->classes);
    h->free_pages = h->cold_pages = (page_list){NULL, NULL};
    h->free_count = 0;
    mem_zero(h->full_ring, sizeof h->full_ring);
    store_release(&h->segments, (segment *)NULL);
    mem_zero(&h->medium, sizeof h->medium);
    store_release(&h->arenas, (struct arena *)NULL);
    h->empty_arenas = NULL;
    h->empty_arena_count = 0;
    h->medium_ops = 0;
    h->sweep_wait = 0;
    store_relaxed(&h->delayed, (page *)NULL);
    store_relaxed(&h->delayed_arenas, (struct arena *)NULL);
    store_relaxed(&h->charged, (size_t)0);
    store_relaxed(&h->charged_peak, (size_t)0);
    store_relaxed(&h->limit_hit, 0u);
}

/* Every block of the heap gone: its large blocks freed (into the process's cache, as frees), its pages
 * and arenas empty, all but a reserve (`keep`: 0 or 1) given back. */
static void created_empty(heap *h, int keep)
{
    large_release_owned(h);
    if (keep) {
        small_empty_keep(h, CREATED_RESERVE_PAGES);
        medium_empty_keep(h, CREATED_RESERVE_ARENAS);
        h->reserve_held = 1;
    } else {
        small_release_all(h);
        medium_release_all(h);
        created_clear(h);
        h->reserve_held = 0;
    }
    store_relaxed(&h->charged_peak, load_relaxed(&h->charged));
    store_relaxed(&h->limit_hit, 0u);
}

/* Under the list's lock: h emptied, keeping a reserve while fewer than CREATED_RESERVE_HEAPS do, and
 * listed for reuse. */
static void created_retire(heap *h)
{
    int keep = destroyed.warm < CREATED_RESERVE_HEAPS;
    destroyed.warm += (unsigned)keep;
    created_empty(h, keep);
    h->retired_at = os_clock_ms();
    h->next_created = destroyed.first;
    destroyed.first = h;
    if (keep)
        heap_arm_reserve_due(h->retired_at + options_values.reserve_delay_ms);
}

/* Take the list's lock, unless another thread's fork holds it (0); the destroys a fork put off are done
 * first, so that whoever takes it finds them listed. */
static int destroyed_lock(void)
{
    if (!spin_lock_unless_fork(&destroyed.lock))
        return 0;
    if (load_relaxed(&destroyed.deferred) != NULL) {
        heap *h = __atomic_exchange_n(&destroyed.deferred, (heap *)NULL, __ATOMIC_ACQUIRE);
        while (h != NULL) {
            heap *next = h->next_created;
            created_retire(h);
            h = next;
        }
    }
    return 1;
}

void created_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&destroyed.lock);
    else
        spin_unlock_for_fork(&destroyed.lock);
}

uint64_t created_reserve_expire(uint64_t now)
{
    uint64_t due = 0;
    if (!destroyed_lock())
        return 0;
    for (heap *h = destroyed.first; h != NULL; h = h->next_created) {
        if (!h->reserve_held)
            continue;
        if (now != UINT64_MAX && (int64_t)(now - h->retired_at) < (int64_t)options_values.reserve_delay_ms) {
            uint64_t at = h->retired_at + options_values.reserve_delay_ms;
            due = due == 0 || at < due ? at : due;
            continue;
        }
        created_empty(h, 0);
        destroyed.warm--;
    }
    spin_unlock(&destroyed.lock);
    return due;
}

shard_heap *shard_heap_create(const shard_heap_options *opt)
{
    heap_started();
    heap *h = NULL;
    if (destroyed_lock()) {
        h = destroyed.first;
        if (h != NULL) {
            destroyed.first = h->next_created;
            destroyed.warm -= h->reserve_held;
            h->reserve_held = 0; /* its reserve is this heap's own now */
        }
        spin_unlock(&destroyed.lock);
    }
    if (h == NULL) {
        h = heap_new(PORT_THREAD_NONE);
        if (h == NULL)
            return NULL;
        h->created = 1;
    }
    h->next_created = NULL;
    if (opt != NULL && opt->limit != 0 && load_relaxed(&h->charged) != 0)
        created_empty(h, 0); /* a heap with a limit starts with nothing: a reserve would take from it */
    store_relaxed(&h->charged_peak, load_relaxed(&h->charged));
    store_relaxed(&h->limit, opt != NULL ? opt->limit : 0);
    h->on_limit = opt != NULL ? opt->on_limit : NULL;
    h->on_limit_arg = opt != NULL ? opt->arg : NULL;
    return (shard_heap *)h;
}

void API(heap_destroy)(shard_heap *sh)
{
    if (sh == NULL)
        return;
    heap *h = created_heap_of(sh);
    /* Under the list's lock throughout (the OS calls too: destroys and creates are far rarer than the
     * blocks); while another thread's fork holds it, put off (`destroyed`, above). */
    if (!destroyed_lock()) {
        heap *first = load_relaxed(&destroyed.deferred);
        do
            h->next_created = first;
        while (!cas_release(&destroyed.deferred, &first, h));
        heap_arm_reserve_due(os_clock_ms());
        return;
    }
    created_retire(h);
    spin_unlock(&destroyed.lock);
}

void API(heap_reset)(shard_heap *sh)
{
    if (sh == NULL)
        return; /* the thread heap is nobody's to reset */
    heap *h = created_heap_of(sh);
    created_empty(h, 1);
    h->reserve_held = 0; /* the heap's own, not a destroyed one's */
}

size_t shard_heap_set_limit(shard_heap *sh, size_t limit)
{
    if (sh == NULL)
        return 0; /* the thread heap has no limit (shard_set_limit bounds the process) */
    return __atomic_exchange_n(&created_heap_of(sh)->limit, limit, __ATOMIC_RELAXED);
}

void shard_heap_get_stats(shard_heap *sh, shard_heap_stats *out)
{
    heap *h = created_heap_of(sh);
    mem_zero(out, sizeof *out);
    if (sh == NULL)
        return; /* the thread heap's counts are shard_get_stats's */
    out->committed = load_relaxed(&h->charged);
    out->committed_peak = load_relaxed(&h->charged_peak);
    out->limit = load_relaxed(&h->limit);
    small_counts sc = {0, 0, 0, 0, 0, 0};
    medium_counts mc = {0, 0, 0, 0, 0};
    small_count(h, &sc);
    medium_count(h, &mc);
    out->live_small = sc.live;
    out->live_medium = mc.live;
    out->live_large = load_relaxed(&h->large_count);
    out->live_small_bytes = sc.live_bytes;
    out->live_medium_bytes = mc.live_bytes;
    out->live_large_bytes = load_relaxed(&h->large_bytes);
}

/* ---- allocation ---------------------------------------------------------------------------------- */

static void *created_alloc(heap *h, size_t size)
{
    if (size > SHARD_MEDIUM_MAX)
        return large_alloc_in(h, size, 16, 0);
    if (size > SHARD_SMALL_MAX)
        return medium_alloc(h, size);
    unsigned cls = class_by_size16[(size + 15) >> 4];
    page *pg = h->classes[cls].first;
    if (pg != NULL && page_ready(pg))
        return page_pop(pg);
    return small_alloc_slow(h, cls);
}

/* After an allocation found the limit in the way: the heap's own free pages and empty arenas go back,
 * then the embedder may free or raise the limit. 1 when the allocation is worth another try. */
static int created_relieve(heap *h, size_t size, int ask)
{
    if (!load_relaxed(&h->limit_hit))
        return 0;
    store_relaxed(&h->limit_hit, 0u);
    if (!ask) {
        small_settle(h); /* what other threads freed into its pages: the pages they emptied go free */
        small_keep(h, 0, 0);
        medium_keep(h, 0);
        return 1;
    }
    return h->on_limit != NULL && h->on_limit(h->on_limit_arg, (shard_heap *)h, size) != 0;
}

/* NULL for want of memory, the C library's way too. */
static void *created_or_oom(void *p)
{
    if (p == NULL)
        os_out_of_memory();
    return p;
}

static __attribute__((noinline)) void *created_malloc_slow(heap *h, size_t size)
{
    void *p = created_alloc(h, size);
    for (int ask = 0; p == NULL && ask < 2 && created_relieve(h, size, ask); ask++)
        p = created_alloc(h, size);
    return created_or_oom(p);
}

void *API(heap_malloc)(shard_heap *sh, size_t size)
{
    if (unlikely(sh == NULL))
        return API(malloc)(size);
    heap *h = created_heap_of(sh);
    if (likely(size <= SHARD_DIRECT_MAX)) {
        page *pg = h->direct[(size + 15) >> 4];
        if (likely(page_ready(pg)))
            return page_pop(pg);
    }
    return created_malloc_slow(h, size);
}

void *API(heap_calloc)(shard_heap *sh, size_t count, size_t size)
{
    size_t total;
    if (__builtin_mul_overflow(count, size, &total))
        return created_or_oom(NULL);
    if (sh == NULL)
        return API(calloc)(count, size);
    heap *h = created_heap_of(sh);
    if (total > SHARD_MEDIUM_MAX) { /* fresh or cleared by large.c */
        void *p = large_alloc_in(h, total, 16, 1);
        for (int ask = 0; p == NULL && ask < 2 && created_relieve(h, total, ask); ask++)
            p = large_alloc_in(h, total, 16, 1);
        return created_or_oom(p);
    }
    void *p = API(heap_malloc)(sh, total);
    if (p != NULL)
        mem_zero_block(p, total);
    return p;
}

static void *created_aligned(heap *h, size_t size, size_t align)
{
    if (size <= SHARD_SMALL_MAX && align <= SHARD_SMALL_MAX) {
        unsigned cls = class_by_size16[((size > align ? size : align) + 15) >> 4];
        while (class_size[cls] % align != 0)
            cls++;
        return created_alloc(h, class_size[cls]);
    }
    if (size <= SHARD_MEDIUM_MAX && align <= SHARD_MEDIUM_ALIGN_MAX)
        return medium_alloc_aligned(h, size, align);
    return large_alloc_in(h, size, align, 0);
}

void *API(heap_malloc_aligned)(shard_heap *sh, size_t size, size_t align)
{
    if (align == 0 || (align & (align - 1)) != 0)
        return NULL;
    if (align <= 16)
        return API(heap_malloc)(sh, size);
    if (sh == NULL)
        return API(malloc_aligned)(size, align);
    heap *h = created_heap_of(sh);
    void *p = created_aligned(h, size, align);
    for (int ask = 0; p == NULL && ask < 2 && created_relieve(h, size, ask); ask++)
        p = created_aligned(h, size, align);
    return created_or_oom(p);
}

/* ---- free and realloc ------------------------------------------------------------------------------ */

static inline int created_owns_small(const heap *h, const void *p)
{
    return h->own[(uint32_t)(uintptr_t)p >> SEGMENT_SHIFT] == ((uintptr_t)p & ~(uintptr_t)SEGMENT_MASK);
}

/* The same past the table: a small segment of h that the table does not hold (its entry taken, or entry
 * 0: heap.h) is known by its owner. For the slow paths; p is not NULL. */
static inline int created_small_past_table(const heap *h, const void *p, unsigned kind)
{
    return kind == SEG_SMALL && load_relaxed(&segment_of(p)->owner) == h;
}

void API(heap_free)(shard_heap *sh, void *p)
{
    if (unlikely(sh == NULL)) {
        API(free)(p);
        return;
    }
    heap *h = created_heap_of(sh);
    if (likely(created_owns_small(h, p))) {
        page *pg = page_of(p);
        block *b = p;
        if (likely(page_has_item(pg, b)) && likely(small_free_fast(pg, b))) /* as the thread heap's (api.c) */
            return;
        small_free_local_slow(h, pg, b);
        return;
    }
    unsigned kind = p != NULL ? segmap_kind((uintptr_t)p) : SEG_NONE;
    if (created_small_past_table(h, p, kind)) {
        small_free_local_slow(h, page_of(p), p); /* tests the item */
        return;
    }
    if (kind == SEG_MEDIUM && segment_of(p)->owner == h) {
        medium_free_local(h, p);
        return;
    }
    API(free)(p); /* a large block, another heap's, or not a block (the error hook) */
}

/* Whether p, a live block, may stay for size bytes without a move: in its class (and not below a quarter
 * of it) for a small block of h, in place for a medium block of h or any large block. p, or NULL. */
static void *created_resize_here(heap *h, void *p, size_t size, size_t old)
{
    unsigned kind = segmap_kind((uintptr_t)p);
    if (created_small_past_table(h, p, kind))
        return size <= old && size >= old / 4 ? p : NULL;
    if (kind == SEG_MEDIUM && segment_of(p)->owner == h && size > SHARD_SMALL_MAX && size <= SHARD_MEDIUM_MAX)
        return medium_resize_in_place(h, p, size);
    if ((kind == SEG_LARGE || kind == SEG_LARGE_FAR) && size > SHARD_MEDIUM_MAX)
        return large_resize_in_place(p, size);
    return NULL;
}

void *API(heap_realloc)(shard_heap *sh, void *p, size_t size)
{
    if (unlikely(sh == NULL))
        return API(realloc)(p, size);
    heap *h = created_heap_of(sh);
    if (likely(created_owns_small(h, p))) { /* the thread heap's realloc fast path (fast.h), for this heap */
        const page *pg = page_of(p);
        if (likely(page_has_item(pg, p) && size <= pg->block_size && size >= pg->block_size / 4 && size != 0) &&
            likely(!small_looks_free(pg, p)))
            return p;
    }
    if (p == NULL)
        return API(heap_malloc)(sh, size);
    size_t old = api_usable_or_report(p, SHARD_ERROR_INVALID_REALLOC);
    if (old == 0)
        return NULL; /* not a live block: reported, nothing changes */
    if (size == 0) {
        API(heap_free)(sh, p);
        return NULL;
    }
    void *q = created_resize_here(h, p, size, old);
    if (q != NULL)
        return q;
    size_t target = size;
    if (size > old) /* headroom, as shard_realloc gives (api.c says why) */
        target = size > SHARD_MEDIUM_MAX ? size + size / 16 : size <= SHARD_SMALL_MAX ? old + old / 2 + 32 : old + old / 4;
    if (target < size || (size <= SHARD_SMALL_MAX && target > SHARD_SMALL_MAX) ||
        (size <= SHARD_MEDIUM_MAX && size > SHARD_SMALL_MAX && target > SHARD_MEDIUM_MAX))
        target = size;
    unsigned kind = segmap_kind((uintptr_t)p);
    if (size > SHARD_MEDIUM_MAX && (kind == SEG_LARGE || kind == SEG_LARGE_FAR) && large_owner_is(p, h) &&
        (q = large_move(p, target)) != NULL)
        return q; /* its pages handed over (Linux), still the heap's */
    q = API(heap_malloc)(sh, target);
    if (q == NULL && target != size)
        q = API(heap_malloc)(sh, size);
    if (q == NULL)
        return NULL;
    mem_copy_block(q, p, old < size ? old : size);
    API(heap_free)(sh, p);
    return q;
}
