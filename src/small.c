/* small.c - the slow paths of small blocks: carving, class lists, foreign frees, free and cold pages.
 *
 * The fast paths (api.c, asm/fast.asm) pop from `free` of the first page of a class and push the
 * owner's frees back onto it; everything else happens here:
 * - A class list holds the pages of a class that may have free items. When its first page has no `free`
 *   item, the slow path takes the page's `local_free`, else what other threads freed into it, else
 *   carves more items from the untouched part in ascending address order (4 KB of them, or as many
 *   again as the page has carved), else takes the page out of the list as full (and biases `used`, see
 *   small.h) and looks at the next page. With no page left it takes a page: the most recently freed
 *   committed one, else an orphan segment's (small.h), else one lent to the pool (small.h, lent pages),
 *   else a cold one (committing it), else a new segment. A segment whose every page went out of its
 *   list as full goes to the orphans, and comes back at its heap's first free into it.
 * - A page that gets items back after being full goes to the tail of its list, so that by the time
 *   allocation reaches it more than one item has gathered. Only a brand-new page goes to the head.
 * - Other threads' frees into a lazy page (small.h) wait in it until the page is its class's first and
 *   dry: the slow path takes them before it carves. Those into a page that is not lazy (a full page,
 *   mostly) queue it at the heap's `delayed` list, which each slow path takes with one exchange, every
 *   page on it having its thread_free word exchanged: the page comes back to its list lazy.
 * - A heap out of free pages takes in what waits in its lazy pages and retires those left empty
 *   (sweep_lazy), before it takes a page it never used.
 * - A page whose items are all back goes to the heap's free pages. Up to SHARD_KEEP_FREE_PAGES stay
 *   committed; the memory of the others goes back once they have been free for the decommit delay
 *   (SHARDMM_DELAY_MS, options.h; SHARD_DECOMMIT_DELAY_MS by default).
 *   A segment with no page in use keeps its address space until the heap is trimmed to nothing (a
 *   waiting heap whose reserve expired, memory pressure: small_release_empty), which releases it.
 *   The clock is read only when there are more free pages than that (pages freed while there were
 *   fewer are stamped when the trim first sees them: they stay a little longer, never shorter).
 * - The page-per-size array `direct` is written only by sync_direct(), when a class's first page changes.
 */
#include "small.h"

#include "../port/port.h"
#include "error.h"
#include "heap.h"
#include "large.h"
#include "libc.h"
#include "options.h"

page small_empty_page;

/* The debug build walks a page after every slow-path change of it (small_check_page, below). */
#if SHARD_DEBUG
#define debug_check_page(pg, reason) \
    (small_check_page(pg) == 0 ? (void)0 : assert_failed(__FILE__, __LINE__, reason))
#else
#define debug_check_page(pg, reason) ((void)0)
#endif

#define THREAD_FREE_HEAD(w) ((uint32_t)(w)&0xffffu)
#define THREAD_FREE_TAIL(w) ((uint32_t)((w) >> 16) & 0xffffu)
#define THREAD_FREE_COUNT(w) ((uint32_t)((w) >> 32) & 0x7fffffffu)
#define THREAD_FREE_WORD(head, tail, count) \
    ((uint64_t)(head) | ((uint64_t)(tail) << 16) | ((uint64_t)(count) << 32))
_Static_assert(SHARD_RUN_PAGES >= 1 && (SHARD_RUN_PAGES & (SHARD_RUN_PAGES - 1)) == 0 &&
                   (uint64_t)SHARD_RUN_PAGES * PAGE_SIZE / 16 <= 0x10000,
               "a run is a power of two of pages, whose item offsets / 16 fit thread_free's 16 bits");

/* ---- page lists ---------------------------------------------------------------------------------- */

static void list_push_front(page_list *l, page *pg)
{
    pg->prev = NULL;
    pg->next = l->first;
    if (l->first)
        l->first->prev = pg;
    else
        l->last = pg;
    l->first = pg;
}

static void list_append(page_list *l, page *pg)
{
    pg->next = NULL;
    pg->prev = l->last;
    if (l->last)
        l->last->next = pg;
    else
        l->first = pg;
    l->last = pg;
}

static void list_remove(page_list *l, page *pg)
{
    if (pg->prev)
        pg->prev->next = pg->next;
    else
        l->first = pg->next;
    if (pg->next)
        pg->next->prev = pg->prev;
    else
        l->last = pg->prev;
    pg->next = pg->prev = NULL;
}

/* Point the page-per-size entries of class cls at its first page (or the empty page). */
static void sync_direct(heap *h, unsigned cls)
{
    if (cls > class_by_size16[SHARD_DIRECT_MAX >> 4])
        return;
    page *first = h->classes[cls].first ? h->classes[cls].first : &small_empty_page;
    unsigned lo = cls == 0 ? 0 : class_size[cls - 1] / 16u + 1, hi = class_size[cls] / 16u;
    for (unsigned i = lo; i <= hi; i++)
        h->direct[i] = first;
}

/* The only page of a class list counts one more in `used` (and has sole = 1), so that it never looks
 * empty to the free fast path: an empty page that is its class's only one stays where it is (see
 * page_emptied), and without the extra one every free that emptied it took a branch of its own, which a
 * program that frees whole batches mispredicts (bench/micro's mixed rows under cachegrind). The
 * class list functions keep it: the extra one leaves the page that stops being alone, comes to the page
 * that is left alone. */
static void sole_set(page *pg, uint8_t sole)
{
    pg->used += (int32_t)sole - (int32_t)pg->sole;
    pg->sole = sole;
}

static void sole_update(page_list *l, uint8_t sole)
{
    if (l->first != NULL && l->first == l->last)
        sole_set(l->first, sole);
}

static void class_push_front(heap *h, page *pg)
{
    page_list *l = &h->classes[pg->cls];
    sole_update(l, 0);
    list_push_front(l, pg);
    sole_update(l, 1);
    sync_direct(h, pg->cls);
}

/* Inlined always: a page that goes full and comes back at each malloc and free (pages of 4-8 items, as
 * bench/medium.c's 8k-16k) made the call a seventh of small_free_local_slow's instructions. */
static inline __attribute__((always_inline)) void class_append(heap *h, page *pg)
{
    page_list *l = &h->classes[pg->cls];
    page *last = l->last;
    pg->next = NULL;
    pg->prev = last;
    l->last = pg;
    if (last == NULL) { /* alone: the extra one, and the class's new first page */
        l->first = pg;
        sole_set(pg, 1);
        sync_direct(h, pg->cls);
    } else {
        last->next = pg;
        if (last == l->first)
            sole_set(last, 0); /* no longer alone */
    }
}

/* class_remove() of pg, its class list's first page: the page that small_alloc_slow finds full. The
 * same result, by the steps that the first page needs. */
static void class_remove_first(heap *h, page *pg)
{
    page_list *l = &h->classes[pg->cls];
    page *next = pg->next;
    sole_set(pg, 0);
    l->first = next;
    pg->next = NULL;
    if (next == NULL) {
        l->last = NULL;
    } else {
        next->prev = NULL;
        if (next == l->last)
            sole_set(next, 1); /* left alone */
    }
    sync_direct(h, pg->cls);
}

static void class_remove(heap *h, page *pg)
{
    page_list *l = &h->classes[pg->cls];
    int was_first = l->first == pg;
    sole_update(l, 0);
    list_remove(l, pg);
    sole_update(l, 1);
    if (was_first)
        sync_direct(h, pg->cls);
}

/* ---- pages --------------------------------------------------------------------------------------- */

/* Page j of the run that head starts (small.h: runs) takes its part: the item test's fields, `back`. */
static void tail_init(const page *head, page *t, unsigned j)
{
    t->free = t->local_free = NULL;
    t->used = USED_TAIL;
    t->sole = 0;
    t->full = 0;
    t->full_out = 0;
    t->capacity = class_capacity[head->cls];
    t->wake = 0;
    t->span = 0;
    t->carved = 0;
    store_relaxed(&t->item_bound, 0u);
    t->block_size = head->block_size;
    t->item_mul = head->item_mul;
    t->cls = head->cls;
    t->back = (uint8_t)j;
    t->lazy = 0;
    t->state = PAGE_TAIL;
    store_relaxed(&t->thread_free, (uint64_t)0);
    store_relaxed(&t->shared_back, (uint8_t)j);
    store_relaxed(&t->shared_divisor, load_relaxed(&head->shared_divisor));
    store_relaxed(&t->shared_block_size, head->block_size);
}

/* pg starts serving class cls, the head of a run of `span` pages (1: a page of its own), in the list of
 * its owner's running thread: lazy (small.h). */
static void page_init(page *pg, unsigned cls, unsigned span)
{
    uint32_t size = class_size[cls];
    uint64_t divisor = UINT64_MAX / size + 1;
    pg->free = pg->local_free = NULL;
    pg->used = 0;
    pg->sole = 0;
    pg->full = 0;
    pg->full_out = 0;
    pg->capacity = (uint16_t)(class_capacity[cls] * span);
    pg->wake = (uint8_t)wake_of(pg->capacity);
    pg->span = (uint8_t)span;
    pg->carved = 0;
    pg->block_size = size;
    pg->item_mul = item_mul_of(size);
    pg->cls = (uint8_t)cls;
    pg->back = 0;
    if (likely(pg->state != PAGE_LENT)) { /* a guest's page: both stay its segment owner's (small.h) */
        store_relaxed(&pg->item_bound, 0u);
        pg->state = PAGE_IN_USE;
    }
    store_relaxed(&pg->shared_back, (uint8_t)0);
    store_relaxed(&pg->shared_divisor, divisor);
    store_relaxed(&pg->shared_block_size, size);
    store_relaxed(&pg->thread_free, THREAD_FREE_LAZY); /* no item out yet: no free pushes meanwhile */
    pg->lazy = 1;
    for (unsigned j = 1; j < span; j++)
        tail_init(pg, pg + j, j);
}

/* pg leaves its class list in h with no free item: `used` counts down to its wake (small.h). A page of
 * h's segments counts in its segment's full pages; a guest page waits in h's guest_full list. */
static void page_set_full(heap *h, page *pg)
{
    int32_t wake = page_wake(pg);
    if (wake > pg->used)
        wake = pg->used; /* every item out is one to come back (used >= 1 here) */
    pg->full_out = pg->used - wake;
    pg->used = wake;
    pg->full = 1;
    if (likely(pg->state != PAGE_LENT))
        segment_of(pg)->full_pages += page_span(pg);
    else
        list_append(&h->guest_full, pg);
}

/* pg goes back into its list, or is retired: `used` is the items out again. */
static void page_clear_full(heap *h, page *pg)
{
    pg->used += pg->full_out;
    pg->full_out = 0;
    pg->full = 0;
    if (likely(pg->state != PAGE_LENT))
        segment_of(pg)->full_pages -= page_span(pg);
    else
        list_remove(&h->guest_full, pg);
}

/* A carve in spared segment s (on small pages until its heap fills the unit: segment.h) is about to write
 * the links of items of `size` bytes in page `bound`, the last one `last` bytes from the page's start.
 * The OS pages its items reach for the first time since the commit count towards the unit's large pages.
 * Where the unit is still on small pages, the pages the links reach are made resident first, in one call
 * (port_caps.populate) rather than a fault each, with as many again as the page had touched, up to its
 * end: a page that fills takes calls at 1, 2, 3, 5 and 9 of its 16 OS pages and no fault, and a page used
 * for a few items holds at most twice what they reach. Only fewer calls than pages pay: on this
 * project's AMD guest a call costs about what a fault does (docs/design.md, huge pages for small and
 * medium memory, has the numbers). Items of an OS page or more are left to their faults: between their
 * links lie bodies only the program touches. */
