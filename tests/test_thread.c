/* test_thread.c - deterministic tests of shardmm's thread lifecycle: heaps made lazily and reused,
 * blocks that outlive their thread, frees into heaps that wait for a new thread, the reserve an
 * exiting thread leaves and its expiry, shard_thread_done and shard_collect.
 *
 * The rules, as this file reads them (include/shardmm.h, src/heap.h, the lifecycle notes of issue 6):
 * - A thread's heap is made at its first allocation; a thread that only frees makes none, and takes
 *   none while the blocks it frees are in heaps that threads have (stats.heaps and heaps_free do not
 *   move). Its first free into a heap that waits in the stack takes that heap (heaps_free - 1), unless
 *   shard_thread_done gave it back. Heaps are never freed: a thread that starts takes a waiting heap
 *   before it makes one - also while another thread has the stack of waiting heaps taken whole (to
 *   trim or check them): it waits for them - so the number of heaps is the peak of threads that held
 *   heaps at once.
 * - Blocks outlive their thread; any thread may check, resize and free them.
 * - A free into a heap that waits in the stack is held there; the next thread to take the heap takes
 *   those frees first (at its first allocation), so the pages and arenas whose blocks were all freed
 *   become free pages and empty arenas. live_small drops at the free itself; live_medium counts a block
 *   freed by another thread until its owner takes it.
 * - A thread that ends (thread exit or shard_thread_done) retires its heap: its empty class pages
 *   become free pages; its segments and arenas without a live block become spare ones, committed, for
 *   any thread; while fewer than 8 heaps wait with a reserve it keeps the free pages of its other
 *   segments and 4 empty arenas committed and decommits the rest at once (an arena keeps its first
 *   64 KB); else its small segments with live blocks go to the orphans, their free pages committed, and
 *   the next thread heap that needs a page and has no free one takes one of them. The heap enters the
 *   stack.
 * - One second after a heap with a reserve entered the stack, the next slow path of any thread (every
 *   medium allocation is one) or the next thread exit leaves it nothing but its live blocks: every free
 *   page decommitted, every segment without a committed page and every empty arena released (address
 *   space and all), and its small segments with live blocks given to the orphans. The spare segments
 *   go too, and orphan segments whose blocks were all freed become spare ones. Before that second
 *   nothing is trimmed; shard_get_stats triggers nothing.
 * - shard_collect() does the same at once, and empties the large-block cache.
 * - shard_thread_done(): the heap goes back as at exit (heaps_free + 1) and only once (the exit that
 *   follows gives nothing back again); blocks stay valid; an allocation after it takes a heap again.
 *   Without a heap it does nothing.
 * - shard_check() is 0: the calling thread's heap, every heap in the stack and the large cache are
 *   consistent (the debug library also checks each heap as its thread ends and the stack whenever
 *   reserves are trimmed, and aborts with a message on an inconsistency).
 *
 * Statistics are those of the whole process, and every test must give the same answers alone and after
 * the others, which leave their heaps waiting in the stack. So the tests compare statistics before and
 * after, and those that must know which heap a thread takes first let holder threads take every waiting
 * heap (hold_waiting_heaps): then a new thread makes a new heap, empty, and an exiting thread's heap is
 * the only one in the stack. Nothing else allocates meanwhile, so every change of the counts is the one
 * expected, exactly. Threads that must act at a given moment with a heap of their own are agents (a
 * thread that runs jobs on request).
 *
 * Built with -DTEST_SYSTEM_MALLOC the same file runs on the system malloc: the checks of shardmm's own
 * rules (statistics, shard_check, shard_thread_done, shard_collect) are left out and the tests made only
 * of them report "skip"; the contents of every block handed between threads are still checked.
 *
 * Build: see build.ninja (build/test-thread, build/debug/test-thread, build/test-thread-system,
 *        build/win64/test-thread.exe, build/win64/debug/test-thread.exe).
 * Run:   build/test-thread [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator.h"
#include "observe.h"

/* ---- the rules, written out independently of the allocator ---- */

#define SMALL_MAX ((size_t)16384)
#define MEDIUM_MAX ((size_t)1 << 20)
#define PAGE_BYTES ((size_t)64 << 10)      /* a small-block page */
#define ARENA_BYTES ((size_t)4 << 20)      /* a medium arena ... */
#define ARENA_HEADER ((size_t)4096)        /* ... whose chunks start 4 KB in */
#define ARENA_KEEP ((size_t)64 << 10)      /* committed in 64 KB steps; kept when it gives memory back */
#define CHUNK_HEADER ((size_t)16)
#define SEGMENT_BYTES ((size_t)4 << 20)    /* small-block pages come 63 to a segment ... */
#define SEGMENT_PAGES 63
#define SEGMENT_DESC ((size_t)8 << 10)     /* ... whose first 8 KB (the page descriptors) stay committed */
#define META_COMMIT ((size_t)64 << 10)     /* heaps come from metadata memory committed 64 KB at a time */
#define PAST_THE_DELAY_MS 1100             /* the reserve's delay (1 s) and a margin for the clock */
#define PAST_THE_LOOSE_DELAY_MS 200        /* the loose delay (15 ms) and a margin: 50 ms once fell short
                                            * under Wine while tests/run kept both processors busy */

/* Four medium blocks of this size fill an arena to within 30 KB of its end (the fourth fits the rest
 * the third leaves), so such an arena is committed whole, and gives back ARENA_BYTES - ARENA_KEEP. */
#define QUARTER_ARENA_BLOCK ((size_t)1039984)
_Static_assert(4 * (QUARTER_ARENA_BLOCK + CHUNK_HEADER) <= ARENA_BYTES - ARENA_HEADER, "four fit one arena");
_Static_assert(ARENA_HEADER + 4 * (QUARTER_ARENA_BLOCK + CHUNK_HEADER) > ARENA_BYTES - ARENA_KEEP,
               "and reach into its last 64 KB");
_Static_assert(QUARTER_ARENA_BLOCK <= MEDIUM_MAX, "a medium block");

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

