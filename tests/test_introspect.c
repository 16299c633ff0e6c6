/* test_introspect.c - deterministic tests of shard_visit, shard_report_leaks and shard_print_stats.
 *
 * The rules, as this file reads them (include/shardmm.h):
 * - shard_visit(scope, fn, arg) calls fn once for every live block in scope - the calling thread's heap
 *   (SHARD_VISIT_THREAD), the heaps of exited threads waiting for a new one (SHARD_VISIT_WAITING), the
 *   large blocks of every thread (SHARD_VISIT_LARGE) - with the block, its usable size
 *   (shard_usable_size) and its kind, and for nothing else: not for freed blocks, also not for blocks
 *   another thread freed and their owner has not taken in yet. Blocks of other running threads' heaps
 *   are not visited (large ones are: they belong to no heap). fn returning non-zero stops the walk. It
 *   returns the number of calls.
 * - shard_report_leaks writes what shard_visit(SHARD_VISIT_ALL) finds, grouped by size, with the first
 *   bytes of the first blocks of each group, and returns the number of blocks.
 * - shard_print_stats writes shard_get_stats as a table, one row per field.
 *
 * Each test starts from a thread heap without live blocks (the tests free what they allocate; the
 * harness allocates through the C library, not through shardmm) and checks that the walk reports exactly
 * the blocks the test holds: each once, with its usable size and kind, its contents (a pattern over the
 * whole usable size) intact. A block found twice, a freed one found, or a held one missing, fails.
 *
 * Build: see build.ninja (build/test-introspect, its debug twin, build/win64/test-introspect.exe).
 * Run:   build/test-introspect [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define MAX_HELD 4096

/* What a walk found, in the order of the calls. */
typedef struct found {
    size_t count, limit; /* limit: stop after this many (0: never) */
    void *block[MAX_HELD];
    size_t usable[MAX_HELD];
    int kind[MAX_HELD];
    size_t overflow;
} found;

static int record(void *arg, void *block, size_t usable, int kind)
{
    found *f = arg;
    if (f->count < MAX_HELD) {
        f->block[f->count] = block;
        f->usable[f->count] = usable;
        f->kind[f->count] = kind;
    } else {
        f->overflow++;
    }
    f->count++;
    return f->limit != 0 && f->count >= f->limit;
}

static int kind_of_size(size_t n) { return n <= 16 * KB ? SHARD_BLOCK_SMALL : n <= MB ? SHARD_BLOCK_MEDIUM : SHARD_BLOCK_LARGE; }

/* The blocks a test holds. */
typedef struct held {
    size_t count;
    void *p[MAX_HELD];
    size_t size[MAX_HELD];
    uint64_t seed[MAX_HELD];
} held;

static void hold(held *h, size_t size, uint64_t seed)
{
    void *p = shard_malloc(size);
    CHECKF(p != NULL, "shard_malloc(%zu)", size);
    if (p == NULL || h->count == MAX_HELD)
        return;
    fill(p, shard_usable_size(p), seed);
    h->p[h->count] = p;
    h->size[h->count] = size;
    h->seed[h->count] = seed;
    h->count++;
}

/* Frees the held blocks i with i % step == rest (and forgets them). */
static void release(held *h, size_t step, size_t rest)
{
    size_t kept = 0;
    for (size_t i = 0; i < h->count; i++) {
        if (i % step == rest) {
            CHECK_PATTERN(h->p[i], shard_usable_size(h->p[i]), h->seed[i], "a held block before its free");
            shard_free(h->p[i]);
        } else {
            h->p[kept] = h->p[i], h->size[kept] = h->size[i], h->seed[kept] = h->seed[i];
            kept++;
        }
    }
    h->count = kept;
}

/* The walk found exactly the held blocks (each once, with its usable size and kind, contents intact). */
static void check_found(const found *f, const held *h, const char *what)
{
    CHECKF(f->overflow == 0, "%s: more than %d blocks reported", what, MAX_HELD);
    CHECKF(f->count == h->count, "%s: %zu blocks reported, %zu held", what, f->count, h->count);
    static unsigned char seen[MAX_HELD];
    memset(seen, 0, sizeof seen);
    for (size_t k = 0; k < f->count && k < MAX_HELD; k++) {
        size_t i = 0;
        while (i < h->count && h->p[i] != f->block[k])
            i++;
        if (i == h->count) {
            CHECKF(0, "%s: %p (usable %zu, kind %d) reported, not held", what, f->block[k], f->usable[k], f->kind[k]);
            continue;
        }
        CHECKF(!seen[i], "%s: %p reported twice", what, h->p[i]);
        seen[i] = 1;
        CHECKF(f->usable[k] == shard_usable_size(h->p[i]), "%s: %p reported with usable %zu, shard_usable_size %zu",
               what, h->p[i], f->usable[k], shard_usable_size(h->p[i]));
        CHECKF(f->kind[k] == kind_of_size(h->size[i]), "%s: %p of %zu bytes reported as kind %d", what, h->p[i],
               h->size[i], f->kind[k]);
        CHECK_PATTERN(h->p[i], f->usable[k], h->seed[i], "a block the walk reported");
    }
}

