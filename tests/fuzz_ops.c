/* fuzz_ops.c - a libFuzzer harness for shardmm: an input is a sequence of allocator operations on a table of
 * live blocks, done by the fuzzer's thread and by a helper thread, with every block's contents, the allocator's
 * own checkers and its statistics checked along the way.
 *
 * The allocator is compiled into the fuzzer (build/fuzz/fuzz-ops, fuzz.ninja) in its debug build
 * (SHARD_DEBUG=1: page, arena and heap checks after slow paths, which abort on an inconsistency), with
 * AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage. It keeps its own names (shard_*), so
 * ASan's malloc, which the fuzzer and this file use, stays apart from it. Linux x86-64 only (pthreads).
 *
 * An input is read as operations, one after another, until it ends (a read past the end gives 0 bytes):
 *
 *   op byte    bits 0..6: the operation (modulo OP_COUNT, table below); bit 7: "async" for the operations
 *              that the helper thread does (the fuzzer's thread does the next operation meanwhile)
 *   operands   as each operation reads them (enum op lists them): a block of the table by one byte scaled
 *              to the table (take_index), a size by a selector byte and 1-3 more (take_size), a count by
 *              one byte
 *
 * Blocks: at most LIVE_MAX live blocks and LIVE_BYTES_MAX usable bytes among them (an allocation beyond
 * either is skipped), sizes 0 .. LARGE_FUZZ_MAX. Every block holds the pattern of a seed of its own
 * (harness.h's pattern_word) over its usable size (above 256 KB: its ends and the start of every 4 KB page,
 * see pattern_range) and is checked:
 * - whole: before it is freed (by either thread), when the helper takes or gives it back, after realloc (the
 *   kept prefix), after an invalid operation aimed at it;
 * - after every operation: its usable size is what it was, and its first and last EDGE bytes hold the pattern;
 * - a new block (malloc, calloc, realloc that moved, a block from the helper) overlaps no live block.
 * After every operation shard_check() is 0 (the fuzzer thread's heap, the heaps waiting for a thread, the
 * large-block cache; the helper checks its own heap after each of its tasks), and, while the helper is idle,
 * shard_get_stats counts exactly the live small and large blocks of the table, and no fewer medium ones (a
 * medium block freed by another thread counts until its owner's next medium operation). The error hook is
 * installed for the whole run: a call that no invalid operation asked for fails the run.
 *
 * The helper: one persistent thread that takes tasks (free, check and rewrite, realloc, allocate and hand
 * over, shard_thread_done, shard_collect, exit) through a mutex and condition variable; a synchronous task is
 * waited for at once, an async one at the end of the next operation, so that operation runs concurrently with
 * it (statistics are not compared while a task is in flight). An exit ends the thread; the next task starts
 * a new one. The helper's thread-exit destructor (a key created before the allocator's, so it runs first and
 * once more after the allocator's own) allocates and frees in the exiting thread: the second round finds the
 * heap gone and takes the path of a thread past its exit hook (a heap lent for one block).
 *
 * At the end of an input everything is freed (inputs are independent), both threads take in the frees
 * the other made into their heaps and call shard_collect, and then the statistics must show no live block
 * and an empty large-block cache.
 *
 * Aligned allocation is not in the API yet; when it is, it becomes one more operation here.
 *
 * Environment: SHARD_FUZZ_SYNC=1 makes every helper task synchronous (a replay that does not depend on
 * timing); SHARD_FUZZ_TRACE=1 prints each operation to stderr.
 *
 * Build: ninja build/fuzz/fuzz-ops (fuzz.ninja).   Run: tests/fuzz, or build/fuzz/fuzz-ops [libFuzzer options].
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h" /* the pattern helpers */
#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define SMALL_MAX (16 * KB)
#define MEDIUM_MAX MB
#define LARGE_HEADER ((size_t)32)
#define LARGE_PAGE ((size_t)4096)
#define LARGE_FUZZ_MAX (32 * MB)   /* the largest size an input asks for */
#define LIVE_MAX 1024              /* live blocks at most: enough to fill the pages of classes from 64 bytes on */
#define LIVE_BYTES_MAX (64 * MB)   /* their usable bytes at most, so that an input stays fast */
#define BATCH_MAX 256              /* blocks in one burst or one helper task */
#define EDGE ((size_t)64)          /* bytes checked at each end of every live block after every operation */

/* ---- failures --------------------------------------------------------------------------------------- */

static const char *current_op = "(start)";
static unsigned current_index;
static int trace;

static _Noreturn __attribute__((format(printf, 1, 2))) void fail(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "fuzz-ops: operation %u (%s): ", current_index, current_op);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

/* ---- the input -------------------------------------------------------------------------------------- */

typedef struct input {
    const uint8_t *at, *end;
} input;

static unsigned take8(input *in) { return in->at < in->end ? *in->at++ : 0u; }
static unsigned take16(input *in)
{
    unsigned lo = take8(in);
    return lo | take8(in) << 8;
}
static size_t take24(input *in)
{
    size_t lo = take16(in);
    return lo | (size_t)take8(in) << 16;
}

/* Sizes next to the boundaries of the allocator's ranges and rules (classes, the direct table, the small,
 * medium and large limits, the large blocks' pages, granules and reservations: the least one is 2 MB +
 * 64 KB, 8 MB blocks reserve 16 MB). */
static const size_t boundary_sizes[] = {
    0, 16, 32, 48, 64, 128, 1024, 2048, 2064, 4096, 8192, 10240, 14336, 16384, 16400, 32768, 65536,
    65536 - 16, 262144, MEDIUM_MAX - 4096, MEDIUM_MAX - 256, MEDIUM_MAX, MEDIUM_MAX + 4096 - LARGE_HEADER,
    2 * MB, 2 * MB + 64 * KB - LARGE_HEADER, 4 * MB - LARGE_HEADER, 8 * MB, 16 * MB - 2 * LARGE_PAGE, 16 * MB,
    24 * MB,
};
enum { BOUNDARY_SIZES = sizeof boundary_sizes / sizeof boundary_sizes[0] };

