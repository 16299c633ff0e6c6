/* small.h - small blocks (up to 16 KB): pages, size classes and the three free lists.
 *
 * A page of 64 KB serves one size class while it has items in use and may take another class when it
 * is empty. Items have no header; they are linked through their first word while free. A page has
 * three free lists:
 *   free        the owner allocates from it and puts its own frees back onto it
 *   local_free  other threads' frees, once the owner has taken them from thread_free (no atomic
 *               operation on either of the two)
 *   thread_free other threads push their frees here with one CAS
 * The owner's frees go onto `free`, not (as in the seed and in mimalloc) onto `local_free`: last in,
 * first out, the next allocation of the class takes back the item just freed, whose cache line the
 * program has usually just touched (half the first-level cache misses of bench/app.c's objects under
 * bench/cachesim.py; bench/results/2026-11-30-quoted-in-code.md has the numbers). The malloc fast path
 * takes local_free whole when `free` is dry.
 *
 * thread_free is one word, not a pointer (layout below): the owner takes the whole list with one
 * exchange, splices it into local_free by its tail and subtracts the count from `used` without walking
 * the items, which other cores have just written. A push computes the new word from the old one alone,
 * so a CAS that succeeds describes the list as it is: no ABA, since nobody pops single items.
 *
 *   thread_free: bits 0..15 head item offset / 16, bits 16..31 tail offset / 16, bits 32..62 count,
 *                bit 63 lazy (THREAD_FREE_LAZY)
 *
 * A lazy page is in a class list of a heap whose thread runs (the owner's slow path marks a new page,
 * the first page of a class and each page its queue brings back): a push onto it only adds to the list,
 * and the owner takes the items when its allocations reach the page (the slow path, when the page is
 * its class's first and has nothing else to hand out), or when it runs out of free pages (small.c:
 * sweep_lazy). Any other non-zero word means "queued at the owner": the push that finds 0
 * puts the page on its heap's `delayed` list, once until the owner exchanges the word again (after
 * taking the page from that list), and the owner's next slow path takes it. Only a full page needs
 * that (it is in no list, so no allocation reaches it), and a page of a heap no thread runs, whose
 * frees must arm the trim: small_settle ends the lazy marks before a heap's thread stops. Queueing
 * every page cost the owner a cache miss per page with a couple of items each time, and ring@2 a
 * fifth of its time (bench/results/2026-12-02-lazy-pages.md). A page is free only with used == 0 and
 * no item in thread_free.
 *
 * `used` counts items handed out, including those waiting in thread_free, plus 1 (`sole`) while the page
 * is the only one of its class list, which keeps it even when empty. A page with no free item left is
 * taken out of its class list (`full`), and then `used` counts down to its wake: it holds the wake count
 * (page_wake: a sixteenth of the page's items, an eighth of a page of 32-64) and `full_out` the rest of
 * the items out. So the owner's free fast path tests one thing: the decremented `used` is <= 0 when the
 * page became empty (not its class's only page) or when a full page has had its wake count of items back,
 * and the slow path retires the page or puts it at the tail of its list, with those items on its free
 * list. Until then the owner's frees into a full page are fast-path pushes: when frees land at random
 * over many pages, a page that went back into its list at its first free would be drained by the next
 * allocation and go out again, a slow path per block (bench/shapes.py's glibc-thread-fixed:
 * bench/results/2026-12-02-spare.md). page_used() is the true count.
 *
 * A page of a thread heap that stays full and untouched (no free into it, by its owner or another
 * thread) while SHARD_LOOSE_AFTER more of its heap's pages go full (heap.h's full_ring) goes loose
 * (`hold`, line 1): its owner stores the items out in `hold` and USED_LOOSE in `used`, and counts the
 * page no more, so that a heap whose thread has stopped allocating does not hold pages that other
 * threads emptied: a main thread that builds what workers free, then waits for them (bench/shapes.c's
 * larson when this was written: 10 MB of 75 at 8 threads; its warm-up since, mimalloc-bench's, has
 * main free into its own pages last, which takes them back, and none is loose when the workers start:
 * bench/results/2026-12-07-foreign-stash.md). While a page is loose, thread_free's count reaching `out`
 * means every item is back, and the thread whose free made it so may release the page: it decommits the
 * memory, when the page has been loose for a sixty-fourth of the decommit delay and its owner, a heap
 * that a thread runs, has drained no queued page since (heap.h's `drains`: an owner that allocates takes
 * its queued pages back long before; a heap that waits for a thread keeps its pages for it, until its
 * reserve expires). The owner takes a loose page back with a compare-and-swap of `hold`, which a
 * release's compare-and-swap excludes: at its next free into it, which USED_LOOSE sends to the slow
 * path, or when it drains the page from its `delayed` list. A released page is always on that list (the
 * free of its first item since the owner's last exchange queued it), and the drain makes it a cold page.
 * A release needs no list of the owner's: the page is in none while loose, and the releaser writes
 * nothing on the descriptor's owner line but item_bound (0, so that a late free of one of its items is
 * refused before it reads the item). A page that frees reach soon never goes loose: its owner's frees
 * stay on the fast path (glibc-thread-fixed), and its owner's drain has no compare-and-swap to make
 * (ring); loosening and taking back every full page cost glibc-thread-fixed 5 %
 * (bench/results/2026-12-02-loose-pages.md). Where pages hold a few items and frees land at random
 * (bench/medium.c's 8-16 KB row: 4-8 items a page), most full pages still see no free while 64 more go
 * full, and the owner's own frees took them back by the hundred thousand, each loosening a clock read
 * and each take-back a compare-and-swap. So a take-back by the owner's free, when it drained no other
 * thread's frees while the page was loose (`loose_drains`: nothing came that loosening could have
 * served), keeps the next SHARD_LOOSE_SKIP pages that go full out of full_ring (heap.h's loose_skip,
 * SHARD_LOOSE_SKIP_MAX pending at most): 8k-16k's allocator instructions fell by three quarters of what
 * loosening cost there (bench/results/2026-12-03-loose-skip.md). A heap that waits takes nothing back,
 * and a main thread that builds what others free loosens as before. A created heap's pages never go
 * loose: their memory is charged to it.
 *
 * Lent pages. Pages belong to segments and segments to heaps, so a page that empties in one heap served
 * only that heap: at rptest's peak at 8 threads some heaps held 18-75 MB of free pages that they would
 * not need for a while, committed, as others committed pages anew
 * (bench/results/2026-12-07-lent-pages.md). A thread heap that retires a page of its own (a page, not a
 * run) while it holds SHARD_LEND_AFTER free pages, and while another heap lately committed a page
 * afresh (small.c's pool_wanted: a thread alone keeps its pages and takes no lock), lends it to the
 * pool, a list of committed free pages for the whole process under a spin lock; a thread heap that
 * needs a page and has no free one takes the most recently lent page of the pool before a spare segment
 * or a cold page. The segment's owner takes its own back as a free page (the segment counts its pages
 * lent, `lent`); any other heap uses it as a guest (`lend` LEND_GUEST, `guest_of`): the descriptor,
 * owner line and all, is the guest's to write as its own page's, but for `state`, which only the
 * segment's owner writes and which stays PAGE_LENT, so that the owner's walks of its segments pass the
 * page by. A guest's carve leaves item_bound 0, so the owner's free and realloc fast paths, whose
 * own-segment test passes there, fail the item test and go to small_free_local_slow, which sends the
 * free on as another thread's. The guest's own frees fail the own-segment test and reach
 * small_free_guest through api_free_slow; the slow paths' item test for a guest page is
 * small_valid_foreign's (and `carved`, for the guest's own frees). Every push queues the page at its
 * user (page_user): the guest. A guest page never goes loose, counts in no segment's full pages, and
 * waits in its guest's guest_full list while full (the walks find it there); when its items are all
 * back it goes back to the pool (home at once from a trim of a heap no thread runs). A page that waited
 * in the pool for the decommit delay is decommitted and goes home (LEND_HOME): queued on its segment
 * owner's `delayed` list, whose drain makes it a cold page. A heap whose thread ends, or that collects,
 * first takes its own pages out of the pool, so that its segments may go; one with pages lent is not
 * moved (to the orphans, the spare segments) nor released, and when a thread's end leaves one so, no heap
 * lends for the decommit delay (small.c: lend_paused_until). A created heap neither lends nor takes: its
 * memory is charged to it; nor does the hardened build, whose link checks are item tests
 * (SHARDMM_LEND_PAGES=0 turns lending off).
 *
 * Runs. A class whose page holds at most SHARD_RUN_CAPACITY items (7.5-16 KB: 4-8) is served by runs
 * of up to SHARD_RUN_PAGES pages (config.h), one descriptor for the whole run: its head's, which holds the
 * lists, the counts and thread_free, and which is what class lists, `full`, `hold` and the slow paths
 * see, with `capacity` and `carved` counting the run's items. Each page of the run lays out its own
 * items from its own 64 KB boundary (page_item), so the item test of every pointer is the one above,
 * on the descriptor of the page it lies in: the tails' descriptors (PAGE_TAIL) keep their page's
 * item_bound, item_mul, block_size and the shared copies, and `back` (and shared_back on line 1), their
 * distance from the head. A tail's `used` is USED_TAIL, so the owner's free fast path sends its frees
 * to small_free_local_slow, which frees onto the head; the malloc fast path only sees heads. Pages of
 * 4-8 items went full at nearly every malloc of bench/medium.c's 8k-16k row, each a slow malloc and a
 * slow free; a run of four holds 16-32 (bench/results/2026-12-04-runs.md). A run lies at the end of an
 * aligned group of SHARD_RUN_PAGES pages, on two or more of its free and cold pages (page 0 holds the
 * descriptors; and a heap that fills a segment with runs fills it all, so that the segment can go full),
 * resident free pages first; a heap that has free or cold pages makes no segment for a run, its class
 * takes a page of its own then (run_acquire), and so it does while the pool holds lent pages and the heap
 * has no two free ones at a group's end: a run commits no cold page then. Retired, a run's pages are free
 * pages of their own again. Runs never go loose, and the hardened build has none (its links must lead
 * within a 64 KB page).
 *
 * The descriptor is laid out by cache lines: the first line holds what the owner reads and writes on
 * every operation, the second what other threads write, so a foreign free does not take the owner's
 * line away from it.
 *
 * The hardened build (SHARD_HARDENED, config.h) stores every link of the three lists encoded: the word
 * in item b that leads to item n holds n ^ b ^ the segment's secret (segment.h; a key per segment, not
 * per page, since the segment header is a line that every page's fast path can reach in one load, where
 * a page descriptor's owner line has no room left; the link's own address makes each item's key its
 * own). Decoding garbage, or a pointer written there by the program, gives an address outside the page
 * (with a 64-bit secret, all but one value in 2^48), so:
 *   - a link followed (malloc takes an item) must lead to an item of the page, or the end; a link that
 *     does not is reported (SHARD_ERROR_FREE_LIST) and the list is cut there: what it led to never
 *     becomes an allocation;
 *   - a free reads the head item's link too before it pushes, so a write into the item at the head
 *     (an overflow out of the block just before it, usually the block being freed) is found then;
 *   - a free item is one whose first word decodes to such a link, a live one's does not: malloc clears
 *     the first word of the item it hands out, and the secret's bits 48..63 are never those of a
 *     small number, a pointer or a negative number. So a second free of a small block, in any position
 *     and from any thread, and a realloc of a freed block, are found in O(1) from the block alone
 *     (SHARD_ERROR_DOUBLE_FREE); two frees racing on two threads may both pass.
 *
 * Depends on: segment.h, classes.h (generated), sync.h; small.c also heap.h (the heap's lists and
 * pages), large.h (the cache's expiry when a page becomes free), error.h, libc.h, options.h (the
 * decommit delay), port.h.
 */