static void carve_reach(heap *h, segment *s, page *bound, size_t last, size_t size)
{
    enum { OS_PAGES = PAGE_SIZE / PORT_PAGE };
    size_t reach = (last + size + PORT_PAGE - 1) / PORT_PAGE, had = bound->touched;
    if (reach > OS_PAGES)
        reach = OS_PAGES;
    if (reach <= had)
        return;
    size_t links = size < PORT_PAGE ? (last + sizeof(block) + PORT_PAGE - 1) / PORT_PAGE : 0;
    if (links > had) {
        size_t to = 2 * had < OS_PAGES ? 2 * had : OS_PAGES;
        if (to < links)
            to = links;
        if (segment_populate(s, page_start(bound) + had * PORT_PAGE, (to - had) * PORT_PAGE) && to > reach)
            reach = to;
    }
    bound->touched = (uint8_t)reach;
    if (segment_spared_touch(s, (size_t)(page_start(bound) - (uint8_t *)s), reach - had))
        medium_spared_grown(h);
}

/* Link untouched items into `free`, in ascending address order: as many as touch SHARD_CARVE_BYTES, or
 * as much as the page's carves touched so far when that is more, but SHARD_CARVE_MIN at least (config.h).
 * The loop keeps the cursor, the size and the end in registers. */
static void page_carve(heap *h, page *pg)
{
    size_t size = pg->block_size;
    size_t touched = size < PORT_PAGE ? size : PORT_PAGE; /* by the link written into each item */
    unsigned n = (unsigned)pg->capacity - pg->carved;
    size_t bytes = (size_t)pg->carved * touched;
    if (bytes < SHARD_CARVE_BYTES)
        bytes = SHARD_CARVE_BYTES;
    unsigned most = (unsigned)(bytes / touched);
    if (most < SHARD_CARVE_MIN)
        most = SHARD_CARVE_MIN;
    if (n > most)
        n = most;
    uint8_t *first;
    page *bound = pg; /* the descriptor of the page the items lie in */
    unsigned per = class_capacity[pg->cls], had = pg->carved, in = had;
    if (pg->capacity > per) { /* a run: up to the end of the page the next item lies in */
        in = had % per;
        if (n > per - in)
            n = per - in;
        bound = pg + had / per;
    }
    first = page_start(bound) + (size_t)in * size;
    segment *s = segment_of(pg);
    int lent = pg->state == PAGE_LENT; /* a guest's page: its segment's fields are its owner's (small.h) */
    if (unlikely(!lent && segment_spared(s)))
        carve_reach(h, s, bound, (size_t)(in + n - 1) * size, size);
    uint8_t *last = first + (size_t)(n - 1) * size;
    for (uint8_t *p = first; p < last; p += size)
        link_set((block *)p, (block *)(p + size));
    link_set((block *)last, pg->free);
    pg->free = (block *)first;
    pg->carved = (uint16_t)(had + n);
    if (likely(!lent))
        store_relaxed(&bound->item_bound, (in + n) * page_item_step(pg));
}

/* Decommit the oldest free pages beyond `keep`: those free for the delay, or all of them with `now`
 * UINT64_MAX (thread exit, the reserve's expiry, shard_collect). */
static void trim_at(heap *h, uint64_t now, unsigned keep)
{
    page *pg = h->free_pages.first;
    while (pg != NULL && h->free_count > keep) {
        page *next = pg->next;
        if (pg->freed_at == 0 && now != UINT64_MAX) {
            pg->freed_at = now;
        } else if (now == UINT64_MAX || now - pg->freed_at >= options_values.decommit_delay_ms) {
            if (os_decommit(page_start(pg), PAGE_SIZE) != 0)
                return;
            heap_uncharge(h, PAGE_SIZE);
            list_remove(&h->free_pages, pg);
            h->free_count--;
            pg->state = PAGE_COLD;
            list_push_front(&h->cold_pages, pg);
        } else {
            return;
        }
        pg = next;
    }
}

/* The own-segment entry of s's 4 GB slot, if s holds it, goes to another of h's segments in that slot
 * (heap_check: every segment's slot has an entry), else is cleared: another heap's segment may come
 * to s's address. The caller has taken s out of h's list. */
static void own_entry_leave(heap *h, const segment *s)
{
    uint32_t slot = (uint32_t)(uintptr_t)s >> SEGMENT_SHIFT;
    if (h->own[slot] != (uintptr_t)s)
        return;
    h->own[slot] = 0;
    for (segment *o = h->segments; o != NULL; o = o->next)
        if ((uint32_t)(uintptr_t)o >> SEGMENT_SHIFT == slot) {
            h->own[slot] = (uintptr_t)o;
            break;
        }
}

/* s, taken out of h's list, leaves h for another heap or the OS: its own-segment entry goes, and h's
 * full_ring forgets its pages. */
static void segment_leave(heap *h, segment *s)
{
    own_entry_leave(h, s);
    for (unsigned i = 0; i < SHARD_LOOSE_AFTER; i++)
        if (h->full_ring[i] != NULL && segment_of(h->full_ring[i]) == s)
            h->full_ring[i] = NULL;
}

/* s becomes one of h's segments: first in its list, which other threads walk for the statistics (the
 * link an atomic: a walk that was at s in another heap's list goes on in h's), and in its own-segment
 * table, where the fast paths of free and realloc find it. */
static void segment_enter(heap *h, segment *s)
{
    store_relaxed(&s->next, h->segments);
    store_release(&h->segments, s);
    heap_own_segment(h, s);
}

unsigned small_release_empty(heap *h, int spare)
{
    spare = spare && !h->created; /* a created heap's memory is charged to it: it keeps to its own */
    unsigned spared = 0;
    segment **link = &h->segments;
    for (segment *s = *link; s != NULL; s = *link) {
        unsigned free_pages = 0, in_use = 0;
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            unsigned state = ((const page *)((uint8_t *)s + i * PAGE_DESC_SIZE))->state;
            free_pages += state == PAGE_FREE;
            in_use += state == PAGE_IN_USE;
        }
        if (in_use != 0 || s->lent != 0) { /* pages lent: small.h */
            link = &s->next;
            continue;
        }
        /* Its free pages go with it, committed: one release instead of a decommit each first. */
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            page *pg = (page *)((uint8_t *)s + i * PAGE_DESC_SIZE);
            list_remove(pg->state == PAGE_FREE ? &h->free_pages : &h->cold_pages, pg);
        }
        h->free_count -= free_pages;
        store_release(link, s->next); /* statistics walk the list (segment_walk_begin) */
        segment_leave(h, s);
        size_t committed = SEGMENT_DESC_BYTES + free_pages * PAGE_SIZE;
        heap_uncharge(h, committed);
        if (spare && segment_spare_put(s, SEG_SMALL, committed))
            spared++;
        else
            segment_release(s, committed);
    }
    return spared;
}

/* A spare segment (segment.h) with at least `least` bytes committed becomes h's, its free pages the
 * most recently freed of h's, its cold pages cold ones; 0, or -1 when there is none. */
static int adopt_spare(heap *h, size_t least)
{
    size_t committed;
    segment *s = h->created ? NULL : segment_spare_take(SEG_SMALL, least, &committed);
    if (s == NULL)
        return -1;
    store_release(&s->owner, h);
    segment_enter(h, s);
    for (unsigned i = SEGMENT_PAGES - 1; i >= 1; i--) {
        page *pg = (page *)((uint8_t *)s + i * PAGE_DESC_SIZE);
        pg->freed_at = 0; /* stamped when a trim first sees it */
        if (pg->state == PAGE_FREE) {
            list_append(&h->free_pages, pg);
            h->free_count++;
        } else {
            list_push_front(&h->cold_pages, pg);
        }
    }
    return 0;
}

void small_spared_grown(heap *h)
{
    for (segment *s = h->segments; s != NULL; s = s->next)
        segment_spared_grown(s, SEG_SMALL);
}

void small_release_all(heap *h)
{
    mem_zero(h->full_ring, sizeof h->full_ring);
    segment *s = h->segments;
    store_release(&h->segments, (segment *)NULL); /* statistics walk the list (segment_walk_begin) */
    while (s != NULL) {
        segment *next = s->next;
        size_t committed = SEGMENT_DESC_BYTES;
        for (unsigned i = 1; i < SEGMENT_PAGES; i++)
            committed += ((const page *)((uint8_t *)s + i * PAGE_DESC_SIZE))->state != PAGE_COLD ? PAGE_SIZE : 0;
        heap_uncharge(h, committed);
        segment_release(s, committed);
        s = next;
    }
}

static void page_set_free(page *pg);

void small_empty_keep(heap *h, unsigned keep)
{
    for (unsigned i = 0; i < SHARD_DIRECT_COUNT; i++)
        h->direct[i] = &small_empty_page;
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++)
        h->classes[cls] = (page_list){NULL, NULL};
    h->free_pages = h->cold_pages = (page_list){NULL, NULL};
    h->free_count = 0;
    mem_zero(h->full_ring, sizeof h->full_ring);
    store_relaxed(&h->delayed, (page *)NULL); /* the queued pages' frees are void: their pages empty now */
    for (segment *s = h->segments; s != NULL; s = s->next) {
        s->full_pages = 0;
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            page *pg = (page *)((uint8_t *)s + i * PAGE_DESC_SIZE);
            if (pg->state == PAGE_IN_USE || pg->state == PAGE_TAIL) { /* as page_retire, whatever its items */
                h->pages_retired++;
                page_set_free(pg);
                pg->next_delayed = NULL;
                pg->sole = 0;
                pg->full = 0;
                pg->full_out = 0;
            }
            pg->freed_at = 0;
            if (pg->state == PAGE_FREE) {
                list_append(&h->free_pages, pg);
                h->free_count++;
            } else {
                list_append(&h->cold_pages, pg);
            }
        }
    }
    trim_at(h, UINT64_MAX, keep); /* the oldest in that order: the first segments' */
    segment **link = &h->segments; /* segments left with no committed page go whole */
    for (segment *s = *link; s != NULL; s = *link) {
        unsigned cold = 0;
        for (unsigned i = 1; i < SEGMENT_PAGES; i++)
            cold += ((const page *)((uint8_t *)s + i * PAGE_DESC_SIZE))->state == PAGE_COLD;
        if (cold != SEGMENT_PAGES - 1) {
            link = &s->next;
            continue;
        }
        for (unsigned i = 1; i < SEGMENT_PAGES; i++)
            list_remove(&h->cold_pages, (page *)((uint8_t *)s + i * PAGE_DESC_SIZE));
        store_release(link, s->next);
        segment_leave(h, s);
        heap_uncharge(h, SEGMENT_DESC_BYTES);
        segment_release(s, SEGMENT_DESC_BYTES);
    }
}

/* Decommit the free pages beyond SHARD_KEEP_FREE_PAGES that are older than the delay. */
static void small_trim(heap *h)
{
    if (h->free_count > SHARD_KEEP_FREE_PAGES)
        trim_at(h, os_clock_ms(), SHARD_KEEP_FREE_PAGES);
}