/* A size: the selector's low 3 bits pick a range, the bytes after it the size in it. */
static size_t take_size(input *in)
{
    unsigned how = take8(in);
    switch (how & 7) {
    case 0:
    case 1:
        return take8(in); /* the sizes of the fast path's direct table and its first classes */
    case 2:
        return take16(in) % (2 * KB + 1);
    case 3:
        return take16(in) % (SMALL_MAX + 1);
    case 4: { /* a boundary, moved by -16 .. +15 (the selector's high bits) */
        long n = (long)boundary_sizes[take8(in) % BOUNDARY_SIZES] + (long)(how >> 3) - 16;
        return n < 0 ? 0 : (size_t)n;
    }
    case 5:
        return SMALL_MAX + 1 + take16(in); /* the lower medium sizes, 16 KB .. 80 KB */
    case 6:
        return SMALL_MAX + 1 + take24(in) % (MEDIUM_MAX - SMALL_MAX);
    default:
        return MEDIUM_MAX + 1 + 2 * take24(in) % (LARGE_FUZZ_MAX - MEDIUM_MAX);
    }
}

/* ---- blocks and their patterns ---------------------------------------------------------------------- */

enum kind { KIND_SMALL, KIND_MEDIUM, KIND_LARGE };
static const char *const kind_names[] = {"small", "medium", "large"};

static enum kind kind_of_size(size_t n)
{
    return n <= SMALL_MAX ? KIND_SMALL : n <= MEDIUM_MAX ? KIND_MEDIUM : KIND_LARGE;
}

/* A live block. Its usable size holds the pattern of seed (pattern_range: all of it, or above DENSE_MAX a
 * sample). kind is the counter of shard_stats it is in: that of its size when it was allocated or
 * moved; a realloc in place keeps it (a medium block shrunk to 100 bytes in place is still medium). */
typedef struct live_block {
    unsigned char *p;
    size_t usable;
    uint64_t seed;
    enum kind kind;
} live_block;

static live_block live[LIVE_MAX];
static unsigned live_count;
static size_t live_bytes;
/* Blocks out with a helper task that returns blocks, and their bytes (an estimate for new ones): they count
 * against the limits until they are back in the table. */
static unsigned pending_count;
static size_t pending_bytes;
static uint64_t seed_counter; /* both threads take seeds: atomic */

static uint64_t new_seed(void) { return __atomic_add_fetch(&seed_counter, 1, __ATOMIC_RELAXED); }

/* Where a block holds its pattern: every byte of a block up to DENSE_MAX; of a larger one the first and
 * last SAMPLE_ENDS bytes and the first SAMPLE_BYTES of every 4 KB page between. Writing and checking 32 MB
 * took most of the fuzzer's time; a large block's errors (a page mapped or moved wrong, a header written
 * over the block) show in the sample as well. */
#define DENSE_MAX (256 * KB)
#define SAMPLE_ENDS ((size_t)4096)
#define SAMPLE_STEP ((size_t)4096)
#define SAMPLE_BYTES ((size_t)64)

/* The first byte in [from, to) that differs from seed's pattern, or to. */
static size_t mismatch_range(const unsigned char *p, size_t from, size_t to, uint64_t seed)
{
    size_t i = from;
    for (; i < to && (i & 7) != 0; i++)
        if (p[i] != pattern_byte(seed, i))
            return i;
    for (; i + 8 <= to; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        if (x != pattern_word(seed, i / 8))
            break;
    }
    for (; i < to; i++)
        if (p[i] != pattern_byte(seed, i))
            return i;
    return to;
}

/* The k-th range [*from, *to) of a block of `usable` bytes that holds the pattern; 0 after the last. */
static int pattern_range(size_t usable, size_t k, size_t *from, size_t *to)
{
    if (usable <= DENSE_MAX) {
        *from = 0;
        *to = usable;
        return k == 0;
    }
    size_t middle = (usable - 2 * SAMPLE_ENDS) / SAMPLE_STEP; /* samples that end before the last SAMPLE_ENDS */
    if (k == 0) {
        *from = 0;
        *to = SAMPLE_ENDS;
    } else if (k <= middle) {
        *from = SAMPLE_ENDS + (k - 1) * SAMPLE_STEP;
        *to = *from + SAMPLE_BYTES;
    } else if (k == middle + 1) {
        *from = usable - SAMPLE_ENDS;
        *to = usable;
    } else {
        return 0;
    }
    return 1;
}

/* Write b's pattern into it. */
static void fill_block(const live_block *b)
{
    size_t from, to;
    for (size_t k = 0; pattern_range(b->usable, k, &from, &to); k++)
        fill_range(b->p, from, to, b->seed);
}

/* The bytes [from, to) of b hold its pattern. */
static void expect_range(const live_block *b, size_t from, size_t to, const char *when)
{
    size_t bad = mismatch_range(b->p, from, to, b->seed);
    if (bad != to)
        fail("%s block %p (usable %zu, seed %llu): byte %zu is 0x%02x, the pattern has 0x%02x (%s)",
             kind_names[b->kind], (void *)b->p, b->usable, (unsigned long long)b->seed, bad, b->p[bad],
             pattern_byte(b->seed, bad), when);
}

/* The pattern of b (laid out for b->usable) is in place in its ranges below `limit`. */
static void expect_pattern(const live_block *b, size_t limit, const char *when)
{
    size_t from, to;
    for (size_t k = 0; pattern_range(b->usable, k, &from, &to) && from < limit; k++)
        expect_range(b, from, to < limit ? to : limit, when);
}