#ifndef SHARD_SMALL_H
#define SHARD_SMALL_H

#include <stddef.h>
#include <stdint.h>

#include "classes.h"
#include "segment.h"

/* Bit 63 of a page's thread_free word (the layout at the top): the page is lazy. */
#define THREAD_FREE_LAZY ((uint64_t)1 << 63)

typedef struct block {
    struct block *next;
} block;

enum page_state {
    PAGE_COLD = 0,   /* memory not committed (never, or decommitted) */
    PAGE_FREE = 1,   /* committed, no class, in the heap's free pages */
    PAGE_IN_USE = 2, /* serves class `cls` (alone, or as the head of a run) */
    PAGE_TAIL = 3,   /* a page of a run after its head: the head's descriptor serves for it */
    PAGE_LENT = 4    /* lent (see the top): in the pool, or a guest heap's page, or on its way home */
};

/* A page's `lend` byte: where a lent page is (any thread reads it; the pool's lock, the guest, the
 * expiry write it). 0 for every page its segment's owner uses. */
enum page_lend {
    LEND_NONE = 0,
    LEND_POOL = 1,  /* in the pool, committed, free */
    LEND_GUEST = 2, /* a page of guest_of, which uses it as its own */
    LEND_HOME = 3,  /* decommitted after its time in the pool, queued at its segment's owner */
    LEND_HOME_KEPT = 4 /* the same, but the OS refused the decommit: committed */
};

