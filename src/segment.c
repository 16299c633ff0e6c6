/* segment.c - segments, the segment map, the platform's calls with their accounting, limit, refusals
 * told (SHARDMM_VERBOSE) and absent capabilities, and the metadata allocator (see segment.h). */
#include "segment.h"

#include "../port/port.h"
#include "libc.h"
#include "options.h"

uintptr_t segmap_top[(size_t)1 << SEGMAP_TOP_BITS];
const uint8_t segmap_zero_leaf[SEGMAP_LEAF_BYTES];

static os_totals totals; /* changed with atomics: one per OS call, never on a fast path */

/* The OS hands addresses out again only after they were released (the kernel maps and unmaps under one
 * lock of the address space; Windows likewise): whatever a thread did to a range before giving it back
 * comes before what the next thread to get those addresses does. ThreadSanitizer does not see the
 * port's system calls, so it is told: a release of this before every release of a range, an acquire
 * after every reservation. Without it, a large block's new header written where a block just released
 * by another thread had its own looks like a race. */
static char address_space_order;

#if SHARD_COUNTERS
uint64_t sync_atomic_ops, sync_lock_acquisitions; /* sync.h */
#endif

static void count_call(void) { fetch_add_relaxed(&totals.calls, 1); }

/* The committed total has become `now`: the peak follows. */
static void count_peak(size_t now)
{
    size_t peak = load_relaxed(&totals.committed_peak);
    while (now > peak && !counted(__atomic_compare_exchange_n(&totals.committed_peak, &peak, now, true,
                                                              __ATOMIC_RELAXED, __ATOMIC_RELAXED))) {
    }
}

/* The accounting of a reservation the platform made (p: port_reserve's, or the large-page kind's) or
 * refused (NULL). */
static void *reserve_counted(void *p, size_t size)
{
    count_call();
    if (p) {
        tsan_acquire(&address_space_order);
        fetch_add_relaxed(&totals.reserved, size);
    } else if (options_values.verbose) {
        options_say_refused("reserve", size);
    }
    return p;
}

void *os_reserve(size_t size, size_t align) { return reserve_counted(port_reserve(size, align), size); }

void *os_reserve_block(size_t size, size_t align)
{
    void *p = port_caps.reserve_pooled != NULL ? port_caps.reserve_pooled(size, align) : NULL;
    return p != NULL ? reserve_counted(p, size) : os_reserve(size, align);
}

static size_t commit_limit = SIZE_MAX; /* shard_set_limit */

size_t os_set_limit(size_t bytes) { return __atomic_exchange_n(&commit_limit, bytes, __ATOMIC_RELAXED); }

/* os_commit, with the platform asked (`ask`) or the memory committed already (segment_commit). */
static int commit_counted(void *addr, size_t size, int ask)
{
    if (ask)
        count_call();
    /* The bytes are counted before the platform is asked, so that threads committing at the same time
     * cannot pass the limit together; a refusal takes them back. */
    size_t limit = load_relaxed(&commit_limit);
    if (limit != SIZE_MAX) {
        size_t now = counted(__atomic_add_fetch(&totals.committed, size, __ATOMIC_RELAXED));
        int past = now > limit;
        if (past || (ask && port_commit(addr, size) != 0)) {
            fetch_add_relaxed(&totals.committed, -size);
            if (options_values.verbose)
                past ? options_say_limit(size, limit) : options_say_refused("commit", size);
            return -1;
        }
        count_peak(now);
        return 0;
    }
    if (ask && port_commit(addr, size) != 0) {
        if (options_values.verbose)
            options_say_refused("commit", size);
        return -1;
    }
    count_peak(counted(__atomic_add_fetch(&totals.committed, size, __ATOMIC_RELAXED)));
    return 0;
}

int os_commit(void *addr, size_t size) { return commit_counted(addr, size, 1); }

int segment_commit(const segment *seg, void *addr, size_t size)
{
    return commit_counted(addr, size, !seg->committed_whole);
}

int os_decommit(void *addr, size_t size)
{
    count_call();
    if (port_decommit(addr, size) != 0)
        return -1;
    fetch_add_relaxed(&totals.committed, -size);
    return 0;
}