static void expect_whole(const live_block *b, const char *when) { expect_pattern(b, b->usable, when); }

/* The first and last EDGE bytes (both lie in the pattern's ranges). */
static void expect_edges(const live_block *b, const char *when)
{
    size_t n = b->usable;
    expect_range(b, 0, n < EDGE ? n : EDGE, when);
    expect_range(b, n < EDGE ? 0 : n - EDGE, n, when);
}

static void refill(live_block *b)
{
    b->seed = new_seed();
    fill_block(b);
}

/* Where a large block starts in its 4 MB granule: the 32-byte header and the block's colour (64-byte steps,
 * under 4 KB), or a page for a block that starts a granule itself (aligned to 4 MB and more). */
static size_t large_offset(const void *p)
{
    size_t off = (uintptr_t)p & (4 * MB - 1);
    return off != 0 ? off : LARGE_PAGE;
}

static size_t large_need(size_t n, size_t offset) { return (n + offset + LARGE_PAGE - 1) & ~(LARGE_PAGE - 1); }

/* What a block the allocator hands out for a request of n bytes must be: 16-byte aligned, at least n usable
 * bytes, a small one no more than 16 KB, a large one exactly need(t) - offset usable bytes (need: t and the
 * block's offset into its granule, which holds the header, rounded up to 4 KB), where t is n, or for a realloc
 * that moved into the large range n + n/16. */
static void expect_block(const void *p, size_t n, size_t usable, enum kind k, size_t t, const char *what)
{
    if (p == NULL)
        fail("%s(%zu) = NULL", what, n);
    if ((uintptr_t)p & 15)
        fail("%s(%zu) = %p, not 16-byte aligned", what, n, p);
    if (usable < n || (k == KIND_SMALL && usable > SMALL_MAX))
        fail("%s(%zu) = %p: a %s block of usable size %zu", what, n, p, kind_names[k], usable);
    if (k == KIND_LARGE && usable != large_need(t, large_offset(p)) - large_offset(p))
        fail("%s(%zu) = %p: a large block of usable size %zu, expected %zu", what, n, p, usable,
             large_need(t, large_offset(p)) - large_offset(p));
}

static void expect_fresh(const void *p, size_t n, size_t usable, const char *what)
{
    expect_block(p, n, usable, kind_of_size(n), n, what);
}

/* Realloc of b to n, by either thread: b is checked whole before, the kept prefix after, and the result
 * against the rules; then b describes the new block, written with a new seed. 0 when n is 0 (the block is
 * freed), 1 otherwise. */
static int resize(live_block *b, size_t n, const char *what)
{
    expect_whole(b, "before realloc");
    unsigned char *q = shard_realloc(b->p, n);
    if (n == 0) {
        if (q != NULL)
            fail("%s(%p, 0) = %p, not NULL", what, (void *)b->p, (void *)q);
        return 0;
    }
    size_t u = shard_usable_size(q);
    /* In place the block keeps its kind (a medium block shrunk to 100 bytes in place is still medium); a
     * block that moved is of its new size's kind, and one that grew into the large range got 1/16 more. */
    enum kind k = q == b->p ? b->kind : kind_of_size(n);
    size_t t = q != b->p && k == KIND_LARGE && n > b->usable ? n + n / 16 : n;
    expect_block(q, n, u, k, t, what);
    /* shardmm.h: a small block stays in place while the new size is within its class and not below a quarter
     * of the class size (whichever thread resizes it). */
    if (b->kind == KIND_SMALL && n <= b->usable && n >= b->usable / 4 && q != b->p)
        fail("%s(%p, %zu) of a small block of %zu moved it to %p", what, (void *)b->p, n, b->usable, (void *)q);
    live_block moved = *b;
    moved.p = q;
    expect_pattern(&moved, n < b->usable ? n : b->usable, "the prefix that realloc keeps");
    b->p = q;
    b->usable = u;
    b->kind = k;
    refill(b);
    return 1;
}

/* A block p of usable bytes overlaps no live block of the table (but the one at index `except`). */
static void expect_apart(const unsigned char *p, size_t usable, unsigned except, const char *what)
{
    for (unsigned i = 0; i < live_count; i++)
        if (i != except && p < live[i].p + live[i].usable && live[i].p < p + usable)
            fail("%s: the new block %p (usable %zu) overlaps the live %s block %p (usable %zu)", what, (void *)p,
                 usable, kind_names[live[i].kind], (void *)live[i].p, live[i].usable);
}

static int room_for(size_t n)
{
    return live_count + pending_count < LIVE_MAX && live_bytes + pending_bytes + n <= LIVE_BYTES_MAX;
}

/* Enter a block into the table (the caller writes its contents). */
static live_block *table_add(unsigned char *p, size_t usable, enum kind k)
{
    if (live_count == LIVE_MAX)
        fail("the table of live blocks is full (the limits were not kept)");
    live_block *b = &live[live_count++];
    b->p = p;
    b->usable = usable;
    b->kind = k;
    live_bytes += usable;
    return b;
}

static live_block table_remove(unsigned i)
{
    live_block b = live[i];
    live_bytes -= b.usable;
    live[i] = live[--live_count];
    return b;
}

/* ---- the error hook --------------------------------------------------------------------------------- */

static struct {
    int expected; /* an invalid operation is under way (only the fuzzer's thread makes them) */
    int calls, error;
    void *ptr;
} hook;

static void recording_hook(void *arg, int error, void *ptr)
{
    (void)arg;
    if (!__atomic_load_n(&hook.expected, __ATOMIC_ACQUIRE))
        fail("the error hook was called (error %d, pointer %p) where nothing invalid was done", error, ptr);
    hook.calls++;
    hook.error = error;
    hook.ptr = ptr;
}