/* pg, a page that served a class (alone, a run's head or tail), becomes a free page, in no list yet. */
static void page_set_free(page *pg)
{
    store_relaxed(&pg->thread_free, (uint64_t)0); /* no item out, so no free pushes: the lazy mark goes */
    pg->lazy = 0;
    store_relaxed(&pg->shared_block_size, 0u);
    store_relaxed(&pg->shared_divisor, 0u);
    store_relaxed(&pg->shared_back, (uint8_t)0);
    pg->back = 0;
    pg->span = 0;
    pg->free = pg->local_free = NULL;
    pg->used = 0;
    pg->carved = 0;
    if (likely(pg->state != PAGE_LENT)) { /* a guest's page: both stay its segment owner's (small.h) */
        pg->state = PAGE_FREE;
        store_relaxed(&pg->item_bound, 0u);
    }
}

/* ---- the pool of lent pages (small.h) -------------------------------------------------------------- */

/* Committed free pages lent by their segments' owners, the oldest first, linked by next and prev; under
 * pool_lock, but for pool_count's look before the lock. A page's freed_at is when it came. */
static spinlock pool_lock;
static page_list pool;
static uint32_t pool_count;
/* The heap that last committed a page afresh, having none free and finding none in the pool, or NULL:
 * a heap lends only while another heap needs pages (page_lends), so that a thread alone, or a heap that
 * grows while the others stay level, keeps its free pages as before. Pages that wait in the pool for
 * the delay untaken end the demand (small_pool_expire). A relaxed word; a stale value costs a lend. */
static heap *pool_wanted;
/* No heap lends before this os_clock_ms(): a thread ended lately whose heap kept segments that guests tie
 * to it, neither spare nor released, and threads that come and go live on spare segments
 * (docs/design.md, thread heaps and their lifecycle). A relaxed word. */
static uint64_t lend_paused_until;

static void page_queue(heap *owner, page *pg);

/* pg, lent and free, in no list, goes back to its segment's owner, decommitted: queued there, its drain
 * makes it a cold page (page_home), or a free one if the OS kept it. */
static void page_send_home(page *pg)
{
    pg->next = NULL;
    int kept = os_decommit(page_start(pg), PAGE_SIZE) != 0;
    store_relaxed(&pg->lend, (uint8_t)(kept ? LEND_HOME_KEPT : LEND_HOME));
    page_queue(load_acquire(&segment_of(pg)->owner), pg);
}

/* pg, free (page_set_free) and in no list, goes to the pool: 1, or 0 when a fork holds the pool (the
 * caller keeps the page). The first page arms the trim that sends it home (small_pool_expire). */
static int pool_put(page *pg)
{
    if (!spin_lock_unless_fork(&pool_lock))
        return 0;
    uint64_t now = os_clock_ms();
    pg->freed_at = now;
    store_relaxed(&pg->lend, (uint8_t)LEND_POOL);
    list_append(&pool, pg);
    uint32_t n = pool_count + 1;
    store_relaxed(&pool_count, n);
    int due = now - pool.first->freed_at >= options_values.decommit_delay_ms;
    spin_unlock(&pool_lock);
    if (n == 1)
        heap_arm_reserve_due(now + options_values.decommit_delay_ms);
    else if (due) /* as a retire checks the age of its heap's free pages */
        small_pool_expire(now);
    return 1;
}

/* pg, lent by its segment's owner, is the owner's again, in `state` (and in none of its lists yet). */
static void page_unlend(page *pg, uint8_t state)
{
    segment_of(pg)->lent--;
    store_relaxed(&pg->lend, (uint8_t)LEND_NONE);
    pg->state = state;
}

/* Whether h (a thread heap, on its thread) lends pg, a page of its own just retired: when it holds
 * SHARD_LEND_AFTER free pages already, and the page is not a run's. */
static int page_lends(heap *h, const page *pg)
{
    if (SHARD_LEND_AFTER == 0 || SHARD_HARDENED || h->free_count < SHARD_LEND_AFTER || page_span(pg) != 1)
        return 0;
    heap *wanted = load_relaxed(&pool_wanted);
    return wanted != NULL && wanted != h && options_values.lend_pages && !h->created && h == heap_mine() &&
           (int64_t)(os_clock_ms() - load_relaxed(&lend_paused_until)) >= 0;
}

/* The pool's most recently lent page for h (a thread heap, on its thread), or NULL: one of h's own
 * segments' becomes a free page of h's again, in no list; another's a guest page of h (small.h). */
static page *pool_take(heap *h)
{
    if (h->created || load_relaxed(&pool_count) == 0 || !spin_lock_unless_fork(&pool_lock))
        return NULL;
    page *pg = pool.last;
    if (pg != NULL) {
        list_remove(&pool, pg);
        store_relaxed(&pool_count, pool_count - 1);
    }
    spin_unlock(&pool_lock);
    if (pg == NULL)
        return NULL;
    if (load_relaxed(&segment_of(pg)->owner) == h) { /* no segment with pages lent changes owner */
        page_unlend(pg, PAGE_FREE);
        return pg;
    }
    h->guests++;
    store_relaxed(&pg->guest_of, h);
    store_release(&pg->lend, (uint8_t)LEND_GUEST);
    return pg;
}

void small_pool_reclaim(heap *h)
{
    if (load_relaxed(&pool_count) == 0 || !spin_lock_unless_fork(&pool_lock))
        return;
    uint32_t n = pool_count;
    for (page *pg = pool.first, *next; pg != NULL; pg = next) {
        next = pg->next;
        if (load_relaxed(&segment_of(pg)->owner) != h)
            continue;
        list_remove(&pool, pg);
        n--;
        page_unlend(pg, PAGE_FREE);
        list_append(&h->free_pages, pg); /* keeps its freed_at: its delay goes on */
        h->free_count++;
    }
    store_relaxed(&pool_count, n);
    spin_unlock(&pool_lock);
}

void small_pool_leave(heap *h)
{
    small_pool_reclaim(h);
    for (const segment *s = h->segments; s != NULL; s = s->next)
        if (s->lent != 0) { /* a guest's page: the segment stays h's (small.h) */
            store_relaxed(&lend_paused_until, os_clock_ms() + options_values.decommit_delay_ms);
            return;
        }
}

uint64_t small_pool_expire(uint64_t now)
{
    if (now == UINT64_MAX) { /* every lent page goes home: the demand ends, and so does a pause */
        store_relaxed(&pool_wanted, (heap *)NULL);
        store_relaxed(&lend_paused_until, 0u);
    }
    if (load_relaxed(&pool_count) == 0 || !spin_lock_unless_fork(&pool_lock))
        return 0;
    page *home = NULL;
    uint64_t due = 0;
    uint32_t n = pool_count;
    while (pool.first != NULL) {
        page *pg = pool.first;
        if (now != UINT64_MAX && now - pg->freed_at < options_values.decommit_delay_ms) {
            due = pg->freed_at + options_values.decommit_delay_ms;
            break;
        }
        list_remove(&pool, pg);
        n--;
        pg->next = home;
        home = pg;
    }
    store_relaxed(&pool_count, n);
    spin_unlock(&pool_lock);
    if (home != NULL) /* untaken for the delay: no heap needs them */
        store_relaxed(&pool_wanted, (heap *)NULL);
    while (home != NULL) {
        page *pg = home;
        home = pg->next;
        page_send_home(pg);
    }
    return due;
}

void small_pool_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&pool_lock);
    else
        spin_unlock_for_fork(&pool_lock);
}

/* pg, lent and back from the pool (LEND_HOME, LEND_HOME_KEPT), was drained from h's `delayed` list: one
 * of h's cold pages, or of its free pages if the decommit failed. */
static void page_home(heap *h, page *pg)
{
    if (load_relaxed(&pg->lend) == LEND_HOME_KEPT) {
        page_unlend(pg, PAGE_FREE);
        list_append(&h->free_pages, pg);
        h->free_count++;
        return;
    }
    page_unlend(pg, PAGE_COLD);
    list_push_front(&h->cold_pages, pg);
}

/* All items of pg are back: it leaves its class (and its list, if in one) for the free pages, and so
 * do the other pages of its run. A guest page goes back to the pool, and so does a page h lends. */
static void page_retire(heap *h, page *pg, int in_list)
{
    if (in_list)
        class_remove(h, pg); /* takes the extra one of an only page away */
    shard_assert(pg->used == 0 && pg->sole == 0 && (load_relaxed(&pg->thread_free) & ~THREAD_FREE_LAZY) == 0,
                 "a retired page has no item out");
    unsigned span = page_span(pg); /* before page_set_free, which clears it */
    if (unlikely(pg->state == PAGE_LENT)) {
        page_set_free(pg);
        if (h != heap_mine()) { /* a trim of a heap no thread runs: the page goes home, not to the pool */
            h->guests--;
            h->pages_retired++;
            page_send_home(pg);
            return;
        }
        if (pool_put(pg)) {
            h->guests--;
            h->pages_retired++;
            large_cache_expire();
            return;
        }
        page_init(pg, pg->cls, 1); /* a fork holds the pool: the page stays h's, empty, in its class */
        class_append(h, pg);
        return;
    }
    if (unlikely(page_lends(h, pg))) {
        page_set_free(pg);
        pg->state = PAGE_LENT;
        segment_of(pg)->lent++;
        if (pool_put(pg)) {
            h->pages_retired++;
            large_cache_expire();
            return;
        }
        page_unlend(pg, PAGE_FREE); /* a fork holds the pool: a free page of h's, as any other */
    }
    /* The clock whenever this retire takes h past the pages it keeps: trim_at measures the delay of
     * every waiting page from it (a 0 there would make every delay look long over). */
    uint64_t now = h->free_count + span > SHARD_KEEP_FREE_PAGES ? os_clock_ms() : 0;
    for (unsigned j = 0; j < span; j++) {
        page_set_free(pg + j);
        pg[j].freed_at = now;
        list_append(&h->free_pages, pg + j);
        h->free_count++;
    }
    h->pages_retired += span;
    if (h->free_count > SHARD_KEEP_FREE_PAGES)
        trim_at(h, now, SHARD_KEEP_FREE_PAGES);
    large_cache_expire(); /* one of the seed's moments to check the large cache's age */
}

/* All items of pg are back. The only page of its class stays in it, so that a thread that frees and
 * allocates one block at a time does not give its page away and take it back on every pair (the seed:
 * every thread keeps one page per class it uses); any other page is retired. A page in its list that is
 * the only one never gets here: its `used` counts one more (sole_set), so it does not reach 0. A full
 * page (out of its list) whose class list has emptied meanwhile becomes that list's only page. */
static inline void page_emptied(heap *h, page *pg, int in_list)
{
    if (!in_list && h->classes[pg->cls].first == NULL) {
        class_append(h, pg);
        return;
    }
    page_retire(h, pg, in_list);
}

void small_keep(heap *h, unsigned keep, int exiting)
{
    if (exiting) {
        /* The only page of a class stays while its thread runs; an exiting thread retires it if empty. */
        for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++) {
            page *pg = h->classes[cls].first;
            if (pg != NULL && pg->next == NULL && pg->used == pg->sole &&
                THREAD_FREE_COUNT(load_relaxed(&pg->thread_free)) == 0)
                page_retire(h, pg, 1);
        }
    }
    if (h->free_count > keep)
        trim_at(h, UINT64_MAX, keep);
}

/* A page to serve a class: the most recently freed committed one, else a cold one, else a spare or new
 * segment's. */
static int segment_new(heap *h);
static int page_commit_cold(heap *h, page *pg);