static int load_int(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static void store_int(int *p, int v)
{
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

#if SHARD_RULES
/* Empty medium arenas that are still committed (beyond their first 64 KB). */
static size_t committed_empty_arenas(const shard_stats *s)
{
    return s->medium_arenas_empty - s->medium_arenas_decommitted;
}

/* b - a of a count, signed, for messages and comparisons with expected changes. */
static long long delta(size_t a, size_t b)
{
    return (long long)(b - a);
}
#endif


/* ---- blocks with their pattern ---- */

struct blk {
    unsigned char *p;
    size_t n;      /* the pattern covers n bytes */
    uint64_t seed;
};

static int blk_alloc(struct blk *b, size_t n, uint64_t seed)
{
    b->p = shard_malloc(n);
    b->n = n;
    b->seed = seed;
    CHECKF(b->p != NULL, "shard_malloc(%zu)", n);
    if (b->p == NULL)
        return 0;
    fill_range(b->p, 0, n, seed);
    return 1;
}

static void blk_check(const struct blk *b, const char *what)
{
    if (b->p != NULL && !holds_pattern(b->p, b->n, b->seed))
        CHECK_PATTERN(b->p, b->n, b->seed, what);
}

/* Resizes to m bytes: the first min(n, m) bytes must survive; the block is then filled to m bytes. */
static void blk_resize(struct blk *b, size_t m, const char *what)
{
    if (b->p == NULL)
        return;
    unsigned char *q = shard_realloc(b->p, m);
    CHECKF(q != NULL, "%s: shard_realloc(%zu -> %zu)", what, b->n, m);
    if (q == NULL)
        return;
    size_t kept = min_size(b->n, m);
    CHECKF(holds_pattern(q, kept, b->seed), "%s: resized %zu -> %zu, byte %zu differs from the pattern", what, b->n,
           m, pattern_mismatch(q, kept, b->seed));
    b->p = q;
    b->n = m;
    fill_range(q, kept, m, b->seed);
}

static void blk_free(struct blk *b)
{
    shard_free(b->p);
    b->p = NULL;
}

/* One medium allocation and free (a slow path: it takes the frees other threads made into the
 * calling thread's medium arenas, and lets a due reserve expire). */
static void medium_op(void)
{
    struct blk b;
    if (blk_alloc(&b, 20000, 77)) {
        blk_check(&b, "medium block of a medium operation");
        blk_free(&b);
    }
}

/* ---- agents: threads that run jobs on request, holding their heap in between ---- */

typedef void (*job_fn)(void *);

struct agent {
    thread_t thread;
    int running;
    job_fn job;
    void *arg;
    int requested, done, quit; /* atomic */
};

static void *agent_main(void *arg)
{
    struct agent *a = arg;
    int seen = 0;
    for (;;) {
        int r = load_int(&a->requested);
        if (r != seen) {
            a->job(a->arg);
            seen = r;
            store_int(&a->done, r);
        } else if (load_int(&a->quit)) {
            return NULL;
        } else {
            sleep_ms(1);
        }
    }
}

static int agent_start(struct agent *a)
{
    memset(a, 0, sizeof *a);
    a->running = thread_start(&a->thread, agent_main, a) == 0;
    CHECKF(a->running, "an agent thread did not start");
    return a->running;
}

/* Runs job(arg) on the agent and waits for it to finish. */
static void agent_do(struct agent *a, job_fn job, void *arg)
{
    if (!a->running)
        return;
    a->job = job;
    a->arg = arg;
    int r = load_int(&a->requested) + 1;
    store_int(&a->requested, r);
    while (load_int(&a->done) != r)
        sleep_ms(1);
}

/* Ends the agent's thread (its heap goes back as the thread exits) and waits for it. */
static void agent_stop(struct agent *a)
{
    if (!a->running)
        return;
    store_int(&a->quit, 1);
    thread_join(a->thread);
    a->running = 0;
}

/* ---- holding the waiting heaps ---- */

/* A small allocation and free: a thread's first allocation takes a waiting heap (or makes one). */
static void small_op_job(void *unused)
{
    (void)unused;
    struct blk b;
    if (blk_alloc(&b, 64, 78)) {
        blk_check(&b, "small block of a holder");
        blk_free(&b);
    }
}

/* Takes a heap and, with a medium operation, every free other threads made into it. */
__attribute__((unused)) static void take_and_drain_job(void *unused)
{
    (void)unused;
    small_op_job(NULL);
    medium_op();
    check_allocator("in a thread that took a waiting heap");
}

struct holders {
    struct agent *agents;
    size_t count;
};

/* Every heap waiting in the stack is taken by a holder thread of its own (which takes the frees others
 * made into it), and held until release_holders. Then the stack is empty: a new thread makes a new
 * heap, and the next heap to enter the stack is the only one there. */
static void hold_waiting_heaps(struct holders *h)
{
    memset(h, 0, sizeof *h);
#if SHARD_RULES
    shard_stats before = stats_now();
    size_t k = before.heaps_free;
    if (k == 0)
        return;
    h->agents = calloc(k, sizeof *h->agents);
    CHECK(h->agents != NULL);
    if (h->agents == NULL)
        return;
    for (h->count = 0; h->count < k; h->count++) {
        if (!agent_start(&h->agents[h->count]))
            break;
        agent_do(&h->agents[h->count], take_and_drain_job, NULL);
    }
    shard_stats after = stats_now();
    CHECKF(after.heaps_free == 0 && after.heaps == before.heaps,
           "holders took the %zu waiting heaps: %zu heaps -> %zu, %zu waiting afterwards", k, before.heaps,
           after.heaps, after.heaps_free);
#endif
}

static void release_holders(struct holders *h)
{
    for (size_t i = 0; i < h->count; i++)
        agent_stop(&h->agents[i]);
    free(h->agents);
    memset(h, 0, sizeof *h);
}

/* Every heap takes the frees other threads made into it: the waiting ones through holders (released
 * again), the calling thread's own through a medium operation. Then the live counts are exact. */
static void drain_all_heaps(void)
{
    struct holders h;
    hold_waiting_heaps(&h);
    release_holders(&h);
    medium_op();
}

/* ---- tests ---- */

/* This file's word-at-a-time pattern helpers write and accept exactly the harness's pattern: ranges
 * filled piecewise at odd offsets equal fill(), and one wrong byte anywhere is seen. */
TEST(pattern_helpers_of_this_file_agree_with_the_harness)
{
    enum { N = 203 };
    unsigned char a[N], b[N];
    fill(a, N, 0x99);
    memset(b, 0, N);
    fill_range(b, 0, 5, 0x99);
    fill_range(b, 5, 8, 0x99);
    fill_range(b, 8, 101, 0x99);
    fill_range(b, 101, N, 0x99);
    CHECK(memcmp(a, b, N) == 0);
    CHECK(holds_pattern(a, N, 0x99));
    CHECK(!holds_pattern(a, N, 0x98));
    for (size_t i = 0; i < N; i++) {
        a[i] ^= 0x10;
        CHECKF(!holds_pattern(a, N, 0x99) && !holds_pattern(a, i + 1, 0x99) && holds_pattern(a, i, 0x99),
               "a wrong byte at %zu of %d", i, N);
        a[i] ^= 0x10;
    }
}

/* A mix of the three kinds: small sizes at class edges, medium ones from the smallest to 1 MB, large. */
static const size_t mixed_sizes[] = {
    1, 16, 17, 100, 1000, 2048, 2049, 5000, 16383, 16384,           /* small */
    16385, 20000, 100000, 300000, 1048576,                           /* medium */
    1048577, 3000000,                                                /* large */
};
#define MIXED_COUNT (sizeof mixed_sizes / sizeof mixed_sizes[0])

struct outlive {
    struct blk blocks[MIXED_COUNT];
};

static void *outlive_alloc_thread(void *arg)
{
    struct outlive *w = arg;
    for (size_t i = 0; i < MIXED_COUNT; i++)
        blk_alloc(&w->blocks[i], mixed_sizes[i], 0x1000 + i);
    for (size_t i = 0; i < MIXED_COUNT; i++)
        blk_check(&w->blocks[i], "block before its thread ends");
    return NULL;
}

/* Another thread than the one that allocated them (which has ended): checks every block, grows it by
 * half (small blocks leave their class, the 1 MB block becomes large), checks it, shrinks it to a third
 * of its first size (some medium blocks become small), checks it, and frees it. */
static void outlive_resize_job(void *arg)
{
    struct outlive *w = arg;
    for (size_t i = 0; i < MIXED_COUNT; i++) {
        struct blk *b = &w->blocks[i];
        size_t first = b->n;
        blk_check(b, "block of an ended thread, handed to another");
        blk_resize(b, first + first / 2 + 100, "block of an ended thread, grown by another");
        blk_check(b, "block of an ended thread after growing");
        blk_resize(b, first / 3 + 1, "block of an ended thread, shrunk by another");
        blk_check(b, "block of an ended thread after shrinking");
        blk_free(b);
    }
    check_allocator("in the thread that resized and freed the blocks of an ended thread");
}

/* Blocks of every kind outlive the thread that allocated them: another thread, which took its heap
 * before the first one ended, finds them intact, resizes them both ways (contents kept) and frees them;
 * once every heap took its frees no block of the test is live. */
TEST(blocks_of_every_kind_outlive_their_thread_and_another_resizes_and_frees_them)
{
    static struct outlive w;
    struct agent other;
    drain_all_heaps();
#if SHARD_RULES
    shard_stats before = stats_now();
#endif
    if (!agent_start(&other))
        return;
    agent_do(&other, small_op_job, NULL); /* its heap is not the one the ended thread leaves */
    run_thread(outlive_alloc_thread, &w);
    agent_do(&other, outlive_resize_job, &w);
    agent_stop(&other);
    drain_all_heaps();
#if SHARD_RULES
    shard_stats after = stats_now();
    CHECKF(after.live_small == before.live_small && after.live_medium == before.live_medium &&
               after.live_large == before.live_large,
           "live small/medium/large %zu/%zu/%zu before, %zu/%zu/%zu after every block was freed", before.live_small,
           before.live_medium, before.live_large, after.live_small, after.live_medium, after.live_large);
#endif
    check_allocator("after the blocks of an ended thread were freed");
}

/* The frees made into a waiting heap. */
#define DRAIN_SMALL 3
#define DRAIN_MEDIUM 30
#define DRAIN_LARGE 2

static const struct {
    size_t size, count; /* three pages of each class */
} drain_small[DRAIN_SMALL] = { { 64, 3 * 1024 }, { 4096, 3 * 16 }, { 2048, 3 * 32 } };

struct drained {
    struct blk *small[DRAIN_SMALL];
    struct blk medium[DRAIN_MEDIUM], large[DRAIN_LARGE];
#if SHARD_RULES
    shard_stats taken; /* seen by the thread that took the heap, after its first allocation */
#endif
};

static void *drain_owner_thread(void *arg)
{
    struct drained *d = arg;
    for (size_t c = 0; c < DRAIN_SMALL; c++)
        for (size_t i = 0; i < drain_small[c].count; i++)
            blk_alloc(&d->small[c][i], drain_small[c].size, 0x2000 + c * 10000 + i);
    for (size_t i = 0; i < DRAIN_MEDIUM; i++)
        blk_alloc(&d->medium[i], 250000, 0x3000 + i); /* 16 to an arena: two arenas */
    for (size_t i = 0; i < DRAIN_LARGE; i++)
        blk_alloc(&d->large[i], 2000000, 0x3100 + i);
    return NULL;
}

static void *drain_taker_thread(void *arg)
{
    struct drained *d = arg;
    struct blk b;
    /* Takes the only waiting heap. A medium block: its slow path takes medium frees, not small ones, so
     * the small pages are free only if taking the heap took its frees. */
    blk_alloc(&b, 20000, 0x3200);
#if SHARD_RULES
    d->taken = stats_now();
#else
    (void)d;
#endif
    blk_check(&b, "block of the thread that took a heap");
    blk_free(&b);
    check_allocator("in the thread that took a heap with frees made into it");
    return NULL;
}

/* The tables of small blocks of d (on the C library's heap: thousands of entries); 0 if there is no room. */
static int drained_tables(struct drained *d)
{
    for (size_t c = 0; c < DRAIN_SMALL; c++) {
        d->small[c] = calloc(drain_small[c].count, sizeof(struct blk));
        CHECK(d->small[c] != NULL);
        if (d->small[c] == NULL)
            return 0;
    }
    return 1;
}

static void drained_tables_free(struct drained *d)
{
    for (size_t c = 0; c < DRAIN_SMALL; c++)
        free(d->small[c]);
}

/* Checks and frees every block drain_owner_thread made (from another thread than the one that made them). */
static void free_drained(struct drained *d)
{
    for (size_t c = 0; c < DRAIN_SMALL; c++)
        for (size_t i = 0; i < drain_small[c].count; i++) {
            blk_check(&d->small[c][i], "small block freed into a waiting heap");
            blk_free(&d->small[c][i]);
        }
    for (size_t i = 0; i < DRAIN_MEDIUM; i++) {
        blk_check(&d->medium[i], "medium block freed into a waiting heap");
        blk_free(&d->medium[i]);
    }
    for (size_t i = 0; i < DRAIN_LARGE; i++) {
        blk_check(&d->large[i], "large block of an ended thread");
        blk_free(&d->large[i]);
    }
}

/* Another thread frees every block of a thread that has ended while its heap waits in the stack (the
 * only heap there): live_small drops at once, the pages stay in use and live_medium still counts the
 * medium blocks. The next thread to take the heap takes those frees as it takes the heap: then no block
 * of the test is live but that thread's first one (medium), every page of the heap is a free page (none
 * is kept for a class), and every arena is empty but the one holding that block. */
TEST(frees_into_a_waiting_heap_are_taken_by_the_next_thread_to_take_it)
{
    static struct drained d;
    struct holders h;
    if (!drained_tables(&d))
        return;
    hold_waiting_heaps(&h);
#if SHARD_RULES
    shard_stats base = stats_now();
#endif
    run_thread(drain_owner_thread, &d);
#if SHARD_RULES
    shard_stats ended = stats_now();
    long long pages = delta(base.small_pages_used, ended.small_pages_used);
    long long arenas = delta(base.medium_arenas, ended.medium_arenas);
    CHECKF(ended.heaps == base.heaps + 1 && ended.heaps_free == 1,
           "the ended thread's heap is the only one waiting: heaps %zu -> %zu, %zu waiting", base.heaps,
           ended.heaps, ended.heaps_free);
    CHECKF(pages == 9 && arenas == 2, "the ended thread used %lld pages and %lld arenas (9 and 2 expected)", pages,
           arenas);
#endif
    free_drained(&d);
#if SHARD_RULES
    shard_stats freed = stats_now();
    CHECK_EQ(freed.live_small, base.live_small);
    CHECK_EQ(freed.live_large, base.live_large);
    CHECKF(freed.live_medium == base.live_medium + DRAIN_MEDIUM,
           "medium blocks freed into a waiting heap count until it is taken: live_medium %zu -> %zu, expected + %d",
           base.live_medium, freed.live_medium, DRAIN_MEDIUM);
    CHECKF(freed.small_pages_used == ended.small_pages_used && freed.medium_arenas_empty == base.medium_arenas_empty,
           "no page or arena changes before the heap is taken: pages in use %zu -> %zu, empty arenas %zu -> %zu",
           ended.small_pages_used, freed.small_pages_used, base.medium_arenas_empty, freed.medium_arenas_empty);
#endif
    run_thread(drain_taker_thread, &d);
#if SHARD_RULES
    shard_stats t = d.taken;
    CHECKF(t.heaps == base.heaps + 1 && t.heaps_free == 0, "the heap was taken, none made: heaps %zu, %zu waiting",
           t.heaps, t.heaps_free);
    CHECKF(t.live_small == base.live_small && t.live_medium == base.live_medium + 1 && t.live_large == base.live_large,
           "after the heap was taken, live small/medium/large %zu/%zu/%zu; expected %zu/%zu/%zu", t.live_small,
           t.live_medium, t.live_large, base.live_small, base.live_medium + 1, base.live_large);
    CHECKF(t.small_pages_used == base.small_pages_used,
           "pages in use %zu before the ended thread, %zu after the next thread took its heap: %lld of its %lld pages "
           "did not become free pages",
           base.small_pages_used, t.small_pages_used, delta(base.small_pages_used, t.small_pages_used), pages);
    CHECKF(delta(base.small_pages_free, t.small_pages_free) == pages,
           "the heap's %lld pages are free pages, committed still: %lld", pages,
           delta(base.small_pages_free, t.small_pages_free));
    CHECKF(delta(base.medium_arenas, t.medium_arenas) == arenas &&
               delta(base.medium_arenas_empty, t.medium_arenas_empty) == arenas - 1,
           "after the heap was taken: %lld of its %lld arenas empty, all but the one of the new block expected",
           delta(base.medium_arenas_empty, t.medium_arenas_empty), arenas);
#endif
    release_holders(&h);
    drained_tables_free(&d);
    check_allocator("after a heap with frees made into it was taken");
}

/* No thread takes the heap: shard_collect() takes in the frees made into it while it waits (and so would
 * the reserve's expiry), so its pages become free and its arenas empty, and then the heap keeps nothing:
 * its segments and arenas are released. */
TEST(shard_collect_takes_in_frees_made_into_a_waiting_heap)
{
    static struct drained d;
    struct holders h;
    if (!drained_tables(&d))
        return;
    hold_waiting_heaps(&h);
#if SHARD_RULES
    shard_collect();
    shard_stats base = stats_now();
#endif
    run_thread(drain_owner_thread, &d);
#if SHARD_RULES
    shard_stats ended = stats_now();
#endif
    free_drained(&d);
#if SHARD_RULES
    shard_collect();
    shard_stats t = stats_now();
    CHECKF(t.heaps_free == 1 && t.live_small == base.live_small && t.live_medium == base.live_medium,
           "after shard_collect: %zu heaps waiting, live small %zu -> %zu, medium %zu -> %zu", t.heaps_free,
           base.live_small, t.live_small, base.live_medium, t.live_medium);
    CHECKF(t.small_pages_used == base.small_pages_used && t.small_pages_free == base.small_pages_free &&
               t.small_pages_decommitted == base.small_pages_decommitted && ended.small_pages_used > base.small_pages_used,
           "after shard_collect: pages in use %zu -> %zu -> %zu, free %zu -> %zu, decommitted %zu -> %zu (the heap's "
           "segments released)", base.small_pages_used, ended.small_pages_used, t.small_pages_used,
           base.small_pages_free, t.small_pages_free, base.small_pages_decommitted, t.small_pages_decommitted);
    CHECKF(t.medium_arenas == base.medium_arenas && t.medium_arenas_empty == base.medium_arenas_empty &&
               ended.medium_arenas == base.medium_arenas + 2,
           "after shard_collect: arenas %zu -> %zu -> %zu, empty %zu -> %zu (the heap's 2 arenas released)",
           base.medium_arenas, ended.medium_arenas, t.medium_arenas, base.medium_arenas_empty, t.medium_arenas_empty);
    CHECKF(t.reserved == base.reserved, "after shard_collect: reserved %zu -> %zu", base.reserved, t.reserved);
#endif
    release_holders(&h);
    drained_tables_free(&d);
    check_allocator("after shard_collect took in frees made into a waiting heap");
}

struct free_only {
    struct blk blocks[MIXED_COUNT];
#if SHARD_RULES
    shard_stats before, after_frees;
#endif
};

static void *free_only_thread(void *arg)
{
    struct free_only *f = arg;
    for (size_t i = 0; i < MIXED_COUNT; i++) {
        blk_check(&f->blocks[i], "block freed by a thread that never allocates");
        blk_free(&f->blocks[i]);
    }
#if SHARD_RULES
    f->after_frees = stats_now(); /* while this thread runs */
    check_allocator("in a thread that only frees");
#endif
    return NULL;
}

/* A thread that never allocates frees blocks of every kind, made by a thread that runs: it holds a heap
 * while it runs, to gather its small frees in (src/small.c; not in the hardened build), and gives it
 * back at its exit. The small and large blocks stop being live at once (the statistics count what it
 * gathered free), the medium ones when their owner takes its frees. */
TEST(a_thread_that_only_frees_holds_a_heap_while_it_runs)
{
    static struct free_only f;
    size_t small = 0, medium = 0, large = 0;
    medium_op();
    for (size_t i = 0; i < MIXED_COUNT; i++) {
        blk_alloc(&f.blocks[i], mixed_sizes[i], 0x4000 + i);
        small += mixed_sizes[i] <= SMALL_MAX;
        medium += mixed_sizes[i] > SMALL_MAX && mixed_sizes[i] <= MEDIUM_MAX;
        large += mixed_sizes[i] > MEDIUM_MAX;
    }
#if SHARD_RULES
    f.before = stats_now();
#endif
    run_thread(free_only_thread, &f);
#if SHARD_RULES
    shard_stats ended = stats_now();
#ifdef TEST_HARDENED
    size_t taken = 0; /* the hardened build gathers nothing */
#else
    size_t taken = 1;
#endif
    size_t owned = f.before.heaps - f.before.heaps_free;
    CHECKF(f.after_frees.heaps - f.after_frees.heaps_free == owned + taken,
           "while the freeing thread runs: heaps %zu -> %zu, waiting %zu -> %zu (%zu more owned expected)",
           f.before.heaps, f.after_frees.heaps, f.before.heaps_free, f.after_frees.heaps_free, taken);
    CHECKF(ended.heaps - ended.heaps_free == owned,
           "after the freeing thread ended: heaps %zu -> %zu, waiting %zu -> %zu (its heap back expected)",
           f.before.heaps, ended.heaps, f.before.heaps_free, ended.heaps_free);
    CHECK_EQ(f.after_frees.live_small, f.before.live_small - small);
    CHECK_EQ(f.after_frees.live_large, f.before.live_large - large);
    CHECK_EQ(f.after_frees.live_medium, f.before.live_medium);
    medium_op(); /* the owner takes the frees */
    CHECK_EQ(stats_now().live_medium, f.before.live_medium - medium);
#else
    (void)small;
    (void)medium;
    (void)large;
#endif
    check_allocator("after a thread that only freed");
}

/* ---- gathered frees ---- */

#if SHARD_RULES
#define GATHER_ROUNDS 4   /* each round's frees are taken in at another moment: see gather_flush */
#define GATHER_BLOCKS 300 /* 48-byte blocks a round, made one after another: runs of frees into a page */

struct gather {
    struct blk blocks[GATHER_ROUNDS][GATHER_BLOCKS];
    const void *addr[GATHER_ROUNDS][GATHER_BLOCKS]; /* where they were, for the walk after their free */
    size_t live_base; /* live small blocks with every one of them live */
    int step;    /* rounds the freeing thread has done */
    int checked; /* rounds the owner has checked */
};

static int gather_count_visit(void *arg, void *block, size_t usable, int kind)
{
    (void)block;
    (void)usable;
    (void)kind;
    ++*(size_t *)arg;
    return 0;
}

/* How round r's frees go to their pages: the freeing thread's walk, shard_collect, an allocation of its
 * own (its first: a slow path) and, in the last round, its exit. */
static void gather_flush(int r)
{
    if (r == 0) {
        size_t n = 0;
        shard_visit(SHARD_VISIT_THREAD, gather_count_visit, &n);
        CHECK_EQ(n, (size_t)0); /* it has allocated nothing */
    } else if (r == 1) {
        shard_collect();
    } else if (r == 2) {
        struct blk own;
        if (blk_alloc(&own, 200, 0x9a00)) {
            blk_check(&own, "the freeing thread's own block");
            blk_free(&own);
        }
    }
}

static void *gather_thread(void *arg)
{
    struct gather *g = arg;
    for (int r = 0; r < GATHER_ROUNDS; r++) {
        for (size_t i = 0; i < GATHER_BLOCKS; i++) {
            blk_check(&g->blocks[r][i], "a block before another thread frees it");
            blk_free(&g->blocks[r][i]);
        }
        size_t live = stats_now().live_small; /* what it gathered is not live, though not handed over yet */
        CHECKF(live == g->live_base - (size_t)(r + 1) * GATHER_BLOCKS,
               "after round %d's frees: %zu small blocks live, %zu expected", r + 1, live,
               g->live_base - (size_t)(r + 1) * GATHER_BLOCKS);
        gather_flush(r);
        store_int(&g->step, r + 1);
        while (r + 1 < GATHER_ROUNDS && load_int(&g->checked) < r + 1)
            sleep_ms(1);
    }
    return NULL;
}

struct gather_seen {
    const struct gather *g;
    int upto;       /* rounds freed and taken in */
    size_t freed;   /* blocks of those rounds reported: none expected */
    size_t held;    /* blocks of the later rounds reported: all expected */
};

static int gather_visit(void *arg, void *block, size_t usable, int kind)
{
    struct gather_seen *s = arg;
    (void)usable;
    (void)kind;
    for (int r = 0; r < GATHER_ROUNDS; r++)
        for (size_t i = 0; i < GATHER_BLOCKS; i++)
            if (s->g->addr[r][i] == block) {
                if (r < s->upto)
                    s->freed++;
                else
                    s->held++;
                return 0;
            }
    return 0;
}

/* The owner's walk after round `upto`'s frees were taken in: none of theirs reported, every later one. */
static void gather_check(const struct gather *g, int upto)
{
    CHECK_EQ(stats_now().live_small, g->live_base - (size_t)upto * GATHER_BLOCKS);
    struct gather_seen s = {g, upto, 0, 0};
    shard_visit(SHARD_VISIT_THREAD, gather_visit, &s);
    CHECKF(s.freed == 0, "after the frees of %d round(s) were taken in (by %s), %zu of them reported live", upto,
           upto == 1 ? "its walk" : upto == 2 ? "shard_collect" : upto == 3 ? "its allocation" : "its exit",
           s.freed);
    CHECKF(s.held == (size_t)(GATHER_ROUNDS - upto) * GATHER_BLOCKS, "after %d round(s): %zu of the %zu held reported",
           upto, s.held, (size_t)(GATHER_ROUNDS - upto) * GATHER_BLOCKS);
    for (int r = upto; r < GATHER_ROUNDS; r++)
        for (size_t i = 0; i < GATHER_BLOCKS; i++)
            blk_check(&g->blocks[r][i], "a block another thread has still to free");
}
#endif

/* A thread that runs frees, round after round, blocks another running thread made: what it gathered
 * reaches their pages at each moment src/small.c names (its walk, shard_collect, its own allocation,
 * its exit). The statistics count none of them live from their free on, gathered or not. The owner's
 * walk then reports none of the freed blocks and every other one, and those keep their contents. */
TEST(frees_gathered_from_another_thread_reach_their_pages_at_every_flush)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    static struct gather g;
    memset(&g, 0, sizeof g);
    for (int r = 0; r < GATHER_ROUNDS; r++)
        for (size_t i = 0; i < GATHER_BLOCKS; i++) {
            if (!blk_alloc(&g.blocks[r][i], 48, 0x9b00 + (uint64_t)(r * GATHER_BLOCKS + i)))
                return;
            g.addr[r][i] = g.blocks[r][i].p;
        }
    g.live_base = stats_now().live_small;
    thread_t t;
    CHECK(thread_start(&t, gather_thread, &g) == 0);
    for (int r = 0; r + 1 < GATHER_ROUNDS; r++) {
        while (load_int(&g.step) < r + 1)
            sleep_ms(1);
        gather_check(&g, r + 1);
        store_int(&g.checked, r + 1);
    }
    thread_join(t);
    gather_check(&g, GATHER_ROUNDS);
    check_allocator("after another thread's gathered frees");
#endif
}

/* ---- a thread without a heap takes the waiting heap it frees into ---- */

#define HANDED_COUNT 64
#define HANDED_SIZE 48

struct handed {
    struct blk blocks[HANDED_COUNT]; /* made by an agent that then ends */
    struct blk again;                /* the taker's allocation after its first free */
    const void *first, *again_at;    /* where the block the taker freed first was, and `again` */
#if SHARD_RULES
    shard_stats before_free, after_free;
#endif
};

static void handed_make_job(void *arg)
{
    struct handed *d = arg;
    for (size_t i = 0; i < HANDED_COUNT; i++)
        blk_alloc(&d->blocks[i], HANDED_SIZE, 0x7100 + (uint64_t)i);
}

/* Fills and empties pages: a heap with free pages to keep, which waits with a reserve. */
static void pages_churn_job(void *unused)
{
    (void)unused;
    static struct blk b[200];
    for (size_t i = 0; i < 200; i++)
        blk_alloc(&b[i], 1024, 0x7200 + (uint64_t)i);
    for (size_t i = 0; i < 200; i++) {
        blk_check(&b[i], "block of a thread that fills and empties pages");
        blk_free(&b[i]);
    }
}

static void *handed_taker_thread(void *arg)
{
    struct handed *d = arg;
    blk_check(&d->blocks[0], "block of an ended thread, before another thread's first free");
    d->first = d->blocks[0].p;
#if SHARD_RULES
    d->before_free = stats_now();
#endif
    blk_free(&d->blocks[0]);
#if SHARD_RULES
    d->after_free = stats_now();
#endif
    blk_alloc(&d->again, HANDED_SIZE, 0x7300);
    d->again_at = d->again.p;
    for (size_t i = 1; i < HANDED_COUNT; i++) {
        blk_check(&d->blocks[i], "block of an ended thread, freed by the thread that took its heap");
        blk_free(&d->blocks[i]);
    }
    blk_check(&d->again, "block allocated after the free that took a heap");
    blk_free(&d->again);
    return NULL;
}

/* A thread that carries on an ended thread's work frees its blocks before it allocates (bench/shapes.c's
 * larson hands a window of blocks from thread to thread): its first free into a heap that waits in the
 * stack takes that heap, not the one a new thread would take, so that its frees are its own and its
 * allocations reuse what they free. Two heaps wait; the other has waited longer, with a reserve. */
TEST(a_thread_without_a_heap_takes_the_waiting_heap_whose_block_it_frees)
{
    static struct handed d;
    struct holders h;
    struct agent maker, churner;
    hold_waiting_heaps(&h);
    if (agent_start(&maker) && agent_start(&churner)) {
        agent_do(&maker, handed_make_job, &d);
        agent_do(&churner, pages_churn_job, NULL);
    }
    agent_stop(&churner); /* its heap waits with a reserve: a new thread would take it first */
    agent_stop(&maker);   /* its heap waits with the blocks */
#if SHARD_RULES
    shard_stats base = stats_now();
#endif
    run_thread(handed_taker_thread, &d);
#if SHARD_RULES
    shard_stats ended = stats_now();
    CHECKF(base.heaps_free == 2 && d.before_free.heaps_free == 2 && d.before_free.heaps == base.heaps,
           "before the first free: %zu heaps, %zu waiting (expected %zu and 2)", d.before_free.heaps,
           d.before_free.heaps_free, base.heaps);
    CHECKF(d.after_free.heaps_free == 1 && d.after_free.heaps == base.heaps,
           "the free into a waiting heap by a thread without one took that heap: %zu heaps, %zu waiting after it "
           "(expected %zu and 1)", d.after_free.heaps, d.after_free.heaps_free, base.heaps);
    CHECKF(d.after_free.live_small == d.before_free.live_small - 1, "live small blocks %zu -> %zu at the free",
           d.before_free.live_small, d.after_free.live_small);
    CHECKF(d.again_at == d.first, "the next block of the size is the one just freed, in the heap taken: %p, not %p",
           d.again_at, d.first);
    CHECKF(ended.heaps == base.heaps && ended.heaps_free == 2, "after the taker ended: %zu heaps, %zu waiting",
           ended.heaps, ended.heaps_free);
#endif
    release_holders(&h);
    check_allocator("after a thread took the heap of the blocks it freed");
}

/* A new thread takes the heap that has waited longest with a reserve, the heap of the thread that ended
 * first, not the last one's (src/heap.c says why). Two threads each leave a block live in a page of their
 * own and free pages around it; a third takes the first one's heap, so its first block of the size lies
 * in the first one's segment. */
enum { ROUND_BLOCKS = 200, ROUND_SIZE = 1024 };
static struct blk round_kept[2];

static void round_job(void *arg)
{
    struct blk *kept = arg;
    static struct blk b[ROUND_BLOCKS];
    for (size_t i = 0; i < ROUND_BLOCKS; i++)
        blk_alloc(&b[i], ROUND_SIZE, 0x7400 + (uint64_t)i);
    for (size_t i = 1; i < ROUND_BLOCKS; i++) {
        blk_check(&b[i], "block of a thread that ends with one block live");
        blk_free(&b[i]);
    }
    *kept = b[0]; /* the first page keeps it; the other pages become free pages */
}

static void round_free_job(void *arg)
{
    blk_check(arg, "block of a thread that took a waiting heap");
    blk_free(arg);
}

static void round_new_job(void *arg)
{
    struct blk *b = arg;
    blk_alloc(b, ROUND_SIZE, 0x7500);
}

TEST(a_new_thread_takes_the_heap_that_has_waited_longest)
{
    struct holders h;
    struct agent first, second, third;
    struct blk got = {NULL, 0, 0};
    hold_waiting_heaps(&h);
    if (agent_start(&first) && agent_start(&second)) {
        agent_do(&first, round_job, &round_kept[0]);
        agent_do(&second, round_job, &round_kept[1]);
    }
    agent_stop(&first);
    agent_stop(&second);
#if SHARD_RULES
    shard_stats base = stats_now();
    CHECKF(base.heaps_free == 2, "two heaps wait: %zu", base.heaps_free);
#endif
    if (agent_start(&third)) {
        agent_do(&third, round_new_job, &got);
#if SHARD_RULES
        shard_stats taken = stats_now();
        CHECKF(taken.heaps == base.heaps && taken.heaps_free == 1, "the third thread took a waiting heap: %zu heaps "
               "(%zu before), %zu waiting", taken.heaps, base.heaps, taken.heaps_free);
        uintptr_t at = (uintptr_t)got.p & ~(uintptr_t)(SEGMENT_BYTES - 1);
        uintptr_t first_seg = (uintptr_t)round_kept[0].p & ~(uintptr_t)(SEGMENT_BYTES - 1);
        uintptr_t second_seg = (uintptr_t)round_kept[1].p & ~(uintptr_t)(SEGMENT_BYTES - 1);
        CHECKF(first_seg != second_seg && at == first_seg,
               "the new thread's block %p lies in the segment of the thread that ended first (%p), not of the "
               "one that ended last (%p)", got.p, (void *)first_seg, (void *)second_seg);
#endif
        agent_do(&third, round_free_job, &got);
        agent_stop(&third);
    }
    for (int i = 0; i < 2; i++) {
        blk_check(&round_kept[i], "block kept live by a thread that ended");
        blk_free(&round_kept[i]);
    }
    release_holders(&h);
    check_allocator("after threads took the heaps of ended ones in order");
}

/* A thread past its exit hook (a key destructor that runs after the allocator's) frees a block of a
 * waiting heap: the heap is not taken, since the thread could never give it back, and stays waiting. */
#ifndef _WIN32
static pthread_key_t past_exit_key;
static struct handed past_exit;

static void past_exit_destructor(void *value)
{
    (void)value;
    blk_check(&past_exit.blocks[0], "block of a waiting heap, freed past a thread's exit hook");
#if SHARD_RULES
    past_exit.before_free = stats_now();
#endif
    blk_free(&past_exit.blocks[0]);
#if SHARD_RULES
    past_exit.after_free = stats_now();
#endif
}

static void past_exit_arm_job(void *unused)
{
    (void)unused;
    medium_op(); /* a heap of its own, and the allocator's key armed before the program's */
    pthread_setspecific(past_exit_key, (void *)1);
}
#endif

TEST(a_free_past_the_exit_hook_into_a_waiting_heap_leaves_it_waiting)
{
#ifdef _WIN32
    SKIP_TEST(); /* the FLS callbacks' order is Windows': test_thread's late tests cover the exit there */
#else
    struct holders h;
    struct agent maker, late;
    medium_op();
    CHECK_EQ(pthread_key_create(&past_exit_key, past_exit_destructor), 0);
    hold_waiting_heaps(&h);
    if (agent_start(&maker) && agent_start(&late)) {
        agent_do(&maker, handed_make_job, &past_exit);
        agent_do(&late, past_exit_arm_job, NULL);
    }
    agent_stop(&maker); /* its heap waits with the blocks */
#if SHARD_RULES
    shard_stats base = stats_now();
#endif
    agent_stop(&late); /* its heap goes back, then its destructor frees into the maker's */
#if SHARD_RULES
    shard_stats ended = stats_now();
    CHECKF(base.heaps_free == 1 && past_exit.before_free.heaps_free == 2 && past_exit.after_free.heaps_free == 2,
           "waiting heaps: %zu with the maker's, %zu after the late thread's exit hook, %zu after its free (1, 2, 2 "
           "expected)", base.heaps_free, past_exit.before_free.heaps_free, past_exit.after_free.heaps_free);
    CHECKF(ended.heaps == base.heaps && ended.heaps_free == 2, "after the late thread ended: %zu heaps (%zu before), "
           "%zu waiting", ended.heaps, base.heaps, ended.heaps_free);
    CHECK_EQ(past_exit.after_free.live_small, past_exit.before_free.live_small - 1);
#endif
    for (size_t i = 1; i < HANDED_COUNT; i++) {
        blk_check(&past_exit.blocks[i], "block of a waiting heap, after a free past a thread's exit hook");
        blk_free(&past_exit.blocks[i]);
    }
    pthread_key_delete(past_exit_key);
    release_holders(&h);
    check_allocator("after a free past a thread's exit hook into a waiting heap");
#endif
}

/* ---- the reserve ---- */

/* What a thread with a reserve to leave uses: 130 small pages (100 of 16384-byte blocks, 30 of 1024) and
 * 6 arenas committed whole; all freed again before it ends. */
#define HEAVY_BIG 400
#define HEAVY_KB 1920
#define HEAVY_MEDIUM 24
#define HEAVY_ARENAS (HEAVY_MEDIUM / 4)
#define LARGE_CACHED_SIZE ((size_t)4 << 20)
/* The large block's reservation: twice its need of 4 MB + 4 KB, rounded up to 64 KB, or to 2 MB where
 * the platform gives large pages (the Linux port; src/large.c). */
#ifdef _WIN32
#define LARGE_CACHED_SPAN (((size_t)8 << 20) + ((size_t)64 << 10))
#else
#define LARGE_CACHED_SPAN ((size_t)10 << 20)
#endif

struct heavy {
    int with_large;   /* also allocate and free one large block (it goes into the large cache) */
#if SHARD_RULES
    shard_stats at_end; /* the last thing the thread does */
#endif
};

static struct blk heavy_big[HEAVY_BIG], heavy_kb[HEAVY_KB], heavy_medium[HEAVY_MEDIUM];

static void *heavy_thread(void *arg)
{
    struct heavy *w = arg;
    for (size_t i = 0; i < HEAVY_BIG; i++)
        blk_alloc(&heavy_big[i], 16384, 0x5000 + i);
    for (size_t i = 0; i < HEAVY_KB; i++)
        blk_alloc(&heavy_kb[i], 1024, 0x6000 + i);
    for (size_t i = 0; i < HEAVY_MEDIUM; i++)
        blk_alloc(&heavy_medium[i], QUARTER_ARENA_BLOCK, 0x7000 + i);
    for (size_t i = 0; i < HEAVY_BIG; i++) {
        blk_check(&heavy_big[i], "16384-byte block of a thread with a reserve to leave");
        blk_free(&heavy_big[i]);
    }
    for (size_t i = 0; i < HEAVY_KB; i++) {
        blk_check(&heavy_kb[i], "1024-byte block of a thread with a reserve to leave");
        blk_free(&heavy_kb[i]);
    }
    for (size_t i = 0; i < HEAVY_MEDIUM; i++) {
        blk_check(&heavy_medium[i], "medium block of a thread with a reserve to leave");
        blk_free(&heavy_medium[i]);
    }
    if (w->with_large) {
        struct blk b;
        if (blk_alloc(&b, LARGE_CACHED_SIZE, 0x7100)) {
            blk_check(&b, "large block of a thread with a reserve to leave");
            blk_free(&b);
        }
    }
#if SHARD_RULES
    w->at_end = stats_now();
#endif
    return NULL;
}

#if SHARD_RULES
/* The scene of the reserve tests: every heap that waited is held (so the heavy thread makes a new
 * heap, and that heap is the only one in the stack once the thread ended), and two agents hold heaps
 * of their own: `slow` runs slow paths (medium operations: one arena of its own, empty between them),
 * `exiter` holds one small block (one page in use) and ends on request. `base` is taken after them. */
struct scene {
    struct holders holders;
    struct agent slow, exiter;
    struct blk exiter_block;
    shard_stats base;
};

static void medium_op_job(void *unused)
{
    (void)unused;
    medium_op();
}

static void exiter_take_job(void *arg)
{
    blk_alloc(arg, 64, 0x7200);
}

static void exiter_free_job(void *arg)
{
    blk_check(arg, "block of the thread that ends to let the reserve expire");
    blk_free(arg);
}

static void medium_take_job(void *arg)
{
    blk_alloc(arg, QUARTER_ARENA_BLOCK, 0x7300);
}

static void medium_free_job(void *arg)
{
    blk_check(arg, "medium block from a spare arena");
    blk_free(arg);
}

static void scene_begin(struct scene *s)
{
    memset(s, 0, sizeof *s);
    shard_collect(); /* no reserve due, the large cache empty */
    hold_waiting_heaps(&s->holders);
    if (agent_start(&s->slow))
        agent_do(&s->slow, medium_op_job, NULL);
    if (agent_start(&s->exiter))
        agent_do(&s->exiter, exiter_take_job, &s->exiter_block);
    s->base = stats_now();
    CHECKF(s->base.heaps_free == 0, "%zu heaps wait although the holders took them all", s->base.heaps_free);
}

static void scene_end(struct scene *s)
{
    if (s->exiter.running) {
        agent_do(&s->exiter, exiter_free_job, &s->exiter_block);
        agent_stop(&s->exiter);
    }
    agent_stop(&s->slow);
    release_holders(&s->holders);
    check_allocator("at the end of a reserve test");
}

/* Runs the heavy thread; checks that it made a new heap and used what it should. Returns its heap's
 * committed pages (free or in use) at its end, 0 when that is not as expected. */
static long long scene_heavy(struct scene *s, struct heavy *w)
{
    run_thread(heavy_thread, w);
    const shard_stats *b = &s->base, *e = &w->at_end;
    long long pages = delta(b->small_pages_used + b->small_pages_free, e->small_pages_used + e->small_pages_free);
    CHECKF(e->heaps == b->heaps + 1 && e->heaps_free == 0,
           "the heavy thread made a heap: heaps %zu -> %zu, %zu waiting", b->heaps, e->heaps, e->heaps_free);
    CHECKF(pages > 100, "the heavy thread had %lld pages committed at its end, 130 expected", pages);
    CHECKF(delta(b->medium_arenas, e->medium_arenas) == HEAVY_ARENAS &&
               delta(committed_empty_arenas(b), committed_empty_arenas(e)) == HEAVY_ARENAS,
           "the heavy thread had %lld arenas, %lld of them empty and committed at its end (%d expected)",
           delta(b->medium_arenas, e->medium_arenas), delta(committed_empty_arenas(b), committed_empty_arenas(e)),
           HEAVY_ARENAS);
    return pages > 100 ? pages : 0;
}

/* The heavy thread's segments: the pages they add from `base` to its end, 63 to a segment. */
static long long heavy_segments(const struct scene *s, const struct heavy *w)
{
    const shard_stats *b = &s->base, *e = &w->at_end;
    long long pages = delta(b->small_pages_used + b->small_pages_free + b->small_pages_decommitted,
                            e->small_pages_used + e->small_pages_free + e->small_pages_decommitted);
    CHECKF(pages == pages / SEGMENT_PAGES * SEGMENT_PAGES && pages >= 3 * SEGMENT_PAGES,
           "the heavy thread's segments hold %lld pages", pages);
    return pages / SEGMENT_PAGES;
}

/* The heavy thread has ended, every block of it freed: its segments and arenas, all empty, became spare
 * ones for any thread, committed as they were (its empty class pages free pages of them), so its heap
 * holds no page and no arena and committed did not fall. Returns the stats then. */
static shard_stats check_spare_at_exit(struct scene *s, struct heavy *w, long long pages)
{
    shard_stats q = stats_now();
    const shard_stats *b = &s->base, *e = &w->at_end;
    long long segments = heavy_segments(s, w);
    CHECKF(q.heaps == b->heaps + 1 && q.heaps_free == 1, "the heavy thread's heap waits: heaps %zu, %zu waiting",
           q.heaps, q.heaps_free);
    CHECKF(delta(b->small_pages_used + b->small_pages_free + b->small_pages_decommitted,
                 q.small_pages_used + q.small_pages_free + q.small_pages_decommitted) == 0 &&
               q.medium_arenas == b->medium_arenas,
           "as the heavy thread ended: its heap holds %lld pages and %lld arenas, none expected",
           delta(b->small_pages_used + b->small_pages_free + b->small_pages_decommitted,
                 q.small_pages_used + q.small_pages_free + q.small_pages_decommitted),
           delta(b->medium_arenas, q.medium_arenas));
    long long spare = delta(b->spare_segments, q.spare_segments);
    CHECKF(spare == segments + HEAVY_ARENAS, "as the heavy thread ended: %lld spare segments, %lld expected", spare,
           segments + HEAVY_ARENAS);
    long long bytes = delta(b->spare_bytes, q.spare_bytes);
    long long expected = segments * (long long)SEGMENT_DESC + pages * (long long)PAGE_BYTES +
                         HEAVY_ARENAS * (long long)ARENA_BYTES;
    CHECKF(bytes == expected, "as the heavy thread ended: %lld spare bytes, %lld expected (%lld segments, %lld pages)",
           bytes, expected, segments, pages);
    CHECKF(q.committed == e->committed, "as the heavy thread ended: committed %+lld bytes, nothing expected",
           delta(e->committed, q.committed));
    return q;
}

/* The heavy thread's spare segments are gone (the delay passed, or shard_collect): from `was` committed
 * fell by their bytes and `other_bytes`, reserved by their 4 MB each and `other_reserved`, and
 * `spare_left` spare segments of others wait. */
static void check_spare_gone(const struct scene *s, const struct heavy *w, const shard_stats *was,
                             const shard_stats *now, long long spare_left, size_t other_bytes, size_t other_reserved,
                             const char *when)
{
    long long segments = heavy_segments(s, w);
    CHECKF(delta(s->base.spare_segments, now->spare_segments) == spare_left,
           "%s: %lld spare segments, %lld expected", when, delta(s->base.spare_segments, now->spare_segments),
           spare_left);
    long long drop = (long long)(was->committed - now->committed);
    long long expected = (long long)(was->spare_bytes - s->base.spare_bytes) + (long long)other_bytes;
    CHECKF(drop == expected, "%s: committed fell by %lld bytes, %lld expected", when, drop, expected);
    long long released = (long long)(was->reserved - now->reserved);
    long long expected_released = (segments + HEAVY_ARENAS) * (long long)SEGMENT_BYTES + (long long)other_reserved;
    CHECKF(released == expected_released, "%s: reserved fell by %lld bytes, %lld expected", when, released,
           expected_released);
}
#endif

/* A thread that used 130 small pages in 3 segments and 6 arenas, all free again, ends: its segments and
 * arenas wait as spare ones, committed, and its heap keeps nothing of them. */
TEST(an_ending_thread_leaves_its_empty_segments_and_arenas_spare_and_committed)
{
#if !SHARD_RULES
    struct heavy w = { .with_large = 0 };
    run_thread(heavy_thread, &w);
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 0 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages)
        check_spare_at_exit(&s, &w, pages);
    scene_end(&s);
#endif
}