/* ---- the helper thread ------------------------------------------------------------------------------ */

enum task_kind {
    TASK_FREE,        /* check and free the blocks */
    TASK_TOUCH,       /* check the blocks and write them with new seeds; they come back */
    TASK_REALLOC,     /* resize() the block to `size`; it comes back (unless `size` is 0: then it is freed) */
    TASK_MALLOC,      /* allocate `count` blocks of `size` and fill them; they come back */
    TASK_THREAD_DONE, /* shard_thread_done */
    TASK_COLLECT,     /* shard_collect */
    TASK_SETTLE,      /* take in what others freed into the heap (a small and a medium allocation), collect */
    TASK_EXIT         /* the thread ends */
};

typedef struct task {
    enum task_kind kind;
    unsigned count;
    size_t size;
    live_block blocks[BATCH_MAX]; /* in: the blocks handed over; out: the blocks handed back */
} task;

enum { HELPER_IDLE, HELPER_POSTED, HELPER_DONE };

static struct {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int state;          /* HELPER_*, under the lock */
    int in_flight;      /* a task was posted and not waited for (the fuzzer's thread's own) */
    int running;        /* the thread exists */
    pthread_t thread;
    unsigned posted_at; /* the operation that posted the task in flight */
    task t;
} helper = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, HELPER_IDLE, 0, 0, 0, 0, {0}};

static pthread_key_t helper_exit_key;
static int always_sync;

static void check_own_heap(const char *who)
{
    int problems = shard_check();
    if (problems != 0)
        fail("shard_check() = %d in %s", problems, who);
}

/* What the helper's thread allocates in its exit destructor: in round 1 while it still has its heap, in round
 * 2 (the key set again) after the allocator's own destructor gave the heap back, so from a lent heap. */
static void helper_exit_destructor(void *value)
{
    static const size_t sizes[] = {40, 3000, 70000, 2 * MB};
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        live_block b = {shard_malloc(sizes[i]), 0, new_seed(), kind_of_size(sizes[i])};
        b.usable = shard_usable_size(b.p);
        expect_fresh(b.p, sizes[i], b.usable, "shard_malloc in a thread's exit destructor");
        fill_block(&b);
        expect_whole(&b, "allocated in a thread's exit destructor");
        shard_free(b.p);
    }
    if ((uintptr_t)value == 1)
        pthread_setspecific(helper_exit_key, (void *)2); /* once more, after the allocator's destructor */
}

static void helper_run(task *t)
{
    switch (t->kind) {
    case TASK_FREE:
        for (unsigned i = 0; i < t->count; i++) {
            expect_whole(&t->blocks[i], "handed to the helper to free");
            shard_free(t->blocks[i].p);
        }
        t->count = 0;
        break;
    case TASK_TOUCH:
        for (unsigned i = 0; i < t->count; i++) {
            live_block *b = &t->blocks[i];
            expect_whole(b, "handed to the helper to rewrite");
            if (shard_usable_size(b->p) != b->usable)
                fail("helper: the usable size of %p is %zu, was %zu", (void *)b->p, shard_usable_size(b->p),
                     b->usable);
            refill(b);
        }
        break;
    case TASK_REALLOC:
        t->count = resize(&t->blocks[0], t->size, "shard_realloc by the helper");
        break;
    case TASK_MALLOC:
        for (unsigned i = 0; i < t->count; i++) {
            live_block *b = &t->blocks[i];
            b->p = shard_malloc(t->size);
            b->usable = shard_usable_size(b->p);
            b->kind = kind_of_size(t->size);
            expect_fresh(b->p, t->size, b->usable, "shard_malloc by the helper");
            refill(b);
        }
        break;
    case TASK_THREAD_DONE:
        shard_thread_done();
        break;
    case TASK_COLLECT:
        shard_collect();
        break;
    case TASK_SETTLE:
        shard_free(shard_malloc(100));
        shard_free(shard_malloc(SMALL_MAX + 1));
        shard_collect();
        break;
    case TASK_EXIT:
        break;
    }
    check_own_heap("the helper");
}

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_setspecific(helper_exit_key, (void *)1);
    for (;;) {
        pthread_mutex_lock(&helper.lock);
        while (helper.state != HELPER_POSTED)
            pthread_cond_wait(&helper.changed, &helper.lock);
        pthread_mutex_unlock(&helper.lock);
        helper_run(&helper.t);
        int exiting = helper.t.kind == TASK_EXIT;
        pthread_mutex_lock(&helper.lock);
        helper.state = HELPER_DONE;
        pthread_cond_broadcast(&helper.changed);
        pthread_mutex_unlock(&helper.lock);
        if (exiting)
            return NULL; /* the destructors run now: the exit destructor above, then the allocator's */
    }
}

static int helper_in_flight(void) { return helper.in_flight; }

/* Wait for the task in flight, if any, and take back the blocks it returns. After an exit, the thread is
 * joined: its destructors, which allocate, have run when this returns. */
static void helper_wait(void)
{
    if (!helper_in_flight())
        return;
    pthread_mutex_lock(&helper.lock);
    while (helper.state != HELPER_DONE)
        pthread_cond_wait(&helper.changed, &helper.lock);
    helper.state = HELPER_IDLE;
    pthread_mutex_unlock(&helper.lock);
    helper.in_flight = 0;
    task *t = &helper.t;
    if (t->kind == TASK_EXIT) {
        pthread_join(helper.thread, NULL);
        helper.running = 0;
    }
    pending_count = 0;
    pending_bytes = 0;
    if (t->kind == TASK_TOUCH || t->kind == TASK_REALLOC || t->kind == TASK_MALLOC) {
        for (unsigned i = 0; i < t->count; i++) {
            live_block *b = &t->blocks[i];
            expect_whole(b, "handed back by the helper");
            expect_apart(b->p, b->usable, LIVE_MAX, "a block from the helper");
            *table_add(b->p, b->usable, b->kind) = *b;
        }
    }
}