typedef struct page {
    /* line 0: the owner's */
    block *free;
    block *local_free;
    int32_t used;            /* items out, + sole; while `full`: the items still to come back before the
                              * page goes back into its list (page_used: the items out) */
    uint32_t item_bound;     /* carved * page_item_step() (page_has_item); stored as a relaxed atomic,
                              * since other threads read it (page_has_item_any_thread) */
    uint32_t item_mul;       /* item_mul_of(block_size): the item test's multiplier */
    uint8_t lazy;            /* 1 while thread_free has THREAD_FREE_LAZY: only the owner sets or ends the
                              * mark, and keeps this copy, which the slow path reads instead of line 1 */
    uint8_t back;            /* in a run (below), the page's place after the head: 0 for the head and for a
                              * page of its own */
    uint8_t wake;            /* page_wake(), stored when the page takes its class: read by every page
                              * that goes full (2026-12-03-lazy-copy.md) */
    uint8_t span;            /* the pages of its run: 1 for a page of its own (0 in a tail, a free page) */
    uint32_t block_size;
    uint16_t capacity;       /* items that fit */
    uint16_t carved;         /* items carved so far, in ascending address order */
    struct page *next, *prev; /* class list, free pages or cold pages */
    uint8_t cls;
    uint8_t state;
    uint8_t sole;            /* 1 while the page is the only one of its class list, counted in `used` too */
    uint8_t full;            /* 1 while the page is out of its list for want of free items */
    int32_t full_out;        /* while `full`: the items out besides `used` */
    /* line 1: what other threads write, and copies of what they read, so that a foreign free does
     * not touch line 0 at all (item offsets come from the address: a page's items start at its
     * 64 KB boundary) */
    uint64_t thread_free __attribute__((aligned(64)));
    struct page *next_delayed; /* link in the owner heap's `delayed` list while queued */
    uint64_t shared_divisor;   /* ceil(2^64 / block_size) while the page is in use, 0 otherwise */
    uint32_t shared_block_size; /* block_size while the page is in use, 0 otherwise */
    uint32_t loose_drains;     /* while loose: the owner's `drains` when the page went loose */
    uint64_t freed_at;         /* ms when the page became free; 0 = not yet stamped (rarely read) */
    uint64_t hold;             /* who counts the page's items: HOLD_* below, with `out` and a generation */
    union {
        uint64_t loose_at;        /* while loose: os_clock_ms() when the page went loose */
        struct heap *guest_of;    /* while lent to a guest: that heap (a guest page never goes loose) */
    };
    uint32_t full_seq;         /* its heap's `fulls` when it last went full (heap.h's full_ring) */
    uint8_t shared_back;       /* `back`, for a foreign free (line 1 only) */
    uint8_t touched;           /* while its segment is spared: the OS pages from its start that carving has
                                * reached or populated since its commit (small.c: carve_reach); the owner's */
    uint8_t lend;              /* LEND_* above: 0 unless lent */
    uint8_t pad2[1];
} page;
_Static_assert(sizeof(page) == PAGE_DESC_SIZE, "page descriptors are two cache lines");
_Static_assert(offsetof(page, used) >= 16 && offsetof(page, item_mul) + sizeof(uint32_t) <= 32,
               "the fields that the owner's free tests first overlay the zero bytes 16..31 of the segment header");
