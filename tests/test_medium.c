/* test_medium.c - deterministic tests of shardmm's medium blocks (above 16 KB up to 1 MB).
 *
 * Fixed sizes in a fixed order, each test one documented behaviour: the kind and usable size of a
 * block, the in-place rules of realloc, merging of free neighbours, frees by other threads, the
 * delayed decommit of empty arenas, the error hook and calloc. Every block is filled with the pattern
 * of its own seed and checked before it is freed, after realloc and after it was handed to another
 * thread, so overlapping live blocks, a byte lost on a move and a stray write show up as a mismatch.
 *
 * The rules, as this file reads them (include/shardmm.h, src/medium.h):
 * - 16384 bytes is small, 16385 .. 1 MB medium, above 1 MB large. A medium block of n bytes has a
 *   usable size from round_up(n, 16) to round_up(n, 16) + 240 (a remainder of 256 bytes or more is
 *   split off its chunk); each chunk has a 16-byte header before its block, and consecutive
 *   allocations from a fresh arena lie one after another (the next block 16 bytes after the end of
 *   the previous one).
 * - realloc by the owner thread: to n' <= usable always in place (also below 16 KB); a freed tail of
 *   256 bytes or more makes the usable size exactly round_up(n', 16), a shorter one leaves it alone.
 *   Growing is in place exactly when the chunk after the block is free and the two hold
 *   round_up(n', 16) + 16 bytes. A growing block that moves gets a quarter of headroom (at least
 *   n' + n'/4, or n' where that passes 1 MB); above 1 MB it is large. Another thread's shrink moves.
 * - A block freed by another thread counts in live_medium until its owner's next medium operation,
 *   which merges it with its free neighbours.
 * - An empty arena other than the most recently emptied one gives back all but its first 64 KB once
 *   empty for a second.
 * - A double free, an interior pointer, realloc or usable_size of them reach the error hook.
 *
 * Several tests need a heap whose arenas hold nothing but their own blocks (where a block lands is
 * then known). run_on_fresh_heap() gets one: a new thread takes a waiting heap of an exited thread
 * first, so every waiting heap is taken by a blocker thread before the test thread starts, and the
 * test thread's first allocation must create a heap (checked through the statistics).
 *
 * Built with -DTEST_SYSTEM_MALLOC the same file runs on the system malloc: the checks of shardmm's own
 * rules (usable sizes, in-place rules, statistics, the error hook, shard_check) are left out and the
 * tests made only of them report "skip"; the contents are still checked. That is a check of the tests.
 *
 * Build: see build.ninja (build/test-medium, build/win64/test-medium.exe and their variants).
 * Run:   build/test-medium [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator.h"
#include "observe.h"

#include "realloc_pairs.h"

/* ---- the rules, written out independently of the allocator ---- */

#define SMALL_MAX ((size_t)16384)
#define MEDIUM_MAX ((size_t)1 << 20)
#define ARENA_SIZE ((size_t)4 << 20)
#define CHUNK_HEADER ((size_t)16)
#define SPLIT_MIN ((size_t)256)
#define ARENA_KEEP ((size_t)64 << 10)

enum kind { KIND_SMALL, KIND_MEDIUM, KIND_LARGE };

static enum kind kind_of_size(size_t n)
{
    return n <= SMALL_MAX ? KIND_SMALL : n <= MEDIUM_MAX ? KIND_MEDIUM : KIND_LARGE;
}

__attribute__((unused)) static const char *kind_name(enum kind k)
{
    return k == KIND_SMALL ? "small" : k == KIND_MEDIUM ? "medium" : "large";
}

/* round_up(n, 16), at least 16. */
static size_t r16(size_t n)
{
    return n < 16 ? 16 : (n + 15) & ~(size_t)15;
}

/* Whether u is a usable size a medium request of n bytes may get. */
__attribute__((unused)) static int medium_usable_ok(size_t u, size_t n)
{
    return u >= r16(n) && u <= r16(n) + 240;
}

/* The usable size after the owner shrinks (or keeps) a medium block of usable size u to n <= u bytes. */
__attribute__((unused)) static size_t shrink_expected(size_t u, size_t n)
{
    return u >= r16(n) + SPLIT_MIN ? r16(n) : u;
}

/* The least usable size of a block of `old` usable bytes that moved because it grew to n bytes: a quarter
 * more than it had, or n when that is more, within the medium range. */
__attribute__((unused)) static size_t grow_target(size_t old, size_t n)
{
    if (n > SMALL_MAX && n <= MEDIUM_MAX) {
        size_t t = old + old / 4;
        if (t < n)
            t = n;
        return t < MEDIUM_MAX ? t : MEDIUM_MAX;
    }
    return n;
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

#if SHARD_RULES

static size_t live_of(const shard_stats *s, enum kind k)
{
    return k == KIND_SMALL ? s->live_small : k == KIND_MEDIUM ? s->live_medium : s->live_large;
}
#endif


/* One medium operation of the calling thread (an allocation and a free): the owner takes the chunks
 * other threads freed into its arenas, and a second-old empty arena is looked at. */
static void medium_op(void)
{
    void *p = shard_malloc(20000);
    CHECK(p != NULL);
    if (p)
        fill(p, 20000, 77);
    shard_free(p);
}

/* Allocates count blocks of the given sizes one after another, each filled with its pattern over its
 * usable size (seed: seeds[i]). Under shardmm's rules, on a fresh arena, every block starts a chunk
 * header after the end of the one before. Returns 1 when all were allocated (and lie so); otherwise 0
 * after reporting why not, and after freeing the blocks it got (all or nothing). */
static int alloc_chain(unsigned char **blocks, size_t *usable, const size_t *sizes, size_t count,
                       const uint64_t *seeds, const char *what)
{
    int ok = 1;
    for (size_t i = 0; i < count; i++) {
        blocks[i] = shard_malloc(sizes[i]);
        CHECKF(blocks[i] != NULL, "%s: shard_malloc(%zu)", what, sizes[i]);
        if (!blocks[i]) {
            usable[i] = 0;
            ok = 0;
            continue;
        }
        usable[i] = shard_usable_size(blocks[i]);
        fill(blocks[i], usable[i], seeds[i]);
#if SHARD_RULES
        CHECKF(medium_usable_ok(usable[i], sizes[i]), "%s: block %zu of %zu bytes has usable size %zu", what, i,
               sizes[i], usable[i]);
        if (i > 0 && blocks[i - 1] && ok && blocks[i] != blocks[i - 1] + usable[i - 1] + CHUNK_HEADER) {
            harness_fail(__FILE__, __LINE__,
                         "%s: consecutive blocks of a fresh arena not adjacent: block %zu at %p, block %zu at "
                         "%p + %zu + 16 = %p expected",
                         what, i, (void *)blocks[i], i - 1, (void *)blocks[i - 1], usable[i - 1],
                         (void *)(blocks[i - 1] + usable[i - 1] + CHUNK_HEADER));
            ok = 0;
        }
#endif
    }
    if (!ok)
        for (size_t i = 0; i < count; i++) {
            shard_free(blocks[i]);
            blocks[i] = NULL;
        }
    return ok;
}

/* ---- heaps ---- */

/* run_on_fresh_heap: blockers take every heap waiting in the stack and hold it while the test runs. */
static int blockers_ready, blockers_release;

static void *blocker_thread(void *unused)
{
    (void)unused;
    void *p = shard_malloc(64); /* the first allocation takes a waiting heap */
    CHECK(p != NULL);
    shard_free(p);
    __atomic_add_fetch(&blockers_ready, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&blockers_release, __ATOMIC_SEQ_CST))
        sleep_ms(1);
    return NULL;
}

struct fresh_run {
    thread_fn fn;
    void *arg;
    int fresh;
};

static void *fresh_entry(void *arg)
{
    struct fresh_run *r = arg;
#if SHARD_RULES
    size_t before = stats_now().heaps;
    void *p = shard_malloc(64);
    shard_free(p);
    r->fresh = stats_now().heaps == before + 1;
#else
    r->fresh = 1;
#endif
    r->fn(r->arg);
    return NULL;
}

/* Runs fn(arg) on a new thread whose heap is new (no arenas, no pages). */
static void run_on_fresh_heap(thread_fn fn, void *arg)
{
    struct fresh_run r = { fn, arg, 0 };
    size_t k = 0, started = 0;
    thread_t *blockers = NULL;
#if SHARD_RULES
    k = stats_now().heaps_free;
#endif
    __atomic_store_n(&blockers_ready, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&blockers_release, 0, __ATOMIC_SEQ_CST);
    if (k > 0) {
        blockers = calloc(k, sizeof *blockers);
        CHECK(blockers != NULL);
        if (!blockers)
            return;
    }
    for (size_t i = 0; i < k; i++) {
        if (thread_start(&blockers[started], blocker_thread, NULL) == 0)
            started++;
        else
            CHECKF(0, "blocker thread %zu of %zu did not start", i, k);
    }
    while (__atomic_load_n(&blockers_ready, __ATOMIC_SEQ_CST) < (int)started)
        sleep_ms(1);
    run_thread(fresh_entry, &r);
    CHECKF(r.fresh, "the test thread did not get a new heap (%zu heaps were waiting, %zu blockers)", k, started);
    __atomic_store_n(&blockers_release, 1, __ATOMIC_SEQ_CST);
    for (size_t i = 0; i < started; i++)
        thread_join(blockers[i]);
    free(blockers);
}

/* drain_all_heaps: a thread per waiting heap performs a medium operation on it (so the blocks other
 * threads freed into it are taken) and checks it; the main thread does the same for its own heap. */
static int drainers_done, drainers_release;

__attribute__((unused)) static void *drainer_thread(void *unused)
{
    (void)unused;
    medium_op();
    check_allocator("in a heap taken from the stack of waiting heaps, after a medium operation");
    __atomic_add_fetch(&drainers_done, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&drainers_release, __ATOMIC_SEQ_CST)) /* each drainer holds its own heap */
        sleep_ms(1);
    return NULL;
}

static void drain_all_heaps(void)
{
    medium_op();
#if SHARD_RULES
    size_t k = stats_now().heaps_free, started = 0;
    thread_t *t = k ? calloc(k, sizeof *t) : NULL;
    if (k && !t) {
        CHECK(!"test bookkeeping allocation failed");
        return;
    }
    __atomic_store_n(&drainers_done, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&drainers_release, 0, __ATOMIC_SEQ_CST);
    for (size_t i = 0; i < k; i++)
        if (thread_start(&t[started], drainer_thread, NULL) == 0)
            started++;
    CHECKF(started == k, "%zu of %zu drainer threads started", started, k);
    while (__atomic_load_n(&drainers_done, __ATOMIC_SEQ_CST) < (int)started)
        sleep_ms(1);
    __atomic_store_n(&drainers_release, 1, __ATOMIC_SEQ_CST);
    for (size_t i = 0; i < started; i++)
        thread_join(t[i]);
    free(t);
#endif
}

/* Blocks handed to another thread, which checks and frees them. */
struct handover {
    unsigned char **blocks;
    const size_t *sizes;
    const uint64_t *seeds;
    size_t count;
};

static void *check_and_free_handed(void *arg)
{
    struct handover *h = arg;
    for (size_t i = 0; i < h->count; i++)
        if (h->blocks[i]) {
            CHECK_PATTERN(h->blocks[i], h->sizes[i], h->seeds[i], "medium block handed to another thread");
            shard_free(h->blocks[i]);
        }
    return NULL;
}

/* ---- tests ---- */