/* The task to fill in before helper_post; waits for the one in flight first. */
static task *helper_task(enum task_kind kind)
{
    helper_wait();
    helper.t.kind = kind;
    helper.t.count = 0;
    helper.t.size = 0;
    return &helper.t;
}

/* Hand the task to the helper (started if it is not running); wait for it unless async. Blocks that come
 * back count as pending_count blocks of pending_bytes meanwhile. */
static void helper_post(int async, unsigned count, size_t bytes)
{
    if (!helper.running) {
        if (pthread_create(&helper.thread, NULL, helper_main, NULL) != 0)
            fail("cannot start the helper thread");
        helper.running = 1;
    }
    pending_count = count;
    pending_bytes = bytes;
    helper.posted_at = current_index;
    helper.in_flight = 1;
    pthread_mutex_lock(&helper.lock);
    helper.state = HELPER_POSTED;
    pthread_cond_broadcast(&helper.changed);
    pthread_mutex_unlock(&helper.lock);
    if (!async || always_sync)
        helper_wait();
}

/* ---- checks after an operation ---------------------------------------------------------------------- */

static shard_stats stats_now(void)
{
    shard_stats s;
    memset(&s, 0, sizeof s);
    shard_get_stats(&s);
    return s;
}

static void count_kinds(size_t counts[3])
{
    counts[0] = counts[1] = counts[2] = 0;
    for (unsigned i = 0; i < live_count; i++)
        counts[live[i].kind]++;
}

static void check_after_op(void)
{
    int problems = shard_check();
    if (problems != 0)
        fail("shard_check() = %d", problems);
    for (unsigned i = 0; i < live_count; i++) {
        size_t u = shard_usable_size(live[i].p);
        if (u != live[i].usable)
            fail("the usable size of the live %s block %p is %zu, was %zu", kind_names[live[i].kind],
                 (void *)live[i].p, u, live[i].usable);
        expect_edges(&live[i], "after the operation");
    }
    if (helper_in_flight())
        return;
    size_t k[3];
    count_kinds(k);
    shard_stats s = stats_now();
    if (s.live_small != k[KIND_SMALL] || s.live_large != k[KIND_LARGE] || s.live_medium < k[KIND_MEDIUM])
        fail("shard_get_stats counts %zu small, %zu medium, %zu large live blocks; the table holds %zu, %zu, %zu",
             s.live_small, s.live_medium, s.live_large, k[KIND_SMALL], k[KIND_MEDIUM], k[KIND_LARGE]);
}

/* ---- operations ------------------------------------------------------------------------------------- */

/* A block of the table, chosen by one byte scaled to the table (every block is reachable within 4). */
static unsigned take_index(input *in) { return (unsigned)((take8(in) * (size_t)live_count) >> 8); }

static void op_malloc(input *in)
{
    size_t n = take_size(in);
    if (!room_for(n))
        return;
    unsigned char *p = shard_malloc(n);
    size_t u = shard_usable_size(p);
    expect_fresh(p, n, u, "shard_malloc");
    expect_apart(p, u, LIVE_MAX, "shard_malloc");
    refill(table_add(p, u, kind_of_size(n)));
}

static void op_calloc(input *in)
{
    size_t count = 1 + take8(in) % 16, n = take_size(in) / count, total = count * n;
    if (!room_for(total))
        return;
    unsigned char *p = shard_calloc(count, n);
    size_t u = shard_usable_size(p);
    expect_fresh(p, total, u, "shard_calloc");
    expect_apart(p, u, LIVE_MAX, "shard_calloc");
    /* Zero over the request; a large block over its whole usable size (shardmm.h, test_large.c). */
    size_t zero = kind_of_size(total) == KIND_LARGE ? u : total;
    size_t bad = bytes_not_equal(p, zero, 0);
    if (bad != zero)
        fail("shard_calloc(%zu, %zu) = %p: byte %zu of %zu is 0x%02x", count, n, (void *)p, bad, zero, p[bad]);
    refill(table_add(p, u, kind_of_size(total)));
}

/* Realloc of live[i] to n by this thread; the table follows. */
static void realloc_block(unsigned i, size_t n)
{
    live_block b = live[i];
    if (!resize(&b, n, "shard_realloc")) {
        table_remove(i);
        return;
    }
    expect_apart(b.p, b.usable, i, "shard_realloc");
    live_bytes += b.usable - live[i].usable;
    live[i] = b;
}

static void op_realloc(input *in)
{
    if (live_count == 0)
        return;
    unsigned i = take_index(in);
    size_t n = take_size(in);
    if (live_bytes - live[i].usable + n > LIVE_BYTES_MAX)
        return;
    realloc_block(i, n);
}

static void op_free(input *in)
{
    if (live_count == 0) {
        shard_free(NULL); /* nothing, and no hook */
        if (shard_usable_size(NULL) != 0)
            fail("shard_usable_size(NULL) = %zu, not 0", shard_usable_size(NULL));
        return;
    }
    live_block b = table_remove(take_index(in));
    expect_whole(&b, "before free");
    shard_free(b.p);
}

static void op_realloc_zero(input *in)
{
    if (live_count == 0)
        return;
    realloc_block(take_index(in), 0);
}

static void op_realloc_null(input *in)
{
    size_t n = take_size(in);
    if (!room_for(n))
        return;
    unsigned char *p = shard_realloc(NULL, n);
    size_t u = shard_usable_size(p);
    expect_fresh(p, n, u, "shard_realloc(NULL, n)");
    expect_apart(p, u, LIVE_MAX, "shard_realloc(NULL, n)");
    refill(table_add(p, u, kind_of_size(n)));
}