static page *page_acquire(heap *h)
{
    page *pg = h->free_pages.last;
    if (pg != NULL) {
        list_remove(&h->free_pages, pg);
        h->free_count--;
        return pg;
    }
    /* Memory another heap left committed comes before a page committed afresh: it is resident
     * already, so it costs neither faults nor more of the process's memory. First a page lent to the
     * pool (small.h); with cold pages of its own, h takes only a spare segment that has a free page. */
    pg = pool_take(h);
    if (pg != NULL)
        return pg;
    if (!h->created && load_relaxed(&pool_wanted) != h)
        store_relaxed(&pool_wanted, h); /* pages afresh: the other heaps lend (page_lends) */
    size_t least = h->cold_pages.first == NULL ? 0 : SEGMENT_DESC_BYTES + PAGE_SIZE;
    if (adopt_spare(h, least) == 0) {
        pg = h->free_pages.last;
        if (pg != NULL) {
            list_remove(&h->free_pages, pg);
            h->free_count--;
            return pg;
        }
    }
    if (h->cold_pages.first == NULL && segment_new(h) != 0)
        return NULL;
    pg = h->cold_pages.first;
    return page_commit_cold(h, pg) == 0 ? pg : NULL;
}

/* The page a new segment of a heap of colour `colour` (heap.h) hands out k-th, k = 1 .. SEGMENT_PAGES - 1:
 * its pages in ascending order, those of its lower large-page unit rotated by the colour
 * (SHARD_SEGMENT_COLOURS, config.h), so that the first segments of heaps made one after another serve
 * their blocks from different offsets. The upper unit's pages still come after the lower unit's, as the
 * spared units expect (segment.h). */
static unsigned page_in_turn(unsigned colour, unsigned k)
{
    const unsigned lower = (unsigned)(SEGMENT_LARGE_UNIT / PAGE_SIZE) - 1; /* page 0 holds the descriptors */
    return k > lower ? k : 1 + (k - 1 + colour) % lower;
}
_Static_assert(SHARD_SEGMENT_COLOURS >= 1 && SHARD_SEGMENT_COLOURS < SEGMENT_LARGE_UNIT / PAGE_SIZE,
               "a colour picks one of the lower unit's pages to start from");

/* A new segment for h, its pages cold ones of h's: 0, or -1 out of memory (or at a created heap's limit,
 * which must have room for its descriptors and a page). */
static int segment_new(heap *h)
{
    if (heap_charge(h, SEGMENT_DESC_BYTES + PAGE_SIZE) != 0)
        return -1;
    int outgrown = 0;
    for (segment *s = h->segments; s != NULL; s = s->next)
        if (unlikely(segment_spared(s)))
            outgrown |= segment_spared_outgrown(s, SEG_SMALL);
    if (outgrown)
        medium_spared_grown(h);
    size_t large_from = segment_large_from(h->segments_made++ == 0, h->created);
    large_cache_shed(SEGMENT_SIZE);
    segment *seg = segment_create(h, SEG_SMALL, SEGMENT_DESC_BYTES, large_from);
    heap_uncharge(h, PAGE_SIZE);
    if (seg == NULL) {
        heap_uncharge(h, SEGMENT_DESC_BYTES);
        return -1;
    }
    segment_enter(h, seg);
    for (unsigned k = SEGMENT_PAGES - 1; k >= 1; k--) {
        page *p = (page *)((uint8_t *)seg + page_in_turn(h->colour, k) * PAGE_DESC_SIZE);
        p->state = PAGE_COLD;
        list_push_front(&h->cold_pages, p);
    }
    return 0;
}

/* Cold page pg of h committed and out of the cold pages (its state still PAGE_COLD): 0, or -1. */
static int page_commit_cold(heap *h, page *pg)
{
    if (heap_charge(h, PAGE_SIZE) != 0)
        return -1;
    segment *s = segment_of(pg);
    if (segment_commit(s, page_start(pg), PAGE_SIZE) != 0) {
        heap_uncharge(h, PAGE_SIZE);
        return -1;
    }
    list_remove(&h->cold_pages, pg);
    pg->touched = 0;
    if (unlikely(segment_spared(s))) {
        size_t at = (size_t)(page_start(pg) - (uint8_t *)s);
        if (at >= SEGMENT_LARGE_UNIT && medium_spared_along(h))
            segment_spared_upper_early(s, SEG_SMALL); /* hinted below, if untouched */
        segment_spared_commit(s, SEG_SMALL, at, at + PAGE_SIZE); /* the upper unit's hint */
    }
    return 0;
}

/* The free pages, and with cold_too the cold ones, at the end of pg's group of SHARD_RUN_PAGES pages
 * (small.h: runs), how many (up to the whole group; page 0 is never one), and in *start the first of
 * them. */
static unsigned run_open_end(page *pg, page **start, int cold_too)
{
    size_t first = ((uintptr_t)pg & SEGMENT_MASK) / PAGE_DESC_SIZE & ~(size_t)(SHARD_RUN_PAGES - 1);
    page *g = (page *)((uintptr_t)segment_of(pg) + first * PAGE_DESC_SIZE);
    unsigned n = 0;
    while (n < SHARD_RUN_PAGES - (first == 0) && (g[SHARD_RUN_PAGES - 1 - n].state == PAGE_FREE ||
                                                  (cold_too && g[SHARD_RUN_PAGES - 1 - n].state == PAGE_COLD)))
        n++;
    *start = g + (SHARD_RUN_PAGES - n);
    return n;
}

/* How many of h's most recently freed pages, and of its cold pages, run_acquire looks at. */
#define RUN_LOOK 64

/* The pages of a run for h, committed and in no list: in *span how many, and returns the head (NULL
 * when there is none). The run lies at the end of a group of h's free and cold pages, two pages at
 * least: among the groups of h's last RUN_LOOK free pages, the one with the most free pages there (they
 * are resident: committing cold ones instead took test-stress 2 times the faults and 15 MB more), then
 * the longest end; else among those of its first RUN_LOOK cold pages the longest end (so that the pages
 * runs leave serve too); else, for a heap with neither, a new segment's first whole group. While the
 * pool holds pages that other heaps lent (small.h), only free pages make a run, and without two at a
 * group's end the class takes a page of its own, h's or the pool's: at rptest@8 the runs committed
 * 330-430 cold pages (21-27 MB) while the pool held pages, which then went home unused
 * (bench/results/2026-12-07-warm-runs.md). */
static page *run_acquire(heap *h, unsigned *span)
{
    page *best = NULL, *start;
    unsigned most = 0, score = 0, n = 0;
    int cold_too = h->created || load_relaxed(&pool_count) == 0; /* a created heap takes no lent page */
    /* score: 2 a free page, 1 a page; a whole group of free pages (3 * SHARD_RUN_PAGES) ends the look */
    for (page *pg = h->free_pages.last; pg != NULL && score < 3 * SHARD_RUN_PAGES && n < RUN_LOOK; pg = pg->prev, n++) {
        unsigned k = run_open_end(pg, &start, cold_too), free = 0;
        for (unsigned j = 0; j < k; j++)
            free += start[j].state == PAGE_FREE;
        if (k >= 2 && 2 * free + k > score)
            best = start, most = k, score = 2 * free + k;
    }
    n = 0;
    if (best == NULL && cold_too)
        for (page *pg = h->cold_pages.first; pg != NULL && most < SHARD_RUN_PAGES && n < RUN_LOOK; pg = pg->next, n++) {
            unsigned k = run_open_end(pg, &start, 1);
            if (k >= 2 && k > most)
                best = start, most = k;
        }
    if (best == NULL && cold_too && h->free_pages.last == NULL && h->cold_pages.first == NULL && segment_new(h) == 0)
        most = run_open_end((page *)((uint8_t *)h->segments + SHARD_RUN_PAGES * PAGE_DESC_SIZE), &best, 1);
    if (best == NULL)
        return NULL; /* a page of its own, then: a heap with free or cold pages makes no segment for a run */
    for (unsigned j = 0; j < most; j++) {
        if (best[j].state == PAGE_FREE) {
            list_remove(&h->free_pages, best + j);
            h->free_count--;
        } else if (page_commit_cold(h, best + j) != 0) {
            while (j-- > 0) { /* those taken become free pages */
                best[j].state = PAGE_FREE;
                best[j].freed_at = 0;
                list_append(&h->free_pages, best + j);
                h->free_count++;
            }
            return NULL;
        }
    }
    *span = most;
    return best;
}

/* ---- loose pages (small.h) ------------------------------------------------------------------------ */

/* pg, just gone full in h (a thread heap), goes loose: its items out go into `hold`. The stamps come
 * before the word, which publishes them to the thread that may release the page. */
static void page_loosen(heap *h, page *pg)
{
    uint64_t hold = load_relaxed(&pg->hold);
    uint32_t out = (uint32_t)(pg->used + pg->full_out);
    store_relaxed(&pg->loose_at, os_clock_ms());
    store_relaxed(&pg->loose_drains, load_relaxed(&h->drains));
    pg->used = USED_LOOSE;
    store_release(&pg->hold, HOLD_WORD(HOLD_LOOSE, out, HOLD_GEN(hold) + 1));
}

/* pg, just gone full in h (a thread heap), takes its entry in h's full_ring. The page there before it
 * goes loose if nobody touched it since it went full then, in h: still full, with every item out (no
 * free of the owner's since; a full page had all its items out), none waiting in thread_free (nothing
 * freed by another thread since the owner's last drain), and the same full spell (small.h). A page that
 * its owner frees into, or that another thread's frees bring back soon, never goes loose:
 * glibc-thread-fixed's frees land in full pages, and ring's consumers free a producer's page while it
 * waits in the ring. No list: a page that comes back from full is not looked for. */
static void full_ring_push(heap *h, page *pg)
{
    uint32_t seq = h->fulls++;
    page **entry = &h->full_ring[seq % SHARD_LOOSE_AFTER];
    page *old = *entry;
    *entry = pg;
    store_relaxed(&pg->full_seq, seq);
    /* Most often false at the first test: the page went full again since, or came back from full. */
    if (old != NULL && load_relaxed(&old->full_seq) == seq - SHARD_LOOSE_AFTER && old->full &&
        old->state == PAGE_IN_USE && page_span(old) == 1 && /* since retired, now a run's head: never loose */
        old->used + old->full_out == old->capacity && /* not loose: USED_LOOSE */
        segment_of(old)->owner == h && load_relaxed(&old->thread_free) == 0)
        page_loosen(h, old);
}

/* The owner of loose page pg takes it back, full as before (its `used` again the count to its wake): 1,
 * or 0 when the page was released (gone, or its release under way). */
static int page_take_loose(page *pg)
{
    uint64_t hold = load_acquire(&pg->hold);
    while (HOLD_STATE(hold) == HOLD_LOOSE) {
        if (cas_acq_rel(&pg->hold, &hold, HOLD_WORD(HOLD_OWNER, 0, HOLD_GEN(hold) + 1))) {
            pg->used = (int32_t)HOLD_OUT(hold) - pg->full_out;
            return 1;
        }
    }
    return 0;
}

/* A free into loose page pg, whose `hold` was `hold` before its push, made thread_free's count `out`:
 * every item is back. The freeing thread releases the page when it has been loose for a sixty-fourth of
 * the decommit delay and its owner, a heap that a thread runs, has drained nothing since (small.h). The
 * compare-and-swap succeeds only if the word stayed as it was since before the push: the owner neither
 * took the page back nor so exchanged its thread_free word meanwhile, so the count is of this loose
 * spell's items. */
