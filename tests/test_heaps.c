/* test_heaps.c - deterministic tests of heaps an embedder owns (shard_heap_create and the rest).
 *
 * The rules, as this file reads them (include/shardmm.h):
 * - shard_heap_malloc/calloc/realloc/malloc_aligned give blocks of the heap (small, medium and large
 *   alike); shard_heap_free and shard_free free them, from any thread; shard_usable_size takes them.
 * - shard_heap_get_stats counts the heap's live blocks and their usable bytes by kind, exactly, and
 *   what it holds committed; destroy and reset end every block (a free of one reaches the error hook)
 *   and give back all but a reserve of pages and arenas for the next blocks, which shard_collect gives
 *   back too: the process's committed bytes return to where they were before the heap's first block.
 * - A limit bounds what the heap holds committed: past it an allocation gives NULL (errno ENOMEM;
 *   Windows: the thread's last error), after the heap's own free memory went back and the on_limit
 *   callback was asked; a callback that frees blocks or raises the limit gets the allocation a second
 *   try. Blocks made before keep their contents, and the heap goes on working.
 * - A heap is used by one thread at a time and may move between threads.
 *
 * Every block is filled with the pattern of its own seed over its whole usable size and checked before
 * it is freed; each test ends with shard_check() == 0.
 *
 * Build: see build.ninja (build/test-heaps, its debug twin, build/win64/test-heaps.exe).
 * Run:   build/test-heaps [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "pages.h"
#include "platform.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define MAX_BLOCKS 20000

static shard_stats stats_now(void)
{
    shard_stats s;
    shard_get_stats(&s);
    return s;
}

static shard_heap_stats heap_stats(shard_heap *h)
{
    shard_heap_stats s;
    shard_heap_get_stats(h, &s);
    return s;
}

static size_t sizes[] = {8, 16, 100, 1000, 4000, 16 * KB, 16 * KB + 1, 100 * KB, MB, MB + 1, 3 * MB};
#define SIZE_COUNT (sizeof sizes / sizeof sizes[0])
static int kind_of(size_t n) { return n <= 16 * KB ? 0 : n <= MB ? 1 : 2; }

static int hook_calls;
static void *hook_last;
static void counting_hook(void *arg, int error, void *p)
{
    (void)arg;
    (void)error;
    hook_calls++;
    hook_last = p;
}

/* Blocks of every kind: the heap's counts and bytes follow them exactly; freed through
 * shard_heap_free and shard_free alike, they are gone from the counts. */
TEST(a_heap_counts_its_blocks_by_kind_exactly)
{
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    static void *p[SIZE_COUNT * 10];
    size_t count[3] = {0, 0, 0}, bytes[3] = {0, 0, 0};
    for (size_t i = 0; i < SIZE_COUNT * 10; i++) {
        size_t n = sizes[i % SIZE_COUNT] + i / SIZE_COUNT * 16;
        p[i] = shard_heap_malloc(h, n);
        CHECKF(p[i] != NULL, "shard_heap_malloc(%zu)", n);
        if (p[i] == NULL)
            return;
        size_t u = shard_usable_size(p[i]);
        CHECK(u >= n);
        fill(p[i], u, 700 + i);
        count[kind_of(n)]++;
        bytes[kind_of(n)] += u;
    }
    shard_heap_stats s = heap_stats(h);
    CHECK_EQ(s.live_small, count[0]);
    CHECK_EQ(s.live_medium, count[1]);
    CHECK_EQ(s.live_large, count[2]);
    CHECK_EQ(s.live_small_bytes, bytes[0]);
    CHECK_EQ(s.live_medium_bytes, bytes[1]);
    CHECK_EQ(s.live_large_bytes, bytes[2]);
    CHECKF(s.committed >= bytes[0] + bytes[1] + bytes[2] && s.committed_peak >= s.committed,
           "committed %zu, peak %zu, for %zu live bytes", s.committed, s.committed_peak, bytes[0] + bytes[1] + bytes[2]);
    CHECK_EQ(s.limit, (size_t)0);
    for (size_t i = 0; i < SIZE_COUNT * 10; i++) {
        CHECK_PATTERN(p[i], shard_usable_size(p[i]), 700 + i, "a heap's block");
        if (i % 2)
            shard_heap_free(h, p[i]);
        else
            shard_free(p[i]);
    }
    shard_heap_free(h, shard_heap_malloc(h, 10)); /* a slow path: the heap takes in its frees */
    shard_heap_free(h, shard_heap_malloc(h, 50 * KB));
    s = heap_stats(h);
    CHECK_EQ(s.live_small + s.live_medium + s.live_large, (size_t)0);
    CHECK_EQ(s.live_small_bytes + s.live_medium_bytes + s.live_large_bytes, (size_t)0);
    shard_heap_destroy(h);
    CHECK_EQ(shard_check(), 0);
}