static void op_burst_malloc(input *in)
{
    unsigned count = 1 + take8(in);
    size_t n = take_size(in);
    for (unsigned i = 0; i < count && room_for(n); i++) {
        unsigned char *p = shard_malloc(n);
        size_t u = shard_usable_size(p);
        expect_fresh(p, n, u, "shard_malloc (burst)");
        expect_apart(p, u, LIVE_MAX, "shard_malloc (burst)");
        refill(table_add(p, u, kind_of_size(n)));
    }
}

/* Pick up to BATCH_MAX blocks (count, first index, stride from the input) and take them out of the table,
 * into out; returns how many. */
static unsigned take_batch(input *in, live_block *out)
{
    unsigned count = 1 + take8(in), first = take16(in), stride = 1 + take8(in) % 8, n = 0;
    if (live_count == 0)
        return 0;
    first %= live_count;
    unsigned picked[BATCH_MAX];
    for (unsigned j = first; j < live_count && n < count && n < BATCH_MAX; j += stride)
        picked[n++] = j;
    /* Highest index first: table_remove moves the last block into the hole, and that one is never picked. */
    for (unsigned k = n; k-- > 0;)
        out[k] = table_remove(picked[k]);
    return n;
}

static void op_burst_free(input *in)
{
    live_block batch[BATCH_MAX];
    unsigned n = take_batch(in, batch);
    for (unsigned i = 0; i < n; i++) {
        expect_whole(&batch[i], "before free (burst)");
        shard_free(batch[i].p);
    }
}

static void op_touch(input *in)
{
    if (live_count == 0)
        return;
    live_block *b = &live[take_index(in)];
    expect_whole(b, "before it is rewritten");
    refill(b);
}

/* A pointer that is not a live block, made from a live block b (variant, offset from the input). Never one
 * that could be a block (of ours, a 16-byte aligned one inside a small block's page) or a freed small item:
 * those the allocator cannot tell from live ones (api.c). */
static unsigned char *not_a_block(const live_block *b, unsigned variant, size_t offset)
{
    static unsigned char not_ours[256] __attribute__((aligned(16)));
    uintptr_t base = (uintptr_t)b->p & ~(uintptr_t)(4 * MB - 1); /* its segment, arena or large granule */
    switch (variant % 4) {
    case 0: /* inside the block, off the 16-byte grid */
        return b->p + (offset % b->usable | 1);
    case 1: /* inside the block on the grid: medium and large blocks only (a small one's may be an item) */
        if (b->kind == KIND_SMALL || b->usable < 32)
            return b->p + (offset % b->usable | 1);
        return b->p + 16 * (1 + offset % (b->usable / 16 - 1));
    case 2: /* the segment's descriptors, the arena's header, the large block's header page (not the block) */
        offset = 16 * (offset % 256); /* below 4 KB + 16, where an arena's first block starts */
        return (unsigned char *)base + (base + offset == (uintptr_t)b->p ? offset + 16 : offset);
    default: /* memory that is not the allocator's */
        return not_ours + 16 * (offset % 16);
    }
}

/* The hook is called once with this error and pointer, the block is as it was, and nothing else changed. */
static void expect_reported(int error, const void *ptr, const live_block *b, const shard_stats *before,
                            const char *what)
{
    __atomic_store_n(&hook.expected, 0, __ATOMIC_RELEASE);
    if (hook.calls != 1 || hook.error != error || hook.ptr != ptr)
        fail("%s(%p): the hook was called %d times, last with error %d and %p; expected once, error %d", what, ptr,
             hook.calls, hook.error, hook.ptr, error);
    expect_whole(b, "after an invalid pointer near it");
    if (shard_usable_size(b->p) != b->usable)
        fail("%s(%p): the usable size of the block %p changed to %zu from %zu", what, ptr, (void *)b->p,
             shard_usable_size(b->p), b->usable);
    shard_stats after = stats_now();
    /* A medium free takes in the frees other threads made into the heap first (live_medium may fall), and a
     * cached large block may expire meanwhile; nothing may rise. */
    if (after.live_small != before->live_small || after.live_large != before->live_large ||
        after.live_medium > before->live_medium || after.large_cached > before->large_cached)
        fail("%s(%p) changed the statistics: live small %zu -> %zu, medium %zu -> %zu, large %zu -> %zu, cached "
             "large %zu -> %zu", what, ptr, before->live_small, after.live_small, before->live_medium,
             after.live_medium, before->live_large, after.live_large, before->large_cached, after.large_cached);
}

static void expect_hook(void)
{
    memset(&hook, 0, sizeof hook);
    __atomic_store_n(&hook.expected, 1, __ATOMIC_RELEASE);
}