static size_t sizes[] = {1, 16, 17, 100, 512, 2000, 4096, 16 * KB, 16 * KB + 1, 40 * KB, 200 * KB, MB,
                         MB + 1, 3 * MB};

static void start_empty(void)
{
    static found f;
    f.count = f.limit = f.overflow = 0;
    shard_collect();
    shard_visit(SHARD_VISIT_THREAD | SHARD_VISIT_LARGE, record, &f);
    CHECKF(f.count == 0, "a test starts with %zu live blocks of its thread and large ones", f.count);
}

/* Every kind, many classes: the walk of the thread's heap and the large blocks finds each held block
 * once; after freeing every other one, exactly the rest. */
TEST(a_walk_finds_exactly_the_blocks_held_by_kind_and_size)
{
    static held h;
    static found f;
    h.count = 0;
    start_empty();
    for (int round = 0; round < 20; round++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            hold(&h, sizes[i] + (size_t)round * 16, 1000 + h.count);
    for (int i = 0; i < 2000; i++)
        hold(&h, 48, 5000 + (uint64_t)i); /* several pages of one class */
    f.count = f.limit = f.overflow = 0;
    size_t n = shard_visit(SHARD_VISIT_THREAD | SHARD_VISIT_LARGE, record, &f);
    CHECK_EQ(n, f.count);
    check_found(&f, &h, "all held");
    release(&h, 2, 0);
    f.count = f.overflow = 0;
    shard_visit(SHARD_VISIT_ALL, record, &f);
    check_found(&f, &h, "every other one freed");
    release(&h, 1, 0);
    f.count = f.overflow = 0;
    shard_visit(SHARD_VISIT_ALL, record, &f);
    CHECK_EQ(f.count, (size_t)0);
    CHECK_EQ(shard_check(), 0);
}

/* The scopes: THREAD reports no large block, LARGE nothing but large blocks. */
TEST(the_scopes_divide_the_blocks)
{
    static held h;
    static found f;
    h.count = 0;
    start_empty();
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        hold(&h, sizes[i], 200 + i);
    size_t large = 0;
    for (size_t i = 0; i < h.count; i++)
        large += kind_of_size(h.size[i]) == SHARD_BLOCK_LARGE;
    f.count = f.limit = f.overflow = 0;
    shard_visit(SHARD_VISIT_THREAD, record, &f);
    CHECK_EQ(f.count, h.count - large);
    for (size_t k = 0; k < f.count; k++)
        CHECK(f.kind[k] != SHARD_BLOCK_LARGE);
    f.count = 0;
    shard_visit(SHARD_VISIT_LARGE, record, &f);
    CHECK_EQ(f.count, large);
    for (size_t k = 0; k < f.count; k++)
        CHECK(f.kind[k] == SHARD_BLOCK_LARGE);
    f.count = 0;
    shard_visit(SHARD_VISIT_WAITING, record, &f);
    CHECK_EQ(f.count, (size_t)0);
    release(&h, 1, 0);
}

/* fn returning non-zero ends the walk at once. */
TEST(the_function_stops_the_walk)
{
    static held h;
    static found f;
    h.count = 0;
    start_empty();
    for (int i = 0; i < 300; i++)
        hold(&h, i % 3 == 0 ? 64 : i % 3 == 1 ? 50 * KB : 2 * MB, 300 + (uint64_t)i);
    for (size_t limit = 1; limit <= 5; limit++) {
        f.count = f.overflow = 0;
        f.limit = limit;
        CHECK_EQ(shard_visit(SHARD_VISIT_ALL, record, &f), limit);
        CHECK_EQ(f.count, limit);
    }
    f.count = f.overflow = f.limit = 0;
    CHECK_EQ(shard_visit(SHARD_VISIT_ALL, record, &f), h.count);
    release(&h, 1, 0);
}

/* Blocks another thread freed - waiting in a page's thread_free list, or medium chunks marked pending -
 * are not live and not reported, before and after their owner takes them in. */
static held foreign;
static void *free_every_third(void *arg)
{
    (void)arg;
    for (size_t i = 0; i < foreign.count; i += 3)
        shard_free(foreign.p[i]);
    return NULL;
}

TEST(blocks_another_thread_freed_are_not_reported)
{
    static found f;
    foreign.count = 0;
    start_empty();
    for (int i = 0; i < 600; i++)
        hold(&foreign, i % 2 ? 80 : 30 * KB, 600 + (uint64_t)i);
    for (size_t i = 0; i < foreign.count; i += 3)
        CHECK_PATTERN(foreign.p[i], shard_usable_size(foreign.p[i]), foreign.seed[i], "before a foreign free");
    run_thread(free_every_third, NULL);
    size_t kept = 0;
    for (size_t i = 0; i < foreign.count; i++)
        if (i % 3 != 0)
            foreign.p[kept] = foreign.p[i], foreign.size[kept] = foreign.size[i], foreign.seed[kept] = foreign.seed[i],
            kept++;
    foreign.count = kept;
    f.count = f.limit = f.overflow = 0;
    shard_visit(SHARD_VISIT_THREAD, record, &f);
    check_found(&f, &foreign, "after another thread's frees, before they are taken in");
    hold(&foreign, 80, 9000); /* slow paths take the frees in */
    hold(&foreign, 30 * KB, 9001);
    shard_collect();
    f.count = 0;
    shard_visit(SHARD_VISIT_THREAD, record, &f);
    check_found(&f, &foreign, "after they are taken in");
    release(&foreign, 1, 0);
}

/* A thread that exits holding blocks leaves them in its heap, which waits for a new thread: WAITING
 * reports them (and the exited thread's large block is among LARGE's). Freed by this thread, they are
 * gone from the walk. */
static held exiting;
static void *allocate_and_exit(void *arg)
{
    (void)arg;
    for (int i = 0; i < 400; i++)
        hold(&exiting, i % 4 == 0 ? 24 * KB : i % 4 == 3 && i < 8 ? 2 * MB : 96 + (size_t)i, 4000 + (uint64_t)i);
    return NULL;
}

TEST(the_heaps_of_exited_threads_are_walked_while_they_wait)
{
    static found f;
    exiting.count = 0;
    start_empty();
    run_thread(allocate_and_exit, NULL);
    f.count = f.limit = f.overflow = 0;
    shard_visit(SHARD_VISIT_WAITING | SHARD_VISIT_LARGE, record, &f);
    check_found(&f, &exiting, "an exited thread's blocks");
    f.count = 0;
    shard_visit(SHARD_VISIT_THREAD, record, &f);
    CHECK_EQ(f.count, (size_t)0);
    release(&exiting, 2, 1);
    f.count = 0;
    shard_visit(SHARD_VISIT_WAITING | SHARD_VISIT_LARGE, record, &f);
    check_found(&f, &exiting, "half of them freed by another thread");
    release(&exiting, 1, 0);
    f.count = 0;
    shard_visit(SHARD_VISIT_ALL, record, &f);
    CHECK_EQ(f.count, (size_t)0);
    CHECK_EQ(shard_check(), 0);
}

/* A running thread's small and medium blocks are not walked by another thread; its large ones are. */
static held running;
static volatile int running_ready, running_done;
static void *allocate_and_wait(void *arg)
{
    (void)arg;
    for (int i = 0; i < 50; i++)
        hold(&running, i < 3 ? 2 * MB : i % 2 ? 200 : 20 * KB, 7000 + (uint64_t)i);
    __atomic_store_n(&running_ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&running_done, __ATOMIC_ACQUIRE))
        sleep_ms(1);
    release(&running, 1, 0);
    return NULL;
}