/* Destroy gives back everything the heap held, live blocks and all: the process's committed bytes are
 * where they were before; the blocks are gone (their free reaches the error hook). The same for reset,
 * after which the heap works as a new one. */
TEST(destroy_and_reset_give_back_everything_at_once)
{
    shard_heap_destroy(shard_heap_create(NULL)); /* the heap structure itself, made once */
    shard_collect();
    size_t base = stats_now().committed, live_large = stats_now().live_large;
    for (int round = 0; round < 3; round++) {
        shard_heap *h = shard_heap_create(NULL);
        CHECK(h != NULL);
        if (h == NULL)
            return;
        static void *p[3000];
        for (int i = 0; i < 3000; i++) {
            size_t n = i % 100 == 0 ? 2 * MB + (size_t)i : i % 7 == 0 ? 30 * KB : 24 + (size_t)i % 500;
            p[i] = shard_heap_malloc(h, n);
            CHECK(p[i] != NULL);
            if (p[i])
                memset(p[i], 0xab, n < 64 ? n : 64);
        }
        CHECK(stats_now().committed > base + 2 * MB);
        CHECK_EQ(stats_now().live_large, live_large + 30);
        if (round < 2) {
            size_t held = heap_stats(h).committed;
            shard_heap_reset(h);
            shard_heap_stats s = heap_stats(h);
            /* It keeps a reserve for its next blocks (its pages and arenas, not the large blocks'), and
             * shard_collect gives that back (checked after the destroy below). */
            CHECKF(s.committed < held - 30 * 2 * MB, "after reset the heap keeps %zu bytes committed of %zu", s.committed,
                   held);
            CHECK_EQ(s.live_small + s.live_medium + s.live_large, (size_t)0);
            void *q = shard_heap_malloc(h, 100); /* works as a new heap */
            CHECK(q != NULL);
            if (q) {
                fill(q, 100, 5);
                CHECK_PATTERN(q, 100, 5, "a block after reset");
            }
            shard_heap_free(h, q);
        }
        shard_heap_destroy(h);
        shard_collect();
        CHECKF(stats_now().committed == base, "round %d: committed %zu after destroy, %zu before", round,
               stats_now().committed, base);
        CHECK_EQ(stats_now().live_large, live_large);
        if (round == 2) {
            shard_error_fn previous = shard_set_error_hook(counting_hook, NULL);
            hook_calls = 0;
            shard_free(p[0]);    /* a large block of the destroyed heap */
            shard_free(p[7]);    /* a medium one */
            shard_free(p[1]);    /* a small one */
            shard_set_error_hook(previous, NULL);
            CHECKF(hook_calls == 3, "frees of a destroyed heap's blocks reached the hook %d times of 3", hook_calls);
        }
    }
    CHECK_EQ(shard_check(), 0);
}

/* The limit: blocks until NULL, with the heap's committed memory within it and out of memory reported;
 * the blocks keep their contents; freeing makes room; medium and large blocks over it give NULL too. */
static int reported_out_of_memory(void)
{
#ifdef _WIN32
    return GetLastError() == ERROR_NOT_ENOUGH_MEMORY;
#else
    return errno == ENOMEM;
#endif
}
static void clear_error(void)
{
#ifdef _WIN32
    SetLastError(0);
#else
    errno = 0;
#endif
}

TEST(a_limit_bounds_what_the_heap_holds_and_nothing_else_changes)
{
    const size_t limit = 8 * MB;
    shard_heap_options opt = {limit, NULL, NULL};
    shard_heap *h = shard_heap_create(&opt);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    static void *p[MAX_BLOCKS];
    int n = 0;
    clear_error();
    for (; n < MAX_BLOCKS; n++) {
        p[n] = shard_heap_malloc(h, 3000);
        if (p[n] == NULL)
            break;
        fill(p[n], 3000, 100 + (uint64_t)n);
    }
    CHECKF(n > 1000 && n < MAX_BLOCKS && reported_out_of_memory(), "%d blocks of 3000 under 8 MB; ENOMEM %s", n,
           reported_out_of_memory() ? "set" : "not set");
    shard_heap_stats s = heap_stats(h);
    CHECKF(s.committed <= limit && s.committed + 128 * KB > limit && s.committed_peak <= limit,
           "committed %zu (peak %zu) under a limit of %zu", s.committed, s.committed_peak, limit);
    CHECK_EQ(s.limit, limit);
    CHECK(shard_heap_malloc(h, 200 * KB) == NULL);
    CHECK(shard_heap_malloc(h, 2 * MB) == NULL);
    CHECK(shard_heap_calloc(h, 1, 5 * MB) == NULL);
    CHECK(shard_heap_malloc_aligned(h, 300 * KB, 4096) == NULL);
    CHECK(shard_malloc(200 * KB) != NULL ? (shard_free(shard_malloc(1)), 1) : 0); /* the thread heap: no limit */
    for (int i = 0; i < n; i += 2)
        shard_heap_free(h, p[i]), p[i] = NULL;
    void *q = shard_heap_malloc(h, 3000);
    CHECK(q != NULL);
    shard_heap_free(h, q);
    CHECK_EQ(shard_heap_set_limit(h, 0), limit);
    void *big = shard_heap_malloc(h, 20 * MB);
    CHECK(big != NULL);
    shard_heap_free(h, big);
    for (int i = 1; i < n; i += 2)
        CHECK_PATTERN(p[i], 3000, 100 + (uint64_t)i, "a block made under the limit");
    shard_heap_destroy(h);
    CHECK_EQ(shard_check(), 0);
}