static void op_invalid(input *in)
{
    unsigned how = take8(in), variant = take8(in);
    size_t offset = take24(in);
    helper_wait(); /* the statistics must hold still */
    if (live_count == 0)
        return;
    unsigned i = take_index(in);
    live_block *b = &live[i];
    shard_stats before = stats_now();
    unsigned char *bad = not_a_block(b, variant, offset);
    switch (how % 4) {
    case 0:
        expect_hook();
        shard_free(bad);
        expect_reported(SHARD_ERROR_INVALID_FREE, bad, b, &before, "shard_free");
        break;
    case 1: {
        expect_hook();
        void *q = shard_realloc(bad, take_size(in));
        if (q != NULL)
            fail("shard_realloc(%p) of a pointer that is not a block = %p, not NULL", (void *)bad, q);
        expect_reported(SHARD_ERROR_INVALID_REALLOC, bad, b, &before, "shard_realloc");
        break;
    }
    case 2: {
        expect_hook();
        size_t u = shard_usable_size(bad);
        if (u != 0)
            fail("shard_usable_size(%p) of a pointer that is not a block = %zu, not 0", (void *)bad, u);
        expect_reported(SHARD_ERROR_INVALID_SIZE_QUERY, bad, b, &before, "shard_usable_size");
        break;
    }
    default: { /* a double free: medium and large blocks are marked and caught; a small item has no room */
        live_block gone = table_remove(i);
        expect_whole(&gone, "before free (then freed again)");
        shard_free(gone.p);
        if (gone.kind == KIND_SMALL)
            break;
        before = stats_now();
        expect_hook();
        shard_free(gone.p);
        __atomic_store_n(&hook.expected, 0, __ATOMIC_RELEASE);
        shard_stats after = stats_now();
        if (hook.calls != 1 || hook.error != SHARD_ERROR_INVALID_FREE || hook.ptr != gone.p)
            fail("second shard_free(%p) of a %s block: the hook was called %d times, last with error %d and %p",
                 (void *)gone.p, kind_names[gone.kind], hook.calls, hook.error, hook.ptr);
        if (after.live_small != before.live_small || after.live_large != before.live_large ||
            after.live_medium > before.live_medium || after.large_cached > before.large_cached)
            fail("second shard_free(%p) changed the statistics", (void *)gone.p);
        break;
    }
    }
}

/* Requests no allocator can serve give NULL and leave the block given to realloc as it was. */
static void op_impossible(input *in)
{
    static const size_t impossible[] = {SIZE_MAX, SIZE_MAX - 4095, (size_t)1 << 62, (size_t)1 << 47,
                                        ((size_t)1 << 46) + 1};
    size_t n = impossible[take8(in) % (sizeof impossible / sizeof impossible[0])];
    unsigned how = take8(in) % 3;
    helper_wait();
    shard_stats before = stats_now();
    if (how == 0) {
        void *p = shard_malloc(n);
        if (p != NULL)
            fail("shard_malloc(%zu) = %p, not NULL", n, p);
    } else if (how == 1) {
        size_t count = 2 + take8(in);
        void *p = shard_calloc(count, n / count + 1); /* overflows or is impossible */
        if (p != NULL)
            fail("shard_calloc(%zu, %zu) = %p, not NULL", count, n / count + 1, p);
    } else if (live_count > 0) {
        live_block *b = &live[take_index(in)];
        void *q = shard_realloc(b->p, n);
        if (q != NULL)
            fail("shard_realloc(%p, %zu) = %p, not NULL", (void *)b->p, n, q);
        if (shard_usable_size(b->p) != b->usable)
            fail("shard_realloc(%p, %zu) failed but changed the usable size to %zu from %zu", (void *)b->p, n,
                 shard_usable_size(b->p), b->usable);
        expect_whole(b, "after a failed realloc");
    }
    shard_stats after = stats_now();
    if (after.live_small != before.live_small || after.live_large != before.live_large ||
        after.live_medium > before.live_medium || after.reserved != before.reserved)
        fail("a request of %zu bytes that failed changed the statistics: live small %zu -> %zu, large %zu -> %zu, "
             "reserved %zu -> %zu", n, before.live_small, after.live_small, before.live_large, after.live_large,
             before.reserved, after.reserved);
}

static void op_foreign_free(input *in, int async)
{
    task *t = helper_task(TASK_FREE);
    t->count = take_batch(in, t->blocks);
    if (t->count)
        helper_post(async, 0, 0);
}

static void op_foreign_touch(input *in, int async)
{
    task *t = helper_task(TASK_TOUCH);
    unsigned count = 1 + take8(in) % 8;
    size_t bytes = 0;
    for (unsigned i = 0; i < count && live_count > 0; i++) {
        t->blocks[t->count] = table_remove(take_index(in));
        bytes += t->blocks[t->count++].usable;
    }
    if (t->count)
        helper_post(async, t->count, bytes);
}

static void op_foreign_realloc(input *in, int async)
{
    task *t = helper_task(TASK_REALLOC);
    if (live_count == 0)
        return;
    unsigned i = take_index(in);
    size_t n = take_size(in), bytes = (n > live[i].usable ? n : live[i].usable) + LARGE_PAGE;
    if (live_bytes - live[i].usable + bytes > LIVE_BYTES_MAX)
        return;
    t->size = n;
    t->blocks[0] = table_remove(i);
    t->count = 1;
    helper_post(async, 1, bytes);
}

static void op_foreign_malloc(input *in, int async)
{
    task *t = helper_task(TASK_MALLOC);
    unsigned count = 1 + take8(in) % 64;
    size_t n = take_size(in), each = n + LARGE_PAGE; /* the usable size is at most this */
    if (n > MEDIUM_MAX && count > 4)
        count = 4;
    if (count > LIVE_MAX - live_count)
        count = LIVE_MAX - live_count;
    if (count > (LIVE_BYTES_MAX - live_bytes) / each)
        count = (unsigned)((LIVE_BYTES_MAX - live_bytes) / each);
    t->size = n;
    t->count = count;
    if (count)
        helper_post(async, count, count * each);
}

static void op_helper(enum task_kind kind, int async)
{
    helper_task(kind);
    helper_post(async, 0, 0);
}

/* The operations and their operands (block: take_index; size: take_size; batch: count - 1, first block
 * (16 bits, modulo the table), stride - 1 (modulo 8)). */