_Static_assert(offsetof(page, shared_divisor) >= offsetof(segment, pad) &&
                   offsetof(page, shared_block_size) + sizeof(uint32_t) <= PAGE_DESC_SIZE,
               "the fields that a foreign free tests overlay the zero padding of the segment header");

/* A page's `hold` word: bits 0..1 the state, bits 2..17 `out` (while loose: the items out when it went
 * loose), bits 18..63 a generation that each change by the owner's side counts, so that a compare-and-
 * swap of the word fails after the owner took the page back and let it go again (loose pages, above). */
enum hold_state {
    HOLD_OWNER = 0,     /* its owner counts its items on line 0, as always */
    HOLD_LOOSE = 1,     /* full, and its items are counted only by thread_free: `used` holds USED_LOOSE */
    HOLD_RELEASING = 2, /* every item came back while loose: the thread whose free brought the last one
                         * is decommitting it (it goes back to HOLD_LOOSE if the decommit fails) */
    HOLD_GONE = 3       /* that thread decommitted it: its owner makes it a cold page when it drains it */
};
#define HOLD_STATE(w) ((unsigned)((w)&3u))
#define HOLD_OUT(w) ((uint32_t)((w) >> 2) & 0xffffu)
#define HOLD_GEN(w) ((w) >> 18)
#define HOLD_WORD(state, out, gen) ((uint64_t)(state) | (uint64_t)(out) << 2 | (uint64_t)(gen) << 18)
/* `used` of a loose page: so far below 0 that the owner's free fast path, which subtracts 1 and takes
 * the slow path at 0 or less, sends every free into it to small_free_local_slow. */