/* on_limit: called with the size asked for when the limit is in the way; freeing blocks or raising the
 * limit there gets the allocation through; returning 0 gives NULL. */
typedef struct limit_case {
    int calls, mode; /* mode 0: refuse; 1: raise the limit; 2: free the held block */
    size_t last_size;
    void *held;
} limit_case;

static int on_limit(void *arg, shard_heap *h, size_t size)
{
    limit_case *c = arg;
    c->calls++;
    c->last_size = size;
    if (c->mode == 1) {
        shard_heap_set_limit(h, 64 * MB);
        return 1;
    }
    if (c->mode == 2 && c->held != NULL) {
        shard_heap_free(h, c->held);
        c->held = NULL;
        return 1;
    }
    return 0;
}

TEST(the_limit_callback_may_free_or_raise_the_limit)
{
    for (int mode = 0; mode < 3; mode++) {
        limit_case c = {0, mode, 0, NULL};
        shard_heap_options opt = {16 * MB, on_limit, &c};
        shard_heap *h = shard_heap_create(&opt);
        CHECK(h != NULL);
        if (h == NULL)
            return;
        c.held = shard_heap_malloc(h, 10 * MB);
        CHECK(c.held != NULL);
        void *q = shard_heap_malloc(h, 9 * MB);
        CHECKF(c.calls == 1 && c.last_size == 9 * MB, "mode %d: on_limit called %d times, last size %zu", mode, c.calls,
               c.last_size);
        CHECKF((q != NULL) == (mode != 0), "mode %d: the allocation %s", mode, q ? "went through" : "failed");
        if (q != NULL) {
            fill(q, 9 * MB, 42);
            CHECK_PATTERN(q, 9 * MB, 42, "a block the callback made room for");
        }
        shard_heap_destroy(h);
    }
    CHECK_EQ(shard_check(), 0);
}

/* realloc within the heap: grows through every kind, contents kept, the block stays the heap's; a large
 * block over the limit stays as it was. */
TEST(realloc_keeps_blocks_in_the_heap_and_within_its_limit)
{
    shard_heap_options opt = {32 * MB, NULL, NULL};
    shard_heap *h = shard_heap_create(&opt);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    unsigned char *p = shard_heap_malloc(h, 10);
    fill(p, 10, 9);
    size_t n = 10, steps[] = {100, 5000, 40 * KB, 600 * KB, 2 * MB, 9 * MB, 3 * MB, 200 * KB, 30};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        unsigned char *q = shard_heap_realloc(h, p, steps[i]);
        CHECKF(q != NULL, "shard_heap_realloc to %zu", steps[i]);
        if (q == NULL)
            break;
        size_t keep = n < steps[i] ? n : steps[i];
        CHECK_PATTERN(q, keep, 9, "a block resized within its heap");
        fill(q, steps[i], 9);
        p = q, n = steps[i];
        shard_heap_stats s = heap_stats(h);
        CHECKF(s.live_small + s.live_medium + s.live_large == 1, "after realloc to %zu: %zu blocks in the heap",
               steps[i], s.live_small + s.live_medium + s.live_large);
    }
    unsigned char *s = shard_heap_malloc(h, 100); /* class 112: in place from 28 to 112 bytes, as shard_realloc */
    fill(s, 100, 31);
    CHECK(shard_heap_realloc(h, s, 112) == s);
    CHECK(shard_heap_realloc(h, s, 28) == s);
    CHECK_PATTERN(s, 28, 31, "a small block resized in its class");
    unsigned char *t = shard_heap_realloc(h, s, 27);
    CHECK(t != NULL && t != s);
    if (t != NULL) {
        CHECK_PATTERN(t, 27, 31, "a small block moved to a smaller class");
        shard_heap_free(h, t);
    }
    unsigned char *big = shard_heap_malloc(h, 20 * MB);
    CHECK(big != NULL);
    if (big) {
        fill(big, 4096, 77);
        CHECK(shard_heap_realloc(h, big, 40 * MB) == NULL);
        CHECK_PATTERN(big, 4096, 77, "a block whose growth the limit refused");
        shard_heap_free(h, big);
    }
    shard_heap_free(h, p);
    shard_heap_destroy(h);
    CHECK_EQ(shard_check(), 0);
}