static void page_release_loose(page *pg, uint64_t hold)
{
    if (os_clock_ms() - load_relaxed(&pg->loose_at) < options_values.decommit_delay_ms / 64)
        return;
    /* A heap that no thread runs keeps its pages for the thread that takes it next, until its reserve
     * expires (heap.c); the orphans' trim takes in theirs. */
    heap *owner = load_acquire(&segment_of(pg)->owner);
    if ((uint32_t)load_relaxed(&owner->owner) == 0 || load_relaxed(&owner->drains) != load_relaxed(&pg->loose_drains))
        return;
    if (!cas_acq_rel(&pg->hold, &hold, HOLD_WORD(HOLD_RELEASING, HOLD_OUT(hold), HOLD_GEN(hold))))
        return;
    /* A late free of one of its items (a second free) fails the owner's item test, or a foreign one's,
     * before it reads the item, whose memory may be gone (Windows: no longer readable). */
    uint32_t bound = load_relaxed(&pg->item_bound);
    uint64_t divisor = load_relaxed(&pg->shared_divisor);
    store_release(&pg->item_bound, 0u); /* after `hold` changed: small_check_page reads them first */
    store_release(&pg->shared_divisor, (uint64_t)0);
    if (os_decommit(page_start(pg), PAGE_SIZE) != 0) { /* nothing done: the owner takes it back */
        store_relaxed(&pg->item_bound, bound);
        store_relaxed(&pg->shared_divisor, divisor);
        store_release(&pg->hold, hold);
        return;
    }
    store_release(&pg->hold, HOLD_WORD(HOLD_GONE, 0, HOLD_GEN(hold)));
}

/* pg, released while loose, was drained from h's `delayed` list: it becomes one of h's cold pages. */
static void page_gone(heap *h, page *pg)
{
    uint64_t hold = load_relaxed(&pg->hold);
    segment_of(pg)->full_pages--;
    store_relaxed(&pg->thread_free, (uint64_t)0); /* its count of the items, all back, is void */
    pg->lazy = 0;
    store_relaxed(&pg->shared_block_size, 0u);
    store_relaxed(&pg->shared_divisor, (uint64_t)0);
    pg->free = pg->local_free = NULL;
    pg->used = 0;
    pg->full = 0;
    pg->full_out = 0;
    pg->carved = 0;
    store_relaxed(&pg->item_bound, 0u);
    pg->state = PAGE_COLD;
    store_release(&pg->hold, HOLD_WORD(HOLD_OWNER, 0, HOLD_GEN(hold) + 1));
    list_push_front(&h->cold_pages, pg);
    h->pages_retired++;
}

/* ---- allocation and free ------------------------------------------------------------------------- */

static int adopt_orphan(heap *h);
static void give_full_segment(heap *h, segment *s);

/* The items of thread-free word w, just exchanged out of pg, go to the front of pg's local_free. */
static void take_items(page *pg, uint64_t w)
{
    uint8_t *start = page_start(pg);
    block *head = (block *)(start + ((size_t)THREAD_FREE_HEAD(w) << 4));
    block *tail = (block *)(start + ((size_t)THREAD_FREE_TAIL(w) << 4));
    link_set(tail, pg->local_free);
    pg->local_free = head;
    pg->used -= (int32_t)THREAD_FREE_COUNT(w);
}

/* The first page of its class has no free item: take what other threads freed into it, when it is
 * lazy; else mark it lazy if it has nothing waiting and can carve more, or end its lazy mark if it
 * cannot and so goes full. 1 when items came (in local_free). A page that is not lazy and cannot carve
 * is done without reading thread_free: whatever other threads freed into it queued it at its owner,
 * and that line is a cache miss here, one per page that goes full (bench/medium.c's 8k-16k). */
static int page_collect(page *pg)
{
    int can_carve = pg->carved < pg->capacity;
    if (!pg->lazy && !can_carve)
        return 0;
    uint64_t w = load_relaxed(&pg->thread_free);
    if (w & THREAD_FREE_LAZY) {
        if (w == THREAD_FREE_LAZY && can_carve)
            return 0;
        uint64_t mark = w != THREAD_FREE_LAZY ? THREAD_FREE_LAZY : (uint64_t)0;
        w = exchange_acq_rel(&pg->thread_free, mark);
        pg->lazy = mark != 0;
        if (w == THREAD_FREE_LAZY)
            return 0; /* nothing came meanwhile: the page goes full, its next free queues it */
        take_items(pg, w);
        return 1;
    }
    if (w == 0 && can_carve && cas_acq_rel(&pg->thread_free, &w, THREAD_FREE_LAZY))
        pg->lazy = 1; /* the CAS fails when a free queued the page meanwhile */
    return 0;
}

/* What other threads freed into lazy page pg of h, its word left `mark` (the lazy mark, or 0 to end it);
 * 1 when that emptied the page and retired it. */
static int page_take_lazy(heap *h, page *pg, uint64_t mark)
{
    uint64_t w = load_relaxed(&pg->thread_free);
    if (!(w & THREAD_FREE_LAZY) || w == mark)
        return 0;
    w = exchange_acq_rel(&pg->thread_free, mark);
    pg->lazy = mark != 0;
    if (w == THREAD_FREE_LAZY)
        return 0; /* nothing waited: only the mark ended */
    take_items(pg, w);
    if (pg->used != 0)
        return 0;
    page_emptied(h, pg, 1);
    return 1;
}

/* Take what other threads freed into h's lazy pages, each page's word left `mark` (the lazy mark, or 0 to
 * end it), and retire the pages left empty. Returns the pages of h's class lists, all read; *retired
 * counts those retired. */
static uint32_t take_lazy(heap *h, uint64_t mark, uint32_t *retired)
{
    uint32_t walked = 0;
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT; cls++) {
        page *next;
        for (page *pg = h->classes[cls].first; pg != NULL; pg = next, walked++) {
            next = pg->next;
            *retired += (uint32_t)page_take_lazy(h, pg, mark);
        }
    }
    return walked;
}

/* h is out of free pages: take in what other threads freed into its lazy pages, so that the pages they
 * emptied serve before a page h never used. The walk reads every page in h's class lists. The pages it
 * retires serve the next slow paths that need a page; after them, as many skip the walk as make up one
 * for each SHARD_SWEEP_PAGES pages it read. */
static void sweep_lazy(heap *h)
{
    if (h->sweep_wait != 0) {
        h->sweep_wait--;
        return;
    }
    uint32_t retired = 0;
    uint32_t due = take_lazy(h, THREAD_FREE_LAZY, &retired) / SHARD_SWEEP_PAGES;
    h->sweep_wait = due > retired ? due - retired : 0;
}

/* small_alloc_slow's class cls has no page left: h takes a page for it, which has items, or the orphan
 * segment it adopts gave it pages of the class (&small_empty_page: look again), or none (NULL). Out of
 * line, so that the slow path's common steps keep to a few registers. */
static __attribute__((noinline)) page *class_page_new(heap *h, unsigned cls)
{
    /* Without a free page of its own, h takes an orphan segment's free pages, and its pages in use,
     * which may serve this class (once: h has a free page after it). */
    if (h->free_pages.last == NULL)
        sweep_lazy(h);
    if (h->free_pages.last == NULL && adopt_orphan(h) == 0)
        return &small_empty_page;
    small_trim(h);
    unsigned span = 1; /* run_acquire sets it when it gives a run */
    /* A run of h's free or cold pages; while the pool has pages, of h's free ones alone (run_acquire). */
    page *pg = class_span(cls) > 1 ? run_acquire(h, &span) : NULL;
    if (pg == NULL)
        pg = page_acquire(h);
    if (pg == NULL)
        return NULL;
    page_init(pg, cls, span);
    class_push_front(h, pg);
    page_carve(h, pg);
    return pg;
}

void *small_alloc_slow(heap *h, unsigned cls)
{
    heap_reserve_tick();
    if (h->gather_page != NULL)
        small_flush_gathered(h);
    if (load_relaxed(&h->delayed) != NULL)
        small_drain_delayed(h, 1);
    if (load_relaxed(&h->delayed_arenas) != NULL) /* medium chunks freed by others: on slow paths too */
        medium_drain_delayed(h);
    page *pg;
    for (;;) {
        pg = h->classes[cls].first;
        if (pg == NULL) {
            pg = class_page_new(h, cls);
            if (pg == &small_empty_page)
                continue;
            if (pg == NULL)
                return NULL;
            break;
        }
        if (page_ready(pg))
            break;
        if (page_collect(pg) && page_ready(pg))
            break;
        if (pg->carved < pg->capacity) {
            page_carve(h, pg);
            break;
        }
        class_remove_first(h, pg); /* full: out of the list until its wake count of items comes back */
        page_set_full(h, pg);
        if (unlikely(pg->state == PAGE_LENT))
            continue; /* a guest page: never loose, and its segment is not h's to give */
        if (h->loose_skip != 0)
            h->loose_skip--; /* its thread's frees took loose pages back lately: this one may not go loose */
        else if (!h->created && page_span(pg) == 1) /* runs never go loose (small.h) */
            full_ring_push(h, pg);
        segment *s = segment_of(pg);
        if (s->full_pages == SEGMENT_PAGES - 1)
            give_full_segment(h, s);
    }
    block *b = page_pop(pg);
    debug_check_page(pg, "page inconsistent after the allocation slow path");
    return b;
}

/* b, an item pg (a page of h's or lent to h) handed out, goes onto its free list; the page empties or
 * goes back into its class list when that was its last item out or its wake count (small.h). */
static void free_push(heap *h, page *pg, block *b)
{
#if SHARD_HARDENED
    block *head = pg->free;
    if (head != NULL && unlikely(!link_fits(pg, head, link_get(head))))
        small_link_damaged(pg, head, b);
#endif
    link_set(b, pg->free);
    pg->free = b;
    pg->used--;
    debug_check_page(pg, "page inconsistent after a free");
    if (pg->used > 0)
        return; /* an ordinary free: the C fast path sends none here, a caller that skips its tests may */
    if (!pg->full) {
        page_emptied(h, pg, 1);
        return;
    }
    page_clear_full(h, pg); /* a full page had its wake count of items back: to the tail of its class */
    if (pg->used == 0)
        page_emptied(h, pg, 0);
    else
        class_append(h, pg);
}

/* The index of b among the items carved in pg, a guest's page (whose item_bound stays 0), or -1. */
static long guest_item(const page *pg, const block *b)
{
    uint32_t off = (uint32_t)((uintptr_t)b & (PAGE_SIZE - 1)); /* an item's (tested first): below the carved */
    return small_valid_foreign(pg, b) && off < (uint32_t)pg->carved * pg->block_size ? (long)(off / pg->block_size) : -1;
}

void small_free_guest(heap *h, page *pg, block *b)
{
    if (unlikely(guest_item(pg, b) < 0 || page_used(pg) == pg->sole)) {
        error_invalid_pointer(SHARD_ERROR_INVALID_FREE, b); /* not an item out: also a second free of the
                                                            * page's last one */
        return;
    }
    free_push(h, pg, b);
}

/* A free by h into a lent page, which h's item test refused (item_bound stays 0 there): h's own guest
 * page's, or another heap's item, which goes as another thread's free (small.h, lent pages). */