int os_release(void *addr, size_t size, size_t committed)
{
    count_call();
    tsan_release(&address_space_order);
    if (port_release(addr, size) != 0)
        return -1;
    fetch_add_relaxed(&totals.reserved, -size);
    fetch_add_relaxed(&totals.committed, -committed);
    return 0;
}

int os_can_move(void) { return port_caps.move_release != NULL; }
int os_can_release_part(void) { return (port_caps.flags & PORT_RELEASE_PARTS) != 0; }
int os_has_large_pages(void) { return port_caps.hint_large_pages != NULL; }

int os_move_release(void *reservation, size_t reservation_size, void *from, size_t size, void *to, size_t dropped)
{
    if (port_caps.move_release == NULL)
        return -1;
    count_call();
    tsan_release(&address_space_order);
    if (port_caps.move_release(reservation, reservation_size, from, size, to) != 0)
        return -1;
    fetch_add_relaxed(&totals.reserved, -reservation_size);
    fetch_add_relaxed(&totals.committed, -dropped);
    return 0;
}

void os_hint_large_pages(void *addr, size_t size)
{
    if (port_caps.hint_large_pages != NULL)
        port_caps.hint_large_pages(addr, size);
}

size_t os_resident_pages(void *addr, size_t size)
{
    return port_caps.resident_pages != NULL ? port_caps.resident_pages(addr, size) : SIZE_MAX;
}

int os_counts_resident(void) { return port_caps.resident_pages != NULL; }

size_t os_address_space_limit(void)
{
    return port_caps.address_space_limit != NULL ? port_caps.address_space_limit() : SIZE_MAX;
}

static uint64_t clock_reads; /* the clock of a platform without one */

uint64_t os_clock_ms(void)
{
    if (port_caps.clock_ms != NULL)
        return port_caps.clock_ms();
    return fetch_add_relaxed(&clock_reads, 1) + 1;
}

uint32_t os_thread_id(void) { return port_caps.thread_id != NULL ? port_caps.thread_id() : 1; }

int os_thread_alive(uint32_t id) { return port_caps.thread_alive != NULL ? port_caps.thread_alive(id) : 1; }

uintptr_t os_thread_tag(void) { return port_caps.thread_tag != NULL ? port_caps.thread_tag() : 1; }

int os_fence_all_threads(void) { return port_caps.fence_all_threads != NULL ? port_caps.fence_all_threads() : -1; }

void os_out_of_memory(void)
{
    if (port_caps.out_of_memory != NULL)
        port_caps.out_of_memory();
}

void os_invalid_argument(void)
{
    if (port_caps.invalid_argument != NULL)
        port_caps.invalid_argument();
}

void os_get_totals(os_totals *out)
{
    out->reserved = load_relaxed(&totals.reserved);
    out->committed = load_relaxed(&totals.committed);
    out->committed_peak = load_relaxed(&totals.committed_peak);
    out->calls = load_relaxed(&totals.calls);
}

/* The metadata allocator: a bump pointer through 4 MB reservations committed 64 KB at a time, under a
 * spin lock (it runs when a thread creates its heap or a new 4 GB range is first mapped); while a fork
 * holds the lock, another thread's block gets a reservation of its own. */
#define META_RESERVE ((size_t)4 << 20)
#define META_COMMIT ((size_t)64 << 10)

static struct {
    spinlock lock;
    uint8_t *cursor, *committed_end, *reserved_end;
} meta;

void meta_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&meta.lock);
    else
        spin_unlock_for_fork(&meta.lock);
}

/* meta_alloc while a fork holds the lock: a reservation of the block's own (rare, and never freed). */
static void *meta_alloc_alone(size_t size)
{
    uint8_t *r = os_reserve(META_COMMIT, PORT_RESERVE_ALIGN);
    if (r != NULL && os_commit(r, (size + PORT_PAGE - 1) & ~(PORT_PAGE - 1)) != 0) {
        os_release(r, META_COMMIT, 0);
        r = NULL;
    }
    return r;
}