/* A heap handed from thread to thread: made here, filled on one thread, half freed on another (with
 * shard_free too), checked and destroyed here. */
typedef struct hand {
    shard_heap *h;
    void *p[2000];
    int phase;
} hand;

static void *heap_user(void *arg)
{
    hand *w = arg;
    for (int i = 0; i < 2000; i++) {
        if (w->phase == 0) {
            size_t n = i % 50 == 0 ? 70 * KB : i % 333 == 0 ? 2 * MB : 16 + (size_t)i % 900;
            w->p[i] = shard_heap_malloc(w->h, n);
            CHECK(w->p[i] != NULL);
            if (w->p[i])
                fill(w->p[i], shard_usable_size(w->p[i]), 3000 + (uint64_t)i);
        } else if (i % 2 == 0 && w->p[i] != NULL) {
            CHECK_PATTERN(w->p[i], shard_usable_size(w->p[i]), 3000 + (uint64_t)i, "on the second thread");
            if (i % 4 == 0)
                shard_heap_free(w->h, w->p[i]);
            else
                shard_free(w->p[i]);
            w->p[i] = NULL;
        }
    }
    return NULL;
}

TEST(a_heap_moves_between_threads)
{
    static hand w;
    w.h = shard_heap_create(NULL);
    CHECK(w.h != NULL);
    if (w.h == NULL)
        return;
    w.phase = 0;
    run_thread(heap_user, &w);
    w.phase = 1;
    run_thread(heap_user, &w);
    size_t left = 0;
    for (int i = 0; i < 2000; i++)
        if (w.p[i] != NULL) {
            CHECK_PATTERN(w.p[i], shard_usable_size(w.p[i]), 3000 + (uint64_t)i, "back on the first thread");
            left++;
        }
    shard_heap_free(w.h, shard_heap_malloc(w.h, 20)); /* slow paths take the foreign frees in */
    shard_heap_free(w.h, shard_heap_malloc(w.h, 50 * KB));
    shard_heap_stats s = heap_stats(w.h);
    CHECK_EQ(s.live_small + s.live_medium + s.live_large, left);
    shard_heap_destroy(w.h);
    CHECK_EQ(shard_check(), 0);
}

/* Another thread frees a heap's blocks while the heap is in use elsewhere: they come back to the heap
 * (its next slow paths take them in), and its large blocks leave its count at once. */
static shard_heap *freed_heap;
static void *freed_blocks[600];
static void *free_them(void *arg)
{
    (void)arg;
    for (int i = 0; i < 600; i++)
        shard_free(freed_blocks[i]);
    return NULL;
}

TEST(frees_from_other_threads_come_back_to_the_heap)
{
    freed_heap = shard_heap_create(NULL);
    CHECK(freed_heap != NULL);
    if (freed_heap == NULL)
        return;
    for (int i = 0; i < 600; i++)
        freed_blocks[i] = shard_heap_malloc(freed_heap, i % 100 == 0 ? 3 * MB : i % 3 ? 48 : 20 * KB);
    size_t committed = heap_stats(freed_heap).committed;
    run_thread(free_them, NULL);
    shard_heap_stats s = heap_stats(freed_heap);
    CHECK_EQ(s.live_large, (size_t)0);
    CHECKF(s.committed <= committed - 6 * 3 * MB, "committed %zu after the large blocks' free, %zu before", s.committed,
           committed);
    for (int i = 0; i < 600; i++) /* the same again: the memory comes back (no growth) */
        freed_blocks[i] = shard_heap_malloc(freed_heap, i % 3 ? 48 : 20 * KB);
    s = heap_stats(freed_heap);
    CHECKF(s.committed <= committed, "committed %zu after reuse, %zu at first", s.committed, committed);
    shard_heap_destroy(freed_heap);
    CHECK_EQ(shard_check(), 0);
}

/* A thread that frees an embedder's heap's blocks holds none of them back (src/small.c gathers a thread's
 * frees into a thread heap's page only): the heap is destroyed while that thread still runs, another
 * heap takes the memory, and the thread's next allocation, which takes in what it gathered, changes
 * nothing of the new heap's blocks. */