static __attribute__((noinline)) void free_into_lent(heap *h, page *pg, block *b)
{
    if (load_relaxed(&pg->lend) == LEND_GUEST && page_user(pg) == h)
        small_free_guest(h, pg, b);
    else if (small_valid_foreign(pg, b))
        small_free_foreign(h, pg, b);
    else
        error_invalid_pointer(SHARD_ERROR_INVALID_FREE, b);
}

void small_free_local_slow(heap *h, page *pg, block *b)
{
    /* A page lent to the pool or a guest keeps item_bound 0, its segment owner's to write; the owner's
     * fast paths and a heap that claimed it for a free send those frees here. */
    if (unlikely(load_relaxed(&pg->item_bound) == 0) && load_relaxed(&pg->lend) != LEND_NONE) {
        free_into_lent(h, pg, b);
        return;
    }
    page *in = pg; /* the page b lies in, whose descriptor has b's item test */
    if (pg->used == USED_TAIL) { /* a run's tail: the free goes to its head, as the fast path's would */
        pg = run_head(pg);
        if (likely(page_has_item(in, b)) && likely(small_free_fast(pg, b)))
            return;
    }
    if (unlikely(pg->used == USED_LOOSE)) {
        if (!page_take_loose(pg)) {
            /* Released: every item had come back, b too, if it is one; its memory is not read. */
            error_invalid_pointer(page_has_item_any_thread(in, b) ? SHARD_ERROR_DOUBLE_FREE : SHARD_ERROR_INVALID_FREE, b);
            return;
        }
        if (load_relaxed(&pg->loose_drains) == h->drains) { /* and no other thread's frees came meanwhile */
            h->loose_skip += SHARD_LOOSE_SKIP;
            if (h->loose_skip > SHARD_LOOSE_SKIP_MAX)
                h->loose_skip = SHARD_LOOSE_SKIP_MAX;
        }
    }
    /* Not an item of the page, or a page with no item out: the second free of its last item (the
     * fast path sends every free here that would make `used` 0 or less) is caught here at no cost. */
    if (SHARD_HARDENED && page_has_item(in, b) && unlikely(small_looks_free(pg, b))) {
        error_invalid_pointer(SHARD_ERROR_DOUBLE_FREE, b); /* also the second free of its last item */
        return;
    }
    if (unlikely(!page_has_item(in, b) || page_used(pg) == pg->sole)) {
        error_invalid_pointer(SHARD_ERROR_INVALID_FREE, b);
        return;
    }
    free_push(h, pg, b);
}

/* Put pg, whose thread_free word is not 0, on owner's `delayed` list. */
static void page_queue(heap *owner, page *pg)
{
    page *head = load_relaxed(&owner->delayed);
    do {
        pg->next_delayed = head;
    } while (!cas_release(&owner->delayed, &head, pg));
    heap_foreign_queued(owner);
}

/* Push the list head..tail of n items of pg, whose items start at `start` (a run's lie up to
 * SHARD_RUN_PAGES pages on), on pg's thread-free list; the word before the push (and after it in *pushed,
 * unless NULL). */
static inline uint64_t push_foreign(page *pg, uint8_t *start, block *head, block *tail, uint32_t n,
                                    uint64_t *pushed)
{
    uint32_t first = (uint32_t)(((uint8_t *)head - start) >> 4);
    uint32_t last = (uint32_t)(((uint8_t *)tail - start) >> 4);
    uint64_t old = load_relaxed(&pg->thread_free), word;
    do {
        if (THREAD_FREE_COUNT(old) == 0) {
            link_set(tail, NULL);
            word = (old & THREAD_FREE_LAZY) | THREAD_FREE_WORD(first, last, n);
        } else {
            link_set(tail, (block *)(start + ((size_t)THREAD_FREE_HEAD(old) << 4)));
            word = (old & THREAD_FREE_LAZY) |
                   THREAD_FREE_WORD(first, THREAD_FREE_TAIL(old), THREAD_FREE_COUNT(old) + n);
        }
    } while (!cas_acq_rel(&pg->thread_free, &old, word));
    if (pushed != NULL)
        *pushed = word;
    return old;
}

/* The push of head..tail (n items) into pg for a page that its owner does not count (`hold` read before
 * the push): a loose one, whose last item back releases it, or one released or being released, whose
 * items all came back (so head is not live: a single free, never a gathered list, finds it so). Out of
 * line, so that the common path saves no register. */
__attribute__((cold, noinline)) static void free_foreign_loose(page *pg, block *head, block *tail, uint32_t n,
                                                               uint64_t hold)
{
    /* A released page's memory may be gone (Windows: unreadable): its items are not read. */
    if (HOLD_STATE(hold) != HOLD_LOOSE || (SHARD_HARDENED && small_looks_free(pg, head))) {
        error_invalid_pointer(SHARD_ERROR_DOUBLE_FREE, head);
        return;
    }
    uint64_t word, old = push_foreign(pg, page_start(pg), head, tail, n, &word);
    if (THREAD_FREE_COUNT(word) == HOLD_OUT(hold))
        page_release_loose(pg, hold); /* the last item of a loose page is back */
    if (old == 0)
        page_queue(page_user(pg), pg); /* as in push_items */
}

/* head..tail, n items of pg (a run's head) whose items start at `start`, go to pg's thread-free list. */
static inline void push_items(page *pg, uint8_t *start, block *head, block *tail, uint32_t n)
{
    uint64_t hold = load_acquire(&pg->hold); /* before the push: page_release_loose */
    if (unlikely(HOLD_STATE(hold) != HOLD_OWNER)) {
        free_foreign_loose(pg, head, tail, n, hold);
        return;
    }
    if (SHARD_HARDENED && unlikely(small_looks_free(pg, head))) { /* hardened: one item at a time */
        error_invalid_pointer(SHARD_ERROR_DOUBLE_FREE, head);
        return;
    }
    if (push_foreign(pg, start, head, tail, n, NULL) != 0)
        return; /* queued already, or lazy: its owner takes the items when it allocates from it */
    /* First items since the owner's last drain: queue the page at its owner, exactly once. The CAS that
     * found 0 read the owner's exchange in small_drain_delayed and acquired with it, so the owner's read
     * of next_delayed there comes before this write (on x86 the same lock cmpxchg as a release CAS). */
    page_queue(page_user(pg), pg);
}

/* ---- gathered frees ------------------------------------------------------------------------------ */

/* Every foreign free is a compare-and-swap on its page's thread_free word, a line the owner takes back at
 * each drain: a thread that frees what another made, block after block (xmalloc's consumers, a batch
 * handed on), pays a contended locked instruction for each. So a thread with a heap gathers its frees
 * into one page of another heap in a list of its own, once SHARD_GATHER_AFTER in a row went to that
 * page, and pushes the list whole: at a free into another page, at SHARD_GATHER_ITEMS items, at its own
 * allocation slow path, when its heap is drained (thread exit, shard_collect, memory pressure, a trim)
 * and before it walks heaps. While a list is gathered, the free fast paths (asm/fast.asm, api.c) add to
 * it themselves: a block of the gathered page that passes the item test of the page's shared line goes
 * on without the slow path's look-ups, but for the list's last item, which the slow path pushes
 * (bench/results/2026-12-07-gathered-fast-path.md). What waits is one page's items at most: its owner
 * sees them out a little longer (the statistics count them free: small_count). Not in the hardened
 * build, whose double-free test looks for an item in the page's lists, nor for a created heap's page
 * (shard_heap_destroy releases its memory whatever is out), nor where a free at once does more
 * (gather_may). A thread without a heap takes one for this (heap_for_frees, from api_free_slow). */

/* Whether h's thread may gather frees into pg (a run's head): a page its owner counts (not loose: the
 * free that brings the last item back releases it) of a heap that a thread runs (one that waits is
 * taken with the frees made into it), not an embedder's. Read at a gathering's start only: a page that
 * goes loose meanwhile, or whose heap's thread ends, takes the list as it would a free. */
static int gather_may(const heap *h, const page *pg)
{
    heap *user = page_user(pg);
    return HOLD_STATE(load_relaxed(&pg->hold)) == HOLD_OWNER && user != h && heap_has_thread(user);
}

void small_flush_gathered(heap *h)
{
    page *pg = h->gather_page;
    if (pg == NULL)
        return;
    uint32_t n = h->gather_count;
    store_relaxed(&h->gather_page, (page *)NULL); /* both read by other threads' statistics */
    store_relaxed(&h->gather_count, 0u);
    push_items(pg, page_start(pg), h->gather_head, h->gather_tail, n);
}

/* small_free_foreign's free of b, an item of pg (a run's head) whose items start at `start`, by h's
 * thread when pg was its last foreign free's page or a list is gathered: b joins the list, starts one,
 * or goes at once (after the list, if pg is another page). Out of line, so that the frees that change
 * page (all of them, where sizes vary: ring) save no register. */
static __attribute__((noinline)) void gather_free(heap *h, page *pg, uint8_t *start, block *b)
{
    if (pg == h->gather_page) {
        if (heap_gather_link(h, b) >= SHARD_GATHER_ITEMS)
            small_flush_gathered(h); /* gather_last stays: the next free starts a list again */
        return;
    }
    small_flush_gathered(h);
    if (pg != h->gather_last) {
        h->gather_last = pg;
        h->gather_run = 1;
    } else if (++h->gather_run >= SHARD_GATHER_AFTER && gather_may(h, pg)) {
        h->gather_head = h->gather_tail = b;
        store_relaxed(&h->gather_count, 1u);
        store_relaxed(&h->gather_page, pg);
        return;
    }
    push_items(pg, start, b, b, 1);
}

void small_free_foreign(heap *h, page *pg, block *b)
{
    /* b's page's own descriptor, or its run's head (small.h), and where the head's items start */
    size_t back = load_relaxed(&pg->shared_back);
    pg -= back;
    uint8_t *start = (uint8_t *)((uintptr_t)b & ~(uintptr_t)(PAGE_SIZE - 1)) - back * PAGE_SIZE;
    if (!SHARD_HARDENED && h != NULL) {
        if (unlikely(pg == h->gather_last || h->gather_page != NULL)) {
            gather_free(h, pg, start, b);
            return;
        }
        h->gather_last = pg;
        h->gather_run = 1;
    }
    push_items(pg, start, b, b, 1);
}

void small_link_damaged(page *pg, block *b, block *freed)
{
    /* The list ends at b: what the damaged link led to is never handed out. The items behind it are out
     * of every list and not counted in `used`, so they come back when the page empties and is carved
     * anew. */
    link_set(b, NULL);
    /* Found by the free of the item just before b: most likely an overflow out of that block. */
    if (freed != NULL && (uint8_t *)freed + pg->block_size == (uint8_t *)b)
        error_invalid_pointer(SHARD_ERROR_OVERFLOW, freed);
    else
        error_invalid_pointer(SHARD_ERROR_FREE_LIST, b);
}