TEST(rules_of_the_test_are_the_documented_ones)
{
    CHECK_EQ(kind_of_size(16384), KIND_SMALL);
    CHECK_EQ(kind_of_size(16385), KIND_MEDIUM);
    CHECK_EQ(kind_of_size(1048576), KIND_MEDIUM);
    CHECK_EQ(kind_of_size(1048577), KIND_LARGE);
    CHECK_EQ(r16(1), 16);
    CHECK_EQ(r16(16385), 16400);
    CHECK_EQ(shrink_expected(200000, 200000 - 255), 200000);
    CHECK_EQ(shrink_expected(200000, 200000 - 256), 200000 - 256);
    CHECK_EQ(shrink_expected(200000, 1), 16);
    CHECK_EQ(grow_target(16384, 16385), 16384 + 4096);
    CHECK_EQ(grow_target(16384, 40000), 40000);
    CHECK_EQ(grow_target(838860, 838861), 1048575);
    CHECK_EQ(grow_target(838862, 838863), 1048576);
    CHECK_EQ(grow_target(1000000, 1048577), 1048577);
}

/* The sizes of the sweep: 16384, 16385, 16400, a geometric sweep to 1 MB with odd offsets, -1/0/+1
 * around every power of two, 1 MB and 1 MB + 1. */
static size_t sweep_sizes(size_t *out, size_t max)
{
    size_t n = 0, s, k;
    out[n++] = 16384;
    out[n++] = 16385;
    out[n++] = 16400;
    for (s = 16385, k = 0; s < MEDIUM_MAX && n < max - 24; s += s / 57 + 1, k++)
        out[n++] = s + (k * 7) % 16 <= MEDIUM_MAX ? s + (k * 7) % 16 : s;
    for (k = 15; k <= 20; k++) {
        out[n++] = ((size_t)1 << k) - 1;
        out[n++] = (size_t)1 << k;
        if (k < 20)
            out[n++] = ((size_t)1 << k) + 1;
    }
    out[n++] = MEDIUM_MAX;
    out[n++] = MEDIUM_MAX + 1;
    return n;
}

struct placed {
    uintptr_t at;
    size_t usable;
};

static int compare_placed(const void *a, const void *b)
{
    uintptr_t x = ((const struct placed *)a)->at, y = ((const struct placed *)b)->at;
    return (x > y) - (x < y);
}

/* Blocks of every kind around the medium range, all live at once: 16-byte aligned, of the kind their
 * size calls for (the live counts of the statistics), medium ones with a usable size within 240 bytes
 * above the request rounded to 16, none overlapping another, contents intact. */
TEST(medium_sizes_are_aligned_of_their_kind_and_usable_size_and_intact)
{
    enum { MAX = 400 };
    static size_t sizes[MAX], usable[MAX];
    static unsigned char *blocks[MAX];
    static struct placed placed[MAX];
    size_t count = sweep_sizes(sizes, MAX), i, np = 0, medium = 0, large = 0, small = 0;
    medium_op(); /* frees other threads left for this heap are taken now, not during the counts */
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    for (i = 0; i < count; i++) {
        size_t n = sizes[i];
        enum kind k = kind_of_size(n);
#if SHARD_RULES
        shard_stats a = stats_now();
#endif
        unsigned char *p = shard_malloc(n);
        blocks[i] = p;
        CHECKF(p != NULL, "shard_malloc(%zu) returned NULL", n);
        if (!p)
            continue;
        small += k == KIND_SMALL;
        medium += k == KIND_MEDIUM;
        large += k == KIND_LARGE;
        CHECKF(aligned16(p), "shard_malloc(%zu) = %p is not 16-byte aligned", n, (void *)p);
        usable[i] = shard_usable_size(p);
        CHECKF(usable[i] >= n, "shard_malloc(%zu): usable size %zu", n, usable[i]);
#if SHARD_RULES
        shard_stats b = stats_now();
        if (k == KIND_SMALL)
            CHECKF(usable[i] == 16384, "shard_malloc(%zu): usable size %zu, class 16384", n, usable[i]);
        if (k == KIND_MEDIUM)
            CHECKF(medium_usable_ok(usable[i], n), "shard_malloc(%zu): usable size %zu, expected %zu .. %zu", n,
                   usable[i], r16(n), r16(n) + 240);
        for (enum kind j = KIND_SMALL; j <= KIND_LARGE; j++)
            CHECKF(live_of(&b, j) == live_of(&a, j) + (j == k),
                   "shard_malloc(%zu), a %s size: live %s blocks %zu -> %zu", n, kind_name(k), kind_name(j),
                   live_of(&a, j), live_of(&b, j));
#endif
        fill(p, usable[i], 0x5000 + i);
        placed[np].at = (uintptr_t)p;
        placed[np++].usable = usable[i];
    }
    CHECKF(small == 1 && large == 1 && medium + 2 == count, "%zu sizes: %zu small, %zu medium, %zu large", count,
           small, medium, large);
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECKF(s1.live_medium == s0.live_medium + medium, "live_medium %zu -> %zu after %zu medium blocks",
           s0.live_medium, s1.live_medium, medium);
    CHECK(s1.medium_arenas > 0);
#endif
    check_allocator("with every size live");
    qsort(placed, np, sizeof placed[0], compare_placed);
    for (i = 0; i + 1 < np; i++)
        CHECKF(placed[i].at + placed[i].usable <= placed[i + 1].at, "block %p of usable size %zu overlaps block %p",
               (void *)placed[i].at, placed[i].usable, (void *)placed[i + 1].at);
    for (i = 0; i < count; i++) {
        char what[64];
        if (!blocks[i])
            continue;
        snprintf(what, sizeof what, "block of %zu bytes", sizes[i]);
        CHECK_PATTERN(blocks[i], usable[i], 0x5000 + i, what);
        CHECKF(shard_usable_size(blocks[i]) == usable[i], "usable size of the %zu-byte block changed", sizes[i]);
    }
    /* Every other block first, then the rest, checked again in between. */
    for (i = 0; i < count; i += 2)
        shard_free(blocks[i]);
    check_allocator("with every other block freed");
    for (i = 1; i < count; i += 2) {
        if (!blocks[i])
            continue;
        CHECK_PATTERN(blocks[i], usable[i], 0x5000 + i, "block after its neighbours were freed");
        shard_free(blocks[i]);
    }
#if SHARD_RULES
    shard_stats s2 = stats_now();
    CHECK_EQ(s2.live_small, s0.live_small);
    CHECK_EQ(s2.live_medium, s0.live_medium);
    CHECK_EQ(s2.live_large, s0.live_large);
#endif
    check_allocator("after every block was freed");
}

/* calloc and realloc(NULL, n) of medium sizes are medium blocks too. */
TEST(calloc_and_realloc_of_null_give_medium_blocks)
{
    static const size_t sizes[] = { 16385, 16400, 100000, 1048576 };
    medium_op();
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
#if SHARD_RULES
        shard_stats a = stats_now();
#endif
        unsigned char *p = shard_calloc(1, n), *q = shard_realloc(NULL, n);
        CHECKF(p != NULL && q != NULL, "calloc / realloc(NULL) of %zu bytes: %p %p", n, (void *)p, (void *)q);
        if (!p || !q) {
            shard_free(p);
            shard_free(q);
            continue;
        }
#if SHARD_RULES
        shard_stats b = stats_now();
        CHECKF(b.live_medium == a.live_medium + 2, "calloc and realloc(NULL) of %zu bytes: live_medium %zu -> %zu", n,
               a.live_medium, b.live_medium);
        CHECK(medium_usable_ok(shard_usable_size(p), n));
        CHECK(medium_usable_ok(shard_usable_size(q), n));
#endif
        CHECK_EQ(bytes_not_equal(p, n, 0), n);
        fill(q, n, 0x5900 + i);
        CHECK_PATTERN(q, n, 0x5900 + i, "block from realloc(NULL, n)");
        shard_free(p);
        shard_free(q);
    }
    check_allocator("after calloc and realloc(NULL)");
}

/* ---- realloc: shrinking in place ---- */

static void *shrink_body(void *unused)
{
    (void)unused;
    enum { P_SIZE = 200000, G_SIZE = 50000, R_SIZE = 300000 };
    static const size_t sizes[2] = { P_SIZE, G_SIZE };
    static const uint64_t seeds[2] = { 0x6000, 0x6001 };
    unsigned char *b[2];
    size_t u[2];
    if (!alloc_chain(b, u, sizes, 2, seeds, "block and its live neighbour"))
        return NULL;
    unsigned char *p = b[0], *g = b[1];
    size_t u0 = u[0], cur = u0, kept = u0;
    /* Targets relative to the current usable size (when small) or absolute. */
    static const struct {
        size_t below; /* the target is usable - below ... */
        size_t abs;   /* ... or this, when not 0 */
    } steps[] = {
        {0, 0},   {1, 0},   {15, 0},  {16, 0},  {240, 0}, {241, 0}, {255, 0}, {256, 0}, {257, 0},
        {0, 150001}, {0, 100000}, {0, 16385}, {0, 16384}, {0, 16383}, {0, 1000}, {0, 17}, {0, 16}, {0, 1},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t n = steps[i].abs ? steps[i].abs : cur - steps[i].below;
#if SHARD_RULES
        shard_stats a = stats_now();
#endif
        unsigned char *q = shard_realloc(p, n);
        CHECKF(q != NULL, "shard_realloc(usable %zu -> %zu) returned NULL", cur, n);
        if (!q)
            break;
        size_t nu = shard_usable_size(q);
        CHECKF(nu >= n, "shard_realloc(usable %zu -> %zu): usable %zu", cur, n, nu);
        CHECK_PATTERN(q, min_size(kept, n), 0x6000, "block shrunk");
#if SHARD_RULES
        shard_stats s = stats_now();
        CHECKF(q == p, "shard_realloc(usable %zu -> %zu) by the owner moved the block (%p -> %p)", cur, n, (void *)p,
               (void *)q);
        CHECKF(nu == shrink_expected(cur, n),
               "shard_realloc(usable %zu -> %zu) in place: usable %zu, expected %zu (freed tail %zu bytes)", cur, n, nu,
               shrink_expected(cur, n), cur - min_size(cur, r16(n)));
        CHECKF(s.live_medium == a.live_medium && s.live_small == a.live_small,
               "shard_realloc(usable %zu -> %zu): live medium %zu -> %zu, live small %zu -> %zu (the block stays "
               "medium)", cur, n, a.live_medium, s.live_medium, a.live_small, s.live_small);
#endif
        check_allocator("after shrinking a block in place");
        p = q;
        cur = nu;
        kept = min_size(kept, n);
    }
    CHECK_PATTERN(g, u[1], 0x6001, "live neighbour after the shrinks");
    /* The freed tails merged into one free chunk between p and g: growing back to the first size fits
     * exactly, one byte more does not (g is live). */
    {
        unsigned char *q = shard_realloc(p, u0);
        CHECKF(q != NULL, "shard_realloc(usable %zu -> %zu) back to the first size", cur, u0);
        if (q) {
#if SHARD_RULES
            CHECKF(q == p, "growing back into the freed tails (%zu -> %zu bytes) moved the block", cur, u0);
            CHECKF(shard_usable_size(q) == u0, "grown back into the freed tails: usable %zu, expected %zu",
                   shard_usable_size(q), u0);
#endif
            CHECK_PATTERN(q, kept, 0x6000, "block grown back");
            p = q;
            fill(p, u0, 0x6002);
            q = shard_realloc(p, u0 + 1);
            CHECK(q != NULL);
            if (q) {
#if SHARD_RULES
                CHECKF(q != p, "a block followed by a live one grew in place (%zu -> %zu bytes)", u0, u0 + 1);
                CHECKF(shard_usable_size(q) >= grow_target(u0, u0 + 1), "moved to %zu bytes: usable %zu, expected >= %zu",
                       u0 + 1, shard_usable_size(q), grow_target(u0, u0 + 1));
#endif
                CHECK_PATTERN(q, u0, 0x6002, "block moved because it grew");
                p = q;
            }
        }
    }
    check_allocator("after growing a shrunk block");
    /* A block followed by free space: a tail below 256 bytes stays with the block all the same. */
    {
        unsigned char *r = shard_malloc(R_SIZE);
        CHECK(r != NULL);
        if (r) {
            size_t ur = shard_usable_size(r);
            fill(r, ur, 0x6003);
            unsigned char *q = shard_realloc(r, ur - 200);
            CHECK(q != NULL);
            if (q) {
#if SHARD_RULES
                CHECK(q == r);
                CHECKF(shard_usable_size(q) == ur, "a 200-byte tail before free space: usable %zu -> %zu", ur,
                       shard_usable_size(q));
#endif
                r = q;
                size_t ur2 = shard_usable_size(r);
                q = shard_realloc(r, ur2 - 256);
                CHECK(q != NULL);
                if (q) {
#if SHARD_RULES
                    CHECK(q == r);
                    CHECKF(shard_usable_size(q) == r16(ur2 - 256),
                           "a 256-byte tail before free space: usable %zu -> %zu, expected %zu", ur2,
                           shard_usable_size(q), r16(ur2 - 256));
#endif
                    r = q;
                }
                CHECK_PATTERN(r, min_size(ur - 200, ur2 - 256), 0x6003, "block shrunk before free space");
            }
            shard_free(r);
        }
    }
    CHECK_PATTERN(g, u[1], 0x6001, "live neighbour at the end");
    shard_free(g);
    shard_free(p);
    check_allocator("at the end of the shrink test");
    return NULL;
}