enum op {
    OP_MALLOC,             /* size */
    OP_CALLOC,             /* count - 1 (modulo 16), size (the total; divided by the count) */
    OP_REALLOC,            /* block, size */
    OP_FREE,               /* block */
    OP_REALLOC_ZERO,       /* block */
    OP_REALLOC_NULL,       /* size */
    OP_BURST_MALLOC,       /* count - 1, size */
    OP_BURST_FREE,         /* batch */
    OP_TOUCH,              /* block: checked and written with a new seed */
    OP_INVALID,            /* how (free, realloc, usable_size, double free), variant (not_a_block), offset
                              (24 bits), block, [size for realloc] */
    OP_IMPOSSIBLE,         /* which size, how (malloc, calloc, realloc), [count - 2 for calloc, block for realloc] */
    OP_FOREIGN_FREE,       /* batch */
    OP_FOREIGN_TOUCH,      /* count - 1 (modulo 8), then a block for each */
    OP_FOREIGN_REALLOC,    /* block, size */
    OP_FOREIGN_MALLOC,     /* count - 1 (modulo 64), size */
    OP_HELPER_THREAD_DONE, /* - */
    OP_HELPER_COLLECT,     /* - */
    OP_HELPER_EXIT,        /* - */
    OP_THREAD_DONE,        /* -: the fuzzer's thread */
    OP_COLLECT,            /* -: the fuzzer's thread */
    OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "malloc", "calloc", "realloc", "free", "realloc to 0", "realloc of NULL", "burst of mallocs", "burst of frees",
    "rewrite", "invalid pointer", "impossible size", "frees by the helper", "rewrites by the helper",
    "realloc by the helper", "mallocs by the helper", "helper's shard_thread_done", "helper's shard_collect",
    "helper's exit", "shard_thread_done", "shard_collect",
};

static void run_op(input *in)
{
    unsigned code = take8(in);
    enum op op = (enum op)((code & 0x7f) % OP_COUNT);
    int async = (code & 0x80) != 0 && op >= OP_FOREIGN_FREE && op <= OP_HELPER_EXIT;
    current_op = op_names[op];
    if (trace)
        fprintf(stderr, "fuzz-ops: %u %s%s (%u live, %zu bytes)\n", current_index, current_op,
                async ? " async" : "", live_count, live_bytes);
    switch (op) {
    case OP_MALLOC: op_malloc(in); break;
    case OP_CALLOC: op_calloc(in); break;
    case OP_REALLOC: op_realloc(in); break;
    case OP_FREE: op_free(in); break;
    case OP_REALLOC_ZERO: op_realloc_zero(in); break;
    case OP_REALLOC_NULL: op_realloc_null(in); break;
    case OP_BURST_MALLOC: op_burst_malloc(in); break;
    case OP_BURST_FREE: op_burst_free(in); break;
    case OP_TOUCH: op_touch(in); break;
    case OP_INVALID: op_invalid(in); break;
    case OP_IMPOSSIBLE: op_impossible(in); break;
    case OP_FOREIGN_FREE: op_foreign_free(in, async); break;
    case OP_FOREIGN_TOUCH: op_foreign_touch(in, async); break;
    case OP_FOREIGN_REALLOC: op_foreign_realloc(in, async); break;
    case OP_FOREIGN_MALLOC: op_foreign_malloc(in, async); break;
    case OP_HELPER_THREAD_DONE: op_helper(TASK_THREAD_DONE, async); break;
    case OP_HELPER_COLLECT: op_helper(TASK_COLLECT, async); break;
    case OP_HELPER_EXIT: op_helper(TASK_EXIT, async); break;
    case OP_THREAD_DONE: shard_thread_done(); break;
    case OP_COLLECT: shard_collect(); break;
    case OP_COUNT: break;
    }
    /* An async task posted by an earlier operation has run alongside this one: now it must be done. */
    if (helper_in_flight() && helper.posted_at != current_index)
        helper_wait();
    check_after_op();
}

/* Free everything; both threads take in what the other freed into their heaps and collect; then nothing is
 * live and the large-block cache is empty. */
static void end_of_input(void)
{
    current_op = "end of the input";
    helper_wait();
    while (live_count > 0) {
        live_block b = table_remove(live_count - 1);
        expect_whole(&b, "at the end of the input");
        shard_free(b.p);
    }
    helper_task(TASK_SETTLE);
    helper_post(0, 0, 0);
    shard_free(shard_malloc(100));
    shard_free(shard_malloc(SMALL_MAX + 1));
    shard_collect();
    int problems = shard_check();
    if (problems != 0)
        fail("shard_check() = %d", problems);
    shard_stats s = stats_now();
    /* Two threads use the allocator: there are never more than two heaps (test_thread.c's rules), both
     * taken now, so no heap waits with frees into it not taken in. */
    if (s.heaps > 2 || s.heaps_free != 0)
        fail("%zu heaps, %zu of them waiting for a thread; two threads allocate", s.heaps, s.heaps_free);
    if (s.live_small != 0 || s.live_medium != 0 || s.live_large != 0 || s.large_cached != 0 ||
        s.large_cached_bytes != 0)
        fail("after every block was freed: %zu small, %zu medium, %zu large live blocks, %zu cached large blocks "
             "of %zu bytes", s.live_small, s.live_medium, s.live_large, s.large_cached, s.large_cached_bytes);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *e = getenv("SHARD_FUZZ_SYNC");
    always_sync = e != NULL && *e != 0 && *e != '0';
    e = getenv("SHARD_FUZZ_TRACE");
    trace = e != NULL && *e != 0 && *e != '0';
    /* Before the allocator's key (its first allocation makes it), so that this destructor runs first. */
    if (pthread_key_create(&helper_exit_key, helper_exit_destructor) != 0)
        fail("pthread_key_create failed");
    shard_set_error_hook(recording_hook, NULL);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, data + size};
    for (current_index = 0; in.at < in.end; current_index++)
        run_op(&in);
    end_of_input();
    return 0;
}