TEST(a_running_threads_heap_is_not_walked_but_its_large_blocks_are)
{
    static found f;
    running.count = 0;
    running_ready = running_done = 0;
    start_empty();
    thread_t t;
    CHECK(thread_start(&t, allocate_and_wait, NULL) == 0);
    while (!__atomic_load_n(&running_ready, __ATOMIC_ACQUIRE))
        sleep_ms(1);
    f.count = f.limit = f.overflow = 0;
    shard_visit(SHARD_VISIT_ALL, record, &f);
    CHECK_EQ(f.count, (size_t)3);
    for (size_t k = 0; k < f.count && k < 3; k++) {
        CHECK(f.kind[k] == SHARD_BLOCK_LARGE);
        int held_one = 0;
        for (size_t i = 0; i < 3; i++)
            held_one |= f.block[k] == running.p[i];
        CHECKF(held_one, "%p reported, not one of the running thread's large blocks", f.block[k]);
    }
    __atomic_store_n(&running_done, 1, __ATOMIC_RELEASE);
    thread_join(t);
}

/* Output captured from the introspection functions. */
typedef struct text {
    size_t len, calls;
    char buf[1 << 16];
} text;

static void capture(void *arg, const char *s, size_t len)
{
    text *t = arg;
    t->calls++;
    for (size_t i = 0; i < len && t->len + 1 < sizeof t->buf; i++)
        t->buf[t->len++] = s[i];
    t->buf[t->len] = 0;
}