/* The owner shrinks a medium block in place to every boundary of the tail rule, down to 1 byte (it stays
 * a medium block); the freed tails merge, so growing back fits exactly. */
TEST(realloc_shrinks_a_medium_block_in_place_and_frees_tails_of_256_bytes_or_more)
{
    run_on_fresh_heap(shrink_body, NULL);
}

/* ---- realloc: growing in place ---- */

static void *grow_body(void *unused)
{
    (void)unused;
    enum { N = 6 };
    static const size_t sizes[N] = { 100000, 60000, 30000, 80000, 40000, 20000 };
    static const uint64_t seeds[N] = { 0x6100, 0x6101, 0x6102, 0x6103, 0x6104, 0x6105 };
    unsigned char *b[N];
    size_t u[N];
    if (!alloc_chain(b, u, sizes, N, seeds, "six blocks of a fresh arena"))
        return NULL;
    unsigned char *a = b[0], *d = b[3], *q;
    /* D is followed by the live E: growing it by one byte moves it, with a quarter of headroom. */
    q = shard_realloc(d, u[3] + 1);
    CHECK(q != NULL);
    if (q) {
#if SHARD_RULES
        CHECKF(q != d, "a block followed by a live block grew in place (%zu -> %zu)", u[3], u[3] + 1);
        CHECKF(shard_usable_size(q) >= grow_target(u[3], u[3] + 1), "moved for %zu bytes: usable %zu, expected >= %zu",
               u[3] + 1, shard_usable_size(q), grow_target(u[3], u[3] + 1));
#endif
        CHECK_PATTERN(q, u[3], seeds[3], "block moved because it grew");
        b[3] = q;
    }
    CHECK_PATTERN(b[4], u[4], seeds[4], "live block after the one that moved");
    check_allocator("after a growing block moved");
    /* B freed: A grows into it. First by one byte (the rest of B's space stays free after A) ... */
    CHECK_PATTERN(b[1], u[1], seeds[1], "block B");
    shard_free(b[1]);
    b[1] = NULL;
    size_t room = u[0] + u[1] + CHUNK_HEADER; /* A's and B's chunks as one block */
    q = shard_realloc(a, u[0] + 1);
    CHECK(q != NULL);
    if (q) {
        size_t nu = shard_usable_size(q);
#if SHARD_RULES
        CHECKF(q == a, "growing into a free following chunk (%zu -> %zu) moved the block", u[0], u[0] + 1);
        CHECKF(medium_usable_ok(nu, u[0] + 1) && nu <= room, "grown in place to %zu bytes: usable %zu", u[0] + 1, nu);
#endif
        CHECK_PATTERN(q, u[0], seeds[0], "block grown in place by one byte");
        CHECK(nu >= u[0] + 1);
        a = q;
        fill(a, nu, 0x6110);
        /* ... then to exactly all of the space ... */
        q = shard_realloc(a, room);
        CHECK(q != NULL);
        if (q) {
#if SHARD_RULES
            CHECKF(q == a, "growing to exactly the free space after the block (%zu -> %zu) moved it", nu, room);
            CHECKF(shard_usable_size(q) == room, "grown to all the space: usable %zu, expected %zu",
                   shard_usable_size(q), room);
#endif
            CHECK_PATTERN(q, nu, 0x6110, "block grown in place to all the space");
            a = q;
            fill(a, room, 0x6111);
            check_allocator("after growing into all of a free neighbour");
            /* ... and one byte more moves (C is live). */
            q = shard_realloc(a, room + 1);
            CHECK(q != NULL);
            if (q) {
#if SHARD_RULES
                CHECKF(q != a, "a block with no free space after it grew in place (%zu -> %zu)", room, room + 1);
                CHECKF(shard_usable_size(q) >= grow_target(room, room + 1),
                       "moved for %zu bytes: usable %zu, expected >= %zu", room + 1, shard_usable_size(q),
                       grow_target(room, room + 1));
#endif
                CHECK_PATTERN(q, room, 0x6111, "block moved because it grew past the free space");
                a = q;
            }
        }
    }
    CHECK_PATTERN(b[2], u[2], seeds[2], "block C after A grew into B");
    shard_free(a);
    for (int i = 2; i < N; i++) {
        CHECK_PATTERN(b[i], u[i], seeds[i], "block at the end of the grow test");
        shard_free(b[i]);
    }
    check_allocator("at the end of the grow test");
    return NULL;
}

/* The owner grows a medium block in place exactly when the chunk after it is free and holds the growth:
 * by one byte, to exactly all the space, and not one byte more; with a live neighbour it moves. */
TEST(realloc_grows_in_place_into_a_free_following_chunk_and_moves_otherwise)
{
    run_on_fresh_heap(grow_body, NULL);
}

static void *grow_past_1mb_body(void *unused)
{
    (void)unused;
    unsigned char *p = shard_malloc(900000), *q;
    CHECK(p != NULL);
    if (!p)
        return NULL;
    fill(p, 900000, 0x6200);
    /* The first block of a fresh arena is followed by the free rest of it. */
    q = shard_realloc(p, MEDIUM_MAX);
    CHECK(q != NULL);
    if (!q) {
        shard_free(p);
        return NULL;
    }
#if SHARD_RULES
    CHECKF(q == p, "the first block of a fresh arena did not grow in place to 1 MB");
    CHECKF(medium_usable_ok(shard_usable_size(q), MEDIUM_MAX), "grown in place to 1 MB: usable %zu",
           shard_usable_size(q));
    shard_stats a = stats_now();
#endif
    CHECK_PATTERN(q, 900000, 0x6200, "block grown to 1 MB");
    p = q;
    fill(p, MEDIUM_MAX, 0x6201);
    q = shard_realloc(p, MEDIUM_MAX + 1);
    CHECK(q != NULL);
    if (!q) {
        shard_free(p);
        return NULL;
    }
#if SHARD_RULES
    shard_stats s = stats_now();
    CHECKF(q != p, "a medium block grew in place past 1 MB");
    CHECKF(s.live_large == a.live_large + 1 && s.live_medium + 1 == a.live_medium,
           "grown past 1 MB: live large %zu -> %zu, live medium %zu -> %zu (expected a large block)", a.live_large,
           s.live_large, a.live_medium, s.live_medium);
#endif
    CHECK(shard_usable_size(q) >= MEDIUM_MAX + 1);
    CHECK_PATTERN(q, MEDIUM_MAX, 0x6201, "block grown past 1 MB");
    shard_free(q);
    check_allocator("after a block grew past 1 MB");
    return NULL;
}

/* Growth in place ends at 1 MB: the first block of a fresh arena (free space after it) grows in place to
 * 1 MB, and to 1 MB + 1 it moves and is large. */
TEST(realloc_grows_in_place_up_to_1mb_and_past_it_becomes_large)
{
    run_on_fresh_heap(grow_past_1mb_body, NULL);
}

/* ---- realloc: moves ---- */

static void *headroom_body(void *unused)
{
    (void)unused;
    static const size_t targets[] = { 16401, 30000, 100000, 524288, 838860, 838861, 838862, 1000000, 1048576 };
    enum { T = sizeof targets / sizeof targets[0] };
    unsigned char *b[2 * T];
    size_t sizes[2 * T], u[2 * T];
    uint64_t seeds[2 * T];
    for (size_t i = 0; i < 2 * T; i++) {
        sizes[i] = i % 2 ? 16400 : (i == 0 ? 16385 : 20000); /* block, live guard, block, guard, ... */
        seeds[i] = 0x6300 + i;
    }
    if (!alloc_chain(b, u, sizes, 2 * T, seeds, "blocks each followed by a live guard"))
        return NULL;
    for (size_t i = 0; i < T; i++) {
        size_t n = targets[i];
        unsigned char *p = b[2 * i];
#if SHARD_RULES
        shard_stats a = stats_now();
#endif
        unsigned char *q = shard_realloc(p, n);
        CHECKF(q != NULL, "shard_realloc(%zu -> %zu)", u[2 * i], n);
        if (!q)
            continue;
#if SHARD_RULES
        shard_stats s = stats_now();
        CHECKF(q != p, "shard_realloc(%zu -> %zu) with a live block after it stayed in place", u[2 * i], n);
        CHECKF(shard_usable_size(q) >= grow_target(u[2 * i], n), "shard_realloc(%zu -> %zu) moved: usable %zu, expected >= %zu",
               u[2 * i], n, shard_usable_size(q), grow_target(u[2 * i], n));
        CHECKF(s.live_medium == a.live_medium, "shard_realloc(%zu -> %zu): live medium %zu -> %zu", u[2 * i], n,
               a.live_medium, s.live_medium);
#endif
        CHECK(shard_usable_size(q) >= n);
        CHECK_PATTERN(q, u[2 * i], seeds[2 * i], "medium block moved because it grew");
        fill(q, n, seeds[2 * i] + 100);
        b[2 * i] = q;
        u[2 * i] = n;
        seeds[2 * i] += 100;
    }
    for (size_t i = 0; i < 2 * T; i++) {
        CHECK_PATTERN(b[i], u[i], seeds[i], "block at the end of the headroom test");
        shard_free(b[i]);
    }
    check_allocator("at the end of the headroom test");
    return NULL;
}

/* A medium block of the owner that must move to grow gets a quarter of headroom, or what it asked for
 * where a quarter more would pass 1 MB (838861 + 838861/4 = 1 MB exactly; 838862 passes). */
TEST(a_medium_block_that_moves_to_grow_gets_a_quarter_of_headroom)
{
    run_on_fresh_heap(headroom_body, NULL);
}