/* Another thread (not the one that takes the heavy thread's heap) that needs a segment and an arena
 * takes spare ones: nothing is reserved or committed anew, and its blocks come from the spare memory. */
TEST(another_thread_takes_the_spare_segments_before_reserving_new_ones)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 0 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages) {
        check_spare_at_exit(&s, &w, pages);
        struct holders again; /* the heavy thread's heap taken: the next thread makes a new heap */
        hold_waiting_heaps(&again);
        shard_stats q = stats_now();
        CHECKF(q.spare_segments > 0, "%zu spare segments left after the holders took heaps", q.spare_segments);
        struct agent a;
        if (agent_start(&a)) {
            struct blk small, medium;
            agent_do(&a, exiter_take_job, &small);
            shard_stats mid = stats_now();
            agent_do(&a, medium_take_job, &medium);
            shard_stats after = stats_now();
            CHECKF(mid.heaps == q.heaps + 1, "the new thread made a heap: heaps %zu -> %zu", q.heaps, mid.heaps);
            /* Its heap may take 64 KB more of the metadata's memory; a new segment would commit 72 KB. */
            long long pages = delta(q.small_pages_used + q.small_pages_free + q.small_pages_decommitted,
                                    mid.small_pages_used + mid.small_pages_free + mid.small_pages_decommitted);
            CHECKF(delta(q.spare_segments, mid.spare_segments) == -1 && pages == SEGMENT_PAGES &&
                       delta(q.committed, mid.committed) <= (long long)META_COMMIT,
                   "the new thread's first small block: spare segments %+lld, pages %+lld, committed %+lld "
                   "(a spare segment of 63 pages expected, nothing new)", delta(q.spare_segments, mid.spare_segments),
                   pages, delta(q.committed, mid.committed));
            CHECKF(delta(mid.spare_segments, after.spare_segments) == -1 && after.reserved == mid.reserved &&
                       after.committed == mid.committed && after.medium_arenas == mid.medium_arenas + 1,
                   "the new thread's first medium block: spare segments %+lld, arenas %+lld, reserved %+lld, "
                   "committed %+lld (a spare arena expected, committed whole, nothing new)",
                   delta(mid.spare_segments, after.spare_segments), delta(mid.medium_arenas, after.medium_arenas),
                   delta(mid.reserved, after.reserved), delta(mid.committed, after.committed));
            agent_do(&a, exiter_free_job, &small);
            agent_do(&a, medium_free_job, &medium);
            agent_stop(&a);
        }
        release_holders(&again);
    }
    scene_end(&s);
#endif
}

#if SHARD_RULES
/* The blocks a running thread takes from a spare segment: 40 of 4096 bytes, three pages' worth. */
#define RESIDENT_BLOCKS 40
static struct blk resident_blocks[RESIDENT_BLOCKS];