static shard_heap *doomed_heap;
static void *doomed_blocks[400];
static int doomed_step; /* 1: freed, 2: destroyed and reused */
static void *free_and_wait(void *arg)
{
    (void)arg;
    shard_free(shard_malloc(64)); /* a thread heap of its own: frees into thread heaps' pages gather */
    for (int i = 0; i < 400; i += 2)
        shard_free(doomed_blocks[i]);
    __atomic_store_n(&doomed_step, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&doomed_step, __ATOMIC_SEQ_CST) != 2)
        sleep_ms(1);
    for (int i = 0; i < 64; i++) /* slow paths: what it may have gathered goes out now */
        shard_free(shard_malloc(16 + 16 * (size_t)i));
    return NULL;
}

TEST(frees_into_an_embedders_heap_are_not_held_past_its_destroy)
{
    doomed_heap = shard_heap_create(NULL);
    CHECK(doomed_heap != NULL);
    if (doomed_heap == NULL)
        return;
    for (int i = 0; i < 400; i++)
        doomed_blocks[i] = shard_heap_malloc(doomed_heap, 48);
    thread_t t;
    CHECK(thread_start(&t, free_and_wait, NULL) == 0);
    while (__atomic_load_n(&doomed_step, __ATOMIC_SEQ_CST) != 1)
        sleep_ms(1);
    shard_heap_destroy(doomed_heap);
    shard_heap *next = shard_heap_create(NULL);
    CHECK(next != NULL);
    static unsigned char *kept[400];
    for (int i = 0; next != NULL && i < 400; i++) {
        kept[i] = shard_heap_malloc(next, 48);
        CHECK(kept[i] != NULL);
        if (kept[i] != NULL)
            fill(kept[i], 48, 0x5100 + (uint64_t)i);
    }
    __atomic_store_n(&doomed_step, 2, __ATOMIC_SEQ_CST);
    thread_join(t);
    for (int i = 0; next != NULL && i < 400; i++)
        if (kept[i] != NULL)
            CHECK_PATTERN(kept[i], 48, 0x5100 + (uint64_t)i, "a block of the heap made after the destroy");
    CHECK_EQ(shard_check(), 0);
    if (next != NULL) {
        shard_heap_stats st = heap_stats(next);
        CHECK_EQ(st.live_small, (size_t)400);
        shard_heap_destroy(next);
    }
    CHECK_EQ(shard_check(), 0);
}

/* Many heaps made and destroyed: the structures are reused (the count of heaps does not grow), and
 * committed memory returns to where it was. */
TEST(heaps_made_and_destroyed_many_times_hold_nothing)
{
    shard_heap_destroy(shard_heap_create(NULL));
    shard_collect();
    shard_stats before = stats_now();
    for (int i = 0; i < 300; i++) {
        shard_heap *h = shard_heap_create(NULL);
        CHECK(h != NULL);
        if (h == NULL)
            return;
        for (int k = 0; k < 50; k++)
            shard_heap_malloc(h, (size_t)(k * 97 % 3000) + 1);
        if (i % 10 == 0)
            shard_heap_malloc(h, 80 * KB);
        if (i % 30 == 0)
            shard_heap_malloc(h, 2 * MB);
        shard_heap_destroy(h);
    }
    shard_collect();
    shard_stats after = stats_now();
    CHECK_EQ(after.heaps, before.heaps);
    CHECKF(after.committed == before.committed, "committed %zu after 300 heaps, %zu before", after.committed,
           before.committed);
    CHECK_EQ(shard_check(), 0);
}

/* shard_heap_free takes a block of the thread heap too (a free like any other), and sends what is not a
 * block to the error hook. */
TEST(shard_heap_free_of_other_blocks_and_of_garbage)
{
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    void *t = shard_malloc(100);
    fill(t, 100, 1);
    shard_heap_free(h, t);
    static char not_a_block[64];
    shard_error_fn previous = shard_set_error_hook(counting_hook, NULL);
    hook_calls = 0;
    shard_heap_free(h, not_a_block + 16);
    CHECK_EQ(hook_calls, 1);
    CHECK(hook_last == not_a_block + 16);
    CHECK(shard_heap_realloc(h, not_a_block + 32, 100) == NULL); /* reported once, as realloc's */
    shard_set_error_hook(previous, NULL);
    CHECK_EQ(hook_calls, 2);
    CHECK(hook_last == not_a_block + 32);
    shard_heap_destroy(h);
    CHECK_EQ(shard_check(), 0);
}

/* shard_heap_visit reports exactly the heap's live blocks (small, medium and its large ones), and none of
 * the thread heap's or another heap's. */
typedef struct seen {
    size_t count, bytes;
    void *first_large;
} seen;