/* A small block that grows beyond 16 KB moves to a medium block with a quarter of headroom; beyond 1 MB
 * to a large block. */
TEST(a_small_block_growing_beyond_16kb_moves_to_a_medium_block_with_headroom)
{
    static const size_t from_sizes[] = { 1, 100, 2048, 10000, 16383, 16384 };
    static const size_t to_sizes[] = { 16385, 16400, 20000, 100000, 838860, 838861, 838862, 1048576, 1048577 };
    medium_op();
    for (size_t i = 0; i < sizeof from_sizes / sizeof from_sizes[0]; i++)
        for (size_t j = 0; j < sizeof to_sizes / sizeof to_sizes[0]; j++) {
            size_t from = from_sizes[i], to = to_sizes[j];
            uint64_t seed = 0x6400 + 16 * i + j;
            unsigned char *p = shard_malloc(from), *q;
            CHECK(p != NULL);
            if (!p)
                continue;
            fill(p, from, seed);
#if SHARD_RULES
            shard_stats a = stats_now();
            size_t u = shard_usable_size(p);
#endif
            q = shard_realloc(p, to);
            CHECKF(q != NULL, "shard_realloc(%zu -> %zu)", from, to);
            if (!q) {
                shard_free(p);
                continue;
            }
#if SHARD_RULES
            shard_stats s = stats_now();
            enum kind k = kind_of_size(to);
            CHECKF(q != p, "shard_realloc(%zu -> %zu) of a small block stayed in place", from, to);
            CHECKF(shard_usable_size(q) >= grow_target(u, to), "shard_realloc(%zu -> %zu): usable %zu, expected >= %zu",
                   from, to, shard_usable_size(q), grow_target(u, to));
            CHECKF(s.live_small + 1 == a.live_small && live_of(&s, k) == live_of(&a, k) + 1,
                   "shard_realloc(%zu -> %zu): live small %zu -> %zu, live %s %zu -> %zu", from, to, a.live_small,
                   s.live_small, kind_name(k), live_of(&a, k), live_of(&s, k));
#endif
            CHECK(aligned16(q));
            CHECK(shard_usable_size(q) >= to);
            CHECK_PATTERN(q, from, seed, "small block grown beyond 16 KB");
            fill(q, to, seed);
            CHECK_PATTERN(q, to, seed, "small block grown beyond 16 KB, filled");
            shard_free(q);
        }
    check_allocator("after small blocks grew beyond 16 KB");
}

/* The in-place rules on every ordered pair of sizes at the boundaries around the medium range: the pairs
 * of tests/realloc_pairs.h with a size above 16 KB, and pairs of sizes of this file's own list. For a
 * medium block of the owner: to at most its usable size is in place with the tail rule; growth in place
 * is within the medium range with a usable size for the new size; a move for growth has a quarter of
 * headroom. A small block growing past 16 KB moves with a quarter of headroom. The kind of the result is
 * its old one when in place, the one of the new size when moved. Contents always survive. */
static void check_pair(size_t from, size_t to, uint64_t seed, unsigned char **ring_p, size_t *ring_n,
                       uint64_t *ring_seed)
{
    unsigned char *p = shard_malloc(from), *q;
    CHECKF(p != NULL, "shard_malloc(%zu)", from);
    if (!p)
        return;
    size_t u = shard_usable_size(p);
    fill(p, from, seed);
#if SHARD_RULES
    shard_stats a = stats_now();
#endif
    q = shard_realloc(p, to);
    CHECKF(q != NULL, "shard_realloc(%zu -> %zu) returned NULL", from, to);
    if (!q) {
        shard_free(p);
        return;
    }
    size_t nu = shard_usable_size(q), keep = min_size(from, to), bad = pattern_mismatch(q, keep, seed);
    CHECKF(bad == keep, "shard_realloc(%zu -> %zu): byte %zu of %zu lost (%s)", from, to, bad, keep,
           q == p ? "in place" : "moved");
    CHECKF(aligned16(q) && nu >= to, "shard_realloc(%zu -> %zu) = %p, usable %zu", from, to, (void *)q, nu);
#if SHARD_RULES
    shard_stats s = stats_now();
    enum kind kf = kind_of_size(from), kt = q == p ? kf : kind_of_size(to);
    for (enum kind j = KIND_SMALL; j <= KIND_LARGE; j++)
        CHECKF(live_of(&s, j) + (j == kf) == live_of(&a, j) + (j == kt),
               "shard_realloc(%zu -> %zu) %s: live %s %zu -> %zu", from, to, q == p ? "in place" : "moved",
               kind_name(j), live_of(&a, j), live_of(&s, j));
    if (kf == KIND_MEDIUM) {
        if (to <= u) {
            CHECKF(q == p, "shard_realloc(%zu -> %zu), usable %zu, by the owner: moved", from, to, u);
            CHECKF(q != p || nu == shrink_expected(u, to),
                   "shard_realloc(%zu -> %zu), usable %zu: usable %zu, expected %zu",
                   from, to, u, nu, shrink_expected(u, to));
        } else if (q == p) {
            CHECKF(to <= MEDIUM_MAX, "shard_realloc(%zu -> %zu): a medium block grew in place past 1 MB", from, to);
            CHECKF(medium_usable_ok(nu, to), "shard_realloc(%zu -> %zu) grown in place: usable %zu", from, to, nu);
        } else {
            CHECKF(nu >= grow_target(u, to), "shard_realloc(%zu -> %zu) moved: usable %zu, expected >= %zu", from, to,
                   nu, grow_target(u, to));
        }
    } else if (kf == KIND_SMALL && to > SMALL_MAX) {
        CHECKF(q != p, "shard_realloc(%zu -> %zu) of a small block stayed in place", from, to);
        CHECKF(nu >= grow_target(u, to), "shard_realloc(%zu -> %zu) moved: usable %zu, expected >= %zu", from, to, nu,
               grow_target(u, to));
    }
#else
    (void)u;
#endif
    fill(q, to, seed);
    if (*ring_p) {
        CHECK_PATTERN(*ring_p, *ring_n, *ring_seed, "realloc result kept live");
        shard_free(*ring_p);
    }
    *ring_p = q;
    *ring_n = to;
    *ring_seed = seed;
}

TEST(realloc_pairs_around_the_medium_range_follow_the_in_place_rules)
{
    enum { RING = 8 };
    static const size_t own[] = { 1, 100, 16383, 16384, 16385, 16400, 16401, 20000, 32767, 32768, 32769, 65536,
                                  100000, 262144, 262145, 524288, 838860, 838861, 838862, 1048575, 1048576,
                                  1048577, 2000000 };
    enum { OWN = sizeof own / sizeof own[0] };
    unsigned char *ring_p[RING] = { 0 };
    size_t ring_n[RING] = { 0 }, pairs = 0;
    uint64_t ring_seed[RING] = { 0 };
    medium_op();
    for (size_t k = 0; k < REALLOC_PAIR_COUNT; k++) {
        size_t from = realloc_pairs[k][0], to = realloc_pairs[k][1];
        if (from <= SMALL_MAX && to <= SMALL_MAX)
            continue; /* test_small's */
        check_pair(from, to, 0x7000 + k, &ring_p[pairs % RING], &ring_n[pairs % RING], &ring_seed[pairs % RING]);
        pairs++;
    }
    CHECKF(pairs > 1000, "only %zu pairs of realloc_pairs.h reach above 16 KB", pairs);
    for (size_t i = 0; i < OWN; i++)
        for (size_t j = 0; j < OWN; j++)
            if (i != j) {
                check_pair(own[i], own[j], 0x80000 + 64 * i + j, &ring_p[pairs % RING], &ring_n[pairs % RING],
                           &ring_seed[pairs % RING]);
                pairs++;
            }
    for (int r = 0; r < RING; r++)
        if (ring_p[r]) {
            CHECK_PATTERN(ring_p[r], ring_n[r], ring_seed[r], "realloc result kept live");
            shard_free(ring_p[r]);
        }
    check_allocator("after the realloc pairs");
}

static void *growth_body(void *unused)
{
    (void)unused;
    const uint64_t seed = 0x6500;
    size_t n = 16385, moves = 0;
    unsigned char *p = shard_malloc(n);
    CHECK(p != NULL);
    if (!p)
        return NULL;
    fill(p, n, seed);
    while (n < MEDIUM_MAX) {
        size_t m = n + 4099 > MEDIUM_MAX ? MEDIUM_MAX : n + 4099, before = shard_usable_size(p);
        unsigned char *q = shard_realloc(p, m);
        CHECKF(q != NULL, "shard_realloc(%zu -> %zu)", n, m);
        if (!q)
            break;
        if (q != p) {
            moves++;
#if SHARD_RULES
            CHECKF(shard_usable_size(q) >= grow_target(before, m), "moved for %zu bytes: usable %zu", m,
                   shard_usable_size(q));
#endif
        } else if (m > before) {
#if SHARD_RULES
            CHECKF(medium_usable_ok(shard_usable_size(q), m), "grown in place to %zu bytes: usable %zu", m,
                   shard_usable_size(q));
#endif
        }
        CHECK(shard_usable_size(q) >= m);
        if (q != p)
            CHECK_PATTERN(q, n, seed, "block grown through the medium range, moved");
        p = q;
        fill(p + n, m - n, seed + 1);                              /* the new bytes: their own seed ... */
        CHECK_PATTERN(p + n, m - n, seed + 1, "new bytes of the grown block");
        fill(p, m, seed);                                          /* ... then all of it */
        n = m;
    }
    CHECK_PATTERN(p, n, seed, "block grown to 1 MB");
#if SHARD_RULES
    /* The only block of a fresh arena has free space after it all the way. */
    CHECKF(moves == 0, "the only block of a fresh arena moved %zu times growing from 16385 to 1 MB", moves);
#endif
    for (size_t m = n / 2; m >= 1; m /= 2) {
        size_t before = shard_usable_size(p);
        unsigned char *q = shard_realloc(p, m);
        CHECKF(q != NULL, "shard_realloc(.. -> %zu)", m);
        if (!q)
            break;
#if SHARD_RULES
        CHECKF(q == p, "shrinking a medium block to %zu bytes moved it", m);
        CHECKF(shard_usable_size(q) == shrink_expected(before, m), "shrunk from %zu to %zu: usable %zu, expected %zu",
               before, m, shard_usable_size(q), shrink_expected(before, m));
#else
        (void)before;
#endif
        CHECK_PATTERN(q, m, seed, "block shrunk by half");
        p = q;
    }
    shard_free(p);
    check_allocator("after growing through the medium range");
    return NULL;
}

/* A block grown by 4099 bytes at a time from 16385 bytes to 1 MB and shrunk by halves to 1 byte keeps its
 * contents; alone in a fresh arena it never moves. */
TEST(realloc_growing_through_the_medium_range_and_shrinking_by_halves_keeps_contents)
{
    run_on_fresh_heap(growth_body, NULL);
}

/* ---- other threads ---- */

struct foreign_resize {
    unsigned char *blocks[4];
    size_t sizes[4];
    size_t to[4];
    uint64_t seeds[4];
};