void small_drain_delayed(heap *h, int lazy)
{
    page *pg = exchange_acq_rel(&h->delayed, NULL);
    if (pg != NULL)
        store_relaxed(&h->drains, h->drains + 1); /* its loose pages are not idle ones (small.h) */
    while (pg != NULL) {
        page *next = pg->next_delayed; /* before the exchange: then the page may be queued again */
        if (unlikely(pg->state == PAGE_LENT) && load_relaxed(&pg->lend) >= LEND_HOME) {
            page_home(h, pg); /* back from the pool (small.h, lent pages) */
            pg = next;
            continue;
        }
        if (unlikely(h->forwards)) {
            /* A page of a segment h gave to the orphans was queued here by a free that read the owner
             * before the change: it goes on to the segment's owner now, still queued (thread_free is
             * not 0, so no free queues it again meanwhile). Only h's own thread moves a segment to h. */
            heap *owner = page_user(pg);
            if (owner != h) {
                page_queue(owner, pg);
                pg = next;
                continue;
            }
        }
        if (unlikely(pg->used == USED_LOOSE) && !page_take_loose(pg)) {
            if (HOLD_STATE(load_acquire(&pg->hold)) == HOLD_GONE)
                page_gone(h, pg);
            else
                page_queue(h, pg); /* its release is under way: the next drain sees how it ended (in a
                                    * fork's child, where the releasing thread is gone, it stays so) */
            pg = next;
            continue;
        }
        uint64_t w = exchange_acq_rel(&pg->thread_free, lazy ? THREAD_FREE_LAZY : (uint64_t)0);
        pg->lazy = (uint8_t)(lazy != 0);
        shard_assert(w != 0 && !(w & THREAD_FREE_LAZY), "a queued page has items in thread_free, and no lazy mark");
        int was_full = pg->full;
        if (was_full)
            page_clear_full(h, pg); /* other threads' frees bring a full page back at once */
        take_items(pg, w);
        debug_check_page(pg, "page inconsistent after taking its thread-free list");
        if (was_full) {
            if (pg->used == 0)
                page_emptied(h, pg, 0);
            else
                class_append(h, pg);
        } else if (pg->used == 0) {
            page_emptied(h, pg, 1);
        }
        pg = next;
    }
}

void small_settle(heap *h)
{
    uint32_t retired = 0;
    (void)take_lazy(h, 0, &retired);
}

/* ---- orphan segments ------------------------------------------------------------------------------- */

/* The orphans: a heap that no thread runs, its lists changed only under orphan_lock. Its owner word is 0,
 * so a foreign free that queues a page here arms the stack's trim (heap_foreign_queued), which drains
 * it (small_orphan_expire). It is not in the list of all heaps; the statistics and walks ask for it. */
static heap orphans = {
    .direct = {[0 ... SHARD_DIRECT_COUNT - 1] = &small_empty_page},
    .own = {[0] = 1},
    .forwards = 1, /* segments leave it: pages queued at it after that go on to their new owner */
};
static spinlock orphan_lock;
/* orphans.free_count as of the last change, for adopt_orphan's look before it takes the lock (the
 * count itself is written without atomics, under the lock). */
static uint32_t orphan_free_pages;

int small_is_orphans(const heap *h) { return h == &orphans; }

static void orphan_unlock(void)
{
    store_relaxed(&orphan_free_pages, orphans.free_count);
    spin_unlock(&orphan_lock);
}

/* pg, a page of a segment that moves from `from` to `to`, leaves from's lists for to's, as it is. A full
 * page is in no list and stays so; its items come back to whoever owns it then. */
static void page_move(heap *from, heap *to, page *pg)
{
    if (pg->state == PAGE_FREE) {
        list_remove(&from->free_pages, pg);
        from->free_count--;
        list_append(&to->free_pages, pg); /* keeps its freed_at: its delay goes on */
        to->free_count++;
    } else if (pg->state == PAGE_COLD) {
        list_remove(&from->cold_pages, pg);
        list_append(&to->cold_pages, pg);
    } else if (pg->state == PAGE_IN_USE && !pg->full) { /* a run's tail moves with its head */
        class_remove(from, pg); /* takes the extra one of an only page away */
        if (pg->used == 0)
            page_emptied(to, pg, 0);
        else
            class_append(to, pg);
    }
}

/* Segment s, with its pages, blocks and all, leaves `from` for `to`: the owner word first changes, so a
 * foreign free that queues a page from then on queues it at `to`; one that read `from` before queues it
 * there, and from's next drain sends it on (`forwards`). */
static void segment_move(heap *from, heap *to, segment *s)
{
    segment **link = &from->segments;
    while (*link != s)
        link = &(*link)->next;
    store_release(link, s->next); /* statistics walk the list (segment_walk_begin) */
    segment_leave(from, s);
    store_release(&s->owner, to);
    store_relaxed(&s->given_by, to == &orphans ? from : (heap *)NULL); /* small_take_back reads it unlocked */
    /* Else every page is full, in no list: none to move. From the last page down: a run's head that
     * page_move retires frees its tails into to's lists, and they were passed over already. */
    if (s->full_pages != SEGMENT_PAGES - 1)
        for (unsigned i = SEGMENT_PAGES - 1; i >= 1; i--)
            page_move(from, to, (page *)((uint8_t *)s + i * PAGE_DESC_SIZE));
    segment_enter(to, s);
}

void small_orphan_give(heap *h)
{
    if (h->segments == NULL || !spin_lock_unless_fork(&orphan_lock))
        return; /* nothing to give; or another thread's fork holds the orphans: h keeps its segments */
    h->forwards = 1; /* before the first owner word changes */
    for (segment *s = h->segments, *next; s != NULL; s = next) {
        next = s->next;
        if (s->lent == 0) /* else its lent pages tie it to h (small.h) */
            segment_move(h, &orphans, s);
    }
    if (orphans.free_count > SHARD_ORPHAN_PAGES)
        trim_at(&orphans, UINT64_MAX, SHARD_ORPHAN_PAGES); /* the oldest first */
    int due = orphans.free_count != 0;
    debug_check_heap(&orphans, "the orphans inconsistent after a heap gave its segments");
    orphan_unlock();
    if (due)
        heap_arm_reserve_due(os_clock_ms() + options_values.reserve_delay_ms);
}

/* s leaves h, a thread heap whose thread runs, for the orphans, as it is: every page of it full. Its
 * pages serve no allocation of h until h takes it back, and the items that other threads free there
 * come back to whichever heap takes the segment. */
static void give_full_segment(heap *h, segment *s)
{
    if (h->created || s->lent != 0)
        return; /* a created heap keeps what is charged to it; lent pages tie s to h (small.h) */
    if (!spin_lock_unless_fork(&orphan_lock))
        return; /* a fork's lock: h keeps s */
    h->forwards = 1; /* before the owner word changes */
    segment_move(h, &orphans, s);
    debug_check_heap(&orphans, "the orphans inconsistent after a heap gave a full segment");
    orphan_unlock();
}

int small_take_given(heap *h, segment *s)
{
    if (load_relaxed(&s->owner) != &orphans || !spin_lock_unless_fork(&orphan_lock))
        return -1;
    int taken = s->owner == &orphans && s->given_by == h; /* not adopted meanwhile */
    if (taken) {
        if (load_relaxed(&orphans.delayed) != NULL)
            small_drain_delayed(&orphans, 0); /* what others freed into its pages comes with them */
        segment_move(&orphans, h, s);
        debug_check_heap(&orphans, "the orphans inconsistent after a heap took back a segment");
    }
    orphan_unlock();
    return taken ? 0 : -1;
}

/* For h, which has no free page: the segment of the orphans' most recently freed page becomes h's, with
 * its free pages and its pages in use: 0, or -1 when there is none. What other threads freed into the
 * orphans is taken in first: it may empty pages of a segment whose free pages went back to the OS (an
 * expired reserve's) or of a full segment a running heap gave, and a heap that took a new page instead
 * would leave those pages waiting for the next trim. */
static int adopt_orphan(heap *h)
{
    if (h->created ||
        (load_relaxed(&orphan_free_pages) == 0 && load_relaxed(&orphans.delayed) == NULL) ||
        !spin_lock_unless_fork(&orphan_lock))
        return -1;
    if (load_relaxed(&orphans.delayed) != NULL)
        small_drain_delayed(&orphans, 0); /* what other threads freed into it, before its pages move */
    segment *s = orphans.free_pages.last != NULL ? segment_of(orphans.free_pages.last) : NULL;
    if (s != NULL)
        segment_move(&orphans, h, s);
    debug_check_heap(&orphans, "the orphans inconsistent after a heap took a segment");
    orphan_unlock();
    return s != NULL ? 0 : -1;
}

uint64_t small_orphan_expire(uint64_t now)
{
    if ((load_relaxed(&orphans.segments) == NULL && load_relaxed(&orphans.delayed) == NULL) ||
        !spin_lock_unless_fork(&orphan_lock))
        return 0;
    if (load_relaxed(&orphans.delayed) != NULL)
        small_drain_delayed(&orphans, 0);
    small_keep(&orphans, UINT32_MAX, 1); /* a class's only page, if empty, is free: no thread keeps it */
    trim_at(&orphans, now, 0); /* with now UINT64_MAX all of them, else those free for the delay */
    unsigned spared = small_release_empty(&orphans, now != UINT64_MAX);
    uint64_t due = 0; /* the next trim: the free pages' decommit, the spare segments' expiry */
    if (now != UINT64_MAX && orphans.free_count != 0)
        due = now + options_values.decommit_delay_ms;
    if (now != UINT64_MAX && spared != 0 && (due == 0 || options_values.reserve_delay_ms < options_values.decommit_delay_ms))
        due = now + options_values.reserve_delay_ms;
    debug_check_heap(&orphans, "the orphans inconsistent after their trim");
    orphan_unlock();
    return due;
}

void small_orphan_count(small_counts *c, size_t *segments)
{
    small_count(&orphans, c);
    size_t n = 0;
    for (segment *s = load_acquire(&orphans.segments); s != NULL; s = load_acquire(&s->next))
        n++;
    *segments = n;
}

void small_orphan_visit(visitor *v)
{
    if (!spin_lock_unless_fork(&orphan_lock))
        return;
    small_visit(&orphans, v);
    spin_unlock(&orphan_lock);
}

int small_orphan_check(void)
{
    if (!spin_lock_unless_fork(&orphan_lock))
        return 0;
    int problems = heap_check(&orphans);
    spin_unlock(&orphan_lock);
    return problems;
}

void small_orphan_lock_for_fork(int take)
{
    if (take)
        spin_lock_for_fork(&orphan_lock);
    else
        spin_unlock_for_fork(&orphan_lock);
}

/* ---- statistics and checker ------------------------------------------------------------------------ */

void small_count(heap *h, small_counts *c)
{
    c->retired += load_relaxed(&h->pages_retired);
    /* What h's thread freed and gathered (gathered frees, above) is not live, though its page, which
     * another heap's sum may count (or has), does not know it yet. */
    page *gathered = load_relaxed(&h->gather_page);
    if (gathered != NULL) {
        size_t n = load_relaxed(&h->gather_count);
        c->live -= n;
        c->live_bytes -= n * load_relaxed(&gathered->shared_block_size);
    }
    for (segment *s = load_acquire(&h->segments); s != NULL; s = load_acquire(&s->next)) {
        for (unsigned i = 1; i < SEGMENT_PAGES; i++) {
            const page *pg = (const page *)((const uint8_t *)s + i * PAGE_DESC_SIZE);
            unsigned state = load_relaxed(&pg->state);
            if (state == PAGE_LENT) { /* its guest's, counted here, once, or the pool's */
                unsigned lend = load_relaxed(&pg->lend);
                if (lend != LEND_GUEST) {
                    if (lend == LEND_POOL || lend == LEND_HOME_KEPT)
                        c->free++;
                    else
                        c->decommitted++;
                    continue;
                }
                state = PAGE_IN_USE;
            }
            if (state == PAGE_IN_USE) {
                long used = load_relaxed(&pg->used);
                if (used == USED_LOOSE) {
                    uint64_t hold = load_relaxed(&pg->hold);
                    if (HOLD_STATE(hold) != HOLD_LOOSE) { /* released: no item, no memory */
                        c->decommitted++;
                        continue;
                    }
                    used = HOLD_OUT(hold);
                } else if (load_relaxed(&pg->full)) {
                    used += load_relaxed(&pg->full_out);
                }
                used -= load_relaxed(&pg->sole); /* the extra one of a class's only page */
                uint64_t w = load_relaxed(&pg->thread_free);
                size_t live = (size_t)used - (size_t)THREAD_FREE_COUNT(w); /* freed by others, not yet taken in */
                c->used++;
                c->live += live;
                c->live_bytes += live * load_relaxed(&pg->shared_block_size);
            } else if (state == PAGE_TAIL) {
                c->used++; /* its items are its head's */
            } else if (state == PAGE_FREE) {
                c->free++;
            } else {
                c->decommitted++;
            }
        }
    }
}


