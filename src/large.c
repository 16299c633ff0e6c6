/* large.c - blocks above 1 MB: one reservation each, with address headroom, and a cache of freed
 * blocks shared by the process (the seed's "Large blocks").
 *
 * A block is one reservation. Its start is aligned to 4 MB so that the segment map can mark it
 * (SEG_LARGE, one entry: the rest of the reservation stays SEG_NONE, so an address in it is not a
 * block); a 32-byte header at the start, the block after it:
 *
 *   start + 0     mark | size | committed | span+offset+slack       header, 32 bytes
 *   start + 32    the block: `size` usable bytes (start + align for an aligned block, below)
 *   ...           committed up to start + committed, then address space only up to start + span
 *
 * The span is the request's size again as headroom (at most 1 GB of it) and never less than 16 MB in
 * all; the reservation is the span plus 4 MB of slack for the alignment. Growing within the committed
 * part changes `size`; within the span it commits pages in place; beyond it the block moves (api.c
 * asks for 1/16 of headroom), so a buffer that keeps growing moves no more often than it doubles. On
 * Linux a move hands the pages over to the new reservation without copying them (port_move_release);
 * Windows has no such call and copies. Shrinking to less than half of what is committed gives the tail
 * back at once; shrinking by less leaves it.
 *
 * An aligned block (shard_malloc_aligned, align 64 B .. 2 MB) starts at start + align instead of
 * start + 32: the header keeps log2 of the block's offset, and everything from the header up to the
 * block's end is committed as for any block (up to 2 MB - 32 bytes of it unused).
 * The header's mark is LIVE while the block is live and FREED while it waits in the cache. A pointer is
 * a live block exactly when it is 32 bytes into a SEG_LARGE entry of the map and the mark there is LIVE;
 * free changes the mark with a CAS, so of two frees of one block only one gets past it, and the other
 * (like any address that is not a live block) goes to the error hook without touching the cache.
 *
 * The cache: up to SHARD_LARGE_CACHE_BLOCKS blocks and SHARD_LARGE_CACHE_BYTES committed, oldest first,
 * under a spin lock of its own (pause, then yield: sync.h). Only the choice and the reordering happen
 * under the lock; the OS calls (commit, decommit, release) come after it. A block is shared by the
 * process because large buffers are often allocated by one thread and freed by another.
 * - Choice: among the blocks whose span fits the request, the smallest of those committed enough; else
 *   the one with the most committed memory, which commits the rest in place. Memory committed beyond
 *   the request stays with the block for growth unless it is both more than four times the request
 *   and more than 16 MB.
 * - Back to the OS: a block cached for SHARD_LARGE_CACHE_DELAY_MS, the oldest ones when slots or bytes
 *   run out, and a block committed above SHARD_LARGE_CACHE_BYTES at once, without entering. The age is
 *   checked on every cache access and, through large_cache_expire (one load when the cache is empty),
 *   when a small page becomes free and when a thread exits.
 *
 * Depends on: segment.h (OS calls with accounting, the map), sync.h, config.h, libc.h.
 */
#include "large.h"

#include "../port/port.h"
#include "config.h"
#include "libc.h"
#include "medium.h"
#include "segment.h"

#define LARGE_HEADER ((size_t)32)
#define LARGE_MARK_LIVE 0x4b4c42454752414cull  /* "LARGEBLK" */
#define LARGE_MARK_FREED 0x4b4c424445455246ull /* "FREEDBLK" */
#define LARGE_SIZE_MAX ((size_t)1 << 46)       /* beyond any address space we can map; no sum below wraps */
#define MB ((size_t)1 << 20)

typedef struct large_header {
    uint64_t mark;
    size_t size;       /* usable bytes after the header: the last request, rounded up to the page */
    size_t committed;  /* bytes committed from the header on, a multiple of PORT_PAGE */
    size_t span_slack; /* span (a multiple of 4 MB) | log2(block offset) << 10 | (start - reservation) / PORT_PAGE */
} large_header;
_Static_assert(sizeof(large_header) == LARGE_HEADER, "the block follows a 32-byte header");