static void *foreign_resize_thread(void *arg)
{
    struct foreign_resize *f = arg;
    for (int i = 0; i < 4; i++) {
        unsigned char *p = f->blocks[i], *q;
        CHECK_PATTERN(p, f->sizes[i], f->seeds[i], "medium block handed to another thread");
        q = shard_realloc(p, f->to[i]);
        CHECKF(q != NULL, "shard_realloc(%zu -> %zu) by another thread", f->sizes[i], f->to[i]);
        if (!q)
            continue;
#if SHARD_RULES
        if (f->to[i] <= f->sizes[i])
            CHECKF(q != p, "another thread shrank a medium block (%zu -> %zu) in place", f->sizes[i], f->to[i]);
#endif
        CHECK(shard_usable_size(q) >= f->to[i]);
        CHECK_PATTERN(q, min_size(f->sizes[i], f->to[i]), f->seeds[i], "medium block resized by another thread");
        fill(q, f->to[i], f->seeds[i] + 1);
        CHECK_PATTERN(q, f->to[i], f->seeds[i] + 1, "medium block resized by another thread, filled");
        shard_free(q);
        f->blocks[i] = NULL;
    }
    check_allocator("in the thread that resized other threads' blocks");
    return NULL;
}

/* Another thread than the owner resizes medium blocks: a shrink moves (to a medium or a small block), a
 * growth keeps the contents too. */
TEST(another_thread_shrinking_a_medium_block_moves_it)
{
    static struct foreign_resize f = {
        .sizes = { 100000, 100000, 300000, 50000 },
        .to = { 50000, 10000, 299999, 400000 },
        .seeds = { 0x6600, 0x6601, 0x6602, 0x6603 },
    };
    medium_op();
    for (int i = 0; i < 4; i++) {
        f.blocks[i] = shard_malloc(f.sizes[i]);
        CHECK(f.blocks[i] != NULL);
        if (!f.blocks[i])
            return;
        fill(f.blocks[i], f.sizes[i], f.seeds[i]);
    }
    run_thread(foreign_resize_thread, &f);
    medium_op();
    check_allocator("after another thread resized this thread's blocks");
}

/* ---- merging ---- */

/* A, B, C with chunks (block + 16-byte header) of 100016 + 120016 + 124032 = 344064 bytes, 2^18 + 5 * 2^14:
 * the start of a TLSF bin (16 per power of two), so the good-fit search, which rounds a request up to the
 * next bin start, finds the merged chunk for a request of exactly its size. D is a live guard. */
#define MERGE_A 100000
#define MERGE_B 120000
#define MERGE_C 124016
#define MERGE_D 16400

/* After A, B and C (chained, usable u[0..2]) were freed: a block of all their space lands at A, and so
 * does one two bins smaller (not depending on the exact-size lookup). The second stays live in *out. */
static void check_merged_reuse(unsigned char *a, const size_t *u, const char *what, unsigned char **out)
{
    size_t all = u[0] + u[1] + u[2] + 2 * CHUNK_HEADER, less = all - 32768;
    unsigned char *x = shard_malloc(all);
    *out = NULL;
    CHECKF(x != NULL, "%s: shard_malloc(%zu)", what, all);
    if (!x)
        return;
#if SHARD_RULES
    CHECKF(x == a,
           "%s: a block of the three freed neighbours' size (%zu bytes) landed at %p, not at the first one, %p "
           "(the merged chunk was not found)", what, all, (void *)x, (void *)a);
#else
    (void)a;
#endif
    fill(x, all, 0x6700);
    CHECK_PATTERN(x, all, 0x6700, what);
    shard_free(x);
    x = shard_malloc(less);
    CHECKF(x != NULL, "%s: shard_malloc(%zu)", what, less);
    if (!x)
        return;
#if SHARD_RULES
    CHECKF(x == a, "%s: a block of %zu bytes (the three freed neighbours hold %zu) landed at %p, not at %p", what,
           less, all, (void *)x, (void *)a);
#endif
    fill(x, less, 0x6701);
    *out = x;
}

static void *merge_body(void *unused)
{
    (void)unused;
    static const char *const orders[3] = { "ACB", "BAC", "CBA" };
    enum { N = 12 };
    size_t sizes[N], u[N];
    uint64_t seeds[N];
    unsigned char *b[N], *kept[3] = { NULL, NULL, NULL };
    for (int i = 0; i < N; i++) {
        static const size_t pattern[4] = { MERGE_A, MERGE_B, MERGE_C, MERGE_D };
        sizes[i] = pattern[i % 4];
        seeds[i] = 0x6800 + (uint64_t)i;
    }
    if (!alloc_chain(b, u, sizes, N, seeds, "three rounds of A B C D"))
        return NULL;
    for (int r = 0; r < 3; r++) {
        unsigned char **abc = b + 4 * r;
        char what[64];
        for (const char *o = orders[r]; *o; o++) {
            int i = *o - 'A';
            CHECK_PATTERN(abc[i], u[4 * r + i], seeds[4 * r + i], "block before it is freed");
            shard_free(abc[i]);
            check_allocator("after freeing one of three neighbours");
        }
        snprintf(what, sizeof what, "freed in the order %s", orders[r]);
        check_merged_reuse(abc[0], u + 4 * r, what, &kept[r]);
        check_allocator("after reusing merged neighbours");
        CHECK_PATTERN(abc[3], u[4 * r + 3], seeds[4 * r + 3], "live guard after the merged chunk");
    }
    for (int r = 0; r < 3; r++) {
        size_t less = u[4 * r] + u[4 * r + 1] + u[4 * r + 2] + 2 * CHUNK_HEADER - 32768;
        if (kept[r]) {
            CHECK_PATTERN(kept[r], less, 0x6701, "block in merged space");
            shard_free(kept[r]);
        }
        shard_free(b[4 * r + 3]);
    }
    check_allocator("at the end of the merge test");
    return NULL;
}

/* Three adjacent blocks freed in the orders ACB, BAC and CBA merge into one free chunk: a block of all
 * their space lands at the first one's address. */
TEST(three_free_neighbours_merge_in_every_order)
{
    run_on_fresh_heap(merge_body, NULL);
}

/* ---- frees by other threads ---- */

static void *foreign_empty_body(void *unused)
{
    (void)unused;
    enum { N = 24 };
    static unsigned char *b[N];
    static size_t sizes[N];
    static uint64_t seeds[N];
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    for (int i = 0; i < N; i++) {
        sizes[i] = 20000 + 7001 * (size_t)i;
        seeds[i] = 0x6900 + (uint64_t)i;
        b[i] = shard_malloc(sizes[i]);
        CHECK(b[i] != NULL);
        if (b[i])
            fill(b[i], sizes[i], seeds[i]);
    }
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECKF(s1.live_medium == s0.live_medium + N, "live_medium %zu -> %zu after %d medium blocks", s0.live_medium,
           s1.live_medium, N);
    CHECKF(s1.medium_arenas > s0.medium_arenas, "medium_arenas %zu -> %zu on a fresh heap's first medium blocks",
           s0.medium_arenas, s1.medium_arenas);
#endif
    struct handover h = { b, sizes, seeds, N };
    run_thread(check_and_free_handed, &h);
#if SHARD_RULES
    shard_stats s2 = stats_now();
    CHECKF(s2.live_medium == s1.live_medium,
           "live_medium %zu -> %zu when another thread freed the blocks (they count until the owner takes them)",
           s1.live_medium, s2.live_medium);
    CHECKF(s2.medium_arenas_empty == s1.medium_arenas_empty,
           "medium_arenas_empty %zu -> %zu before the owner took the foreign frees", s1.medium_arenas_empty,
           s2.medium_arenas_empty);
#endif
    medium_op();
#if SHARD_RULES
    shard_stats s3 = stats_now();
    CHECKF(s3.live_medium == s0.live_medium, "live_medium %zu after the owner's next medium operation, %zu before",
           s3.live_medium, s0.live_medium);
    CHECKF(s3.medium_arenas_empty > s2.medium_arenas_empty,
           "medium_arenas_empty %zu -> %zu: the arena emptied by another thread is not empty after the owner's medium "
           "operation", s2.medium_arenas_empty, s3.medium_arenas_empty);
    CHECKF(s3.medium_arenas_empty - s0.medium_arenas_empty == s3.medium_arenas - s0.medium_arenas,
           "of the %zu arenas of this heap %zu are empty", s3.medium_arenas - s0.medium_arenas,
           s3.medium_arenas_empty - s0.medium_arenas_empty);
#endif
    check_allocator("after taking the frees of another thread");
    return NULL;
}

/* A thread's medium blocks freed by another thread still count as live until the owner's next medium
 * operation; after it, they are gone and the arena is empty. */
TEST(blocks_freed_by_another_thread_count_until_the_owners_next_medium_operation)
{
    run_on_fresh_heap(foreign_empty_body, NULL);
}

static void *foreign_merge_body(void *unused)
{
    (void)unused;
    static const size_t sizes[4] = { MERGE_A, MERGE_B, MERGE_C, MERGE_D };
    static const uint64_t seeds[4] = { 0x6a00, 0x6a01, 0x6a02, 0x6a03 };
    unsigned char *b[4], *kept = NULL;
    size_t u[4];
    if (!alloc_chain(b, u, sizes, 4, seeds, "A B C D"))
        return NULL;
    /* Another thread frees A, C, B (in that order). */
    unsigned char *handed[3] = { b[0], b[2], b[1] };
    size_t hsizes[3] = { u[0], u[2], u[1] };
    uint64_t hseeds[3] = { seeds[0], seeds[2], seeds[1] };
    struct handover h = { handed, hsizes, hseeds, 3 };
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    run_thread(check_and_free_handed, &h);
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECKF(s1.live_medium == s0.live_medium, "live_medium %zu -> %zu on foreign frees alone", s0.live_medium,
           s1.live_medium);
#endif
    medium_op();
#if SHARD_RULES
    shard_stats s2 = stats_now();
    CHECKF(s2.live_medium + 3 == s0.live_medium, "live_medium %zu -> %zu after the owner's medium operation",
           s0.live_medium, s2.live_medium);
#endif
    check_allocator("after taking three neighbours freed by another thread");
    check_merged_reuse(b[0], u, "freed by another thread", &kept);
    CHECK_PATTERN(b[3], u[3], seeds[3], "live guard");
    if (kept)
        shard_free(kept);
    shard_free(b[3]);
    check_allocator("at the end of the foreign merge test");
    return NULL;
}

/* Chunks freed by another thread merge with their free neighbours when the owner takes them: after its
 * next medium operation a block of the three neighbours' space lands at the first one's address. */
TEST(chunks_freed_by_another_thread_merge_after_the_owners_next_medium_operation)
{
    run_on_fresh_heap(foreign_merge_body, NULL);
}

/* live_medium_bytes on a heap of its own: the usable sizes of the live medium blocks. It moves by
 * exactly the usable size of each block allocated (aligned ones too), by the change of it when the
 * owner shrinks a block in place and grows it back into the freed tail, not at all when another thread
 * frees blocks (they count until the owner's next medium operation, as in live_medium) and by their
 * usable sizes at that operation; the other kinds' bytes stay. */