#define USED_LOOSE (INT32_MIN / 2)
/* `used` of a run's tail: the same for every free the owner's fast path tries there, which then goes to
 * small_free_local_slow with the tail, and that finds the head. */
#define USED_TAIL (INT32_MIN / 2 + 1)

/* The items pg has out (with the extra one of a class's only page), full or not; for a loose page those
 * out when it went loose (those other threads have freed since wait in thread_free, as always), none
 * once it is released. */
static inline int32_t page_used(const page *pg)
{
    if (unlikely(pg->used == USED_LOOSE)) {
        uint64_t hold = load_relaxed(&pg->hold);
        return HOLD_STATE(hold) == HOLD_LOOSE ? (int32_t)HOLD_OUT(hold) : 0;
    }
    return pg->used + (pg->full ? pg->full_out : 0);
}

/* How many of its items a full page waits for before it goes back into its list: a sixteenth (255 at
 * most, a byte: the 16-byte class waits for 255 of 4096), but an eighth of a page of 32-64 items (the
 * classes of 1-2 KB), one of a page of fewer. Each wake costs a slow free, and the next page to go full a
 * slow malloc: where frees land at random in full pages of 64 items, a wake of 4 made that pair of
 * slow paths every fourth replacement, and waiting for 8 took 3-7 % off bench/shapes.c's
 * glibc-thread-fixed at every thread count, with the other cells level; an eighth of every page's items
 * raised rptest@8's peak (bench/results/2026-12-07-wake-count.md). */
static inline int32_t wake_of(uint32_t capacity)
{
    if (capacity >= 16 * 255)
        return 255; /* a byte */
    return capacity > 64 ? (int32_t)capacity / 16 : capacity >= 32 ? (int32_t)capacity / 8 : 1;
}
static inline int32_t page_wake(const page *pg) { return pg->wake; }

/* The first item of a page: its 64 KB boundary, found from the descriptor's place in page 0. */
static inline uint8_t *page_start(const page *pg)
{
    uintptr_t seg = (uintptr_t)pg & ~(uintptr_t)SEGMENT_MASK;
    return (uint8_t *)(seg + (((uintptr_t)pg - seg) / PAGE_DESC_SIZE) * PAGE_SIZE);
}

/* A run's head from any of its pages' descriptors, by the owner (line 0; another thread reads
 * shared_back on line 1: small_free_foreign). */
static inline page *run_head(page *pg) { return (page *)((uint8_t *)pg - (size_t)pg->back * PAGE_DESC_SIZE); }

/* The pages of a run of class cls (1: the class takes pages of their own). */
static inline unsigned class_span(unsigned cls)
{
    return class_capacity[cls] <= SHARD_RUN_CAPACITY ? SHARD_RUN_PAGES : 1;
}

/* The pages of pg's run, from its head (1 for a page of its own). */
static inline unsigned page_span(const page *pg) { return pg->span; }

/* The k-th item of pg, a run's head or a page of its own: each page of a run lays out class_capacity
 * items from its own 64 KB boundary. */
static inline uint8_t *page_item(const page *pg, unsigned k)
{
    unsigned per = class_capacity[pg->cls];
    return page_start(pg) + (size_t)(k / per) * PAGE_SIZE + (size_t)(k % per) * pg->block_size;
}

/* The item test's multiplier for items of `size` bytes, and its step (page_has_item). */
static inline uint32_t item_mul_of(uint32_t size) { return (uint32_t)(((uint64_t)1 << 32) / size + 1); }
static inline uint32_t page_item_step(const page *pg) { return pg->item_mul * pg->block_size; }

/* Whether p is an item pg has handed out: at a multiple of the class size and below the carved ones, by
 * one multiply and one compare. With off = p's offset in its page (below 2^16), m = item_mul =
 * floor(2^32 / size) + 1 and e = page_item_step = m * size mod 2^32 (1 <= e <= size), off * m mod 2^32 is:
 * - k * e for the k-th item (off = k * size): k * e <= off < 2^16, so it grows with k, and is below
 *   item_bound = carved * e exactly for the carved items;
 * - for any other offset, off = k * size + r with 0 < r < size: r * m lies in [2^32 / size, 2^32 -
 *   2^32 / size + size), and adding k * e (below 2^16) does not wrap for size <= 16 KB (2^32 / size >=
 *   2^18), so the product is at least 2^18, above every bound (at most carved * size <= 2^16).
 * (The divisibility part is that of Lemire, Kaser and Kurz, "Faster remainder by direct computation",
 * 2019, on 32 bits; the carved bound folds into its compare. tests/test_asm.c checks every offset of
 * every class.) A page that serves no class (free, cold) has item_bound 0, and so has descriptor 0 (the
 * segment header), so p is rejected for them too. */