static void resident_take_job(void *unused)
{
    (void)unused;
    for (size_t i = 0; i < RESIDENT_BLOCKS; i++)
        blk_alloc(&resident_blocks[i], 4096, 0x7400 + i);
}

static void resident_free_job(void *unused)
{
    (void)unused;
    for (size_t i = 0; i < RESIDENT_BLOCKS; i++) {
        blk_check(&resident_blocks[i], "4096-byte block from a spare segment's free pages");
        blk_free(&resident_blocks[i]);
    }
}
#endif

/* A thread whose heap has a segment of its own with pages never committed (the exiter: one page in
 * use) and needs fresh pages takes a spare segment with free pages first: they are committed and
 * resident already, so nothing is committed anew and no page faults in. On the old rule it committed
 * three pages of its own segment. */
TEST(a_running_thread_takes_a_spare_segments_free_pages_before_committing_its_own)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 0 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages && s.exiter.running) {
        shard_stats q = check_spare_at_exit(&s, &w, pages);
        agent_do(&s.exiter, resident_take_job, NULL);
        shard_stats after = stats_now();
        uintptr_t own = (uintptr_t)s.exiter_block.p & ~(uintptr_t)(SEGMENT_BYTES - 1);
        size_t elsewhere = 0;
        for (size_t i = 0; i < RESIDENT_BLOCKS; i++)
            elsewhere += ((uintptr_t)resident_blocks[i].p & ~(uintptr_t)(SEGMENT_BYTES - 1)) != own;
        CHECKF(delta(q.spare_segments, after.spare_segments) == -1 && after.committed == q.committed &&
                   after.reserved == q.reserved && elsewhere == RESIDENT_BLOCKS,
               "a running thread's %d blocks of 4096 bytes: spare segments %+lld, committed %+lld, reserved %+lld, "
               "%zu of them outside its own segment (a spare segment's free pages expected, nothing new)",
               RESIDENT_BLOCKS, delta(q.spare_segments, after.spare_segments), delta(q.committed, after.committed),
               delta(q.reserved, after.reserved), elsewhere);
        agent_do(&s.exiter, resident_free_job, NULL);
    }
    scene_end(&s);
#endif
}

/* The spare segments last: a slow path of another thread right after the heavy thread ended releases
 * nothing, and neither does shard_get_stats after the delay. The next slow path after the delay
 * releases them. */
TEST(a_slow_path_after_a_second_releases_the_spare_segments)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 0 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages) {
        shard_stats q = check_spare_at_exit(&s, &w, pages);
        agent_do(&s.slow, medium_op_job, NULL);
        shard_stats early = stats_now();
        CHECKF(early.spare_segments == q.spare_segments && early.committed == q.committed,
               "after a slow path before the delay: spare segments %+lld, committed %+lld, nothing expected",
               delta(q.spare_segments, early.spare_segments), delta(q.committed, early.committed));
        sleep_ms(PAST_THE_DELAY_MS);
        shard_stats late = stats_now();
        CHECKF(late.spare_segments == q.spare_segments && late.committed == q.committed,
               "after the delay, with no slow path: spare segments %+lld, committed %+lld, nothing expected",
               delta(q.spare_segments, late.spare_segments), delta(q.committed, late.committed));
        agent_do(&s.slow, medium_op_job, NULL);
        shard_stats trimmed = stats_now();
        check_spare_gone(&s, &w, &late, &trimmed, 0, 0, 0, "after a slow path after the delay");
    }
    scene_end(&s);
#endif
}

/* After the delay, the next thread exit releases them: the thread that ends leaves its own segment (its
 * one block freed) spare, and the heavy thread's are gone. */
TEST(a_thread_exit_after_a_second_releases_the_spare_segments)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 0 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages) {
        check_spare_at_exit(&s, &w, pages);
        sleep_ms(PAST_THE_DELAY_MS);
        shard_stats late = stats_now();
        agent_do(&s.exiter, exiter_free_job, &s.exiter_block);
        agent_stop(&s.exiter);
        shard_stats trimmed = stats_now();
        CHECKF(trimmed.heaps_free == 2, "%zu heaps wait, 2 expected", trimmed.heaps_free);
        /* The exiter's segment: its descriptors and its one page, now free, stay committed as a spare. */
        check_spare_gone(&s, &w, &late, &trimmed, 1, 0, 0, "after a thread exit after the delay");
    }
    scene_end(&s);
#endif
}

/* shard_collect() right after the heavy thread ended (no delay) releases the spare segments and empties
 * the large-block cache; committed and reserved fall by all of that. */
TEST(shard_collect_releases_the_spare_segments_at_once_and_the_large_cache)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 1 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages) {
        shard_stats q = check_spare_at_exit(&s, &w, pages);
        CHECKF(q.large_cached == 1 && q.large_cached_bytes >= LARGE_CACHED_SIZE,
               "the freed large block waits in the cache: %zu blocks, %zu bytes", q.large_cached, q.large_cached_bytes);
        shard_collect();
        shard_stats c = stats_now();
        CHECKF(c.large_cached == 0 && c.large_cached_bytes == 0,
               "after shard_collect the cache holds %zu blocks, %zu bytes", c.large_cached, c.large_cached_bytes);
        check_spare_gone(&s, &w, &q, &c, 0, q.large_cached_bytes, LARGE_CACHED_SPAN, "after shard_collect");
    }
    scene_end(&s);
#endif
}

/* Memory running out gives the spare segments back before it fails: under a limit that the spare
 * segments' memory keeps full, a 24 MB block is still had, the spare segments gone, and the limit holds. */
TEST(an_allocation_past_the_limit_takes_the_spare_segments_back_first)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    struct heavy w = { .with_large = 0 };
    scene_begin(&s);
    long long pages = scene_heavy(&s, &w);
    if (pages) {
        shard_stats q = check_spare_at_exit(&s, &w, pages);
        size_t limit = q.committed + ((size_t)8 << 20);
        CHECKF(q.spare_bytes - s.base.spare_bytes > ((size_t)24 << 20), "%zu spare bytes, more than 24 MB expected",
               q.spare_bytes - s.base.spare_bytes);
        size_t was = shard_set_limit(limit);
        struct blk big;
        int had = blk_alloc(&big, (size_t)24 << 20, 0x7400);
        shard_stats after = stats_now();
        shard_set_limit(was);
        CHECKF(had, "a 24 MB block under a limit 8 MB above what was committed, with %zu spare bytes: refused",
               q.spare_bytes);
        CHECKF(after.spare_segments == 0 && after.committed <= limit,
               "after it: %zu spare segments, %zu bytes committed under a limit of %zu", after.spare_segments,
               after.committed, limit);
        if (had) {
            blk_check(&big, "24 MB block had after the spare segments went back");
            blk_free(&big);
        }
    }
    scene_end(&s);
#endif
}

/* ---- rounds of threads ---- */

#define CHURN_ROUNDS 50
#define CHURN_THREADS 8
#define CHURN_BLOCKS 24
#define CHURN_HANDED 8 /* of its CHURN_BLOCKS, a thread hands this many to the next round */

/* churn_handed[r % 2][i]: the blocks thread i of round r hands on; thread i of round r + 1 takes those
 * of thread i + 1. */
static struct blk churn_handed[2][CHURN_THREADS][CHURN_HANDED];

struct churn_arg {
    int round, index;
};

/* Threads of the round that hold their heap; each waits for all of them before it goes on, so the 8
 * threads of a round hold heaps at the same time. */
static int churn_arrived;

/* The size of block j of a thread: mostly small, every fourth medium, in some rounds one large (handed
 * on in some, freed by its thread in others). Blocks 0, 3, 6 .. 21 are handed on. */
static size_t churn_size(int round, int j, uint64_t seed)
{
    if ((j == 21 && round % 5 == 0) || (j == 22 && round % 5 == 2))
        return MEDIUM_MAX + 1 + (size_t)(seed % 2000000);
    if (j % 4 == 3)
        return SMALL_MAX + 1 + (size_t)(seed % 300000);
    return 1 + (size_t)(seed % 4000);
}

static void *churn_thread(void *arg)
{
    const struct churn_arg *a = arg;
    struct blk mine[CHURN_BLOCKS];
    for (int j = 0; j < CHURN_BLOCKS; j++) {
        uint64_t seed = ((uint64_t)a->round << 40) | ((uint64_t)a->index << 20) | (uint64_t)j;
        blk_alloc(&mine[j], churn_size(a->round, j, harness_mix64(seed)), seed);
    }
    __atomic_add_fetch(&churn_arrived, 1, __ATOMIC_SEQ_CST);
    while (load_int(&churn_arrived) < CHURN_THREADS)
        sleep_ms(1);
    if (a->round > 0) { /* the blocks of the round before: checked, every other one resized, freed */
        struct blk *in = churn_handed[(a->round - 1) % 2][(a->index + 1) % CHURN_THREADS];
        for (int j = 0; j < CHURN_HANDED; j++) {
            blk_check(&in[j], "block handed on by a thread of the round before");
            if (j % 2)
                blk_resize(&in[j], j % 4 == 1 ? in[j].n * 2 + 1 : in[j].n / 2 + 1, "handed block resized");
            blk_check(&in[j], "handed block after its resize");
            blk_free(&in[j]);
        }
    }
    struct blk *out = churn_handed[a->round % 2][a->index];
    for (int j = 0; j < CHURN_BLOCKS; j++) {
        blk_check(&mine[j], "block of a thread of a round");
        if (j % 3 == 0)
            out[j / 3] = mine[j];
        else
            blk_free(&mine[j]);
    }
    check_allocator("as a thread of a round ends");
    return NULL;
}

#if SHARD_RULES
/* A thread without a heap that checks the heaps over and over while the rounds run: each shard_check
 * takes the stack of waiting heaps whole for a while, and a thread that starts meanwhile must wait for
 * the heaps to come back rather than make one. */
#define CHURN_CHECK_BURST 50 /* checks back to back (the stack is away nearly all the time), then a pause */

static struct {
    mutex_t lock; /* held for each check: the statistics see the stack as it is only outside a check */
    int stop, problems, checks; /* atomic */
} churn_checker = { .lock = MUTEX_INIT };

static void *churn_checker_thread(void *unused)
{
    (void)unused;
    while (!load_int(&churn_checker.stop)) {
        for (int i = 0; i < CHURN_CHECK_BURST; i++) {
            mutex_lock(&churn_checker.lock);
            int problems = shard_check();
            mutex_unlock(&churn_checker.lock);
            __atomic_add_fetch(&churn_checker.problems, problems, __ATOMIC_SEQ_CST);
            __atomic_add_fetch(&churn_checker.checks, 1, __ATOMIC_SEQ_CST);
        }
        sleep_ms(1); /* threads that wait for the stack get it back */
    }
    return NULL;
}
#endif

/* 50 rounds of 8 threads, which hold heaps at the same time: each allocates blocks of all kinds,
 * checks them, frees most and hands the rest on to a thread of the next round, which checks, resizes
 * and frees them; meanwhile another thread checks the heaps over and over. No heap is made after the
 * first round, not even by a thread that starts while the checker has taken the stack: the number of
 * heaps stays at the peak of threads holding heaps at once (8 and those that held heaps before), and
 * after each round every heap of its threads waits again. */
TEST(heaps_stay_at_the_peak_of_threads_over_50_rounds_of_8_that_hand_blocks_on)
{
#if SHARD_RULES
    shard_stats before = stats_now();
    size_t held = before.heaps - before.heaps_free; /* by threads that run (this one, if it allocated) */
    size_t peak = held + CHURN_THREADS > before.heaps ? held + CHURN_THREADS : before.heaps;
    thread_t checker;
    store_int(&churn_checker.stop, 0);
    store_int(&churn_checker.problems, 0);
    store_int(&churn_checker.checks, 0);
    int checking = thread_start(&checker, churn_checker_thread, NULL) == 0;
    CHECK(checking);
#endif
    int rounds = CHURN_ROUNDS;
    for (int r = 0; r < rounds; r++) {
        thread_t t[CHURN_THREADS];
        struct churn_arg args[CHURN_THREADS];
        int started[CHURN_THREADS];
        store_int(&churn_arrived, 0);
        for (int i = 0; i < CHURN_THREADS; i++) {
            args[i].round = r;
            args[i].index = i;
            started[i] = thread_start(&t[i], churn_thread, &args[i]) == 0;
            CHECK(started[i]);
            if (!started[i]) { /* the others do not wait for it, and it hands nothing on */
                __atomic_add_fetch(&churn_arrived, 1, __ATOMIC_SEQ_CST);
                memset(churn_handed[r % 2][i], 0, sizeof churn_handed[r % 2][i]);
            }
        }
        for (int i = 0; i < CHURN_THREADS; i++)
            if (started[i])
                thread_join(t[i]);
#if SHARD_RULES
        mutex_lock(&churn_checker.lock);
        shard_stats s = stats_now();
        mutex_unlock(&churn_checker.lock);
        if (s.heaps != peak || s.heaps_free != peak - held) {
            CHECKF(0, "after round %d: %zu heaps, %zu waiting; expected %zu and %zu (%zu held before, %zu heaps)", r,
                   s.heaps, s.heaps_free, peak, peak - held, held, before.heaps);
            rounds = r + 1; /* the rest would only repeat it */
        }
#endif
    }
#if SHARD_RULES
    store_int(&churn_checker.stop, 1);
    if (checking)
        thread_join(checker);
    CHECKF(churn_checker.problems == 0, "%d problems in %d checks during the rounds", churn_checker.problems,
           churn_checker.checks);
#endif
    for (int i = 0; i < CHURN_THREADS; i++)
        for (int j = 0; j < CHURN_HANDED; j++) {
            struct blk *b = &churn_handed[(rounds - 1) % 2][i][j];
            blk_check(b, "block handed on by a thread of the last round");
            blk_free(b);
        }
    check_allocator("after the rounds of threads");
}

/* ---- shard_thread_done ---- */

#if SHARD_RULES
struct done_work {
    struct blk small, medium, large, again;
    shard_stats holding;
    int took_again; /* the allocation after shard_thread_done took a heap, made none */
};

static void *done_thread(void *arg)
{
    struct done_work *w = arg;
    blk_alloc(&w->small, 3000, 0x8000);
    blk_alloc(&w->medium, 50000, 0x8001);
    blk_alloc(&w->large, 2000000, 0x8002);
    struct blk gone;
    blk_alloc(&gone, 100, 0x8003);
    size_t usable[3] = { shard_usable_size(w->small.p), shard_usable_size(w->medium.p), shard_usable_size(w->large.p) };
    shard_stats holding = w->holding = stats_now();
    shard_thread_done();
    shard_stats done = stats_now();
    CHECKF(done.heaps == holding.heaps && done.heaps_free == holding.heaps_free + 1,
           "shard_thread_done: heaps %zu -> %zu, waiting %zu -> %zu (+ 1 expected)", holding.heaps, done.heaps,
           holding.heaps_free, done.heaps_free);
    CHECK_EQ(done.live_small, holding.live_small);
    CHECK_EQ(done.live_medium, holding.live_medium);
    CHECK_EQ(done.live_large, holding.live_large);
    CHECK_EQ(shard_usable_size(w->small.p), usable[0]);
    CHECK_EQ(shard_usable_size(w->medium.p), usable[1]);
    CHECK_EQ(shard_usable_size(w->large.p), usable[2]);
    blk_check(&w->small, "small block after shard_thread_done");
    blk_check(&w->medium, "medium block after shard_thread_done");
    blk_check(&w->large, "large block after shard_thread_done");
    blk_check(&gone, "block freed after shard_thread_done");
    blk_free(&gone); /* a free alone takes no heap, not even the one it gave back (heap_claim) */
    shard_stats freed = stats_now();
    CHECKF(freed.heaps == done.heaps && freed.heaps_free == done.heaps_free,
           "a free after shard_thread_done: heaps %zu -> %zu, waiting %zu -> %zu", done.heaps, freed.heaps,
           done.heaps_free, freed.heaps_free);
    CHECK_EQ(freed.live_small, done.live_small - 1);
    blk_resize(&w->medium, 120000, "medium block grown after shard_thread_done"); /* allocates: takes a heap */
    blk_alloc(&w->again, 200, 0x8004);
    shard_stats again = stats_now();
    w->took_again = again.heaps == holding.heaps && again.heaps_free == holding.heaps_free;
    CHECKF(w->took_again, "allocating after shard_thread_done takes a heap again: heaps %zu -> %zu, waiting %zu -> %zu",
           holding.heaps, again.heaps, holding.heaps_free, again.heaps_free);
    blk_check(&w->small, "small block once the thread allocates again");
    blk_check(&w->large, "large block once the thread allocates again");
    if (w->took_again) /* else its heap may be in the stack and in use at once */
        check_allocator("in a thread that allocates again after shard_thread_done");
    return NULL;
}
#endif

/* shard_thread_done gives the thread's heap back (heaps_free + 1) and leaves its blocks live and
 * intact; a free after it takes no heap; an allocation takes one again (none is made), and the thread's
 * exit gives that one back. Another thread then checks, resizes and frees the blocks. */
TEST(shard_thread_done_gives_the_heap_back_and_its_blocks_stay_valid)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    static struct done_work w;
    run_thread(done_thread, &w);
    shard_stats ended = stats_now();
    int once = ended.heaps == w.holding.heaps && ended.heaps_free == w.holding.heaps_free + 1;
    CHECKF(once, "after the thread ended: heaps %zu -> %zu, waiting %zu -> %zu (+ 1 expected)", w.holding.heaps,
           ended.heaps, w.holding.heaps_free, ended.heaps_free);
    struct blk *blocks[4] = { &w.small, &w.medium, &w.large, &w.again };
    for (int i = 0; i < 4; i++) {
        blk_check(blocks[i], "block of a thread that called shard_thread_done, after it ended");
        blk_resize(blocks[i], blocks[i]->n + 5000, "block of a thread that called shard_thread_done, resized");
        blk_free(blocks[i]);
    }
    if (once && w.took_again) /* a heap in the stack twice would make the checker walk a cycle */
        check_allocator("after shard_thread_done");
#endif
}

#if SHARD_RULES
struct done_twice {
    shard_stats before, after_first, after_second;
};

static void *done_without_heap_thread(void *arg)
{
    struct done_twice *d = arg;
    d->before = stats_now();
    shard_thread_done();
    d->after_first = stats_now();
    return NULL;
}

static void *done_then_exit_thread(void *arg)
{
    struct done_twice *d = arg;
    struct blk b;
    blk_alloc(&b, 500, 0x8100);
    d->before = stats_now();
    shard_thread_done();
    d->after_first = stats_now();
    shard_thread_done(); /* no heap any more */
    d->after_second = stats_now();
    blk_check(&b, "block after shard_thread_done");
    blk_free(&b);
    return NULL;
}
#endif

/* shard_thread_done in a thread without a heap does nothing: in one that never allocated, and a second
 * time after it gave its heap back; and the exit of a thread that gave its heap back gives nothing back
 * again. */