/* The leak report counts the blocks and bytes a walk finds, groups them by size, and shows the first
 * bytes of a block as hex and text. */
TEST(the_leak_report_lists_the_live_blocks_with_their_first_bytes)
{
    static held h;
    static text t;
    h.count = 0;
    t.len = t.calls = 0;
    start_empty();
    const char *marker = "leaked-by-test-introspect";
    for (int i = 0; i < 5; i++) {
        hold(&h, 64, 100 + (uint64_t)i);
        strcpy(h.p[h.count - 1], marker);
    }
    hold(&h, 100 * KB, 7);
    hold(&h, 3 * MB, 8);
    size_t n = shard_report_leaks(capture, &t);
    CHECK_EQ(n, h.count);
    CHECKF(t.calls > 1, "the report came in %zu calls", t.calls);
    CHECKF(strstr(t.buf, "shardmm: 7 live blocks") != NULL, "the report's first line: %.80s", t.buf);
    CHECKF(strstr(t.buf, "small blocks of 64 B: 5 blocks, 320 B") != NULL, "no group of 5 blocks of 64 B in:\n%s",
           t.buf);
    CHECKF(strstr(t.buf, "medium blocks of 64.0 KB to 128 KB: 1 block") != NULL, "no medium group in:\n%s", t.buf);
    CHECKF(strstr(t.buf, "large blocks of 2.00 MB to 4.00 MB: 1 block") != NULL, "no large group in:\n%s", t.buf);
    CHECKF(strstr(t.buf, "|leaked-by-test-introspect.") != NULL, "the block's text is not shown:\n%s", t.buf);
    CHECKF(strstr(t.buf, " 6c 65 61 6b 65 64 2d") != NULL, "the block's bytes are not shown in hex:\n%s", t.buf);
    char address[40];
    snprintf(address, sizeof address, "0x%012llx:", (unsigned long long)(uintptr_t)h.p[0]);
    CHECKF(strstr(t.buf, address) != NULL, "the first block's address %s is not shown:\n%s", address, t.buf);
    for (size_t i = 0; i < 5; i++) /* the marker over the pattern: the pattern again, for release's check */
        fill(h.p[i], shard_usable_size(h.p[i]), h.seed[i]);
    release(&h, 1, 0);
    t.len = 0;
    CHECK_EQ(shard_report_leaks(capture, &t), (size_t)0);
    CHECKF(strcmp(t.buf, "shardmm: 0 live blocks, 0 B\n") == 0, "the report with nothing live: %s", t.buf);
}

/* The statistics table holds shard_get_stats' numbers (those that do not change between the two calls
 * in one thread), one row each, with units. */