static void *live_bytes_body(void *unused)
{
    (void)unused;
    enum { N = 8, ALIGNED = N - 1 };
    static const size_t sizes[N] = { 16385, 20000, 65536 + 7, 100000, 262144, 300000 + 1, MEDIUM_MAX, 40000 };
    unsigned char *b[N];
    size_t u[N], n[N], total = 0;
    uint64_t seeds[N];
#if SHARD_RULES
    shard_stats s0 = stats_now(), s;
#endif
    for (size_t i = 0; i < N; i++) {
        n[i] = sizes[i];
        seeds[i] = 0x6b00 + i;
#if SHARD_RULES
        b[i] = i == ALIGNED ? shard_malloc_aligned(n[i], 4096) : shard_malloc(n[i]);
#else
        b[i] = shard_malloc(n[i]);
#endif
        CHECKF(b[i] != NULL, "shard_malloc(%zu)", n[i]);
        u[i] = b[i] ? shard_usable_size(b[i]) : 0;
        if (b[i])
            fill(b[i], n[i], seeds[i]);
        total += u[i];
#if SHARD_RULES
        CHECKF(medium_usable_ok(u[i], n[i]), "block of %zu bytes: usable size %zu", n[i], u[i]);
        s = stats_now();
        CHECKF(s.live_medium_bytes == s0.live_medium_bytes + total,
               "live_medium_bytes %zu -> %zu after blocks of %zu usable bytes (the last of %zu bytes)",
               s0.live_medium_bytes, s.live_medium_bytes, total, n[i]);
#endif
    }
#if SHARD_RULES
    CHECK_EQ(s.live_medium, s0.live_medium + N);
    CHECK_EQ(s.live_small_bytes, s0.live_small_bytes);
    CHECK_EQ(s.live_large_bytes, s0.live_large_bytes);
#endif
    /* The 262144-byte block shrinks in place to 100000 (its tail goes back, usable r16(100000)) and
     * grows back in place to 150000 over the freed tail. */
    const size_t r = 4, to[2] = { 100000, 150000 };
    for (size_t k = 0; k < 2 && b[r]; k++) {
        unsigned char *p = shard_realloc(b[r], to[k]);
        CHECKF(p == b[r], "realloc of the %zu-byte block to %zu moved it", n[r], to[k]);
        if (!p)
            break;
        CHECK_PATTERN(p, min_size(n[r], to[k]), seeds[r], "block resized in place");
        size_t was = u[r];
        b[r] = p;
        n[r] = to[k];
        u[r] = shard_usable_size(p);
        fill(p, n[r], seeds[r]);
        total = total - was + u[r];
#if SHARD_RULES
        if (k == 0)
            CHECK_EQ(u[r], shrink_expected(was, to[k]));
        else
            CHECKF(medium_usable_ok(u[r], to[k]), "grown to %zu bytes: usable size %zu", to[k], u[r]);
        s = stats_now();
        CHECKF(s.live_medium_bytes == s0.live_medium_bytes + total,
               "live_medium_bytes %zu, expected %zu after realloc in place from %zu to %zu usable bytes",
               s.live_medium_bytes, s0.live_medium_bytes + total, was, u[r]);
#endif
    }
    /* Another thread frees the first three blocks. */
    size_t handed_bytes = u[0] + u[1] + u[2];
    struct handover h = { b, n, seeds, 3 };
    run_thread(check_and_free_handed, &h);
#if SHARD_RULES
    s = stats_now();
    CHECKF(s.live_medium_bytes == s0.live_medium_bytes + total,
           "live_medium_bytes %zu, expected %zu on foreign frees alone", s.live_medium_bytes,
           s0.live_medium_bytes + total);
#endif
    medium_op();
    total -= handed_bytes;
#if SHARD_RULES
    s = stats_now();
    CHECKF(s.live_medium_bytes == s0.live_medium_bytes + total,
           "live_medium_bytes %zu, expected %zu after the owner's next medium operation", s.live_medium_bytes,
           s0.live_medium_bytes + total);
#endif
    for (size_t i = 3; i < N; i++)
        if (b[i]) {
            CHECK_PATTERN(b[i], n[i], seeds[i], "block freed by its owner");
            shard_free(b[i]);
        }
#if SHARD_RULES
    s = stats_now();
    CHECK_EQ(s.live_medium_bytes, s0.live_medium_bytes);
    CHECK_EQ(s.live_medium, s0.live_medium);
#endif
    check_allocator("after the medium blocks of the byte count were freed");
    return NULL;
}

TEST(live_medium_bytes_move_by_the_usable_sizes_of_the_blocks_allocated_resized_and_freed)
{
    run_on_fresh_heap(live_bytes_body, NULL);
}

/* ---- delayed decommit ---- */

static void *decommit_body(void *unused)
{
    (void)unused;
    enum { N = 28, SIZE = 512 * 1024 };
    static unsigned char *b[N];
    static uintptr_t arena_of[N] __attribute__((unused));
#if SHARD_RULES
    shard_stats s0 = stats_now();
#endif
    for (int i = 0; i < N; i++) {
        b[i] = shard_malloc(SIZE);
        CHECK(b[i] != NULL);
        if (!b[i])
            return NULL; /* what was allocated leaks; the failure is reported */
        fill(b[i], SIZE, 0x6b00 + (uint64_t)i);
        arena_of[i] = (uintptr_t)b[i] & ~(uintptr_t)(ARENA_SIZE - 1);
    }
#if SHARD_RULES
    shard_stats sa = stats_now();
    size_t arenas = sa.medium_arenas - s0.medium_arenas;
    CHECKF(arenas >= 3, "%d blocks of 512 KB made %zu arenas of 4 MB", N, arenas);
    /* The memory of each arena's blocks (chunks included) and the largest such sum. */
    size_t total = 0, largest = 0, distinct = 0;
    for (int i = 0; i < N; i++) {
        int first = 1;
        for (int j = 0; j < i; j++)
            first &= arena_of[j] != arena_of[i];
        if (!first)
            continue;
        size_t bytes = 0;
        for (int j = i; j < N; j++)
            if (arena_of[j] == arena_of[i])
                bytes += shard_usable_size(b[j]) + CHUNK_HEADER;
        distinct++;
        total += bytes > 2 * ARENA_KEEP ? bytes - 2 * ARENA_KEEP : 0;
        largest = bytes > largest ? bytes : largest;
    }
    CHECKF(distinct == arenas, "the blocks lie in %zu 4 MB granules, the heap made %zu arenas", distinct, arenas);
#endif
    for (int i = 0; i < N; i++) {
        CHECK_PATTERN(b[i], SIZE, 0x6b00 + (uint64_t)i, "512 KB block");
        shard_free(b[i]);
    }
#if SHARD_RULES
    shard_stats s1 = stats_now();
    CHECKF(s1.medium_arenas_empty - s0.medium_arenas_empty == arenas,
           "%zu of %zu arenas empty after every block was freed",
           s1.medium_arenas_empty - s0.medium_arenas_empty, arenas);
    CHECKF(s1.medium_arenas_decommitted == sa.medium_arenas_decommitted,
           "medium_arenas_decommitted %zu -> %zu at once on the frees", sa.medium_arenas_decommitted,
           s1.medium_arenas_decommitted);
    CHECKF(s1.committed + ARENA_KEEP >= sa.committed, "committed %zu -> %zu at once on the frees (before the delay)",
           sa.committed, s1.committed);
#endif
    sleep_ms(1100);
    medium_op();
#if SHARD_RULES
    shard_stats s2 = stats_now();
    size_t dropped = s1.committed > s2.committed ? s1.committed - s2.committed : 0;
    /* All arenas but one give back all but 64 KB; the one that stays is at most the largest. */
    size_t expected = total > largest ? total - largest : 0;
    CHECKF(s2.medium_arenas_decommitted > s1.medium_arenas_decommitted,
           "medium_arenas_decommitted %zu -> %zu after a second with %zu empty arenas", s1.medium_arenas_decommitted,
           s2.medium_arenas_decommitted, arenas);
    CHECKF(s2.medium_arenas_decommitted - s1.medium_arenas_decommitted + 1 >= arenas &&
               s2.medium_arenas_decommitted - s1.medium_arenas_decommitted < arenas,
           "%zu of %zu empty arenas decommitted (all but the most recently emptied one)",
           s2.medium_arenas_decommitted - s1.medium_arenas_decommitted, arenas);
    CHECKF(dropped >= expected,
           "committed %zu -> %zu (-%zu) after a second with %zu empty arenas; expected -%zu or more",
           s1.committed, s2.committed, dropped, arenas, expected);
    CHECKF(s2.medium_arenas == sa.medium_arenas, "medium_arenas %zu -> %zu", sa.medium_arenas, s2.medium_arenas);
#endif
    check_allocator("after the empty arenas were decommitted");
    /* The memory comes back when it is needed again. */
    for (int i = 0; i < N; i++) {
        b[i] = shard_malloc(SIZE);
        CHECK(b[i] != NULL);
        if (b[i])
            fill(b[i], SIZE, 0x6c00 + (uint64_t)i);
    }
#if SHARD_RULES
    shard_stats s3 = stats_now();
    CHECKF(s3.committed >= s2.committed + expected, "committed %zu -> %zu when the blocks came back", s2.committed,
           s3.committed);
    CHECKF(s3.medium_arenas == sa.medium_arenas, "medium_arenas %zu -> %zu: decommitted arenas were not reused",
           sa.medium_arenas, s3.medium_arenas);
#endif
    for (int i = 0; i < N; i++)
        if (b[i]) {
            CHECK_PATTERN(b[i], SIZE, 0x6c00 + (uint64_t)i, "512 KB block in an arena committed again");
            shard_free(b[i]);
        }
    check_allocator("at the end of the decommit test");
    return NULL;
}

/* Empty arenas give back all but their first 64 KB once empty for a second (the most recently emptied one
 * stays committed); a medium operation after the delay does it; the arenas are used again afterwards. */
TEST(empty_arenas_give_back_their_memory_after_the_delay)
{
    run_on_fresh_heap(decommit_body, NULL); /* on the system malloc only the contents are checked */
}

/* ---- the error hook ---- */

#if SHARD_RULES
/* Second free, realloc and usable_size of the freed block p: each reaches the hook once, with p. */
static void check_freed_pointer(void *p, const char *what)
{
    char msg[96];
    hook_reset();
    shard_free(p);
    snprintf(msg, sizeof msg, "second shard_free (%s)", what);
    CHECK_HOOK(SHARD_ERROR_INVALID_FREE, p, msg);
    hook_reset();
    void *q = shard_realloc(p, 50000);
    snprintf(msg, sizeof msg, "shard_realloc of a freed block (%s)", what);
    CHECKF(q == NULL, "%s = %p", msg, q);
    CHECK_HOOK(SHARD_ERROR_INVALID_REALLOC, p, msg);
    hook_reset();
    (void)shard_usable_size(p);
    snprintf(msg, sizeof msg, "shard_usable_size of a freed block (%s)", what);
    CHECK_HOOK(SHARD_ERROR_INVALID_SIZE_QUERY, p, msg);
}
#endif