TEST(shard_thread_done_without_a_heap_does_nothing_and_the_exit_after_it_gives_nothing_back)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct done_twice d;
    run_thread(done_without_heap_thread, &d);
    shard_stats ended = stats_now();
    CHECKF(d.after_first.heaps == d.before.heaps && d.after_first.heaps_free == d.before.heaps_free,
           "shard_thread_done without a heap: heaps %zu -> %zu, waiting %zu -> %zu", d.before.heaps,
           d.after_first.heaps, d.before.heaps_free, d.after_first.heaps_free);
    CHECKF(ended.heaps == d.before.heaps && ended.heaps_free == d.before.heaps_free,
           "the exit of a thread without a heap: heaps %zu -> %zu, waiting %zu -> %zu", d.before.heaps, ended.heaps,
           d.before.heaps_free, ended.heaps_free);
    run_thread(done_then_exit_thread, &d);
    ended = stats_now();
    CHECKF(d.after_first.heaps_free == d.before.heaps_free + 1, "shard_thread_done: waiting %zu -> %zu",
           d.before.heaps_free, d.after_first.heaps_free);
    CHECKF(d.after_second.heaps == d.after_first.heaps && d.after_second.heaps_free == d.after_first.heaps_free,
           "shard_thread_done a second time: heaps %zu -> %zu, waiting %zu -> %zu", d.after_first.heaps,
           d.after_second.heaps, d.after_first.heaps_free, d.after_second.heaps_free);
    int once = ended.heaps == d.before.heaps && ended.heaps_free == d.before.heaps_free + 1;
    CHECKF(once, "the exit after shard_thread_done: heaps %zu -> %zu, waiting %zu -> %zu (the heap went back once)",
           d.before.heaps, ended.heaps, d.before.heaps_free, ended.heaps_free);
    if (once) /* a heap in the stack twice would make the checker walk a cycle */
        check_allocator("after shard_thread_done without a heap");
#endif
}

/* ---- threads the exit hook misses, and releases under a statistics walk ---- */

/* A thread whose first block is allocated too late for the allocator's exit hook, which was armed for
 * the thread only then: on Linux by a key destructor in glibc's last round (the allocator's key, made
 * before this one, was seen empty in that round); on Windows by an FLS callback of the program's own
 * (Windows may have run the allocator's already). The heap made then must not outlive the thread for
 * good: the heaps of threads that no longer live are reused (heap.c), so 150 such threads one after
 * another leave a few heaps, not 150. Their blocks stay valid and the main thread frees them. */
#define LATE_BATCHES 3
#define LATE_THREADS (LATE_BATCHES * 50)
static struct blk late_blocks[LATE_THREADS];
static int late_count;

static void late_first_allocation(void)
{
    if (late_count < LATE_THREADS && blk_alloc(&late_blocks[late_count], 300, 0x8200 + (uint64_t)late_count))
        late_count++;
    struct blk medium;
    if (blk_alloc(&medium, 40000, 0x8300))
        blk_free(&medium);
}

#ifdef _WIN32
static DWORD late_fls = FLS_OUT_OF_INDEXES;
static void NTAPI late_fls_callback(void *value)
{
    if (value != NULL)
        late_first_allocation();
}
static int late_setup(void)
{
    late_fls = FlsAlloc(late_fls_callback);
    return late_fls != FLS_OUT_OF_INDEXES ? 0 : -1;
}
static void *late_thread(void *unused)
{
    (void)unused;
    FlsSetValue(late_fls, (void *)1);
    return NULL;
}
#else
static pthread_key_t late_key;
static void late_destructor(void *value)
{
    uintptr_t round = (uintptr_t)value;
    if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
        pthread_setspecific(late_key, (void *)(round + 1)); /* once more in the next round */
        return;
    }
    late_first_allocation();
}
static int late_setup(void) { return pthread_key_create(&late_key, late_destructor); }
static void *late_thread(void *unused)
{
    (void)unused;
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}
#endif

TEST(threads_that_first_allocate_too_late_for_the_exit_hook_leave_no_heap_for_good)
{
    medium_op(); /* the allocator's hook is in place before the program's */
    CHECK_EQ(late_setup(), 0);
#if SHARD_RULES
    size_t heaps[LATE_BATCHES + 1];
    heaps[0] = stats_now().heaps;
#endif
    for (int batch = 1; batch <= LATE_BATCHES; batch++) {
        for (int i = 0; i < LATE_THREADS / LATE_BATCHES; i++)
            run_thread(late_thread, NULL);
#if SHARD_RULES
        heaps[batch] = stats_now().heaps;
#endif
    }
    CHECKF(late_count == LATE_THREADS, "%d of %d threads allocated in their exit", late_count, LATE_THREADS);
#if SHARD_RULES
    /* The first batches may make heaps up to the bound that earlier tests' threads set (twice the
     * threads found alive when heaps last ran out, plus 8: with the holders of the reserve tests, up to
     * about 60 heaps); the last makes a few at most (a thread just joined may still count as alive for a
     * moment: the kernel reaps it after the join returns), not one per thread. */
    CHECKF(heaps[1] - heaps[0] < LATE_THREADS / LATE_BATCHES && heaps[LATE_BATCHES] - heaps[LATE_BATCHES - 1] <= 4,
           "heaps %zu -> %zu -> %zu -> %zu over %d batches of %d threads, one at a time", heaps[0], heaps[1],
           heaps[2], heaps[3], LATE_BATCHES, LATE_THREADS / LATE_BATCHES);
#endif
    for (int i = 0; i < late_count; i++) {
        blk_check(&late_blocks[i], "block allocated in a thread's exit");
        blk_free(&late_blocks[i]);
    }
    check_allocator("after threads that allocated too late for the exit hook");
}

/* shard_get_stats walks every heap's segments and arenas while their owners release them: threads
 * that end without a reserve (only 8 heaps in the stack keep one) and shard_collect (which empties the
 * waiting heaps) give segments and arenas back to the OS all the time meanwhile. The walk must never
 * read one that is gone (it would fault), and its counts stay sane. */
static int walk_stop, release_rounds;

static void *release_churn_thread(void *unused)
{
    (void)unused;
    static const size_t sizes[] = {16384, 3000, 100000, 600000};
    struct blk b[64];
    for (int i = 0; i < 64; i++)
        blk_alloc(&b[i], sizes[i % 4], 0x8400 + (uint64_t)i);
    for (int i = 0; i < 64; i++) {
        blk_check(&b[i], "block of a thread that ends while statistics are walked");
        blk_free(&b[i]);
    }
    return NULL;
}

static void *release_driver(void *unused)
{
    (void)unused;
    while (!load_int(&walk_stop)) {
        thread_t t[4];
        for (int i = 0; i < 4; i++)
            thread_start(&t[i], release_churn_thread, NULL);
        for (int i = 0; i < 4; i++)
            thread_join(t[i]);
#if SHARD_RULES
        shard_collect();
#endif
        store_int(&release_rounds, load_int(&release_rounds) + 1);
    }
    return NULL;
}

TEST(statistics_walk_safely_while_segments_and_arenas_are_released)
{
    thread_t driver;
    CHECK_EQ(thread_start(&driver, release_driver, NULL), 0);
    long walks = 0;
    while (load_int(&release_rounds) < 40) { /* a round releases 4 heaps' segments and arenas */
#if SHARD_RULES
        shard_stats s = stats_now();
        CHECKF(s.small_pages_used <= s.heaps * 64 * 63 && s.medium_arenas_empty <= s.medium_arenas,
               "statistics during releases: %zu pages in use, %zu of %zu arenas empty", s.small_pages_used,
               s.medium_arenas_empty, s.medium_arenas);
#endif
        walks++;
    }
    store_int(&walk_stop, 1);
    thread_join(driver);
    CHECK(walks > 0);
    check_allocator("after statistics walked while segments were released");
}

/* ---- which heaps keep a reserve ---- */

#if SHARD_RULES
#define RESERVE_HEAPS 8 /* heaps in the stack that keep a reserve at a time */

/* The blocks page_user_job leaves live, one per call, freed by free_pins. */
static struct blk pins[64];
static int pin_count;

/* Allocates `pages` pages' worth of 16 KB blocks and frees all but the first: the heap has pages - 1
 * free pages to keep, in a segment that still holds a live block (an empty one would become a spare
 * segment, for any thread, and no reserve of its heap). */
static void page_user_job(void *arg)
{
    enum { SIZE = 4096, PER_PAGE = 16 }; /* pages of their own: 16 KB blocks come in runs of pages */
    size_t pages = (size_t)(uintptr_t)arg;
    struct blk *b = calloc(pages * PER_PAGE, sizeof *b);
    CHECK(b != NULL);
    if (b == NULL)
        return;
    for (size_t i = 0; i < pages * PER_PAGE; i++)
        blk_alloc(&b[i], SIZE, 0x8500 + i);
    int pin = __atomic_fetch_add(&pin_count, 1, __ATOMIC_RELAXED);
    CHECK(pin < 64);
    if (pin < 64)
        pins[pin] = b[0];
    for (size_t i = pin < 64 ? 1 : 0; i < pages * PER_PAGE; i++)
        blk_free(&b[i]);
    free(b);
}

static void free_pins(void)
{
    for (int i = 0; i < pin_count && i < 64; i++) {
        blk_check(&pins[i], "block left live by a thread with pages to keep");
        blk_free(&pins[i]);
    }
    pin_count = 0;
}

static void *page_user_thread(void *arg)
{
    page_user_job(arg);
    return NULL;
}

/* Allocates blocks that outlive the thread (the test frees them later): the heap has nothing to keep. */
static void hand_on_job(void *arg)
{
    struct blk *b = arg;
    for (int i = 0; i < 4; i++)
        blk_alloc(&b[i], 16384, 0x8600 + (uint64_t)i);
}

/* n agents at once, each with a heap of its own, each running job(args[i]) and then ending, in order:
 * their heaps enter the stack one after another. */
static void agents_run_and_end(int n, job_fn job, void *const *args)
{
    struct agent *a = calloc((size_t)n, sizeof *a);
    CHECK(a != NULL);
    if (a == NULL)
        return;
    for (int i = 0; i < n; i++)
        if (agent_start(&a[i]))
            agent_do(&a[i], job, args[i]);
    for (int i = 0; i < n; i++)
        agent_stop(&a[i]);
    free(a);
}
#endif

/* A heap that ends with nothing to keep takes no place among the 8 that keep a reserve: after 16 such
 * heaps entered the stack (and stay there), the next heap with free pages still keeps its reserve. */
TEST(a_heap_with_nothing_to_keep_takes_no_reserve_place)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    static struct blk handed_on[2 * RESERVE_HEAPS][4];
    void *args[2 * RESERVE_HEAPS];
    for (int i = 0; i < 2 * RESERVE_HEAPS; i++)
        args[i] = handed_on[i];
    struct holders h;
    hold_waiting_heaps(&h); /* every reserve of earlier tests taken by a running thread */
    agents_run_and_end(2 * RESERVE_HEAPS, hand_on_job, args);
    shard_stats before = stats_now();
    run_thread(page_user_thread, (void *)(uintptr_t)20); /* takes one of the 16 heaps, frees 19 pages, ends */
    shard_stats after = stats_now();
    CHECKF(delta(before.small_pages_free, after.small_pages_free) == 19,
           "a thread that freed 19 pages ended after 16 heaps with nothing to keep: %+lld free pages kept, 19 "
           "expected", delta(before.small_pages_free, after.small_pages_free));
    free_pins();
    for (int i = 0; i < 2 * RESERVE_HEAPS; i++)
        for (int j = 0; j < 4; j++) {
            blk_check(&handed_on[i][j], "block of a thread that handed it on");
            blk_free(&handed_on[i][j]);
        }
    release_holders(&h);
    check_allocator("after heaps with nothing to keep");
#endif
}

/* The heaps that keep a reserve are the first a new thread takes, also when heaps without one entered
 * the stack after them: a new thread's first block comes from a free page its heap kept (no new
 * segment, no commit). */
TEST(a_new_thread_takes_a_heap_with_a_reserve_first)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    void *args[RESERVE_HEAPS + 4];
    for (int i = 0; i < RESERVE_HEAPS + 4; i++)
        args[i] = (void *)(uintptr_t)4;
    struct holders h;
    hold_waiting_heaps(&h);
    /* 8 heaps enter the stack with a reserve, then 4 more, which find the places taken. */
    agents_run_and_end(RESERVE_HEAPS + 4, page_user_job, args);
    shard_stats before = stats_now();
    CHECKF(before.heaps_free == RESERVE_HEAPS + 4, "%zu heaps wait, %d expected", before.heaps_free, RESERVE_HEAPS + 4);
    struct agent a;
    if (agent_start(&a)) {
        agent_do(&a, small_op_job, NULL);
        shard_stats after = stats_now();
        CHECKF(delta(before.small_pages_free, after.small_pages_free) == -1 &&
                   after.small_pages_decommitted == before.small_pages_decommitted && after.heaps == before.heaps,
               "a new thread's first block: free pages %+lld, decommitted %+lld, heaps %+lld (a kept page expected)",
               delta(before.small_pages_free, after.small_pages_free),
               delta(before.small_pages_decommitted, after.small_pages_decommitted), delta(before.heaps, after.heaps));
        agent_stop(&a);
    }
    free_pins();
    release_holders(&h);
    check_allocator("after a new thread took a heap with a reserve");
#endif
}

/* ---- orphan segments ---- */

/* A thread heap that ends where no reserve place is left (SHARD_RESERVE_HEAPS heaps wait with one), or
 * whose reserve expired, gives its segments that still hold live blocks to the orphans, and the next
 * thread heap that needs a page takes one, with its free pages, its pages in use and its blocks. */
#define RESERVE_PLACES 8   /* heaps that may wait in the stack with a reserve at once */
#define ORPHAN_KB 640      /* the orphaning thread's 1024-byte blocks: 10 pages of 64 ... */
#define ORPHAN_KB_EVERY 64 /* ... of which the first of each page stays live */
#define ORPHAN_BIG 160     /* and 4096-byte blocks, 10 pages of 16, all freed: 10 free pages (16 KB blocks
                           * come in runs of pages) */
#define ORPHAN_PAGES 20

#if SHARD_RULES
struct filler {
    struct agent agent;
    struct blk keep, big[32];
};

/* A thread that will leave a reserve: two free pages of 4096-byte blocks, around one live 64-byte
 * block, which keeps its segment from going spare. */
static void filler_job(void *arg)
{
    struct filler *f = arg;
    for (size_t i = 0; i < 32; i++)
        blk_alloc(&f->big[i], 4096, 0x8000 + i);
    blk_alloc(&f->keep, 64, 0x8100);
    for (size_t i = 0; i < 32; i++) {
        blk_check(&f->big[i], "4096-byte block of a thread that leaves a reserve");
        blk_free(&f->big[i]);
    }
}

struct orphaner {
    struct agent agent;
    struct blk kb[ORPHAN_KB], big[ORPHAN_BIG];
    shard_stats at_end;
};

/* Ten pages of 1024-byte blocks with one live block each, and ten free pages, in one new segment. */
static void orphaner_job(void *arg)
{
    struct orphaner *o = arg;
    for (size_t i = 0; i < ORPHAN_KB; i++)
        blk_alloc(&o->kb[i], 1024, 0x8200 + i);
    for (size_t i = 0; i < ORPHAN_BIG; i++)
        blk_alloc(&o->big[i], 4096, 0x8600 + i);
    for (size_t i = 0; i < ORPHAN_KB; i++) {
        blk_check(&o->kb[i], "1024-byte block of a thread whose segment becomes an orphan");
        if (i % ORPHAN_KB_EVERY != 0)
            blk_free(&o->kb[i]);
    }
    for (size_t i = 0; i < ORPHAN_BIG; i++) {
        blk_check(&o->big[i], "4096-byte block of a thread whose segment becomes an orphan");
        blk_free(&o->big[i]);
    }
}

static void orphaner_end_job(void *arg)
{
    struct orphaner *o = arg;
    o->at_end = stats_now();
}

static uintptr_t segment_base(const void *p) { return (uintptr_t)p & ~(uintptr_t)(SEGMENT_BYTES - 1); }

/* The orphaner's live blocks: all in one segment, their patterns whole. Returns that segment. */
static uintptr_t orphaner_segment(const struct orphaner *o, const char *when)
{
    uintptr_t seg = segment_base(o->kb[0].p);
    for (size_t i = 0; i < ORPHAN_KB; i += ORPHAN_KB_EVERY) {
        blk_check(&o->kb[i], when);
        CHECKF(segment_base(o->kb[i].p) == seg, "%s: block %zu lies in another segment", when, i);
    }
    return seg;
}

/* After `what`, an allocation that should have taken orphan segment seg: one orphan segment fewer,
 * nothing more committed or reserved, and block p in seg. */
static void check_took_orphan(const shard_stats *before, const shard_stats *after, const void *p, uintptr_t seg,
                              const char *what)
{
    CHECKF(delta(before->orphan_segments, after->orphan_segments) == -1 && after->committed == before->committed &&
               after->reserved == before->reserved,
           "%s: orphan segments %+lld (-1 expected), committed %+lld, reserved %+lld (nothing expected: the "
           "orphan segment's pages serve it)",
           what, delta(before->orphan_segments, after->orphan_segments), delta(before->committed, after->committed),
           delta(before->reserved, after->reserved));
    CHECKF(p != NULL && segment_base(p) == seg, "%s: the block %p lies outside the orphan segment %p", what, p,
           (void *)seg);
}

struct adopter_job_arg {
    struct orphaner *o;
    struct blk kb, big;
};

/* A thread with a new heap takes a 1024-byte and a 4096-byte block, then frees the orphaner's. */
static void adopter_alloc_job(void *arg)
{
    struct adopter_job_arg *a = arg;
    blk_alloc(&a->kb, 1024, 0x8a00);
    blk_alloc(&a->big, 4096, 0x8a01);
}

static void adopter_free_job(void *arg)
{
    struct adopter_job_arg *a = arg;
    for (size_t i = 0; i < ORPHAN_KB; i += ORPHAN_KB_EVERY) {
        blk_check(&a->o->kb[i], "orphaner's block freed by the thread that took its segment");
        blk_free(&a->o->kb[i]);
    }
    blk_check(&a->kb, "1024-byte block from an orphan segment");
    blk_check(&a->big, "4096-byte block from an orphan segment");
    blk_free(&a->kb);
    blk_free(&a->big);
}

static void adopter_kb_job(void *arg) { blk_alloc(arg, 1024, 0x8b00); }

static void adopter_kb_free_job(void *arg)
{
    blk_check(arg, "1024-byte block from an orphan segment whose blocks were freed");
    blk_free(arg);
}
#endif

/* Eight heaps wait with a reserve; a ninth thread ends with live blocks in a segment that also has free
 * pages: the segment goes to the orphans as it is, committed, blocks and all. Another thread, whose
 * heap has no free page, then takes it before it commits a page of its own: its blocks come from that
 * segment's pages in use and free pages, nothing is committed, and it frees the orphaned blocks as its
 * own. */