static inline int page_has_item(const page *pg, const void *p)
{
    uint32_t off = (uint32_t)((uintptr_t)p & (PAGE_SIZE - 1));
    return off * pg->item_mul < pg->item_bound;
}

/* page_has_item() for another thread's page, from the descriptor's second line only (the owner's line
 * stays with the owner). It does not see `carved`: an offset the page never handed out passes. */
static inline int small_valid_foreign(const page *pg, const void *p)
{
    uint32_t off = (uint32_t)((uintptr_t)p & (PAGE_SIZE - 1));
    uint64_t divisor = load_relaxed(&pg->shared_divisor);
    uint32_t size = load_relaxed(&pg->shared_block_size);
    /* A page not in use has divisor 0 and fails; so does page 0, whose descriptor is the segment
     * header (zero there). The item must lie whole inside the page (no tail item). */
    return (uint64_t)off * divisor < divisor && off + size <= PAGE_SIZE;
}

/* page_has_item() from a thread that need not own pg (usable size, realloc of another thread's block):
 * the owner may carve meanwhile, so item_bound is read as an atomic, relaxed (the owner stores it so).
 * A thread holds an item only after the carve that made it, so the bound it reads is at least that
 * one's: a stale bound rejects only items the reader cannot hold. item_mul changes only while the page
 * has no item out. The owner's fast paths keep the plain read (page_has_item): nobody else writes the
 * field. */
static inline int page_has_item_any_thread(const page *pg, const void *p)
{
    uint32_t off = (uint32_t)((uintptr_t)p & (PAGE_SIZE - 1));
    if (unlikely(load_relaxed(&pg->lend) == LEND_GUEST))
        return small_valid_foreign(pg, p); /* a guest's page: its item_bound stays 0 (see the top) */
    return off * pg->item_mul < load_relaxed(&pg->item_bound);
}

/* The shared empty page: the page-per-size array points here for a class without pages, so the fast
 * path needs no NULL test; its free list is always empty. */
extern page small_empty_page;

static inline page *page_of(const void *p)
{
    return (page *)((uintptr_t)segment_of(p) + (((uintptr_t)p >> PAGE_SHIFT) & (SEGMENT_PAGES - 1)) * PAGE_DESC_SIZE);
}

/* The heap that uses pg (a page in use, or a run's head): its guest while it is lent to one, else its
 * segment's owner. Any thread; a thread that holds an item of pg reads the guest that handed it out. */
struct heap;
static inline struct heap *page_user(const page *pg)
{
    if (unlikely(load_relaxed(&pg->lend) == LEND_GUEST))
        return load_relaxed(&pg->guest_of);
    return load_acquire(&segment_of(pg)->owner);
}

/* ---- links (encoded in the hardened build: see the top) ---- */

#if SHARD_HARDENED
static inline uintptr_t link_key(const block *b) { return segment_of(b)->secret ^ (uintptr_t)b; }
static inline block *link_get(const block *b) { return (block *)((uintptr_t)b->next ^ link_key(b)); }
static inline void link_set(block *b, const block *n) { b->next = (block *)((uintptr_t)n ^ link_key(b)); }
#else
static inline block *link_get(const block *b) { return b->next; }
static inline void link_set(block *b, const block *n) { b->next = (block *)n; }
#endif

/* Whether n lies in b's page. */
static inline int link_in_page(const block *b, const block *n) { return (((uintptr_t)n ^ (uintptr_t)b) >> PAGE_SHIFT) == 0; }

/* Whether n may follow b in a list of pg, a page of the calling thread: the end, or an item of b's page. */
static inline int link_fits(const page *pg, const block *b, const block *n)
{
    return n == NULL || (link_in_page(b, n) && page_has_item(pg, n));
}

/* The hardened build's report (small.c) of b's link, which does not fit: the list is cut after b. `freed`:
 * the block whose free found it (NULL: an allocation did). */
__attribute__((cold, noinline)) void small_link_damaged(page *pg, block *b, block *freed);