#define SLACK_BITS 10 /* (start - reservation) / PORT_PAGE < SEGMENT_SIZE / PORT_PAGE = 1024 */
#define OFFSET_SHIFT SLACK_BITS
_Static_assert(SEGMENT_SIZE / PORT_PAGE <= (1u << SLACK_BITS) && OFFSET_SHIFT + 5 <= SEGMENT_SHIFT,
               "slack and offset fit below the span's bits");

static size_t span_of(const large_header *h) { return h->span_slack & ~(size_t)SEGMENT_MASK; }
static uint8_t *reservation_of(const large_header *h)
{
    return (uint8_t *)h - (h->span_slack & ((1u << SLACK_BITS) - 1)) * PORT_PAGE;
}
/* Where the block starts, from the header: 32, or the alignment of an aligned block. */
static size_t offset_of(const large_header *h) { return (size_t)1 << ((h->span_slack >> OFFSET_SHIFT) & 31); }
static uint8_t *block_of(large_header *h) { return (uint8_t *)h + offset_of(h); }
static size_t span_slack_of(size_t span, size_t offset, const large_header *h, const uint8_t *r)
{
    return span | (size_t)__builtin_ctzll(offset) << OFFSET_SHIFT | (size_t)((const uint8_t *)h - r) / PORT_PAGE;
}
/* What port_reserve took for a span: the span and the slack that aligns it. */
static size_t reserved_for(size_t span) { return span + SEGMENT_SIZE; }

static size_t round_up(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }
/* The bytes from the header to the block's end, whole pages. */
static size_t need_of(size_t size, size_t offset) { return round_up(size + offset, PORT_PAGE); }

static size_t span_for(size_t need)
{
    size_t headroom = need < SHARD_LARGE_HEADROOM_MAX ? need : SHARD_LARGE_HEADROOM_MAX;
    size_t span = need + headroom < SHARD_LARGE_SPAN_MIN ? SHARD_LARGE_SPAN_MIN : need + headroom;
    return round_up(span, SEGMENT_SIZE);
}

static size_t live_blocks; /* atomic: large blocks have no owner to count them */

/* ---- reservations ---------------------------------------------------------------------------------- */

/* A new reservation for a block of `need` bytes, header included, with [commit_from, need) committed
 * and its map entry set to kind; *reservation receives what port_reserve gave. With commit_from 0 the header's
 * fields but the mark are filled (otherwise the header page is not committed: a move brings it). NULL
 * out of memory. */
static large_header *reserve_block(size_t need, size_t offset, size_t commit_from, unsigned kind, uint8_t **reservation)
{
    size_t span = span_for(need);
    uint8_t *r = os_reserve(reserved_for(span));
    *reservation = r;
    if (r == NULL)
        return NULL;
    large_header *h = (large_header *)round_up((uintptr_t)r, SEGMENT_SIZE);
    if (SHARD_LARGE_PAGES)
        port_hint_large_pages(h, span);
    if (need > commit_from && os_commit((uint8_t *)h + commit_from, need - commit_from) != 0) {
        os_release(r, reserved_for(span), 0);
        return NULL;
    }
    if (segmap_set((uintptr_t)h, SEGMENT_SIZE, kind, kind) != 0) {
        os_release(r, reserved_for(span), need - commit_from);
        return NULL;
    }
    if (commit_from == 0) {
        h->size = need - offset;
        h->committed = need;
        h->span_slack = span_slack_of(span, offset, h, r);
    }
    return h;
}

static void release_block(large_header *h)
{
    size_t span = span_of(h), committed = h->committed;
    uint8_t *r = reservation_of(h);
    segmap_set((uintptr_t)h, SEGMENT_SIZE, SEG_NONE, SEG_NONE);
    if (os_release(r, reserved_for(span), committed) != 0)
        report_error("large block: the OS refused to release a reservation at", (uintptr_t)r);
}