TEST(a_heap_without_a_reserve_place_gives_its_segment_with_live_blocks_to_the_next_thread)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct filler fillers[RESERVE_PLACES];
    static struct orphaner o;
    memset(&o, 0, sizeof o);
    struct agent a; /* the thread that takes the orphan: a heap of its own from the start, no free page */
    struct adopter_job_arg job = {.o = &o};
    if (agent_start(&a))
        agent_do(&a, small_op_job, NULL);
    if (agent_start(&o.agent))
        agent_do(&o.agent, orphaner_job, &o);
    for (int i = 0; i < RESERVE_PLACES; i++) {
        memset(&fillers[i], 0, sizeof fillers[i]);
        if (agent_start(&fillers[i].agent))
            agent_do(&fillers[i].agent, filler_job, &fillers[i]);
    }
    for (int i = 0; i < RESERVE_PLACES; i++)
        agent_stop(&fillers[i].agent);
    agent_do(&o.agent, orphaner_end_job, &o);
    agent_stop(&o.agent);
    shard_stats q = stats_now();
    const shard_stats *e = &o.at_end;
    uintptr_t seg = orphaner_segment(&o, "1024-byte block of an orphan segment");
    CHECKF(q.heaps_free == RESERVE_PLACES + 1, "%zu heaps wait, %d expected", q.heaps_free, RESERVE_PLACES + 1);
    CHECKF(delta(e->orphan_segments, q.orphan_segments) == 1,
           "the thread without a reserve place ended: orphan segments %+lld, 1 expected",
           delta(e->orphan_segments, q.orphan_segments));
    /* Its empty page of 4096-byte blocks, which a class keeps while its thread runs, became free. */
    CHECKF(q.committed == e->committed && q.reserved == e->reserved && q.live_small == e->live_small &&
               delta(e->small_pages_free, q.small_pages_free) == 1 &&
               delta(e->small_pages_used, q.small_pages_used) == -1,
           "as it ended: committed %+lld, reserved %+lld, live small blocks %+lld, free pages %+lld, pages in "
           "use %+lld; nothing expected but one page free (its segment waits as it was)",
           delta(e->committed, q.committed), delta(e->reserved, q.reserved), delta(e->live_small, q.live_small),
           delta(e->small_pages_free, q.small_pages_free), delta(e->small_pages_used, q.small_pages_used));
    check_allocator("with an orphan segment");
    shard_stats before = stats_now();
    if (a.running) {
        agent_do(&a, adopter_alloc_job, &job);
        shard_stats after = stats_now();
        check_took_orphan(&before, &after, job.kb.p, seg, "the new thread's first 1024-byte block");
        CHECKF(job.big.p != NULL && segment_base(job.big.p) == seg,
               "the new thread's 4096-byte block %p lies outside the orphan segment %p", (void *)job.big.p, (void *)seg);
        agent_do(&a, adopter_free_job, &job);
        shard_stats freed = stats_now();
        CHECKF(delta(after.live_small, freed.live_small) == -(long long)(ORPHAN_KB / ORPHAN_KB_EVERY + 2),
               "the new thread freed the orphaned blocks and its own: live small blocks %+lld, %d expected",
               delta(after.live_small, freed.live_small), -(ORPHAN_KB / ORPHAN_KB_EVERY + 2));
        check_allocator("after the thread that took the orphan segment freed its blocks");
        agent_stop(&a);
    }
    for (int i = 0; i < RESERVE_PLACES; i++) {
        blk_check(&fillers[i].keep, "64-byte block of a thread that left a reserve");
        blk_free(&fillers[i].keep);
    }
    scene_end(&s);
#endif
}

/* A heap whose reserve expired gives its segment with live blocks to the orphans, its free pages
 * decommitted. Blocks freed into the orphan segment wait in its queue; the next trim after the delay
 * takes them in, and the segment, empty now, becomes a spare one. */
TEST(an_expired_reserve_gives_its_segment_to_the_orphans_until_its_blocks_are_freed)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct orphaner o;
    memset(&o, 0, sizeof o);
    if (agent_start(&o.agent)) {
        agent_do(&o.agent, orphaner_job, &o);
        agent_do(&o.agent, orphaner_end_job, &o);
        agent_stop(&o.agent);
    }
    shard_stats q = stats_now();
    CHECKF(q.orphan_segments == o.at_end.orphan_segments && q.committed == o.at_end.committed,
           "a heap with a reserve place ended: orphan segments %+lld, committed %+lld, nothing expected",
           delta(o.at_end.orphan_segments, q.orphan_segments), delta(o.at_end.committed, q.committed));
    sleep_ms(PAST_THE_DELAY_MS);
    agent_do(&s.slow, medium_op_job, NULL);
    shard_stats expired = stats_now();
    uintptr_t seg = orphaner_segment(&o, "1024-byte block of an orphan segment");
    (void)seg;
    CHECKF(delta(q.orphan_segments, expired.orphan_segments) == 1 &&
               delta(q.committed, expired.committed) == -(long long)(ORPHAN_PAGES / 2 * PAGE_BYTES) &&
               expired.reserved == q.reserved && expired.live_small == q.live_small,
           "after the reserve's expiry: orphan segments %+lld (1 expected), committed %+lld (its %d free pages "
           "expected to go), reserved %+lld, live small blocks %+lld",
           delta(q.orphan_segments, expired.orphan_segments), delta(q.committed, expired.committed), ORPHAN_PAGES / 2,
           delta(q.reserved, expired.reserved), delta(q.live_small, expired.live_small));
    for (size_t i = 0; i < ORPHAN_KB; i += ORPHAN_KB_EVERY)
        blk_free(&o.kb[i]);
    shard_stats freed = stats_now();
    CHECKF(delta(expired.live_small, freed.live_small) == -(long long)(ORPHAN_KB / ORPHAN_KB_EVERY) &&
               freed.orphan_segments == expired.orphan_segments,
           "its blocks freed: live small blocks %+lld (%d expected), orphan segments %+lld (nothing expected before "
           "the next trim)",
           delta(expired.live_small, freed.live_small), -(ORPHAN_KB / ORPHAN_KB_EVERY),
           delta(expired.orphan_segments, freed.orphan_segments));
    check_allocator("with frees waiting in an orphan segment");
    sleep_ms(PAST_THE_DELAY_MS);
    agent_do(&s.slow, medium_op_job, NULL);
    shard_stats trimmed = stats_now();
    CHECKF(delta(freed.orphan_segments, trimmed.orphan_segments) == -1 &&
               delta(freed.spare_segments, trimmed.spare_segments) == 1,
           "after the next trim: orphan segments %+lld (-1 expected), spare segments %+lld (1 expected)",
           delta(freed.orphan_segments, trimmed.orphan_segments), delta(freed.spare_segments, trimmed.spare_segments));
    /* That trim armed the next, at which the spare segment, unused for the delay, goes back. */
    sleep_ms(PAST_THE_DELAY_MS);
    agent_do(&s.slow, medium_op_job, NULL);
    shard_stats gone = stats_now();
    CHECKF(gone.spare_segments == trimmed.spare_segments - 1 && gone.reserved == trimmed.reserved - SEGMENT_BYTES,
           "after the delay: spare segments %+lld (-1 expected), reserved %+lld (the segment's 4 MB expected to go)",
           delta(trimmed.spare_segments, gone.spare_segments), delta(trimmed.reserved, gone.reserved));
    scene_end(&s);
#endif
}

/* Blocks freed into an orphan segment whose free pages went back to the OS wait in the orphans' queue.
 * A thread heap that needs a page takes them in before it commits one of its own, and takes the
 * segment their pages emptied. (Before, it looked only for free pages the orphans already had: with
 * every heap's segments orphaned, larson's memory grew to a gigabyte within the delay.) */
TEST(a_thread_that_needs_a_page_takes_in_what_was_freed_into_the_orphans)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct orphaner o;
    memset(&o, 0, sizeof o);
    struct agent a; /* the thread that takes the orphan: a heap of its own from the start, no free page */
    struct blk kb = {0};
    if (agent_start(&a))
        agent_do(&a, small_op_job, NULL);
    if (agent_start(&o.agent)) {
        agent_do(&o.agent, orphaner_job, &o);
        agent_stop(&o.agent);
    }
    sleep_ms(PAST_THE_DELAY_MS);
    agent_do(&s.slow, medium_op_job, NULL); /* the reserve expires: the segment becomes an orphan */
    uintptr_t seg = orphaner_segment(&o, "1024-byte block of an orphan segment");
    for (size_t i = 0; i < ORPHAN_KB; i += ORPHAN_KB_EVERY)
        blk_free(&o.kb[i]);
    shard_stats before = stats_now();
    CHECKF(before.orphan_segments == s.base.orphan_segments + 1 && before.live_small == s.base.live_small,
           "the orphaner's blocks freed: orphan segments %+lld (1 expected), live small blocks %+lld (none expected)",
           delta(s.base.orphan_segments, before.orphan_segments), delta(s.base.live_small, before.live_small));
    if (a.running) {
        agent_do(&a, adopter_kb_job, &kb);
        shard_stats after = stats_now();
        check_took_orphan(&before, &after, kb.p, seg, "the thread's first 1024-byte block (a page the frees emptied)");
        check_allocator("after a thread took an orphan segment whose blocks were freed");
        agent_do(&a, adopter_kb_free_job, &kb);
        agent_stop(&a);
    }
    scene_end(&s);
#endif
}

/* A running thread's heap gives the orphans a segment whose every page is full: its allocations cannot
 * use it until items come back, and items other threads free there then serve whichever heap needs a
 * page first. The heap that gave it takes it back at its own first free into it. */
#define FULL_SEGMENT_BLOCKS 252 /* 16384-byte blocks: 63 pages of 4 fill a segment */
#define FULL_SEGMENT_MOST (3 * FULL_SEGMENT_BLOCKS)

#if SHARD_RULES
struct segment_filler {
    struct agent agent;
    struct blk big[FULL_SEGMENT_MOST];
    size_t count;         /* blocks made */
    size_t given_at;      /* the block whose allocation gave a segment away, 0 for none */
    uintptr_t segment;    /* the segment given, that of the block before it */
    shard_stats before;   /* at the start */
};

/* 16384-byte blocks, until the orphans gain a segment (or FULL_SEGMENT_MOST): the one that filled up.
 * Other allocations of the thread's (its start) may share the first segment, so that it never fills;
 * the second does. */
static void segment_filler_job(void *arg)
{
    struct segment_filler *f = arg;
    f->before = stats_now();
    while (f->count < FULL_SEGMENT_MOST && f->given_at == 0) {
        if (!blk_alloc(&f->big[f->count], 16384, 0x9000 + f->count))
            return;
        f->count++;
        if (f->count >= 2 && stats_now().orphan_segments == f->before.orphan_segments + 1) {
            f->given_at = f->count - 1;
            f->segment = segment_base(f->big[f->count - 2].p);
        }
    }
}

/* The filler's blocks in the given segment: each checked; freed (by whoever runs this) when `free`. */
static size_t segment_filler_blocks(struct segment_filler *f, int free, const char *what)
{
    size_t n = 0;
    for (size_t i = 0; i < f->count; i++) {
        if (f->big[i].p == NULL || segment_base(f->big[i].p) != f->segment)
            continue;
        blk_check(&f->big[i], what);
        if (free)
            blk_free(&f->big[i]);
        n++;
    }
    return n;
}

static void segment_filler_free_all_job(void *arg)
{
    struct segment_filler *f = arg;
    for (size_t i = 0; i < f->count; i++)
        if (f->big[i].p != NULL) {
            blk_check(&f->big[i], "16384-byte block of the thread that filled a segment");
            blk_free(&f->big[i]);
        }
}

static void segment_filler_take_back_job(void *arg)
{
    struct segment_filler *f = arg;
    for (size_t i = 0; i < f->count; i++)
        if (f->big[i].p != NULL && segment_base(f->big[i].p) == f->segment) {
            blk_check(&f->big[i], "16384-byte block in the segment its thread gave away");
            blk_free(&f->big[i]); /* the first free into it: the segment comes back */
            break;
        }
    f->before = stats_now();
}

static void big_alloc_job(void *arg) { blk_alloc(arg, 16384, 0x9400); }

static void big_free_job(void *arg)
{
    blk_check(arg, "16384-byte block from a segment another thread filled");
    blk_free(arg);
}

/* Runs f until it gave a segment away; 0 when it did, as expected. */
static int segment_filler_run(struct segment_filler *f)
{
    memset(f, 0, sizeof *f);
    if (!agent_start(&f->agent))
        return -1;
    agent_do(&f->agent, segment_filler_job, f);
    CHECKF(f->given_at != 0 && f->given_at <= 2 * FULL_SEGMENT_BLOCKS,
           "a thread made %zu blocks of 16384 bytes and gave %s segment to the orphans (one expected by the %dth)",
           f->count, f->given_at != 0 ? "a" : "no", 2 * FULL_SEGMENT_BLOCKS);
    if (f->given_at == 0)
        return -1;
    size_t in_segment = segment_filler_blocks(f, 0, "16384-byte block of a full segment given to the orphans");
    CHECKF(in_segment == FULL_SEGMENT_BLOCKS, "the given segment holds %zu of the thread's blocks, %d expected",
           in_segment, FULL_SEGMENT_BLOCKS);
    return in_segment == FULL_SEGMENT_BLOCKS ? 0 : -1;
}
#endif

TEST(a_running_thread_gives_a_full_segment_to_the_heap_that_needs_a_page)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct segment_filler f;
    struct agent a; /* a heap of its own, no free page */
    struct blk big = {0};
    if (agent_start(&a))
        agent_do(&a, small_op_job, NULL);
    if (segment_filler_run(&f) == 0 && a.running) {
        shard_stats given = stats_now();
        size_t freed = segment_filler_blocks(&f, 1, "16384-byte block freed by another thread");
        shard_stats before = stats_now();
        CHECKF(before.orphan_segments == given.orphan_segments && delta(given.live_small, before.live_small) == -(long long)freed,
               "its blocks freed by another thread: orphan segments %+lld (none expected), live small blocks %+lld "
               "(%zu expected)",
               delta(given.orphan_segments, before.orphan_segments), delta(given.live_small, before.live_small), freed);
        agent_do(&a, big_alloc_job, &big);
        shard_stats after = stats_now();
        check_took_orphan(&before, &after, big.p, f.segment,
                          "another thread's first 16384-byte block (a page of the full segment, its blocks freed)");
        check_allocator("after a thread took a full segment that another gave away");
        agent_do(&a, big_free_job, &big);
    }
    if (f.agent.running) {
        agent_do(&f.agent, segment_filler_free_all_job, &f);
        agent_stop(&f.agent);
    }
    if (a.running)
        agent_stop(&a);
    scene_end(&s);
#endif
}

TEST(a_thread_takes_back_the_full_segment_it_gave_at_its_first_free_into_it)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct segment_filler f;
    if (segment_filler_run(&f) == 0) {
        shard_stats given = stats_now();
        agent_do(&f.agent, segment_filler_take_back_job, &f);
        shard_stats back = f.before;
        CHECKF(delta(given.orphan_segments, back.orphan_segments) == -1 && back.committed == given.committed &&
                   delta(given.live_small, back.live_small) == -1,
               "the thread freed one block of the segment it gave: orphan segments %+lld (-1 expected), committed "
               "%+lld, live small blocks %+lld (-1 expected)",
               delta(given.orphan_segments, back.orphan_segments), delta(given.committed, back.committed),
               delta(given.live_small, back.live_small));
        check_allocator("after a thread took back the segment it gave");
    }
    if (f.agent.running) {
        agent_do(&f.agent, segment_filler_free_all_job, &f);
        agent_stop(&f.agent);
    }
    scene_end(&s);
#endif
}

/* A running thread's segment whose pages are full but for its classes' current pages stays its own: the
 * class pages go on serving it. (The heap once gave such a segment to the orphans early, class pages and
 * all, for larson's main thread; the thread made new pages for those classes meanwhile, and larson@8's
 * warm-up took every segment back: bench/results/2026-12-07-no-early-give.md.) Fails where the segment
 * goes: the orphans gain it, and the next blocks of those classes take new pages. */
#define QUIET_CLASSES 16 /* one block each, a page each; 16384-byte blocks fill the other 47 */

#if SHARD_RULES
static const size_t quiet_size[QUIET_CLASSES] = {16, 32, 64, 80, 96, 112, 128, 160,
                                                 192, 224, 256, 320, 384, 448, 512, 640};

struct quiet_filler {
    struct blk small[2 * QUIET_CLASSES];
    struct blk big[FULL_SEGMENT_BLOCKS];
    shard_stats before, filled, after; /* at the start, after the segment filled, after the second blocks */
};

/* A block of each class, then the 16384-byte blocks that fill the rest of the segment's pages. */
static void quiet_fill_job(void *arg)
{
    struct quiet_filler *f = arg;
    f->before = stats_now();
    for (size_t i = 0; i < QUIET_CLASSES; i++)
        if (!blk_alloc(&f->small[i], quiet_size[i], 0x7700 + i))
            return;
    for (size_t i = 0; i < FULL_SEGMENT_BLOCKS; i++) /* enough for 63 pages: some may lie in the next segment */
        if (!blk_alloc(&f->big[i], 16384, 0x7800 + i))
            return;
    f->filled = stats_now();
    for (size_t i = 0; i < QUIET_CLASSES; i++)
        if (!blk_alloc(&f->small[QUIET_CLASSES + i], quiet_size[i], 0x7900 + i))
            return;
    f->after = stats_now();
}

static void quiet_free_job(void *arg)
{
    struct quiet_filler *f = arg;
    for (size_t i = 0; i < 2 * QUIET_CLASSES; i++)
        if (f->small[i].p != NULL) {
            blk_check(&f->small[i], "small block of a thread whose segment filled");
            blk_free(&f->small[i]);
        }
    for (size_t i = 0; i < FULL_SEGMENT_BLOCKS; i++)
        if (f->big[i].p != NULL) {
            blk_check(&f->big[i], "16384-byte block of a thread whose segment filled");
            blk_free(&f->big[i]);
        }
}
#endif