static int count_seen(void *arg, void *block, size_t usable, int kind)
{
    seen *s = arg;
    CHECKF(usable == shard_usable_size(block), "%p visited with usable %zu, shard_usable_size %zu", block, usable,
           shard_usable_size(block));
    s->count++;
    s->bytes += usable;
    if (kind == SHARD_BLOCK_LARGE && s->first_large == NULL)
        s->first_large = block;
    return 0;
}

TEST(a_walk_of_a_heap_finds_its_blocks_and_no_others)
{
    shard_heap *a = shard_heap_create(NULL), *b = shard_heap_create(NULL);
    CHECK(a != NULL && b != NULL);
    if (a == NULL || b == NULL)
        return;
    size_t want = 0, bytes = 0;
    void *big = NULL;
    for (size_t i = 0; i < SIZE_COUNT * 3; i++) {
        void *p = shard_heap_malloc(a, sizes[i % SIZE_COUNT]);
        CHECK(p != NULL);
        if (sizes[i % SIZE_COUNT] == 3 * MB && big == NULL)
            big = p;
        want++, bytes += shard_usable_size(p);
        shard_heap_malloc(b, sizes[i % SIZE_COUNT]); /* the other heap's: not visited */
    }
    void *mine = shard_malloc(3 * MB), *mine_small = shard_malloc(64); /* the thread heap's: not visited */
    seen s = {0, 0, NULL};
    CHECK_EQ(shard_heap_visit(a, count_seen, &s), want);
    CHECK_EQ(s.count, want);
    CHECK_EQ(s.bytes, bytes);
    shard_heap_stats st = heap_stats(a);
    CHECK_EQ(s.bytes, st.live_small_bytes + st.live_medium_bytes + st.live_large_bytes);
    CHECK(s.first_large != NULL && s.first_large != mine);
    shard_free(mine);
    shard_free(mine_small);
    shard_heap_destroy(a);
    shard_heap_destroy(b);
    CHECK_EQ(shard_check(), 0);
}

/* A NULL heap is the calling thread's: its blocks are the thread heap's (shard_visit finds them), they
 * keep their contents through realloc and free with either name; the calls that act on a created heap
 * as a whole do nothing. */
static int find_block(void *arg, void *block, size_t usable, int kind)
{
    (void)usable, (void)kind;
    void **want = arg;
    if (block == want[0])
        want[1] = block;
    return 0;
}

TEST(a_null_heap_is_the_calling_threads_own)
{
    void *p = shard_heap_malloc(NULL, 100);
    CHECK(p != NULL);
    if (p == NULL)
        return;
    fill(p, 100, 1);
    void *want[2] = {p, NULL};
    shard_visit(SHARD_VISIT_THREAD, find_block, want);
    CHECK(want[1] == p);
    want[1] = NULL;
    shard_heap_visit(NULL, find_block, want);
    CHECK(want[1] == p);
    void *q = shard_heap_realloc(NULL, p, 50000);
    CHECK(q != NULL);
    CHECK_PATTERN(q, 100, 1, "a block of the NULL heap, resized");
    shard_heap_free(NULL, q);
    unsigned char *z = shard_heap_calloc(NULL, 10, 100);
    CHECK(z != NULL);
    for (int i = 0; z != NULL && i < 1000; i++)
        CHECK(z[i] == 0);
    shard_free(z);
    void *a = shard_heap_malloc_aligned(NULL, 300, 256);
    CHECK(a != NULL && ((uintptr_t)a & 255) == 0);
    shard_heap_free(NULL, a);
    shard_heap_stats st;
    memset(&st, 0xff, sizeof st);
    shard_heap_get_stats(NULL, &st);
    CHECK_EQ(st.committed, 0);
    CHECK_EQ(shard_heap_set_limit(NULL, 1), 0);
    shard_heap_reset(NULL);
    shard_heap_destroy(NULL);
    void *b = shard_malloc(64); /* the thread heap goes on */
    CHECK(b != NULL);
    shard_free(b);
    CHECK_EQ(shard_check(), 0);
}

/* A destroyed heap's reserve waits a second for the next heap (which then starts warm), then goes back
 * on its own at the next slow path of any thread. */