TEST(the_statistics_table_shows_the_numbers_of_shard_get_stats)
{
    static held h;
    static text t;
    h.count = 0;
    t.len = 0;
    start_empty();
    for (int i = 0; i < 37; i++)
        hold(&h, 48, 50 + (uint64_t)i);
    hold(&h, 300 * KB, 90);
    hold(&h, 5 * MB, 91);
    shard_print_stats(capture, &t);
    shard_stats s;
    shard_get_stats(&s);
    char row[120];
    /* A row: its name in 34 columns, then the number right-aligned in 10. */
    const char *names[] = {"  small (up to 16 KB)", "  medium (up to 1 MB)", "  large (above 1 MB)", "  created"};
    size_t values[] = {s.live_small, s.live_medium, s.live_large, s.heaps};
    for (size_t i = 0; i < 4; i++) {
        snprintf(row, sizeof row, "%s%*zu", names[i], (int)(34 - strlen(names[i]) + 10), values[i]);
        CHECKF(strstr(t.buf, row) != NULL, "no row \"%s\" in:\n%s", row, t.buf);
    }
    CHECK(s.live_small >= 37 && s.live_medium >= 1 && s.live_large >= 1);
    snprintf(row, sizeof row, "  small (up to 16 KB)%*zu", (int)(34 - 21 + 10), s.live_small);
    const char *at = strstr(t.buf, row);
    CHECKF(at != NULL && strncmp(at + strlen(row), "     ", 5) == 0 && strstr(at, " usable\n") != NULL,
           "no usable bytes after the small blocks' count:\n%s", t.buf);
    const char *rows[] = {"reserved (address space)", "committed, peak", "medium (up to 1 MB)", "serving a size class",
                          "decommitted", "arenas", "large-block cache", "calls since start"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        CHECKF(strstr(t.buf, rows[i]) != NULL, "no row \"%s\" in:\n%s", rows[i], t.buf);
    CHECKF(strstr(t.buf, " MB   readable and writable now") != NULL, "no committed bytes in MB:\n%s", t.buf);
    release(&h, 1, 0);
}

/* Walks of everything while other threads allocate, free and hand over blocks of every kind: each walk
 * ends, every large block it reports can be read while the function runs (none is released under it),
 * and the allocator stays consistent. */
static volatile int churn_stop;
static void *churn(void *arg)
{
    uint64_t x = (uintptr_t)arg | 1;
    void *slot[64] = {0};
    while (!__atomic_load_n(&churn_stop, __ATOMIC_ACQUIRE)) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned i = (unsigned)(x % 64);
        if (slot[i] != NULL) {
            shard_free(slot[i]);
            slot[i] = NULL;
        } else {
            size_t n = x >> 60 == 0 ? MB + (x >> 8) % (3 * MB) : x >> 60 < 4 ? 20 * KB + (x >> 8) % (200 * KB)
                                                                             : 16 + (x >> 8) % 4000;
            slot[i] = shard_malloc(n);
            if (slot[i] != NULL)
                memset(slot[i], 0x5a, n < 64 ? n : 64);
        }
    }
    for (unsigned i = 0; i < 64; i++)
        shard_free(slot[i]);
    return NULL;
}

static int read_first_bytes(void *arg, void *block, size_t usable, int kind)
{
    size_t *sum = arg;
    (void)kind;
    *sum += ((volatile unsigned char *)block)[0] + ((volatile unsigned char *)block)[usable - 1];
    return 0;
}

TEST(walks_of_everything_while_other_threads_churn)
{
    enum { THREADS = 3 };
    thread_t t[THREADS];
    churn_stop = 0;
    for (int i = 0; i < THREADS; i++)
        CHECK(thread_start(&t[i], churn, (void *)(uintptr_t)(0x9e3779b97f4a7c15ull * (uint64_t)(i + 1))) == 0);
    size_t sum = 0, walks = 0;
    for (; walks < 300; walks++) {
        shard_visit(SHARD_VISIT_ALL, read_first_bytes, &sum);
        if (walks % 50 == 0)
            sleep_ms(2);
    }
    __atomic_store_n(&churn_stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < THREADS; i++)
        thread_join(t[i]);
    CHECKF(walks == 300, "%zu walks", walks);
    CHECK_EQ(shard_check(), 0);
}

/* The report writes what it copied during the walk: a block freed (and its memory given back) between
 * the walk and the writing still shows its first bytes, and the report reads nothing that is gone. The
 * output function here frees a block of 130 MB (above what the large-block cache keeps, so its memory
 * goes back at once) before the line that shows it is written. */
static void *freed_meanwhile;
static void capture_and_free(void *arg, const char *s, size_t len)
{
    capture(arg, s, len);
    if (freed_meanwhile != NULL) {
        shard_free(freed_meanwhile);
        freed_meanwhile = NULL;
    }
}

TEST(the_leak_report_shows_a_block_freed_while_it_is_written)
{
    static text t;
    t.len = t.calls = 0;
    start_empty();
    char *big = shard_malloc(130 * MB);
    CHECK(big != NULL);
    if (big == NULL)
        return;
    strcpy(big, "freed-while-reported");
    freed_meanwhile = big;
    size_t n = shard_report_leaks(capture_and_free, &t);
    CHECK_EQ(n, (size_t)1);
    CHECK(freed_meanwhile == NULL);
    CHECKF(strstr(t.buf, "|freed-while-reported.") != NULL, "the block's text is not shown:\n%s", t.buf);
}