/* The first free item of pg, which has one (page_ready). */
static inline void *page_pop(page *pg)
{
    block *b = pg->free;
    block *n = link_get(b);
#if SHARD_HARDENED
    if (unlikely(!link_fits(pg, b, n))) {
        small_link_damaged(pg, b, NULL);
        n = NULL;
    }
    b->next = NULL; /* a live block's first word decodes to no link: what a free tests */
#endif
    pg->free = n;
    pg->used++;
    prefetch_write(n);
    return b;
}

/* Whether item b of pg looks free: its first word decodes to a link that fits (the hardened build's
 * double free test; always 0 in the default build). Any thread (item_bound read as an atomic). */
static inline int small_looks_free(const page *pg, const block *b)
{
#if SHARD_HARDENED
    block *n = link_get(b);
    return n == NULL || (link_in_page(b, n) && page_has_item_any_thread(pg, n));
#else
    (void)pg, (void)b;
    return 0;
#endif
}

/* The owner's free of item b of pg in the fast paths (api.c, engine.c; asm/fast.asm the same steps):
 * 1 when done, 0 when the slow path (small_free_local_slow) must take it: the page empties or was full,
 * and in the hardened build b looks free or the head's link does not fit. */
static inline int small_free_fast(page *pg, block *b)
{
#if SHARD_HARDENED
    block *head = pg->free;
    if (unlikely(small_looks_free(pg, b)) || unlikely(head != NULL && !link_fits(pg, head, link_get(head))))
        return 0;
#endif
    if (likely(--pg->used > 0)) {
        /* Above 0: an ordinary free, also the one that empties its class's only page, whose `used`
         * counts one more (small.c, sole_set). Last in, first out: see the top. */
        link_set(b, pg->free);
        pg->free = b;
        return 1;
    }
    pg->used++; /* the page empties or was full: the slow path gets it as it was */
    return 0;
}

/* Whether pg has a free item (the fast paths' test, and the slow path's first), taking its local_free
 * list (other threads' frees, drained by an earlier slow path) as the free list when that is dry. Only
 * the slow path drains other threads' frees and carves: a class whose items come and go in the owner's
 * hands stays on the fast path (with pages carved a few items at a time, it would otherwise take the
 * slow path once per few items). */
static inline int page_ready(page *pg)
{
    if (likely(pg->free != NULL))
        return 1;
    if (pg->local_free == NULL)
        return 0;
    pg->free = pg->local_free;
    pg->local_free = NULL;
    return 1;
}

struct heap;

/* Allocation of class cls when the first page of the class had no free item (or there was none). */
void *small_alloc_slow(struct heap *h, unsigned cls);
/* The owner frees b, and its page would become empty or was full, or b failed the fast path's check.
 * A b that is not an item the page handed out goes to the error hook and changes nothing. */
void small_free_local_slow(struct heap *h, page *pg, block *b);
/* A free of an item of a segment the calling thread does not own; h is the thread's heap, NULL when it
 * has none (then the free goes at once). */
void small_free_foreign(struct heap *h, page *pg, block *b);
/* h frees b into pg, a page lent to h (page_user(pg) == h, LEND_GUEST): as small_free_local_slow for a
 * page of its own; a b that is not an item the page handed out goes to the error hook. */
void small_free_guest(struct heap *h, page *pg, block *b);
/* The frees h's thread gathered (small.c) go to their page now. */
void small_flush_gathered(struct heap *h);
/* Take the thread-free lists of every page other threads queued at h; with `lazy` (h's thread, on its
 * slow path) the pages come back lazy. */
void small_drain_delayed(struct heap *h, int lazy);
/* Take what other threads freed into h's lazy pages and end their lazy marks, so that every later foreign
 * free queues its page at h (before h's thread stops using it, for a heap's trim or collect, and for a
 * created heap at its limit, whose walk of the lazy pages may be waiting: small.c, sweep_lazy). */
void small_settle(struct heap *h);
/* Decommit h's free pages beyond the `keep` most recently freed, whatever their age (thread exit, the
 * expiry of an exited thread's reserve, shard_collect). With `exiting` the pages its classes keep while
 * their thread runs (the only page of a class, empty) are retired first. */
void small_keep(struct heap *h, unsigned keep, int exiting);
/* Release h's segments with no page in use (free pages and all): their address space goes back too;
 * with `spare`, a thread heap's go to the spare segments (segment.h) while there is room, committed.
 * Returns how many went there. */