TEST(a_running_threads_segment_full_but_for_its_class_pages_stays_its_own)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct quiet_filler f;
    memset(&f, 0, sizeof f);
    struct agent a;
    if (agent_start(&a)) {
        agent_do(&a, quiet_fill_job, &f);
        size_t together = 0;
        for (size_t i = 0; i < QUIET_CLASSES; i++)
            together += f.small[i].p != NULL && f.small[QUIET_CLASSES + i].p != NULL &&
                        segment_base(f.small[QUIET_CLASSES + i].p) == segment_base(f.small[i].p);
        CHECKF(f.filled.orphan_segments == f.before.orphan_segments &&
                   f.after.orphan_segments == f.before.orphan_segments,
               "a thread made a block of each of %d classes and filled the rest of their segment with 16384-byte "
               "blocks: orphan segments %zu -> %zu -> %zu (none given expected)", QUIET_CLASSES,
               f.before.orphan_segments, f.filled.orphan_segments, f.after.orphan_segments);
        CHECKF(together == QUIET_CLASSES && f.after.small_pages_used == f.filled.small_pages_used,
               "a second block of each class: %zu of %d beside the first, pages in use %zu -> %zu (the class "
               "pages serve them)", together, QUIET_CLASSES, f.filled.small_pages_used, f.after.small_pages_used);
        check_allocator("after a thread filled a segment but for its class pages");
        agent_do(&a, quiet_free_job, &f);
        check_allocator("after the thread freed the blocks of its filled segment");
        agent_stop(&a);
    }
    scene_end(&s);
#endif
}

/* A running thread collects what other threads free into the pages of its class lists itself, when its
 * allocations reach those pages (small.h: lazy pages); a heap out of free pages first takes in those
 * frees and retires the pages they emptied, and uses them before a page it never used. Here a thread
 * fills 40 pages with 1024-byte blocks; another frees half of them, the thread drains those frees (its
 * pages go back into their list, lazy) and the other frees the rest. The 39 pages emptied (one holds
 * the block of the allocation that drained) must then serve the thread's 4096-byte blocks, with nothing
 * more committed. */
#define LAZY_KB_BLOCKS (40 * 64)
#define LAZY_4K_BLOCKS (39 * 16)

#if SHARD_RULES
struct lazy_filler {
    struct blk kb[LAZY_KB_BLOCKS];
    struct blk big[LAZY_4K_BLOCKS];
    struct blk extra; /* the allocation whose slow path drains the first half of the frees */
};

static void lazy_fill_job(void *arg)
{
    struct lazy_filler *f = arg;
    for (size_t i = 0; i < LAZY_KB_BLOCKS; i++)
        if (!blk_alloc(&f->kb[i], 1024, 0xa000 + i))
            return;
}

static void lazy_drain_job(void *arg) { blk_alloc(&((struct lazy_filler *)arg)->extra, 1024, 0xa800); }

static void lazy_4k_job(void *arg)
{
    struct lazy_filler *f = arg;
    for (size_t i = 0; i < LAZY_4K_BLOCKS; i++)
        if (!blk_alloc(&f->big[i], 4096, 0xb000 + i))
            return;
}

static void lazy_free_job(void *arg)
{
    struct lazy_filler *f = arg;
    for (size_t i = 0; i < LAZY_4K_BLOCKS; i++) {
        blk_check(&f->big[i], "4096-byte block in a page another thread emptied");
        blk_free(&f->big[i]);
    }
    blk_check(&f->extra, "1024-byte block");
    blk_free(&f->extra);
}

static void lazy_free_kb(struct lazy_filler *f, size_t first)
{
    for (size_t i = first; i < LAZY_KB_BLOCKS; i += 2) {
        blk_check(&f->kb[i], "1024-byte block freed by another thread");
        blk_free(&f->kb[i]);
    }
}
#endif

TEST(a_running_thread_uses_the_pages_others_emptied_before_committing_more)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct lazy_filler f;
    memset(&f, 0, sizeof f);
    struct agent a;
    if (agent_start(&a)) {
        agent_do(&a, lazy_fill_job, &f);
        lazy_free_kb(&f, 0);
        agent_do(&a, lazy_drain_job, &f);
        lazy_free_kb(&f, 1);
        shard_stats before = stats_now();
        agent_do(&a, lazy_4k_job, &f);
        shard_stats after = stats_now();
        size_t pages_before = before.small_pages_used + before.small_pages_free;
        size_t pages_after = after.small_pages_used + after.small_pages_free;
        CHECKF(after.committed <= before.committed && pages_after <= pages_before,
               "%d blocks of 4096 bytes in a thread whose 40 pages of 1024-byte blocks another thread emptied "
               "(one holds a block): committed %+lld bytes (none expected), small pages used or free %+lld "
               "(none expected)",
               LAZY_4K_BLOCKS, delta(before.committed, after.committed),
               delta(pages_before, pages_after));
        CHECKF(delta(before.live_small, after.live_small) == LAZY_4K_BLOCKS, "live small blocks %+lld (%d expected)",
               delta(before.live_small, after.live_small), LAZY_4K_BLOCKS);
        check_allocator("after a thread reused the pages another thread emptied");
        agent_do(&a, lazy_free_job, &f);
        agent_stop(&a);
    }
    scene_end(&s);
#endif
}

/* A thread heap's page that stays full while 64 more of its pages go full (config.h's
 * SHARD_LOOSE_AFTER) goes loose (small.h): when another thread frees its last item, and the heap's
 * thread has drained no frees since it went loose (it allocates no more: a main thread that built what
 * workers free, and waits), the freeing thread gives its memory back. Here a thread fills 96 pages with
 * 1024-byte blocks (95 go full, the first 31 go loose) and waits; it frees half of page 0 itself (a free
 * into its loose page takes the page back), and 200 ms later (the loose delay is a 64th of the decommit
 * delay: 15 ms) another thread frees every other block. Pages 1-30 go back at once, while their thread
 * sleeps. A second free of one of their blocks reaches the error hook, from the other thread or from the
 * owner, and reads nothing; the owner's next allocations make them cold pages and use them again. */
#define LOOSE_PAGES 96 /* SHARD_LOOSE_AFTER + 32 */
#define LOOSE_PER_PAGE 64 /* 1024-byte blocks in a 64 KB page */
#define LOOSE_GONE 30     /* pages 1-30: the 31 loose ones but page 0, which its owner took back */
#define LOOSE_ANCHORS 17  /* 63 pages - 46 */

#if SHARD_RULES
struct loose_filler {
    struct blk kb[LOOSE_PAGES * LOOSE_PER_PAGE];
    struct blk again[LOOSE_GONE * LOOSE_PER_PAGE];
    void *twice; /* a block of a page that went back, freed already: the owner frees it again */
    /* In each of the first two segments the 1024-byte pages reach, blocks of LOOSE_ANCHORS classes of
     * their own, each its class's page, so that at most 46 pages of a segment go full: a segment whose
     * every page is full leaves its heap for the orphans (small.c's give_full_segment), and its pages
     * with it. */
    struct blk anchor[2 * LOOSE_ANCHORS];
};

/* The anchors' sizes: a class each, none of them 1024's. */
static const size_t loose_anchor_size[2 * LOOSE_ANCHORS] = {
    16, 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
    1280, 1536, 1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096, 4608, 5120, 5632, 6144, 6656};

static void loose_fill_job(void *arg)
{
    struct loose_filler *f = arg;
    uintptr_t segment = 0;
    size_t anchors = 0;
    for (size_t i = 0; i < LOOSE_PAGES * LOOSE_PER_PAGE; i++) {
        if (!blk_alloc(&f->kb[i], 1024, 0xc000 + i))
            return;
        if ((uintptr_t)f->kb[i].p >> 22 != segment && anchors < 2 * LOOSE_ANCHORS) {
            segment = (uintptr_t)f->kb[i].p >> 22; /* the next cold pages are this segment's */
            for (size_t k = 0; k < LOOSE_ANCHORS; k++, anchors++) {
                if (!blk_alloc(&f->anchor[anchors], loose_anchor_size[anchors], 0xa000 + anchors))
                    return;
                CHECKF((uintptr_t)f->anchor[anchors].p >> 22 == segment, "the %zu-byte block in the segment of "
                       "the 1024-byte ones", loose_anchor_size[anchors]);
            }
        }
    }
}

static void loose_half_job(void *arg)
{
    struct loose_filler *f = arg;
    for (size_t i = 0; i < LOOSE_PER_PAGE; i += 2) {
        blk_check(&f->kb[i], "1024-byte block its thread frees into its loose page");
        blk_free(&f->kb[i]);
    }
}

static void loose_twice_job(void *arg) { shard_free(((struct loose_filler *)arg)->twice); }

static void loose_again_job(void *arg)
{
    struct loose_filler *f = arg;
    for (size_t i = 0; i < LOOSE_GONE * LOOSE_PER_PAGE; i++)
        if (!blk_alloc(&f->again[i], 1024, 0xd000 + i))
            break;
    for (size_t i = 0; i < LOOSE_GONE * LOOSE_PER_PAGE; i++) {
        blk_check(&f->again[i], "1024-byte block in a page that went back while loose");
        blk_free(&f->again[i]);
    }
    check_allocator("in the thread whose loose pages went back, after it used them again");
}
#endif

TEST(the_pages_other_threads_empty_in_a_heap_that_allocates_no_more_go_back)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    struct scene s;
    scene_begin(&s);
    static struct loose_filler f;
    memset(&f, 0, sizeof f);
    struct agent a;
    if (agent_start(&a)) {
        agent_do(&a, loose_fill_job, &f);
        agent_do(&a, loose_half_job, &f);
        sleep_ms(PAST_THE_LOOSE_DELAY_MS);
        void *first_gone = f.kb[LOOSE_PER_PAGE].p, *second_gone = f.kb[2 * LOOSE_PER_PAGE].p;
        shard_stats before = stats_now();
        for (size_t i = 0; i < LOOSE_PAGES * LOOSE_PER_PAGE; i++) {
            if (f.kb[i].p == NULL)
                continue; /* page 0's blocks that its thread freed */
            blk_check(&f.kb[i], "1024-byte block another thread frees");
            blk_free(&f.kb[i]);
        }
        shard_stats after = stats_now();
        long long gone = (long long)LOOSE_GONE * 65536;
        CHECKF(delta(before.committed, after.committed) == -gone &&
                   delta(before.small_pages_used, after.small_pages_used) == -LOOSE_GONE,
               "another thread emptied the %d loose pages of a thread that allocates no more: committed %+lld "
               "bytes (%lld expected), pages in use %+lld (%d expected)",
               LOOSE_GONE, delta(before.committed, after.committed), -gone,
               delta(before.small_pages_used, after.small_pages_used), -LOOSE_GONE);
        CHECKF(delta(before.live_small, after.live_small) == -(LOOSE_PAGES * LOOSE_PER_PAGE - LOOSE_PER_PAGE / 2),
               "live small blocks %+lld after another thread's frees", delta(before.live_small, after.live_small));
        check_allocator("after another thread emptied a waiting thread's loose pages");
        if (delta(before.committed, after.committed) == -gone) { /* a second free reads none of a page gone */
            hook_reset();
            shard_error_fn previous = shard_set_error_hook(recording_hook, NULL);
            shard_free(first_gone);
            CHECKF(hook_record.calls == 1 && hook_record.ptr == first_gone &&
                       (hook_record.error == SHARD_ERROR_INVALID_FREE || hook_record.error == SHARD_ERROR_DOUBLE_FREE),
                   "another thread's second free of a block of a page gone back: %d hook calls, error %d",
                   hook_record.calls, hook_record.error);
            f.twice = second_gone;
            agent_do(&a, loose_twice_job, &f);
            CHECKF(hook_record.calls == 2 && hook_record.ptr == second_gone &&
                       (hook_record.error == SHARD_ERROR_INVALID_FREE || hook_record.error == SHARD_ERROR_DOUBLE_FREE),
                   "the owner's second free of a block of a page gone back: %d hook calls in all, error %d",
                   hook_record.calls, hook_record.error);
            shard_set_error_hook(previous, NULL);
        }
        agent_do(&a, loose_again_job, &f);
        for (size_t i = 0; i < 2 * LOOSE_ANCHORS; i++)
            if (f.anchor[i].p != NULL) {
                blk_check(&f.anchor[i], "block of a class of its own among the 1024-byte pages");
                blk_free(&f.anchor[i]);
            }
        check_allocator("after a thread used its pages that went back again");
        agent_stop(&a);
    }
    scene_end(&s);
#endif
}

/* A page goes loose for other threads' frees; one that its own thread's free takes back, with no other
 * thread's frees drained meanwhile, cost its loosening and the take-back for nothing: medium.c's 8k-16k
 * row, whose pages of four to eight items go loose and come back by the hundred thousand. For each such
 * take-back (config.h's SHARD_LOOSE_SKIP: 8) the next pages that go full in its heap, 32 at most
 * (SHARD_LOOSE_SKIP_MAX), take no place in its full_ring, so none of them goes loose later. Here the
 * thread of the test above fills its 96 pages (pages 0-30 go loose, 31-94 wait in the ring), frees a
 * block of each of pages 0-3 itself (four take-backs: 32 skipped), then fills 40 more pages: the first
 * 32 of them to go full are skipped, the last 8 take their places in the ring and put out pages 31-38,
 * which go loose. Another thread then empties pages 31-70: 31-38 go back, 39-70 stay with the owner
 * (before, all 40 went loose and back). When the owner drained another thread's free into a loose page
 * (page 5) before its take-backs, they count for nothing: all 40 go loose and back. */
#define SKIP_TAKEN 4       /* take-backs by the owner's frees: pages 0-3 */
#define SKIP_MORE 40       /* pages filled after them */
#define SKIP_LOOSE 8       /* SKIP_MORE - 4 * SHARD_LOOSE_SKIP */

#if SHARD_RULES
struct skip_filler {
    struct loose_filler f;
    struct blk more[SKIP_MORE * LOOSE_PER_PAGE];
    struct blk drain; /* a block of a class of its own, whose allocation drains the page 5 free */
};

static void skip_drain_job(void *arg)
{
    struct skip_filler *s = arg;
    blk_alloc(&s->drain, 16384, 0xf000);
}

static void skip_take_back_job(void *arg)
{
    struct skip_filler *s = arg;
    for (size_t i = 0; i < SKIP_TAKEN; i++) {
        blk_check(&s->f.kb[i * LOOSE_PER_PAGE], "1024-byte block its thread frees into its loose page");
        blk_free(&s->f.kb[i * LOOSE_PER_PAGE]);
    }
}

static void skip_more_job(void *arg)
{
    struct skip_filler *s = arg;
    for (size_t i = 0; i < SKIP_MORE * LOOSE_PER_PAGE; i++)
        if (!blk_alloc(&s->more[i], 1024, 0xe000 + i))
            return;
}

/* The scene of both tests: the pages that go back when another thread empties pages 31-70, -1 when the
 * committed bytes and the pages in use disagree, -2 when no agent thread started. drained: another
 * thread frees a block of loose page 5 first, and the owner drains it. */
static long long skip_scene(int drained)
{
    long long back = -2;
    struct scene sc;
    scene_begin(&sc);
    static struct skip_filler s;
    memset(&s, 0, sizeof s);
    struct agent a;
    if (agent_start(&a)) {
        agent_do(&a, loose_fill_job, &s.f);
        if (drained) {
            blk_check(&s.f.kb[5 * LOOSE_PER_PAGE], "1024-byte block another thread frees into a loose page");
            blk_free(&s.f.kb[5 * LOOSE_PER_PAGE]);
            agent_do(&a, skip_drain_job, &s);
        }
        agent_do(&a, skip_take_back_job, &s);
        agent_do(&a, skip_more_job, &s);
        sleep_ms(PAST_THE_LOOSE_DELAY_MS);
        shard_stats before = stats_now();
        for (size_t i = 31 * LOOSE_PER_PAGE; i < (31 + SKIP_MORE) * LOOSE_PER_PAGE; i++) {
            blk_check(&s.f.kb[i], "1024-byte block another thread frees");
            blk_free(&s.f.kb[i]);
        }
        shard_stats after = stats_now();
        long long pages = -delta(before.small_pages_used, after.small_pages_used);
        back = delta(before.committed, after.committed) == -pages * 65536 ? pages : -1;
        check_allocator("after another thread emptied pages, some of them loose");
        struct blk *all[] = {s.f.kb, s.more, s.f.anchor, &s.drain};
        size_t counts[] = {LOOSE_PAGES * LOOSE_PER_PAGE, SKIP_MORE * LOOSE_PER_PAGE, 2 * LOOSE_ANCHORS, 1};
        for (size_t k = 0; k < 4; k++)
            for (size_t i = 0; i < counts[k]; i++)
                if (all[k][i].p != NULL) {
                    blk_check(&all[k][i], "block of the scene");
                    blk_free(&all[k][i]);
                }
        check_allocator("after the blocks of the scene were freed");
        agent_stop(&a);
    }
    scene_end(&sc);
    return back;
}
#endif

TEST(a_heap_whose_own_frees_take_its_loose_pages_back_loosens_fewer)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    long long back = skip_scene(0);
    CHECKF(back == SKIP_LOOSE, "another thread emptied pages 31-70 of a thread whose own frees took 4 loose pages "
           "back: %lld went back (-1: committed bytes and pages in use disagree, -2: no thread; %d "
           "expected)", back, SKIP_LOOSE);
#endif
}

TEST(take_backs_after_a_drain_of_other_threads_frees_do_not_keep_pages_from_going_loose)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    long long back = skip_scene(1);
    CHECKF(back == SKIP_MORE, "another thread emptied pages 31-70 of a thread that drained a free into a loose page "
           "before its own took 4 back: %lld went back (-1: committed bytes and pages in use disagree, -2: no thread; "
           "%d expected)", back, SKIP_MORE);
#endif
}

/* ---- lent pages (src/small.h): the free pages of one thread's heap serve another's ---- */

#if SHARD_RULES
#define LEND_SIZE ((size_t)1024)                  /* 64 items to a page */
#define LEND_PER_PAGE (PAGE_BYTES / LEND_SIZE)
#define LEND_PAGES 48                             /* the lender's pages */
#define LEND_KEPT 16                              /* free pages a heap keeps before it lends (src/config.h) */
#define LEND_LENT (LEND_PAGES - LEND_KEPT - 1)    /* the class keeps its last page, empty, while its thread runs */
#define LEND_TAKEN 24                             /* pages the borrower fills: fewer than were lent */
#define LEND_STALE_PAGE 30                        /* a page the lender lent: retired after the 16 it keeps */

struct lend {
    struct blk a[LEND_PAGES * LEND_PER_PAGE]; /* the lender's blocks, page after page */
    struct blk b[LEND_TAKEN * LEND_PER_PAGE]; /* the borrower's */
    size_t seen, strays;                      /* the borrower's walk: its blocks found, other blocks */
    int part;                                 /* which third of b[] a free job takes */
};

static void lend_fill_job(void *arg)
{
    struct lend *l = arg;
    for (size_t i = 0; i < LEND_PAGES * LEND_PER_PAGE; i++)
        blk_alloc(&l->a[i], LEND_SIZE, 0x4c000 + i);
}

/* The lender frees its blocks page after page: the first pages retired stay its free pages, the later
 * ones go to the pool. */
static void lend_free_job(void *arg)
{
    struct lend *l = arg;
    for (size_t i = 0; i < LEND_PAGES * LEND_PER_PAGE; i++) {
        blk_check(&l->a[i], "1024-byte block of the lender");
        blk_free(&l->a[i]);
    }
}