TEST(a_destroyed_heaps_reserve_goes_back_after_the_delay)
{
    shard_collect();
    size_t base = stats_now().committed;
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    for (int i = 0; i < 4000; i++)
        shard_heap_malloc(h, 2000);
    shard_heap_destroy(h);
    size_t kept = stats_now().committed;
    CHECKF(kept > base + 4 * MB, "a destroyed heap kept %zu bytes over %zu", kept - base, base);
    shard_heap *again = shard_heap_create(NULL); /* takes the reserve: no new commit for the same blocks */
    for (int i = 0; i < 4000; i++)
        shard_heap_malloc(again, 2000);
    CHECKF(stats_now().committed <= kept, "a heap made after a destroy committed %zu more",
           stats_now().committed - kept);
    shard_heap_destroy(again);
    sleep_ms(1200);
    void *p[64];
    for (int i = 0; i < 64; i++) /* slow paths: new pages of a class this thread had not used */
        p[i] = shard_malloc(12000);
    for (int i = 0; i < 64; i++)
        shard_free(p[i]);
    CHECKF(stats_now().committed < base + 2 * MB, "%zu bytes over %zu still committed a second after the destroy",
           stats_now().committed - base, base);
    CHECK_EQ(shard_check(), 0);
}

#ifndef _WIN32
/* fork() while another thread makes and destroys heaps: the child can make, destroy and collect heaps
 * (the list of destroyed heaps is held across the fork, as the allocator's other locks are). A child
 * that hangs is killed after 10 s and counts as a failure. */
static volatile int churn_heaps_stop;
static void *churn_heaps(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&churn_heaps_stop, __ATOMIC_ACQUIRE)) {
        shard_heap *h = shard_heap_create(NULL);
        for (int i = 0; h != NULL && i < 300; i++)
            shard_heap_malloc(h, i % 10 == 0 ? 40 * KB : 200);
        shard_heap_destroy(h);
        if (rand() % 8 == 0)
            shard_collect();
    }
    return NULL;
}

TEST(fork_while_another_thread_destroys_heaps)
{
    thread_t t;
    churn_heaps_stop = 0;
    CHECK(thread_start(&t, churn_heaps, NULL) == 0);
    int hung = 0, failed = 0;
    for (int i = 0; i < 150; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            for (int k = 0; k < 3; k++) {
                shard_heap *h = shard_heap_create(NULL);
                void *p = h ? shard_heap_malloc(h, 100) : NULL;
                shard_heap_destroy(h);
                if (p == NULL)
                    _exit(2);
            }
            shard_collect();
            _exit(0);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid)
            failed++;
        else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            hung++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    __atomic_store_n(&churn_heaps_stop, 1, __ATOMIC_RELEASE);
    thread_join(t);
    CHECKF(hung == 0 && failed == 0, "of 150 children %d hung and %d failed", hung, failed);
    CHECK_EQ(shard_check(), 0);
}
#endif

/* A heap at its limit takes in what other threads freed into its pages before it gives NULL: the pages
 * they emptied serve the allocation. Here 40 pages of 1024-byte blocks are filled; another thread frees
 * one block of each (the full pages come back into their list at the next allocation, the 2048-byte
 * one) and then the rest; with the limit at what the heap holds, a 512-byte block must still come. */
#define LIMIT_PAGES 40
#define LIMIT_PER_PAGE 64
static unsigned char *limit_blocks[LIMIT_PAGES * LIMIT_PER_PAGE];
static int limit_phase;

static void *free_limit_blocks(void *arg)
{
    (void)arg;
    for (int p = 0; p < LIMIT_PAGES; p++)
        for (int i = limit_phase == 1 ? 0 : 1; i < (limit_phase == 1 ? 1 : LIMIT_PER_PAGE); i++) {
            unsigned char *b = limit_blocks[p * LIMIT_PER_PAGE + i];
            if (b != NULL && !holds_pattern(b, 1024, 0x5100 + (uint64_t)(p * LIMIT_PER_PAGE + i)))
                CHECK_PATTERN(b, 1024, 0x5100 + (uint64_t)(p * LIMIT_PER_PAGE + i), "1024-byte block of a heap");
            shard_free(b);
            limit_blocks[p * LIMIT_PER_PAGE + i] = NULL;
        }
    return NULL;
}

TEST(a_heap_at_its_limit_uses_the_pages_other_threads_emptied)
{
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    for (int i = 0; i < LIMIT_PAGES * LIMIT_PER_PAGE; i++) {
        limit_blocks[i] = shard_heap_malloc(h, 1024);
        CHECK(limit_blocks[i] != NULL);
        if (limit_blocks[i] != NULL)
            fill_range(limit_blocks[i], 0, 1024, 0x5100 + (uint64_t)i);
    }
    limit_phase = 1;
    run_thread(free_limit_blocks, NULL);
    unsigned char *drained = shard_heap_malloc(h, 2048);
    CHECK(drained != NULL);
    limit_phase = 2;
    run_thread(free_limit_blocks, NULL);
    shard_heap_stats before = heap_stats(h);
    CHECK_EQ(before.live_small, (size_t)1);
    shard_heap_set_limit(h, before.committed);
    unsigned char *p = shard_heap_malloc(h, 512);
    CHECKF(p != NULL, "a 512-byte block at the limit (%zu bytes committed) with 40 pages that other threads "
                      "emptied: NULL", before.committed);
    if (p != NULL) {
        fill_range(p, 0, 512, 0x5200);
        CHECK(holds_pattern(p, 512, 0x5200));
        CHECK(heap_stats(h).committed <= before.committed);
    }
    shard_heap_free(h, p);
    shard_heap_free(h, drained);
    shard_heap_destroy(h);
    CHECK_EQ(shard_check(), 0);
}