void *meta_alloc(size_t size)
{
    size = (size + 63) & ~(size_t)63;
    shard_assert(size <= META_COMMIT, "metadata blocks are small");
    void *result = NULL;
    if (!spin_lock_unless_fork(&meta.lock))
        return meta_alloc_alone(size);
    if (meta.cursor == NULL || (size_t)(meta.reserved_end - meta.cursor) < size) {
        uint8_t *r = os_reserve(META_RESERVE, PORT_RESERVE_ALIGN);
        if (r == NULL)
            goto out;
        meta.cursor = meta.committed_end = r;
        meta.reserved_end = r + META_RESERVE;
    }
    while ((size_t)(meta.committed_end - meta.cursor) < size) {
        if (os_commit(meta.committed_end, META_COMMIT) != 0)
            goto out;
        meta.committed_end += META_COMMIT;
    }
    result = meta.cursor;
    meta.cursor += size;
out:
    spin_unlock(&meta.lock);
    return result;
}

int segmap_set(uintptr_t start, size_t size, unsigned first, unsigned rest)
{
    shard_assert((start & SEGMENT_MASK) == 0 && (size & SEGMENT_MASK) == 0 && size > 0, "4 MB granules");
    for (uintptr_t a = start; a < start + size; a += SEGMENT_SIZE) {
        uintptr_t hi = a >> 32;
        if (hi >= ((uintptr_t)1 << SEGMAP_TOP_BITS))
            return -1;
        uintptr_t distance = load_acquire(&segmap_top[hi]);
        if (distance == 0) {
            uint8_t *fresh = meta_alloc(SEGMAP_LEAF_BYTES);
            if (fresh == NULL)
                return -1;
            /* Two threads may race for the same 4 GB; the loser's table is left unused. */
            uintptr_t expected = 0, mine = (uintptr_t)fresh - (uintptr_t)segmap_zero_leaf;
            distance = cas_acq_rel(&segmap_top[hi], &expected, mine) ? mine : expected;
        }
        uint8_t *leaf = (uint8_t *)((uintptr_t)segmap_zero_leaf + distance);
        store_release(&leaf[(a >> SEGMENT_SHIFT) & (SEGMAP_LEAF_BYTES - 1)], (uint8_t)(a == start ? first : rest));
    }
    return 0;
}

/* ---- secrets (hardened build) ----------------------------------------------------------------------- */

/* splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014) over one
 * state word, advanced by an atomic add so that threads never draw the same value. */
static uint64_t secret_state;
uint64_t secret_process;