__attribute__((unused)) static void *double_free_body(void *unused)
{
    (void)unused;
#if SHARD_RULES
    enum { N = 10 };
    size_t sizes[N], u[N];
    uint64_t seeds[N];
    unsigned char *b[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = 30000 + 1000 * (size_t)i;
        seeds[i] = 0x6d00 + (uint64_t)i;
    }
    /* L1 P1 R1 L2 P2 R2 L3 P3 R3 guard */
    if (!alloc_chain(b, u, sizes, N, seeds, "three blocks between neighbours"))
        return NULL;
    shard_error_fn previous = shard_set_error_hook(recording_hook, NULL);
    /* Both neighbours live. */
    shard_free(b[1]);
    shard_stats s0 = stats_now();
    check_freed_pointer(b[1], "neighbours live");
    /* Merged into the free chunk before it. */
    shard_free(b[3]);
    shard_free(b[4]);
    check_freed_pointer(b[4], "merged with the free chunk before it");
    /* Merged with the free chunk after it. */
    shard_free(b[8]);
    shard_free(b[7]);
    check_freed_pointer(b[7], "merged with the free chunk after it");
    shard_stats s1 = stats_now();
    CHECKF(s1.live_medium + 4 == s0.live_medium, "live_medium %zu -> %zu for 4 frees and 3 double frees",
           s0.live_medium, s1.live_medium);
    shard_set_error_hook(previous, NULL);
    check_allocator("after double frees");
    static const int live[] = { 0, 2, 5, 6, 9 };
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++)
        CHECK_PATTERN(b[live[i]], u[live[i]], seeds[live[i]], "live block next to double frees");
    /* New blocks of the freed sizes fill the freed space and overlap nothing live. */
    unsigned char *again[5];
    static const int freed[] = { 1, 3, 4, 7, 8 };
    for (int i = 0; i < 5; i++) {
        again[i] = shard_malloc(sizes[freed[i]]);
        CHECK(again[i] != NULL);
        if (!again[i])
            continue;
        fill(again[i], sizes[freed[i]], 0x6d80 + (uint64_t)i);
        for (size_t j = 0; j < sizeof live / sizeof live[0]; j++)
            CHECKF(again[i] + sizes[freed[i]] <= b[live[j]] || again[i] >= b[live[j]] + u[live[j]],
                   "new block %p overlaps live block %p", (void *)again[i], (void *)b[live[j]]);
    }
    for (int i = 0; i < 5; i++)
        if (again[i]) {
            CHECK_PATTERN(again[i], sizes[freed[i]], 0x6d80 + (uint64_t)i, "block allocated after double frees");
            shard_free(again[i]);
        }
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
        CHECK_PATTERN(b[live[i]], u[live[i]], seeds[live[i]], "live block next to double frees");
        shard_free(b[live[i]]);
    }
    check_allocator("at the end of the double free test");
#endif
    return NULL;
}

/* A second free of a medium block by its owner reaches the error hook and changes nothing, whether the
 * freed chunk stands alone or merged with the free chunk before or after it; realloc and usable_size of
 * the freed block reach the hook as well. */
TEST(double_free_of_a_medium_block_reaches_the_error_hook_and_changes_nothing)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    run_on_fresh_heap(double_free_body, NULL);
#endif
}

#if SHARD_RULES
static void *free_one(void *p)
{
    shard_free(p);
    return NULL;
}

static void *check_freed_pointer_thread(void *p)
{
    check_freed_pointer(p, "from another thread");
    return NULL;
}

static void *foreign_double_free_body(void *unused)
{
    (void)unused;
    enum { N = 7 };
    size_t sizes[N], u[N];
    uint64_t seeds[N];
    unsigned char *b[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = 40000 + 1000 * (size_t)i;
        seeds[i] = 0x6e00 + (uint64_t)i;
    }
    /* L P1 M P2 N P3 R: each freed block between live ones */
    if (!alloc_chain(b, u, sizes, N, seeds, "blocks between live neighbours"))
        return NULL;
    shard_error_fn previous = shard_set_error_hook(recording_hook, NULL);
    shard_stats s0 = stats_now();
    /* P1: freed by another thread, taken by the owner, then freed again by another thread. */
    run_thread(free_one, b[1]);
    medium_op();
    run_thread(check_freed_pointer_thread, b[1]);
    /* P2: freed by the owner, then by another thread. */
    shard_free(b[3]);
    run_thread(check_freed_pointer_thread, b[3]);
    /* P3: freed by another thread twice before the owner looked (the second finds it pending), and then by
     * the owner. */
    run_thread(free_one, b[5]);
    run_thread(check_freed_pointer_thread, b[5]);
    hook_reset();
    shard_free(b[5]);
    CHECK_HOOK(SHARD_ERROR_INVALID_FREE, b[5], "the owner freeing a block another thread freed");
    medium_op();
    shard_stats s1 = stats_now();
    CHECKF(s1.live_medium + 3 == s0.live_medium, "live_medium %zu -> %zu for 3 frees and 4 double frees",
           s0.live_medium, s1.live_medium);
    shard_set_error_hook(previous, NULL);
    check_allocator("after double frees from other threads");
    for (int i = 0; i < N; i += 2) {
        CHECK_PATTERN(b[i], u[i], seeds[i], "live block next to double frees");
        shard_free(b[i]);
    }
    check_allocator("at the end of the foreign double free test");
    return NULL;
}
#endif

/* A second free from another thread of a medium block whose first free the owner has already taken (or
 * that is still pending at the owner, or that the owner freed) reaches the error hook; nothing changes. */
TEST(double_free_of_a_medium_block_from_another_thread_reaches_the_error_hook)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    run_on_fresh_heap(foreign_double_free_body, NULL);
#endif
}

#if SHARD_RULES
struct interior {
    unsigned char *blocks[2];
    int failures;
};

/* Frees, reallocs and size-queries pointers into the two blocks; each must reach the hook once. */
static void *try_interior(void *arg)
{
    struct interior *c = arg;
    static const size_t offsets[] = { 16, 4096, 8, 32, 65536, 99984 };
    static const size_t realloc_sizes[] = { 64, 50000, 200000 };
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof offsets / sizeof offsets[0]; i++) {
            unsigned char *p = c->blocks[k] + offsets[i];
            char what[96];
            hook_reset();
            shard_free(p);
            snprintf(what, sizeof what, "shard_free(%s block + %zu)", k ? "zeroed" : "filled", offsets[i]);
            CHECK_HOOK(SHARD_ERROR_INVALID_FREE, p, what);
            for (size_t j = 0; j < sizeof realloc_sizes / sizeof realloc_sizes[0]; j++) {
                hook_reset();
                void *q = shard_realloc(p, realloc_sizes[j]);
                snprintf(what, sizeof what, "shard_realloc(%s block + %zu, %zu)", k ? "zeroed" : "filled", offsets[i],
                         realloc_sizes[j]);
                CHECKF(q == NULL, "%s = %p", what, q);
                CHECK_HOOK(SHARD_ERROR_INVALID_REALLOC, p, what);
            }
            hook_reset();
            (void)shard_usable_size(p);
            snprintf(what, sizeof what, "shard_usable_size(%s block + %zu)", k ? "zeroed" : "filled", offsets[i]);
            CHECK_HOOK(SHARD_ERROR_INVALID_SIZE_QUERY, p, what);
        }
    return NULL;
}
#endif

/* Pointers into a live medium block (p + 16, p + 4096 and others), in a block full of a pattern and in one
 * full of zeros, given to free, realloc and usable_size by the owner and by another thread, reach the error
 * hook; the blocks keep their contents and size and are freed normally afterwards. */
TEST(interior_pointers_of_a_medium_block_reach_the_error_hook_and_lose_nothing)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    enum { SIZE = 100000 };
    struct interior c;
    int cookie;
    medium_op();
    c.blocks[0] = shard_malloc(SIZE);
    c.blocks[1] = shard_calloc(1, SIZE);
    CHECK(c.blocks[0] != NULL && c.blocks[1] != NULL);
    if (!c.blocks[0] || !c.blocks[1]) {
        shard_free(c.blocks[0]);
        shard_free(c.blocks[1]);
        return;
    }
    size_t u0 = shard_usable_size(c.blocks[0]), u1 = shard_usable_size(c.blocks[1]);
    fill(c.blocks[0], u0, 0x6f00);
    memset(c.blocks[1], 0, u1);
    shard_stats s0 = stats_now();
    shard_error_fn previous = shard_set_error_hook(recording_hook, &cookie);
    try_interior(&c);             /* the owner */
    run_thread(try_interior, &c); /* another thread */
    shard_set_error_hook(previous, NULL);
    shard_stats s1 = stats_now();
    CHECK_EQ(s1.live_medium, s0.live_medium);
    CHECK_PATTERN(c.blocks[0], u0, 0x6f00, "block after bad pointers into it");
    CHECK_EQ(bytes_not_equal(c.blocks[1], u1, 0), u1);
    CHECK_EQ(shard_usable_size(c.blocks[0]), u0);
    CHECK_EQ(shard_usable_size(c.blocks[1]), u1);
    check_allocator("after interior pointers");
    hook_reset();
    shard_set_error_hook(recording_hook, &cookie);
    unsigned char *q = shard_realloc(c.blocks[0], u0 + 50000);
    CHECK(q != NULL);
    if (q) {
        CHECK_PATTERN(q, u0, 0x6f00, "block grown after bad pointers into it");
        c.blocks[0] = q;
    }
    shard_free(c.blocks[0]);
    shard_free(c.blocks[1]);
    CHECKF(hook_record.calls == 0, "valid calls reached the hook %d times", hook_record.calls);
    shard_set_error_hook(previous, NULL);
    check_allocator("at the end of the interior pointer test");
#endif
}

/* ---- calloc ---- */

/* Whether [p, p + n) overlaps any of the count ranges. */
static int overlaps_any(const unsigned char *p, size_t n, const struct placed *ranges, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if ((uintptr_t)p < ranges[i].at + ranges[i].usable && ranges[i].at < (uintptr_t)p + n)
            return 1;
    return 0;
}

/* Medium blocks made dirty (0xAA over their usable size) and freed come back zeroed from calloc, whichever
 * way the count and the size are given, also where the new block covers merged chunks (old headers and
 * free-list links) and a tail freed by an in-place shrink. */
TEST(calloc_of_medium_sizes_is_zero_on_dirty_reused_chunks)
{
    static const size_t sizes[] = { 16385, 16400, 20000, 65536, 100000, 300000, 524288, 1048576, 40000, 17000 };
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *b[N];
    struct placed dirty[N + 1];
    size_t nd = 0, reused = 0, total = 0;
    medium_op();
    for (int round = 0; round < 3; round++) {
        nd = 0;
        for (int i = 0; i < N; i++) {
            b[i] = shard_malloc(sizes[i]);
            CHECK(b[i] != NULL);
            if (!b[i])
                continue;
            size_t u = shard_usable_size(b[i]);
            memset(b[i], 0xAA, u);
            dirty[nd].at = (uintptr_t)b[i];
            dirty[nd++].usable = u;
        }
        /* Freed in an order that merges neighbours: every other one, then the rest. */
        for (int i = 0; i < N; i += 2)
            shard_free(b[i]);
        for (int i = 1; i < N; i += 2)
            shard_free(b[i]);
        for (int i = 0; i < N; i++) {
            size_t n = sizes[i];
            unsigned char *p = round == 0   ? shard_calloc(1, n)
                               : round == 1 ? shard_calloc(n, 1)
                                            : (n % 16 == 0 ? shard_calloc(n / 16, 16) : shard_calloc(1, n));
            CHECKF(p != NULL, "shard_calloc of %zu bytes", n);
            b[i] = p;
            if (!p)
                continue;
            size_t bad = bytes_not_equal(p, n, 0);
            CHECKF(bad == n, "calloc of %zu bytes (round %d): byte %zu is not zero", n, round, bad);
            reused += overlaps_any(p, n, dirty, nd);
            total++;
            memset(p, 0xAA, n);
        }
        for (int i = 0; i < N; i++)
            shard_free(b[i]);
    }
#if SHARD_RULES
    CHECKF(reused * 2 >= total, "only %zu of %zu calloc blocks lay on dirty freed memory", reused, total);
#endif
    /* Three dirty neighbours freed: one calloc block over all of them. */
    {
        unsigned char *x[3];
        size_t u[3];
        for (int i = 0; i < 3; i++) {
            x[i] = shard_malloc(50000 + 10000 * (size_t)i);
            CHECK(x[i] != NULL);
            u[i] = x[i] ? shard_usable_size(x[i]) : 0;
            if (x[i])
                memset(x[i], 0xAA, u[i]);
        }
        size_t n = u[0] + u[1] + u[2] + 2 * CHUNK_HEADER;
        uintptr_t first = (uintptr_t)x[0];
        for (int i = 0; i < 3; i++)
            shard_free(x[i]);
        unsigned char *p = shard_calloc(1, n);
        CHECK(p != NULL);
        if (p) {
            size_t bad = bytes_not_equal(p, n, 0);
            CHECKF(bad == n, "calloc over merged dirty chunks (%zu bytes at %p, first freed %p): byte %zu is not zero",
                   n, (void *)p, (void *)first, bad);
            shard_free(p);
        }
    }
    /* A dirty tail freed by an in-place shrink. */
    {
        unsigned char *p = shard_malloc(400000), *q;
        CHECK(p != NULL);
        if (p) {
            memset(p, 0xAA, 400000);
            q = shard_realloc(p, 20000);
            CHECK(q != NULL);
            if (!q)
                q = p;
            unsigned char *z = shard_calloc(1, 300000);
            CHECK(z != NULL);
            if (z) {
                size_t bad = bytes_not_equal(z, 300000, 0);
                CHECKF(bad == 300000, "calloc after a shrink freed a dirty tail: byte %zu is not zero", bad);
                shard_free(z);
            }
            CHECK_EQ(bytes_not_equal(q, 20000, 0xAA), 20000);
            shard_free(q);
        }
    }
    check_allocator("after calloc of medium sizes");
}