static void borrow_job(void *arg)
{
    struct lend *l = arg;
    for (size_t i = 0; i < LEND_TAKEN * LEND_PER_PAGE; i++)
        blk_alloc(&l->b[i], LEND_SIZE, 0x4d000 + i);
}

static int borrow_visit(void *arg, void *block, size_t usable, int kind)
{
    struct lend *l = arg;
    int mine = 0;
    for (size_t i = 0; i < LEND_TAKEN * LEND_PER_PAGE && !mine; i++)
        mine = l->b[i].p == block;
    if (mine && usable == LEND_SIZE && kind == SHARD_BLOCK_SMALL)
        l->seen++;
    else
        l->strays++;
    return 0;
}

__attribute__((unused)) static void borrow_visit_job(void *arg)
{
    struct lend *l = arg;
    l->seen = l->strays = 0;
    shard_visit(SHARD_VISIT_THREAD, borrow_visit, l);
    check_allocator("in the thread whose pages came from another thread's segments");
}

/* Every third block of b[], from l->part on: checked, resized within its class, freed. */
static void borrow_free_part_job(void *arg)
{
    struct lend *l = arg;
    for (size_t i = (size_t)l->part; i < LEND_TAKEN * LEND_PER_PAGE; i += 3) {
        blk_check(&l->b[i], "1024-byte block in a lent page");
        CHECKF(shard_usable_size(l->b[i].p) == LEND_SIZE, "usable size %zu of a block in a lent page",
               shard_usable_size(l->b[i].p));
        unsigned char *was = l->b[i].p;
        blk_resize(&l->b[i], LEND_SIZE - 24, "1024-byte block in a lent page");
        CHECKF(l->b[i].p == was, "a block in a lent page moved when it shrank within its class");
        blk_free(&l->b[i]);
    }
    shard_collect(); /* what this thread gathered of them goes now (src/small.c, gathered frees) */
    check_allocator("after frees into lent pages");
}

static void check_allocator_job(void *arg) { check_allocator(arg); }

/* A lender that filled and emptied LEND_PAGES pages and a borrower, both new heaps (the waiting ones are
 * held); the pool holds nothing from before. A heap lends while another needs pages: the borrower's
 * first job (`first`), whose allocation commits a page afresh, comes before the lender's frees. */
static void lend_begin(struct lend *l, struct holders *h, struct agent *lender, struct agent *borrower,
                       void (*first)(void *), void *arg)
{
    memset(l, 0, sizeof *l);
    shard_collect(); /* every page lent before goes home */
    hold_waiting_heaps(h);
    agent_start(lender);
    agent_do(lender, lend_fill_job, l);
    agent_start(borrower);
    agent_do(borrower, first, arg);
    agent_do(lender, lend_free_job, l);
}

__attribute__((unused)) static size_t all_small_pages(const shard_stats *s)
{
    return s->small_pages_used + s->small_pages_free + s->small_pages_decommitted;
}
#endif

/* A thread that needs pages takes those another thread's heap emptied and lent, before it makes a segment:
 * its blocks there are its own to walk, and any thread checks, resizes and frees them (the borrower, the
 * lender whose segment holds them, a third). Fails where pages serve only the heap of their segment: the
 * borrower made a segment of its own. */
TEST(pages_one_thread_emptied_serve_another_before_new_memory)
{
#if !SHARD_RULES || defined(TEST_HARDENED) /* the hardened build lends no page */
    SKIP_TEST();
#else
    static struct lend l;
    struct holders h;
    struct agent lender, borrower;
    lend_begin(&l, &h, &lender, &borrower, small_op_job, NULL);
    shard_stats s0 = stats_now();
    agent_do(&borrower, borrow_job, &l);
    shard_stats s1 = stats_now();
    CHECKF(all_small_pages(&s1) == all_small_pages(&s0) && s1.reserved == s0.reserved,
           "the borrower's %d pages: small pages %zu -> %zu, reserved %zu -> %zu (a new segment: no page lent)",
           LEND_TAKEN, all_small_pages(&s0), all_small_pages(&s1), s0.reserved, s1.reserved);
    CHECKF(s1.committed <= s0.committed, "committed %zu -> %zu while the borrower used lent pages", s0.committed,
           s1.committed);
    CHECKF(s1.small_pages_used >= s0.small_pages_used + LEND_TAKEN, "pages in use %zu -> %zu",
           s0.small_pages_used, s1.small_pages_used);
    agent_do(&borrower, borrow_visit_job, &l);
    CHECKF(l.seen == LEND_TAKEN * LEND_PER_PAGE && l.strays == 0,
           "the borrower's walk found %zu of its %zu blocks and %zu others", l.seen,
           (size_t)(LEND_TAKEN * LEND_PER_PAGE), l.strays);
    l.part = 0;
    agent_do(&borrower, borrow_free_part_job, &l); /* the borrower's own frees */
    l.part = 1;
    agent_do(&lender, borrow_free_part_job, &l);   /* the frees of the heap whose segments hold them */
    l.part = 2;
    borrow_free_part_job(&l);                      /* a third thread's */
    agent_do(&borrower, medium_op_job, NULL);      /* takes in the others' frees */
    agent_do(&borrower, borrow_visit_job, &l);
    CHECKF(l.seen == 0 && l.strays == 0, "after every free the borrower's walk found %zu blocks", l.seen + l.strays);
    agent_do(&lender, lend_fill_job, &l); /* the pages come back to their lender */
    agent_do(&lender, lend_free_job, &l);
    agent_do(&lender, check_allocator_job, "in the lender after its pages came back");
    agent_stop(&borrower);
    agent_stop(&lender);
    release_holders(&h);
    check_allocator("after lent pages went back");
#endif
}

#if SHARD_RULES
#define WARM_RUN_SIZE ((size_t)12 * 1024) /* 5 to a page: a class that runs serve (src/small.h) */
#define WARM_RUN_BLOCKS 40                /* 8 pages' worth */

struct warm_run {
    struct blk own[2 * LEND_PER_PAGE];    /* two pages of the borrower's, the first one freed */
    struct blk r[WARM_RUN_BLOCKS];
};

/* The borrower fills two pages of 1 KB blocks and empties the first: one free page of its own. */
__attribute__((unused)) static void warm_run_free_page_job(void *arg)
{
    struct warm_run *w = arg;
    for (size_t i = 0; i < 2 * LEND_PER_PAGE; i++)
        blk_alloc(&w->own[i], LEND_SIZE, 0x4e000 + i);
    for (size_t i = 0; i < LEND_PER_PAGE; i++) {
        blk_check(&w->own[i], "1024-byte block of the borrower");
        blk_free(&w->own[i]);
    }
}

__attribute__((unused)) static void warm_run_alloc_job(void *arg)
{
    struct warm_run *w = arg;
    for (size_t i = 0; i < WARM_RUN_BLOCKS; i++)
        blk_alloc(&w->r[i], WARM_RUN_SIZE, 0x4f000 + i);
}

__attribute__((unused)) static void warm_run_free_job(void *arg)
{
    struct warm_run *w = arg;
    for (size_t i = 0; i < WARM_RUN_BLOCKS; i++) {
        blk_check(&w->r[i], "12 KB block of a class of runs");
        blk_free(&w->r[i]);
    }
    for (size_t i = LEND_PER_PAGE; i < 2 * LEND_PER_PAGE; i++) {
        blk_check(&w->own[i], "1024-byte block of the borrower");
        blk_free(&w->own[i]);
    }
    check_allocator("after the blocks of a class of runs were freed");
}
#endif

/* A class served by runs of pages takes, while the pool holds pages other heaps lent, the free pages of
 * its heap and the pool's, one by one, and commits none: a run is made of free pages alone then. Fails
 * where a run also takes cold pages: the borrower, which holds one free page, committed runs of them
 * beside the 31 pages lent. */
TEST(a_class_of_runs_takes_lent_pages_before_it_commits_cold_ones)
{
#if !SHARD_RULES || defined(TEST_HARDENED) /* the hardened build lends no page, and has no runs */
    SKIP_TEST();
#else
    static struct lend l;
    static struct warm_run w;
    struct holders h;
    struct agent lender, borrower;
    memset(&w, 0, sizeof w);
    lend_begin(&l, &h, &lender, &borrower, warm_run_free_page_job, &w); /* with a free page of its own */
    shard_stats s0 = stats_now();
    agent_do(&borrower, warm_run_alloc_job, &w);
    shard_stats s1 = stats_now();
    CHECKF(s1.committed <= s0.committed && s1.small_pages_decommitted == s0.small_pages_decommitted,
           "%d blocks of 12 KB beside %d pages lent: committed %zu -> %zu, pages not committed %zu -> %zu",
           WARM_RUN_BLOCKS, LEND_LENT, s0.committed, s1.committed, s0.small_pages_decommitted,
           s1.small_pages_decommitted);
    CHECKF(s1.small_pages_used >= s0.small_pages_used + WARM_RUN_BLOCKS / 5, "pages in use %zu -> %zu",
           s0.small_pages_used, s1.small_pages_used);
    agent_do(&borrower, warm_run_free_job, &w);
    agent_do(&borrower, check_allocator_job, "in the borrower after its blocks in lent pages went");
    agent_stop(&borrower);
    agent_stop(&lender);
    release_holders(&h);
    check_allocator("after the blocks of a class of runs went");
#endif
}

/* Pages lent and taken by no one go back to the system after the delay, at any thread's slow path (the
 * lender's thread does nothing), and the lender's segments go when it ends. Fails where free pages wait in
 * their heap: an idle lender's stay committed. */
TEST(pages_lent_and_not_taken_go_back_to_the_system_after_the_delay)
{
#if !SHARD_RULES || defined(TEST_HARDENED) /* the hardened build lends no page */
    SKIP_TEST();
#else
    static struct lend l;
    struct holders h;
    struct agent lender, wanter;
    medium_op(); /* this thread's arena, which a collect keeps, is there before the count */
    shard_collect();
    shard_stats sb = stats_now();
    lend_begin(&l, &h, &lender, &wanter, small_op_job, NULL);
    shard_stats s0 = stats_now();
    sleep_ms(PAST_THE_DELAY_MS);
    medium_op(); /* a slow path of this thread: the trims that are due */
    shard_stats s1 = stats_now();
    CHECKF(s1.small_pages_decommitted >= s0.small_pages_decommitted + LEND_LENT,
           "decommitted pages %zu -> %zu after the delay (%d lent)", s0.small_pages_decommitted,
           s1.small_pages_decommitted, LEND_LENT);
    /* (the slow path's medium block may commit 64 KB of an arena) */
    CHECKF(s0.committed - s1.committed >= (size_t)(LEND_LENT - 1) * PAGE_BYTES,
           "committed %zu -> %zu after the delay", s0.committed, s1.committed);
    agent_do(&lender, small_op_job, NULL); /* takes its pages back, cold */
    agent_do(&lender, check_allocator_job, "in the lender after its lent pages came home");
    agent_stop(&wanter);
    agent_stop(&lender);
    release_holders(&h);
    shard_collect();
    shard_stats s2 = stats_now();
    CHECKF(s2.reserved <= sb.reserved, "reserved %zu before the lender, %zu after it ended and a collect",
           sb.reserved, s2.reserved);
    check_allocator("after the lender ended");
#endif
}

/* A thread alone lends nothing: no other heap needed pages, so its free pages stay its own, and wait for
 * its own slow paths (another thread's, after the delay, decommits none of them). */
TEST(a_thread_whose_free_pages_no_other_heap_needs_keeps_them)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    static struct lend l;
    struct holders h;
    struct agent lender;
    memset(&l, 0, sizeof l);
    shard_collect(); /* the pool empty, and no heap's need of pages left over */
    hold_waiting_heaps(&h);
    agent_start(&lender);
    agent_do(&lender, lend_fill_job, &l);
    agent_do(&lender, lend_free_job, &l);
    shard_stats s0 = stats_now();
    sleep_ms(PAST_THE_DELAY_MS);
    medium_op(); /* a slow path of this thread: the trims that are due */
    shard_stats s1 = stats_now();
    CHECKF(s1.small_pages_decommitted == s0.small_pages_decommitted && s1.small_pages_free == s0.small_pages_free,
           "decommitted pages %zu -> %zu, free %zu -> %zu: pages of a thread no other heap asked for went",
           s0.small_pages_decommitted, s1.small_pages_decommitted, s0.small_pages_free, s1.small_pages_free);
    agent_do(&lender, small_op_job, NULL); /* its own slow path: its free pages beyond 16 go now */
    shard_stats s2 = stats_now();
    CHECKF(s2.small_pages_decommitted >= s1.small_pages_decommitted + LEND_LENT,
           "decommitted pages %zu -> %zu at the thread's own slow path", s1.small_pages_decommitted,
           s2.small_pages_decommitted);
    agent_stop(&lender);
    release_holders(&h);
    check_allocator("after a thread that lent nothing ended");
#endif
}

/* The borrower ends with its blocks in lent pages: they stay valid, other threads free them, and once they
 * are all back the pages go home and the lender's segments can go. */
TEST(blocks_in_lent_pages_outlive_their_thread)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    static struct lend l;
    struct holders h;
    struct agent lender, borrower, freer;
    shard_collect();
    shard_stats sb = stats_now();
    lend_begin(&l, &h, &lender, &borrower, small_op_job, NULL);
    agent_do(&borrower, borrow_job, &l);
    agent_stop(&borrower); /* its heap waits, holding blocks in pages of the lender's segments */
    check_allocator("with a waiting heap that holds lent pages");
    l.part = 0;
    borrow_free_part_job(&l);
    l.part = 1;
    agent_start(&freer);
    agent_do(&freer, borrow_free_part_job, &l);
    l.part = 2;
    agent_do(&lender, borrow_free_part_job, &l);
    agent_stop(&freer);
    agent_stop(&lender);
    release_holders(&h);
    shard_collect();
    shard_stats s1 = stats_now();
    CHECKF(s1.reserved <= sb.reserved, "reserved %zu before, %zu after every block in lent pages was freed and a "
           "collect", sb.reserved, s1.reserved);
    check_allocator("after the blocks in lent pages were freed");
#endif
}

#if SHARD_RULES
static struct blk fresh_class_block; /* a 2 KB block: a class the borrower had no page of */

__attribute__((unused)) static void fresh_class_job(void *unused)
{
    (void)unused;
    blk_alloc(&fresh_class_block, 2048, 0x4a000);
}

__attribute__((unused)) static void fresh_class_free_job(void *unused)
{
    (void)unused;
    blk_check(&fresh_class_block, "2 KB block of the borrower");
    blk_free(&fresh_class_block);
}

/* The borrower's blocks of l->b[]: checked and freed, all of them. */
__attribute__((unused)) static void borrow_free_job(void *arg)
{
    struct lend *l = arg;
    for (l->part = 0; l->part < 3; l->part++)
        borrow_free_part_job(l);
}
#endif

/* A thread ends while another heap uses pages of its segment as guests: the segment stays with its heap,
 * neither spare nor released, so no heap lends for the decommit delay (src/small.c, lend_paused_until): a
 * second lender's free pages stay its own, and a heap that needs pages commits them. Fails where lending
 * goes on: the borrower's second 24 pages came from the second lender, and it committed none. */
TEST(no_heap_lends_for_the_delay_after_a_thread_ends_whose_segment_guests_tie)
{
#if !SHARD_RULES || defined(TEST_HARDENED) /* the hardened build lends no page */
    SKIP_TEST();
#else
    static struct lend l, l2;
    struct holders h;
    struct agent lender, borrower, lender2;
    memset(&l2, 0, sizeof l2);
    lend_begin(&l, &h, &lender, &borrower, small_op_job, NULL);
    agent_do(&borrower, borrow_job, &l); /* 24 of the lender's pages, as guests */
    agent_start(&lender2);
    agent_do(&lender2, lend_fill_job, &l2);
    agent_stop(&lender); /* its segment stays its heap's: the borrower uses pages of it */
    agent_do(&borrower, fresh_class_job, NULL); /* a page afresh: the other heaps would lend */
    agent_do(&lender2, lend_free_job, &l2);
    shard_stats s0 = stats_now();
    agent_do(&borrower, borrow_job, &l2);
    shard_stats s1 = stats_now();
    /* the pages of the first lender that the second took as guests come back to the pool (7), and a margin */
    CHECKF(s1.committed >= s0.committed + (size_t)(LEND_TAKEN - (LEND_LENT - LEND_TAKEN) - 1) * PAGE_BYTES,
           "committed %zu -> %zu for the borrower's %d pages after a thread ended whose segment it uses: "
           "another heap lent its pages", s0.committed, s1.committed, LEND_TAKEN);
    agent_do(&borrower, borrow_free_job, &l2);
    agent_do(&borrower, borrow_free_job, &l);
    agent_do(&borrower, fresh_class_free_job, NULL);
    agent_do(&borrower, check_allocator_job, "in the borrower after the lending pause");
    agent_stop(&borrower);
    agent_stop(&lender2);
    release_holders(&h);
    shard_collect();
    check_allocator("after the lending pause");
#endif
}

__attribute__((unused)) static void stale_free_job(void *arg) { shard_free(arg); }

/* A pointer into a page lent to the pool is no block: its free and realloc reach the error hook, from the
 * lender's thread (whose segment holds the page) and from another, and the pool's pages serve as before. */
TEST(a_free_into_a_lent_page_that_holds_no_block_reaches_the_error_hook)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    static struct lend l;
    struct holders h;
    struct agent lender, borrower;
    memset(&l, 0, sizeof l);
    shard_collect();
    hold_waiting_heaps(&h);
    agent_start(&lender);
    agent_do(&lender, lend_fill_job, &l);
    void *stale = l.a[LEND_STALE_PAGE * LEND_PER_PAGE + 5].p; /* in a page the lender lends when it frees */
    agent_start(&borrower);
    agent_do(&borrower, small_op_job, NULL); /* a heap that needs pages: the lender lends */
    agent_do(&lender, lend_free_job, &l);
    hook_reset();
    shard_error_fn old = shard_set_error_hook(recording_hook, &l);
    shard_free(stale);
    CHECK_HOOK(SHARD_ERROR_INVALID_FREE, stale, "free of a pointer into a lent page, by another thread");
    hook_reset();
    CHECK(shard_realloc(stale, 100) == NULL);
    CHECK_HOOK(SHARD_ERROR_INVALID_REALLOC, stale, "realloc of a pointer into a lent page");
    hook_reset();
    agent_do(&lender, stale_free_job, stale);
    CHECK_HOOK(SHARD_ERROR_INVALID_FREE, stale, "free of a pointer into a lent page, by its segment's owner");
    shard_set_error_hook(old, NULL);
    agent_do(&borrower, borrow_job, &l);
    agent_do(&borrower, borrow_free_job, &l);
    agent_do(&borrower, check_allocator_job, "in the borrower after the error hook's calls");
    agent_stop(&borrower);
    agent_stop(&lender);
    release_holders(&h);
#endif
}