/* ---- the cache ------------------------------------------------------------------------------------- */

typedef struct cached {
    large_header *h;
    size_t committed, span;
    uint64_t freed_at;
} cached;

static struct {
    spinlock lock;
    unsigned count;     /* entries, oldest first */
    size_t bytes;       /* their committed memory */
    uint64_t oldest_at; /* freed_at of the first entry, UINT64_MAX when empty: read without the lock */
    cached entry[SHARD_LARGE_CACHE_BLOCKS];
} cache = {.oldest_at = UINT64_MAX};

/* Under the lock: remove n entries from index at on, keeping the order of the rest. */
static void remove_entries(unsigned at, unsigned n)
{
    for (unsigned i = at; i < at + n; i++)
        cache.bytes -= cache.entry[i].committed;
    for (unsigned i = at; i + n < cache.count; i++)
        cache.entry[i] = cache.entry[i + n];
    cache.count -= n;
}

/* Under the lock: move the first n entries to out (the caller releases them after unlocking). */
static unsigned take_oldest(unsigned n, large_header **out)
{
    for (unsigned i = 0; i < n; i++)
        out[i] = cache.entry[i].h;
    remove_entries(0, n);
    return n;
}

/* Whether a block freed at `then` has waited the delay. Signed: another thread may have read a later
 * time than `now` before it stamped its entry. */
static int expired(uint64_t then, uint64_t now) { return (int64_t)(now - then) >= SHARD_LARGE_CACHE_DELAY_MS; }

/* Under the lock: how many of the first entries have waited the delay. The clock is read under the
 * lock too, so that the entries stay in the order of their times. */
static unsigned expired_count(uint64_t now)
{
    unsigned n = 0;
    while (n < cache.count && expired(cache.entry[n].freed_at, now))
        n++;
    return n;
}

static void publish_oldest(void)
{
    store_relaxed(&cache.oldest_at, cache.count ? cache.entry[0].freed_at : UINT64_MAX);
}

static void release_all(large_header **victims, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        release_block(victims[i]);
}