/* A run of free pages that takes a heap from below 16 free pages to above them starts the delay of the
 * pages beyond the 16 as any retire does: it decommits none at once. (It read the clock only when the
 * heap held 16 free pages before the retire, so a run that crossed the line passed 0 for now, and the
 * delay of every page already waiting, now - freed_at, wrapped around: bench/shapes.c's ring on 8
 * threads decommitted 200-550 pages a run, each soon committed again.) A created heap: its free pages
 * are only the test's, and its committed memory counts each decommit. */
TEST(a_run_that_crosses_the_kept_free_pages_decommits_nothing_before_the_delay)
{
    enum { FILL = 24, SIZE = 4096, PER_PAGE = PAGE_SIZE / SIZE, TAKE = 10, RUN_SIZE = 14336,
           RUN_ITEMS = 4 * RUN_PAGES }; /* FILL - 1 - TAKE = 13 free pages, 13 + RUN_PAGES > 16 */
    static void *fill_blocks[FILL * PER_PAGE], *taken[(TAKE + 1) * PER_PAGE], *run_blocks[2 * RUN_ITEMS];
    shard_heap_stats s1, s2, s3;
    if (RUN_PAGES == 1)
        SKIP_TEST(); /* no runs: a retire adds one page and crosses no line */
    shard_heap *h = shard_heap_create(NULL);
    CHECK(h != NULL);
    if (h == NULL)
        return;
    /* Two runs of one class, so that emptying the first retires it (the second stays the class's). */
    for (size_t i = 0; i < 2 * RUN_ITEMS; i++) {
        run_blocks[i] = shard_heap_malloc(h, RUN_SIZE);
        CHECK(run_blocks[i] != NULL);
        if (run_blocks[i])
            fill(run_blocks[i], RUN_SIZE, 800 + i);
    }
    /* FILL pages of 4 KB blocks, freed: all but the class's last become free pages, and the retires
     * past the 16th start the delay of every one of them. */
    for (size_t i = 0; i < FILL * PER_PAGE; i++) {
        fill_blocks[i] = shard_heap_malloc(h, SIZE);
        CHECK(fill_blocks[i] != NULL);
        if (fill_blocks[i])
            fill(fill_blocks[i], SIZE, 900 + i);
    }
    for (size_t i = 0; i < FILL * PER_PAGE; i++) {
        CHECK_PATTERN(fill_blocks[i], SIZE, 900 + i, "4 KB block");
        shard_heap_free(h, fill_blocks[i]);
    }
    shard_heap_get_stats(h, &s1);
    /* The class's own page, then TAKE of the newest free pages, come back: 13 free pages are left. */
    for (size_t i = 0; i < (TAKE + 1) * PER_PAGE; i++) {
        taken[i] = shard_heap_malloc(h, SIZE);
        CHECK(taken[i] != NULL);
        if (taken[i])
            fill(taken[i], SIZE, 820 + i);
    }
    shard_heap_get_stats(h, &s2);
    CHECKF(s2.committed == s1.committed, "committed %zu -> %zu: the pages taken were not free ones", s1.committed,
           s2.committed);
    /* The first run empties and retires: 13 + RUN_PAGES free pages, all well within their second. */
    for (size_t i = 0; i < RUN_ITEMS; i++) {
        CHECK_PATTERN(run_blocks[i], RUN_SIZE, 800 + i, "14 KB block");
        shard_heap_free(h, run_blocks[i]);
    }
    shard_heap_get_stats(h, &s3);
    CHECKF(s3.committed == s2.committed, "committed %zu -> %zu (%zd pages) when a run retired", s2.committed,
           s3.committed, ((ptrdiff_t)s3.committed - (ptrdiff_t)s2.committed) / PAGE_SIZE);
    for (size_t i = RUN_ITEMS; i < 2 * RUN_ITEMS; i++)
        CHECK_PATTERN(run_blocks[i], RUN_SIZE, 800 + i, "14 KB block");
    for (size_t i = 0; i < (TAKE + 1) * PER_PAGE; i++)
        CHECK_PATTERN(taken[i], SIZE, 820 + i, "4 KB block taken back");
    shard_heap_destroy(h);
    CHECK_EQ(shard_check(), 0);
}