unsigned small_release_empty(struct heap *h, int spare);
/* Release all of h's segments, live blocks and all (a created heap's destroy or reset: engine.c); the
 * caller clears h's lists. */
void small_release_all(struct heap *h);
/* h filled its medium spared unit: segment_spared_grown for each of its segments still spared. */
void small_spared_grown(struct heap *h);
/* Every page of h becomes free, its blocks gone, without a look at them; then all but the `keep` most
 * recently listed free pages are decommitted, and segments left without a committed page released (a
 * created heap's destroy or reset that keeps a warm reserve: engine.c). */
void small_empty_keep(struct heap *h, unsigned keep);
typedef struct small_counts {
    size_t live, used, free, decommitted, retired; /* blocks; pages in use, free, not committed; retirements */
    size_t live_bytes;                             /* the live blocks' class sizes */
} small_counts;
/* Adds h's pages and blocks to *c (statistics; any thread, between segment_walk_begin and _end: reads
 * racy counters, exact when no other thread allocates or frees meanwhile). */
void small_count(struct heap *h, small_counts *c);

/* Orphan segments: the small segments with live blocks of a thread heap that ends without a place
 * among the reserves, or whose reserve expired, go to the orphans, a heap that no thread runs, and any
 * thread heap takes one when it needs a page (segment.h's spare segments are the empty ones). So the
 * free pages around blocks that outlive their thread serve whichever thread needs pages next, and its
 * frees into them become its own. A running thread's heap gives them a segment too when every page of
 * it is full (its allocations cannot use it until items come back): items other threads free there
 * serve whichever heap needs a page next, not only the one that made them, which may allocate no more
 * (a main thread that fills and hands out, waiting meanwhile). The heap that gave a segment takes it
 * back at its own first free into it (small_take_back), so a thread that frees what it made keeps
 * freeing without atomics. A segment changes its owner word under the orphans' lock; a foreign
 * free that read the old owner queues its page there, and that heap's next drain sends the page on
 * (heap.h's `forwards`). The orphans keep SHARD_ORPHAN_PAGES free pages committed at most, each for
 * the decommit delay; segments left empty go to the spare segments or back to the OS.
 *   small_orphan_give: every segment of h (a thread heap no thread runs, trimmed) becomes the orphans'.
 *   small_orphan_expire: take in what other threads freed into them, decommit the pages free for the
 *     delay (all with now UINT64_MAX) and make the segments left empty spare ones (released, with now
 *     UINT64_MAX); when the next decommit or the spare segments' expiry is due, or 0 (always with now
 *     UINT64_MAX). */
void small_orphan_give(struct heap *h);
int small_is_orphans(const struct heap *h); /* whether h is the orphans' heap */
/* Segment s becomes h's again if h gave it to the orphans and no heap took it since: 0, else -1. Called
 * by h's thread, for a free into s. Its first test is inline: a segment that h did not give away
 * (given_by is set only while the orphans hold it) costs a free of another thread's block one load;
 * small_take_given() does the rest. */
int small_take_given(struct heap *h, segment *s);
static inline int small_take_back(struct heap *h, segment *s)
{
    return load_relaxed(&s->given_by) == h ? small_take_given(h, s) : -1;
}
uint64_t small_orphan_expire(uint64_t now);
void small_orphan_count(small_counts *c, size_t *segments); /* statistics: between segment_walk_begin, _end */
void small_orphan_visit(visitor *v);
int small_orphan_check(void);
void small_orphan_lock_for_fork(int take);
/* The pool of lent pages (the top):
 *   small_pool_expire: pages that waited there for the decommit delay (all of them with now UINT64_MAX)
 *     are decommitted and go home; when the next one is due, or 0.
 *   small_pool_reclaim: h's own pages in the pool become its free pages again (a collect);
 *   small_pool_leave: the same as h's thread ends, and lending pauses if guests tie a segment to h.
 *   small_pool_lock_for_fork: as small_orphan_lock_for_fork. */
uint64_t small_pool_expire(uint64_t now);
void small_pool_reclaim(struct heap *h);
void small_pool_leave(struct heap *h);
void small_pool_lock_for_fork(int take);
/* Report h's live small blocks to v, page by page: the items carved but on none of the page's three free
 * lists. Only for the calling thread's heap or one that no thread uses (the walk takes it from the stack
 * meanwhile); other threads' frees pushed during the walk may be reported still live. */
void small_visit(struct heap *h, visitor *v);

/* Problems in one page's lists and counts (reported through report_error); 0 when it is consistent. */
int small_check_page(const page *pg);

#endif