/* The index of b among the items pg has carved (pg a page of its own or a run's head; the item test of
 * the page b lies in), or -1 when b is not one of them: the walks' and the checker's test, before they
 * read b's link. */
static long item_index(const page *pg, const block *b)
{
    uintptr_t off = (uintptr_t)b - (uintptr_t)page_start(pg); /* below the start: wraps, and fails */
    if (off >= (uintptr_t)page_span(pg) * PAGE_SIZE)
        return -1;
    if (pg->state == PAGE_LENT) /* a guest's page (a page of its own): item_bound stays 0 */
        return guest_item(pg, b);
    if (!page_has_item(pg + (off >> PAGE_SHIFT), b))
        return -1;
    return (long)((off >> PAGE_SHIFT) * class_capacity[pg->cls] + (off & (PAGE_SIZE - 1)) / pg->block_size);
}

static int carved_item(const page *pg, const block *b) { return item_index(pg, b) >= 0; }

/* Marks the items of a free list in `bits` (one per item index); stops at anything that is not an item of
 * pg (a broken list is shard_check's to report, not the walk's to follow). */
static void mark_free(const page *pg, const block *b, const block *last, long limit, uint64_t *bits)
{
    for (long n = 0; b != NULL && n < limit; n++) {
        long k = item_index(pg, b);
        if (k < 0)
            return;
        size_t i = (size_t)k;
        bits[i / 64] |= (uint64_t)1 << (i % 64);
        if (b == last)
            return;
        b = link_get(b);
    }
}

/* Reports pg's live items to v (bits: room for an index per item). */
static void visit_page(const page *pg, visitor *v, uint64_t *bits)
{
    if (pg->carved == 0)
        return;
    /* A loose page: its items as its thread_free list shows them, unless it was released, or is
     * released while they are read (its memory gone, the list with it): no item is live then. */
    uint64_t hold = load_acquire(&pg->hold);
    if (pg->used == USED_LOOSE && HOLD_STATE(hold) != HOLD_LOOSE)
        return;
    mem_zero(bits, PAGE_SIZE / 16 / 8);
    mark_free(pg, pg->free, NULL, pg->carved, bits);
    mark_free(pg, pg->local_free, NULL, pg->carved, bits);
    uint64_t w = load_acquire(&pg->thread_free); /* others push meanwhile: what was there now */
    if (THREAD_FREE_COUNT(w) != 0) {
        uint8_t *start = page_start(pg);
        mark_free(pg, (const block *)(start + ((size_t)THREAD_FREE_HEAD(w) << 4)),
                  (const block *)(start + ((size_t)THREAD_FREE_TAIL(w) << 4)), pg->carved, bits);
    }
    if (pg->used == USED_LOOSE && load_acquire(&pg->hold) != hold)
        return;
    for (unsigned k = 0; k < pg->carved; k++)
        if (!(bits[k / 64] >> (k % 64) & 1) && visit_block(v, page_item(pg, k), pg->block_size, VISIT_SMALL))
            return;
}

void small_visit(heap *h, visitor *v)
{
    uint64_t bits[PAGE_SIZE / 16 / 64]; /* an item index each: 16 bytes is the least class */
    for (segment *s = h->segments; s != NULL && !v->stop; s = s->next) {
        for (unsigned i = 1; i < SEGMENT_PAGES && !v->stop; i++) {
            const page *pg = (const page *)((const uint8_t *)s + i * PAGE_DESC_SIZE);
            if (pg->state == PAGE_IN_USE) /* not a lent one: its guest's walk reports it */
                visit_page(pg, v, bits);
        }
    }
    /* Pages lent to h: in its class lists, or full in guest_full */
    if (h->guests == 0)
        return;
    for (unsigned cls = 0; cls < SHARD_CLASS_COUNT && !v->stop; cls++)
        for (const page *pg = h->classes[cls].first; pg != NULL && !v->stop; pg = pg->next)
            if (pg->state == PAGE_LENT)
                visit_page(pg, v, bits);
    for (const page *pg = h->guest_full.first; pg != NULL && !v->stop; pg = pg->next)
        visit_page(pg, v, bits);
}

/* Length of a free list whose items must lie in pg at class offsets below `carved`; -1 if not. */
static long list_length(const page *pg, const block *b, long limit)
{
    long n = 0;
    for (; b != NULL; b = link_get(b)) {
        if (!carved_item(pg, b) || ++n > limit)
            return -1;
    }
    return n;
}

/* What the item test of page j of run pg (j = 0: the head itself, or a page of its own) must see. */
static uint32_t run_item_bound(const page *pg, unsigned j)
{
    long per = class_capacity[pg->cls], k = (long)pg->carved - (long)j * per;
    return (uint32_t)(k < 0 ? 0 : k > per ? per : k) * page_item_step(pg);
}

/* A run's tail: its head serves a class as a run that holds it, and its item test's fields agree. */
static int check_tail(const page *pg)
{
    const page *head = (const page *)((const uint8_t *)pg - (size_t)pg->back * PAGE_DESC_SIZE);
    if (insist(pg->back != 0 && head->state == PAGE_IN_USE && pg->back < page_span(head) &&
                    load_relaxed(&pg->shared_back) == pg->back,
                "small: a run's tail whose head is not a run that holds it:", pg))
        return 1;
    return insist(pg->used == USED_TAIL && pg->cls == head->cls && pg->block_size == head->block_size &&
                      pg->item_mul == head->item_mul && load_relaxed(&pg->shared_block_size) == head->block_size &&
                      load_relaxed(&pg->shared_divisor) == load_relaxed(&head->shared_divisor) &&
                      load_acquire(&pg->item_bound) == run_item_bound(head, pg->back) && pg->free == NULL &&
                      pg->local_free == NULL && load_relaxed(&pg->thread_free) == 0,
                  "small: a run's tail that differs from its head, or with items of its own:", pg);
}

int small_check_page(const page *pg)
{
    if (pg->state == PAGE_TAIL)
        return check_tail(pg);
    int guest = pg->state == PAGE_LENT;
    if (guest && load_relaxed(&pg->lend) != LEND_GUEST) /* in the pool, or on its way home */
        return insist(load_relaxed(&pg->lend) != LEND_NONE && pg->free == NULL && pg->used == 0 &&
                          load_relaxed(&pg->item_bound) == 0 && load_relaxed(&pg->shared_divisor) == 0,
                      "small: a lent page out of use with items, or not marked lent:", pg);
    if (pg->state != PAGE_IN_USE && !guest)
        return insist(pg->state == PAGE_FREE || pg->state == PAGE_COLD, "small: a page with an unknown state:", pg);
    /* What a release changes is read before `hold`: unchanged if `hold` still shows the page loose. */
    uint32_t item_bound = load_acquire(&pg->item_bound);
    uint64_t shared_divisor = load_acquire(&pg->shared_divisor);
    uint64_t hold = load_acquire(&pg->hold);
    int loose = pg->used == USED_LOOSE;
    if (loose && HOLD_STATE(hold) != HOLD_LOOSE) /* released: its memory and its lists are gone */
        return insist(pg->full == 1 && pg->sole == 0 && HOLD_STATE(hold) != HOLD_OWNER,
                      "small: a page whose `used` says loose and whose hold does not:", pg);
    int problems = insist(loose || HOLD_STATE(hold) == HOLD_OWNER, "small: a page whose hold says loose and whose `used` does not:", pg);
    long cap = pg->capacity;
    long nfree = list_length(pg, pg->free, cap), nlocal = list_length(pg, pg->local_free, cap);
    long used = (long)page_used(pg) - pg->sole;
    uint64_t w = load_acquire(&pg->thread_free);
    long nthread = 0;
    if (THREAD_FREE_COUNT(w) != 0) {
        const uint8_t *start = page_start(pg);
        const block *b = (const block *)(start + ((size_t)THREAD_FREE_HEAD(w) << 4));
        const block *tail = (const block *)(start + ((size_t)THREAD_FREE_TAIL(w) << 4));
        /* Each link is followed only from an item of the page: a damaged one (a write after free into an
         * item that waits here) ends the walk, with a count that differs. */
        for (nthread = 1; b != tail && nthread <= cap && carved_item(pg, b); nthread++)
            b = link_get(b);
        if (b != tail)
            nthread = -1;
        if (loose && load_acquire(&pg->hold) != hold)
            return problems; /* released while its list was read */
        problems += insist(nthread == (long)THREAD_FREE_COUNT(w), "small: thread_free's count differs from its list in page", pg);
    }
    if (nfree < 0 || nlocal < 0)
        problems += insist(0, "small: a free item outside its page or off its class's offsets in page", pg);
    else
        problems += insist(nfree + nlocal + used == pg->carved, "small: free + local_free + used != carved in page", pg);
    problems += insist(nthread <= used, "small: more items in thread_free than are out, in page", pg);
    problems += insist(!(pg->full && (w & THREAD_FREE_LAZY)), "small: a full page marked lazy:", pg);
    problems += insist(pg->lazy == ((w & THREAD_FREE_LAZY) != 0), "small: the lazy copy differs from thread_free's mark in page", pg);
    problems += insist(pg->sole <= 1 && !(pg->sole && pg->full), "small: a full page counted as its class's only one:", pg);
    problems += insist(loose ? pg->full == 1 && pg->full_out >= 0 && pg->full_out < (long)HOLD_OUT(hold)
                       : pg->full ? pg->full <= 1 && pg->used >= 0 && pg->used <= page_wake(pg) && pg->full_out >= 0
                                  : pg->full_out == 0 && pg->used >= 0,
                       "small: a full page's count to its wake, or a page's count, out of range:", pg);
    problems += insist(pg->wake == wake_of(pg->capacity), "small: the wake count differs from its capacity's in page", pg);
    problems += insist(pg->back == 0 && pg->span >= 1 && pg->span <= SHARD_RUN_PAGES &&
                           pg->capacity == pg->span * class_capacity[pg->cls] && pg->carved <= pg->capacity &&
                           item_bound == (guest ? 0u : run_item_bound(pg, 0)) && (!guest || pg->span == 1),
                       "small: a span, capacity or carved count out of range, or item_bound not carved's, in page", pg);
    problems += insist(pg->block_size == class_size[pg->cls] && load_relaxed(&pg->shared_block_size) == pg->block_size &&
                           shared_divisor == UINT64_MAX / pg->block_size + 1 &&
                           pg->item_mul == item_mul_of(pg->block_size),
                       "small: the block size differs from its class's or from the shared copies in page", pg);
    return problems;
}