/* ---- many threads ---- */

#define HO_THREADS 6
#define HO_BLOCKS 150
#define HO_QUEUE 32

struct handed {
    unsigned char *p;
    size_t n;
    uint64_t seed;
};

static struct ho_state {
    mutex_t lock;
    struct handed queue[HO_THREADS][HO_QUEUE];
    int count[HO_THREADS];
} ho = { .lock = MUTEX_INIT };

static void ho_take_all(int me, struct handed *out, int *n)
{
    mutex_lock(&ho.lock);
    *n = ho.count[me];
    memcpy(out, ho.queue[me], sizeof(struct handed) * (size_t)*n);
    ho.count[me] = 0;
    mutex_unlock(&ho.lock);
}

/* Checks each block; every third is resized first (a move: this thread is not the owner). */
static void ho_check_and_free(struct handed *h, int n)
{
    for (int i = 0; i < n; i++) {
        unsigned char *p = h[i].p;
        CHECK_PATTERN(p, h[i].n, h[i].seed, "medium block handed to another thread");
        if (h[i].seed % 3 == 0) {
            size_t m = h[i].seed % 2 ? h[i].n / 2 + 1 : h[i].n + h[i].n / 3, keep = min_size(m, h[i].n);
            unsigned char *q = shard_realloc(p, m);
            CHECK(q != NULL);
            if (q) {
                CHECK_PATTERN(q, keep, h[i].seed, "handed medium block after realloc");
                fill(q, m, h[i].seed + 1);
                CHECK_PATTERN(q, m, h[i].seed + 1, "handed medium block after realloc, filled");
                p = q;
            }
        }
        shard_free(p);
    }
}

static void *ho_thread(void *arg)
{
    int me = (int)(intptr_t)arg, next = (me + 1) % HO_THREADS, got;
    struct handed mine[HO_QUEUE];
    for (int i = 0; i < HO_BLOCKS; i++) {
        uint64_t seed = (uint64_t)me << 32 | (uint64_t)i;
        struct handed h = { NULL, 16385 + (size_t)(harness_mix64(seed) % 120000), seed };
        h.p = shard_malloc(h.n);
        CHECK(h.p != NULL);
        if (h.p == NULL)
            break;
        fill(h.p, h.n, seed);
        if (i % 5 == 0) { /* the owner resizes some itself: in place or not, contents stay */
            size_t m = h.n + 5000;
            unsigned char *q = shard_realloc(h.p, m);
            CHECK(q != NULL);
            if (q) {
                CHECK_PATTERN(q, h.n, seed, "medium block grown by its owner");
                fill(q, m, seed);
                h.p = q;
                h.n = m;
            }
        }
        mutex_lock(&ho.lock);
        int queued = ho.count[next] < HO_QUEUE;
        if (queued)
            ho.queue[next][ho.count[next]++] = h;
        mutex_unlock(&ho.lock);
        if (!queued)
            ho_check_and_free(&h, 1);
        if (i % 8 == 0) {
            ho_take_all(me, mine, &got);
            ho_check_and_free(mine, got);
        }
    }
    check_allocator("in a thread that handed medium blocks around");
    return NULL;
}

/* Threads hand medium blocks of mixed sizes to each other (some resized by their owner first, some by
 * their receiver); every block is checked by its receiver before realloc and free. Once every heap has
 * performed a medium operation afterwards, no medium block is live beyond those before the test, and
 * every heap passes its check. */
TEST(medium_blocks_handed_between_threads_keep_contents_and_are_all_taken_back)
{
    drain_all_heaps();
#if SHARD_RULES
    size_t live_before = stats_now().live_medium;
#endif
    thread_t t[HO_THREADS];
    int started[HO_THREADS];
    for (int i = 0; i < HO_THREADS; i++) {
        started[i] = thread_start(&t[i], ho_thread, (void *)(intptr_t)i) == 0;
        CHECK(started[i]);
    }
    for (int i = 0; i < HO_THREADS; i++)
        if (started[i])
            thread_join(t[i]);
    struct handed rest[HO_QUEUE];
    int got;
    for (int i = 0; i < HO_THREADS; i++) {
        ho_take_all(i, rest, &got);
        ho_check_and_free(rest, got);
    }
    drain_all_heaps();
#if SHARD_RULES
    shard_stats s = stats_now();
    CHECKF(s.live_medium == live_before, "live_medium %zu before, %zu after every heap took its foreign frees",
           live_before, s.live_medium);
#endif
    check_allocator("after the medium hand-over");
}

#define OUTLIVE_THREADS 4
#define OUTLIVE_BLOCKS 40

struct outlive {
    unsigned char *blocks[OUTLIVE_BLOCKS];
    size_t sizes[OUTLIVE_BLOCKS];
    uint64_t seed;
};

static void *outlive_thread(void *arg)
{
    struct outlive *w = arg;
    for (size_t i = 0; i < OUTLIVE_BLOCKS; i++) {
        w->sizes[i] = 16385 + (size_t)(harness_mix64(w->seed + i) % 200000);
        w->blocks[i] = shard_malloc(w->sizes[i]);
        CHECK(w->blocks[i] != NULL);
        if (w->blocks[i])
            fill(w->blocks[i], w->sizes[i], w->seed + i);
    }
    return NULL;
}

/* Medium blocks outlive the thread that allocated them; another thread checks, resizes and frees them
 * into the exited thread's heap, and the next thread to take that heap takes the frees: then no medium
 * block is live beyond those before the test, and (with none live then) every arena is empty. */
TEST(medium_blocks_outlive_their_thread_and_the_next_owner_takes_their_frees)
{
    static struct outlive w[OUTLIVE_THREADS];
    drain_all_heaps();
#if SHARD_RULES
    size_t live_before = stats_now().live_medium;
#endif
    thread_t t[OUTLIVE_THREADS];
    for (int i = 0; i < OUTLIVE_THREADS; i++) {
        w[i].seed = 0x7100000 + (uint64_t)i * 1000;
        CHECK(thread_start(&t[i], outlive_thread, &w[i]) == 0);
    }
    for (int i = 0; i < OUTLIVE_THREADS; i++)
        thread_join(t[i]);
    for (int i = 0; i < OUTLIVE_THREADS; i++)
        for (size_t j = 0; j < OUTLIVE_BLOCKS; j++) {
            unsigned char *p = w[i].blocks[j];
            size_t n = w[i].sizes[j];
            if (!p)
                continue;
            CHECK_PATTERN(p, n, w[i].seed + j, "medium block of an exited thread");
            if (j % 3 == 0) {
                size_t m = j % 2 ? n / 3 + 1 : n + 1 + j;
                unsigned char *q = shard_realloc(p, m);
                CHECK(q != NULL);
                if (!q)
                    continue;
#if SHARD_RULES
                if (m < n)
                    CHECKF(q != p, "a thread shrank another (exited) thread's medium block in place");
#endif
                CHECK_PATTERN(q, min_size(n, m), w[i].seed + j, "medium block of an exited thread after realloc");
                p = q;
            }
            shard_free(p);
        }
    drain_all_heaps();
#if SHARD_RULES
    shard_stats s = stats_now();
    CHECKF(s.live_medium == live_before, "live_medium %zu before, %zu after every heap took its foreign frees",
           live_before, s.live_medium);
    if (s.live_medium == 0)
        CHECKF(s.medium_arenas_empty == s.medium_arenas, "no medium block is live, yet %zu of %zu arenas are empty",
               s.medium_arenas_empty, s.medium_arenas);
#endif
    check_allocator("after freeing the blocks of exited threads");
}

/* ---- regressions found in review ---- */

/* The first block of a fresh arena sized so that the remainder's header ends exactly at the first
 * 64 KB commit boundary: the remainder's links (after its header) must be committed too. Without that
 * the allocation itself crashed. */
static void *boundary_body(void *arg)
{
    (void)arg;
    size_t n = 65536 - 4096 - 16 - 16; /* chunk at 4096 + 16 + n, remainder header up to 65536 */
    unsigned char *p = shard_malloc(n);
    CHECK(p != NULL);
    if (p == NULL)
        return NULL;
    fill(p, n, 9100);
    unsigned char *q = shard_malloc(100000); /* the remainder is usable */
    CHECK(q != NULL);
    if (q)
        fill(q, 100000, 9101);
    CHECK_PATTERN(p, n, 9100, "block ending at the commit boundary");
    if (q)
        CHECK_PATTERN(q, 100000, 9101, "block after it");
#if SHARD_RULES
    CHECK_EQ(shard_check(), 0);
#endif
    shard_free(q);
    shard_free(p);
    return NULL;
}

TEST(a_remainder_at_the_commit_boundary_is_committed_with_its_links)
{
    run_on_fresh_heap(boundary_body, NULL);
}

/* A block freed by another thread whose chunk the owner then merges into a free chunk before it: a
 * second free of it, its usable size and a realloc reach the error hook (its old header, now inside a
 * free chunk, must not look live). */
TEST(a_block_merged_after_a_foreign_free_is_not_live_any_more)
{
#if !SHARD_RULES
    SKIP_TEST();
#else
    unsigned char *x = shard_malloc(100000), *y = shard_malloc(100000), *z = shard_malloc(100000);
    CHECK(x != NULL && y != NULL && z != NULL);
    if (!x || !y || !z)
        return;
    shard_free(x);                   /* x is a free chunk before y */
    run_thread(free_one, y);         /* y pending at the owner */
    void *w = shard_malloc(20000);   /* the owner drains: y merges into x's chunk */
    CHECK(w != NULL);
    shard_error_fn previous = shard_set_error_hook(recording_hook, NULL);
    hook_reset();
    CHECK_EQ(shard_usable_size(y), 0);
    shard_free(y);
    CHECK(shard_realloc(y, 200000) == NULL);
    CHECKF(hook_record.calls == 3, "hook called %d times for 3 uses of a merged block", hook_record.calls);
    shard_set_error_hook(previous, NULL);
    shard_free(w);
    shard_free(z);
    CHECK_EQ(shard_check(), 0);
#endif
}