void large_cache_expire(void)
{
    uint64_t oldest = load_relaxed(&cache.oldest_at);
    if (oldest == UINT64_MAX || !expired(oldest, port_clock_ms()))
        return;
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    spin_lock(&cache.lock);
    unsigned n = take_oldest(expired_count(port_clock_ms()), victims);
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

void large_cache_release_all(void)
{
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    spin_lock(&cache.lock);
    unsigned n = take_oldest(cache.count, victims);
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

/* Take the cached block that fits `need` best (see the file comment); NULL when none fits. Expired
 * blocks go back to the OS on the way. */
static large_header *cache_take(size_t need, size_t *committed)
{
    if (load_relaxed(&cache.oldest_at) == UINT64_MAX)
        return NULL; /* an empty cache costs one load */
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS], *h = NULL;
    spin_lock(&cache.lock);
    unsigned n = take_oldest(expired_count(port_clock_ms()), victims);
    unsigned best = cache.count;
    for (unsigned i = 0; i < cache.count; i++) {
        const cached *c = &cache.entry[i];
        if (c->span < need)
            continue;
        if (best == cache.count) {
            best = i;
            continue;
        }
        const cached *b = &cache.entry[best];
        int c_enough = c->committed >= need, b_enough = b->committed >= need;
        if (c_enough != b_enough ? c_enough : c_enough ? c->committed < b->committed : c->committed > b->committed)
            best = i;
    }
    if (best < cache.count) {
        h = cache.entry[best].h;
        *committed = cache.entry[best].committed;
        remove_entries(best, 1);
    }
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
    return h;
}

/* Put a freed block (mark FREED) into the cache, or give it back to the OS. */
static void cache_put(large_header *h)
{
    size_t committed = h->committed;
    if (committed > SHARD_LARGE_CACHE_BYTES) {
        release_block(h);
        return;
    }
    large_header *victims[SHARD_LARGE_CACHE_BLOCKS];
    spin_lock(&cache.lock);
    uint64_t now = port_clock_ms();
    unsigned n = expired_count(now);
    /* Room for one more entry and its bytes: the oldest go first. */
    size_t bytes = cache.bytes;
    for (unsigned i = 0; i < n; i++)
        bytes -= cache.entry[i].committed;
    while (n < cache.count && (cache.count - n >= SHARD_LARGE_CACHE_BLOCKS || bytes + committed > SHARD_LARGE_CACHE_BYTES))
        bytes -= cache.entry[n++].committed;
    take_oldest(n, victims);
    cache.entry[cache.count++] = (cached){h, committed, span_of(h), now};
    cache.bytes += committed;
    publish_oldest();
    spin_unlock(&cache.lock);
    release_all(victims, n);
}

void large_lock_for_fork(int take)
{
    if (take)
        spin_lock(&cache.lock);
    else
        spin_unlock(&cache.lock);
}

void large_cache_counts(size_t *blocks, size_t *bytes)
{
    spin_lock(&cache.lock);
    *blocks = cache.count;
    *bytes = cache.bytes;
    spin_unlock(&cache.lock);
}

/* ---- blocks ---------------------------------------------------------------------------------------- */

/* Commit or decommit so that h, committed `committed` bytes, holds `need` the way the cache rule says:
 * at least need, and beyond it no more than 4 x need or 16 MB, whichever is more (the seed's "up to
 * 16 MB, or four times the request"). 0, or -1 out of memory. */
static int fit_commit(large_header *h, size_t committed, size_t need)
{
    uint8_t *base = (uint8_t *)h;
    if (committed < need) {
        if (os_commit(base + committed, need - committed) != 0)
            return -1;
        committed = need;
    } else if (committed - need > 4 * need && committed - need > SHARD_LARGE_EXCESS_MIN) {
        if (os_decommit(base + need, committed - need) == 0)
            committed = need;
    }
    h->committed = committed;
    return 0;
}

void *large_alloc(size_t size, int zero) { return large_alloc_aligned(size, LARGE_HEADER, zero); }

void *large_alloc_aligned(size_t size, size_t align, int zero)
{
    if (size > LARGE_SIZE_MAX)
        return NULL;
    size_t offset = align > LARGE_HEADER ? align : LARGE_HEADER;
    size_t need = need_of(size, offset), committed = 0;
    large_header *h = cache_take(need, &committed);
    if (h != NULL) {
        if (fit_commit(h, committed, need) != 0) {
            cache_put(h); /* out of memory: the block waits for a smaller request */
            return NULL;
        }
        h->size = need - offset;
        h->span_slack = span_slack_of(span_of(h), offset, h, reservation_of(h));
        if (zero && committed > offset) /* memory committed in place reads zero; what was committed when cached is dirty */
            mem_zero(block_of(h), (committed < need ? committed : need) - offset);
    } else {
        uint8_t *r;
        h = reserve_block(need, offset, 0, SEG_LARGE, &r);
        if (h == NULL)
            return NULL;
    }
    fetch_add_relaxed(&live_blocks, 1);
    store_release(&h->mark, LARGE_MARK_LIVE);
    return block_of(h);
}

static large_header *live_header(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    if ((a & 15) != 0 || segmap_kind(a) != SEG_LARGE)
        return NULL;
    large_header *h = (large_header *)(a & ~(uintptr_t)SEGMENT_MASK); /* committed: the map says a block starts here */
    if (load_acquire(&h->mark) != LARGE_MARK_LIVE || (a & SEGMENT_MASK) != offset_of(h))
        return NULL;
    return h;
}

int large_free(void *p)
{
    large_header *h = live_header(p);
    uint64_t live = LARGE_MARK_LIVE;
    if (h == NULL || !cas_acq_rel(&h->mark, &live, LARGE_MARK_FREED))
        return -1;
    fetch_add_relaxed(&live_blocks, (size_t)-1);
    cache_put(h);
    return 0;
}

size_t large_usable(const void *p)
{
    large_header *h = live_header(p);
    return h ? h->size : 0;
}

void *large_resize_in_place(void *p, size_t size)
{
    large_header *h = live_header(p);
    if (h == NULL || size <= SHARD_MEDIUM_MAX || size > LARGE_SIZE_MAX)
        return NULL;
    large_cache_expire(); /* a cache access, as the seed counts them: the age is checked */
    size_t offset = offset_of(h), need = need_of(size, offset), committed = h->committed;
    if (need <= committed) {
        if (need < committed / 2 && os_decommit((uint8_t *)h + need, committed - need) == 0)
            h->committed = need; /* shrunk to less than half: the tail goes back at once */
    } else if (need <= span_of(h)) {
        if (os_commit((uint8_t *)h + committed, need - committed) != 0)
            return NULL;
        h->committed = need;
    } else {
        return NULL;
    }
    h->size = need - offset;
    return p;
}

#if PORT_MOVES_PAGES
void *large_move(void *p, size_t size)
{
    large_header *old = live_header(p);
    if (old == NULL || size > LARGE_SIZE_MAX)
        return NULL;
    size_t offset = offset_of(old), need = need_of(size, offset), moved = old->committed, span = span_for(need);
    if (need <= moved)
        return NULL; /* only growth moves pages over */
    /* The new entry is SEG_NONE until the pages are there (setting it now makes sure that its table
     * exists, so that the change to SEG_LARGE below cannot fail). */
    uint8_t *r;
    large_header *h = reserve_block(need, offset, moved, SEG_NONE, &r);
    if (h == NULL)
        return NULL;
    /* The old entry goes first: once the pages have moved, the old addresses may be anyone's. */
    segmap_set((uintptr_t)old, SEGMENT_SIZE, SEG_NONE, SEG_NONE);
    if (os_move_release(reservation_of(old), reserved_for(span_of(old)), old, moved, h) != 0) {
        segmap_set((uintptr_t)old, SEGMENT_SIZE, SEG_LARGE, SEG_LARGE); /* nothing moved: the caller copies */
        os_release(r, reserved_for(span), need - moved);
        return NULL;
    }
    /* The header came along with the pages, mark LIVE; only where the block lives now changes. */
    h->size = need - offset;
    h->committed = need;
    h->span_slack = span_slack_of(span, offset, h, r);
    segmap_set((uintptr_t)h, SEGMENT_SIZE, SEG_LARGE, SEG_LARGE);
    return block_of(h);
}
#else
void *large_move(void *p, size_t size)
{
    (void)p, (void)size;
    return NULL; /* this OS cannot move pages: the caller copies */
}
#endif

size_t large_live_count(void) { return load_relaxed(&live_blocks); }

int large_check(void)
{
    int problems = 0;
    spin_lock(&cache.lock);
    size_t bytes = 0;
    for (unsigned i = 0; i < cache.count; i++) {
        const cached *c = &cache.entry[i];
        bytes += c->committed;
        if (c->h->mark != LARGE_MARK_FREED || c->h->committed != c->committed || span_of(c->h) != c->span ||
            segmap_kind((uintptr_t)c->h) != SEG_LARGE || (i > 0 && c->freed_at < cache.entry[i - 1].freed_at)) {
            report_error("large-block cache: an entry that does not match its block:", (uintptr_t)c->h);
            problems++;
        }
    }
    if (bytes != cache.bytes || cache.count > SHARD_LARGE_CACHE_BLOCKS || bytes > SHARD_LARGE_CACHE_BYTES ||
        cache.oldest_at != (cache.count ? cache.entry[0].freed_at : UINT64_MAX)) {
        report_error("large-block cache: counts differ from the entries, bytes", bytes);
        problems++;
    }
    spin_unlock(&cache.lock);
    return problems;
}