static uint64_t secret_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t secret_new(void)
{
    if (load_relaxed(&secret_state) == 0) {
        uint64_t local = 0, seed = __builtin_ia32_rdtsc() ^ ((uint64_t)(uintptr_t)&local << 16) ^
                                   (uint64_t)(uintptr_t)&secret_state ^ (os_clock_ms() << 40);
        uint64_t expected = 0;
        seed = secret_mix(seed) | 1;
        __atomic_compare_exchange_n(&secret_state, &expected, seed, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
    uint64_t z = secret_mix(__atomic_add_fetch(&secret_state, 0x9e3779b97f4a7c15ull, __ATOMIC_RELAXED));
    uint64_t top = z >> 48;
    if (top == 0 || top == 0xffff)
        z ^= (uint64_t)0x5a5a << 48;
    return z;
}

uint64_t secret_of_process(void)
{
    uint64_t s = load_relaxed(&secret_process);
    if (likely(s != 0))
        return s;
    uint64_t expected = 0, fresh = secret_new();
    __atomic_compare_exchange_n(&secret_process, &expected, fresh, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return load_relaxed(&secret_process);
}

size_t segment_large_from(int first, uint32_t created)
{
    if (port_caps.reserve_large_pages == NULL || load_relaxed(&commit_limit) != SIZE_MAX)
        return SEGMENT_LARGE_NONE;
    if (options_values.huge_pages == SHARD_HUGE_PAGES_ALL)
        return 0;
    if (options_values.huge_pages == SHARD_HUGE_PAGES_GROWN && !created)
        return !first ? 0 : port_caps.collapse_large_pages != NULL ? SEGMENT_SIZE : SEGMENT_LARGE_UNIT;
    return SEGMENT_LARGE_NONE;
}

/* What a spared unit of a segment of `kind` takes before it goes on large pages: for small pages the OS
 * pages carved there, for an arena the commits of 64 KB (segment.h). */
static uint32_t spared_full(unsigned kind)
{
    return kind == SEG_SMALL ? (uint32_t)(SHARD_SPARED_SMALL / PORT_PAGE) : SHARD_SPARED_MEDIUM;
}

/* spared_left[1] of a segment whose lower unit went on large pages before its upper one was used, or
 * whose heap is well into the other kind (segment_spared_upper_early): the upper one is hinted at its
 * first commit, before anything there is touched (segment.h). */
#define SPARED_HINT 0xffffu

/* seg's upper unit (of `kind`) waits for its hint if nothing there counts yet and the platform hints. */
static void spared_upper_hint(segment *seg, unsigned kind)
{
    if (seg->spared_left[1] == spared_full(kind) && port_caps.hint_large_pages != NULL)
        seg->spared_left[1] = SPARED_HINT;
}

/* Whether seg's unit u still counts towards its large pages: neither gone nor waiting for its hint. */
static int spared_counting(const segment *seg, unsigned u)
{
    return seg->spared_left[u] != 0 && seg->spared_left[u] != SPARED_HINT;
}

/* seg's spared unit u onto large pages now, if the platform finds that worth it (segment.h). */
static void spared_collapse(segment *seg, unsigned kind, unsigned u)
{
    seg->spared_left[u] = 0;
    count_call();
    int large = port_caps.collapse_large_pages((uint8_t *)seg + u * SEGMENT_LARGE_UNIT, SEGMENT_LARGE_UNIT);
    if (large && u == 0)
        spared_upper_hint(seg, kind);
}

/* count more of what unit u of seg (of `kind`), still spared and not waiting for its hint, takes before it
 * goes on large pages: 1 when that made it go. */
static int spared_take(segment *seg, unsigned kind, unsigned u, size_t count)
{
    if (seg->spared_left[u] > count) {
        seg->spared_left[u] = (uint16_t)(seg->spared_left[u] - count);
        return 0;
    }
    spared_collapse(seg, kind, u);
    return 1;
}

int segment_spared_commit(segment *seg, unsigned kind, size_t from, size_t to)
{
    int filled = 0;
    for (unsigned u = 0; u < 2; u++) {
        size_t lo = u * SEGMENT_LARGE_UNIT, hi = lo + SEGMENT_LARGE_UNIT;
        size_t a = from > lo ? from : lo, b = to < hi ? to : hi;
        if (seg->spared_left[u] == 0 || a >= b)
            continue;
        if (seg->spared_left[u] == SPARED_HINT) {
            seg->spared_left[u] = 0;
            count_call();
            port_caps.hint_large_pages((uint8_t *)seg + lo, SEGMENT_LARGE_UNIT);
        } else if (kind != SEG_SMALL) {
            filled |= spared_take(seg, kind, u, (b - a) / PAGE_SIZE);
        }
    }
    return filled;
}

int segment_populate(segment *seg, void *p, size_t size)
{
    if (port_caps.populate == NULL || !spared_counting(seg, (uintptr_t)p - (uintptr_t)seg >= SEGMENT_LARGE_UNIT))
        return 0;
    count_call();
    port_caps.populate(p, size);
    return 1;
}

int segment_spared_touch(segment *seg, size_t at, size_t pages)
{
    unsigned u = at >= SEGMENT_LARGE_UNIT;
    return spared_counting(seg, u) ? spared_take(seg, SEG_SMALL, u, pages) : 0;
}

/* Each unit of seg (of `kind`) still counting that has gone `least` of the way or more, onto large pages
 * now: 1 when one went. */
static int spared_collapse_used(segment *seg, unsigned kind, uint32_t least)
{
    uint32_t all = spared_full(kind);
    int went = 0;
    for (unsigned u = 0; u < 2; u++)
        if (spared_counting(seg, u) && all - seg->spared_left[u] >= least) {
            spared_collapse(seg, kind, u);
            went = 1;
        }
    return went;
}

int segment_spared_outgrown(segment *seg, unsigned kind) { return spared_collapse_used(seg, kind, 0); }

/* A quarter of the way through a spared unit of `kind` (segment_spared_grown, segment_spared_along). */
static uint32_t spared_quarter(unsigned kind) { return (spared_full(kind) + 3) / 4; }

void segment_spared_grown(segment *seg, unsigned kind) { spared_collapse_used(seg, kind, spared_quarter(kind)); }

int segment_spared_along(const segment *seg, unsigned kind)
{
    return !spared_counting(seg, 0) || spared_full(kind) - seg->spared_left[0] >= spared_quarter(kind);
}

void segment_spared_upper_early(segment *seg, unsigned kind) { spared_upper_hint(seg, kind); }

segment *segment_create(struct heap *owner, unsigned kind, size_t commit, size_t large_from)
{
    void *r = large_from != SEGMENT_LARGE_NONE ? port_caps.reserve_large_pages(SEGMENT_SIZE, SEGMENT_SIZE, large_from)
                                               : NULL;
    if (r == NULL)
        large_from = SEGMENT_LARGE_NONE; /* none now (port.h): a plain reservation, on small pages */
    segment *seg = r != NULL ? reserve_counted(r, SEGMENT_SIZE) : os_reserve(SEGMENT_SIZE, SEGMENT_SIZE);
    if (seg == NULL)
        return NULL;
    int whole = large_from != SEGMENT_LARGE_NONE && (port_caps.flags & PORT_LARGE_RESERVE_COMMITTED) != 0;
    if (commit_counted(seg, commit, !whole) != 0) {
        os_release(seg, SEGMENT_SIZE, 0);
        return NULL;
    }
    seg->owner = owner;
    seg->committed_whole = (uint32_t)whole;
    for (unsigned u = 0; u < 2; u++) /* the units below large_from, on small pages for now */
        if (large_from != SEGMENT_LARGE_NONE && large_from >= (u + 1) * SEGMENT_LARGE_UNIT &&
            port_caps.collapse_large_pages != NULL)
            seg->spared_left[u] = (uint16_t)spared_full(kind);
#if SHARD_HARDENED
    seg->secret = secret_new();
#endif
    if (segmap_set((uintptr_t)seg, SEGMENT_SIZE, kind, kind) != 0) {
        os_release(seg, SEGMENT_SIZE, commit);
        return NULL;
    }
    return seg;
}

/* Segments given up while a walk was going on, linked by next_released; and the walks going on. A walk
 * counts itself in before it reads a list; a release takes the segment out of its list, then looks at
 * the count: 0 means no walk can hold it (a walk that counts itself in later finds it unlinked), so it
 * goes at once. Otherwise it waits in `released`, and whoever finds the count 0 afterwards releases the
 * waiting ones, after taking the whole list and checking the count once more (a walk may have begun
 * between the count and the taking, but only after the segments it holds were unlinked). */
static uint32_t walkers;
static segment *released;

static void release_now(segment *seg)
{
    if (os_release(seg, SEGMENT_SIZE, seg->released_committed) != 0)
        report_error("the OS refused to release a segment at", (uintptr_t)seg);
}

static void push_released(segment *list)
{
    while (list != NULL) {
        segment *next = list->next_released, *head = load_relaxed(&released);
        do {
            list->next_released = head;
        } while (!cas_release(&released, &head, list));
        list = next;
    }
}

static void release_waiting(void)
{
    if (load_relaxed(&released) == NULL)
        return;
    segment *list = exchange_acq_rel(&released, NULL);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (load_relaxed(&walkers) != 0) { /* a walk began meanwhile: the list waits for its end */
        push_released(list);
        return;
    }
    while (list != NULL) {
        segment *next = list->next_released;
        release_now(list);
        list = next;
    }
}

void segment_release(segment *seg, size_t committed)
{
    segmap_set((uintptr_t)seg, SEGMENT_SIZE, SEG_NONE, SEG_NONE); /* its tables exist: this cannot fail */
    seg->released_committed = committed;
    seg->next_released = NULL;
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* the caller's unlinking, then the count */
    if (load_relaxed(&walkers) == 0) {
        release_now(seg);
    } else {
        push_released(seg);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (load_relaxed(&walkers) != 0)
            return;
    }
    release_waiting();
}

void segment_walk_begin(void) { (void)counted(__atomic_fetch_add(&walkers, 1u, __ATOMIC_SEQ_CST)); }

void segment_walk_end(void)
{
    if (counted(__atomic_sub_fetch(&walkers, 1u, __ATOMIC_SEQ_CST)) == 0)
        release_waiting();
}

void segment_after_fork(void) { store_relaxed(&walkers, 0u); }

void spin_wait_yield(void)
{
    if (port_caps.yield != NULL)
        port_caps.yield();
}

/* ---- spare segments (segment.h) -------------------------------------------------------------------- */

static struct {
    spinlock lock;
    unsigned count;           /* entries in use: 0..count-1, oldest first */
    size_t bytes;             /* committed in them (statistics) */
    struct spare {
        segment *seg;
        size_t committed;
        uint64_t at;          /* os_clock_ms() when put */
        unsigned kind;
    } entries[SHARD_SPARE_SEGMENTS + 1]; /* + 1: no zero-length array when the pool is off */
} spare;

int segment_spare_put(segment *seg, unsigned kind, size_t committed)
{
    if (SHARD_SPARE_SEGMENTS == 0 || !spin_lock_unless_fork(&spare.lock))
        return 0;
    int taken = spare.count < SHARD_SPARE_SEGMENTS;
    if (taken) {
        store_release(&seg->owner, (struct heap *)NULL); /* a stray free finds no owner */
        spare.entries[spare.count] = (struct spare){seg, committed, os_clock_ms(), kind};
        store_relaxed(&spare.count, spare.count + 1);
        store_relaxed(&spare.bytes, spare.bytes + committed);
    }
    spin_unlock(&spare.lock);
    return taken;
}

segment *segment_spare_take(unsigned kind, size_t least, size_t *committed)
{
    if (SHARD_SPARE_SEGMENTS == 0 || load_relaxed(&spare.count) == 0 || !spin_lock_unless_fork(&spare.lock))
        return NULL;
    segment *seg = NULL;
    for (unsigned i = spare.count; i-- > 0;) {
        if (spare.entries[i].kind != kind || spare.entries[i].committed < least)
            continue;
        seg = spare.entries[i].seg;
        *committed = spare.entries[i].committed;
        store_relaxed(&spare.bytes, spare.bytes - *committed);
        for (; i + 1 < spare.count; i++) /* the order stays oldest first */
            spare.entries[i] = spare.entries[i + 1];
        store_relaxed(&spare.count, spare.count - 1);
        break;
    }
    spin_unlock(&spare.lock);
    return seg;
}

uint64_t segment_spare_expire(uint64_t now, uint32_t delay)
{
    if (SHARD_SPARE_SEGMENTS == 0 || load_relaxed(&spare.count) == 0 || !spin_lock_unless_fork(&spare.lock))
        return 0;
    unsigned gone = 0;
    while (gone < spare.count && (now == UINT64_MAX || now - spare.entries[gone].at >= delay)) {
        struct spare *e = &spare.entries[gone++];
        store_relaxed(&spare.bytes, spare.bytes - e->committed);
        segment_release(e->seg, e->committed); /* after any walk that still holds it (above) */
    }
    for (unsigned i = gone; i < spare.count; i++)
        spare.entries[i - gone] = spare.entries[i];
    store_relaxed(&spare.count, spare.count - gone);
    uint64_t due = spare.count != 0 ? spare.entries[0].at + delay : 0;
    spin_unlock(&spare.lock);
    return due;
}

void segment_spare_counts(size_t *segments, size_t *bytes)
{
    *segments = load_relaxed(&spare.count);
    *bytes = load_relaxed(&spare.bytes);
}

void segment_spare_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&spare.lock);
    else
        spin_unlock_for_fork(&spare.lock);
}
