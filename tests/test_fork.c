/* test_fork.c - fork() in a multithreaded program whose malloc is shardmm (linked with the drop-in
 * build/libshardmm.so, so malloc, free, realloc and the rest are shardmm's).
 *
 * The parent runs, while it forks again and again:
 * - workers, each allocating, checking, resizing and freeing blocks of every kind (small, medium,
 *   large; malloc, calloc, realloc, aligned_alloc) in a table of its own, and handing blocks to the
 *   next worker through a mailbox;
 * - large-block threads that allocate, grow and free blocks of 1-8 MB in a tight loop, so that the
 *   large-block cache's lock is often held, and now and then empty the cache (shard_collect);
 * - a checker calling shard_check() over and over: it holds the stack of free heaps taken and the
 *   large-block cache locked while it walks them;
 * - a thread-churn thread starting short-lived threads that allocate, leave blocks in a table and exit
 *   (their heaps go onto the stack of free heaps, and the next ones take them back), and freeing what
 *   the previous ones left.
 * A fork can thus come while another thread holds any of the allocator's locks. Each child (a time
 * limit of its own: alarm, so a lock left taken is a failure, not a hang) checks the pattern of every
 * block the parent's threads had published - the tables, the mailboxes, the blocks of exited threads -
 * frees half of them and resizes some, allocates and frees blocks of every kind in its own thread and
 * in new threads that hand blocks to one another, checks shard_check() == 0, checks the parent's blocks
 * it kept again, and exits with 0 only when all of that held. Some children fork again (a grandchild)
 * while threads of their own allocate. The parent checks every child's exit status. The forks come
 * from the main thread (40) and from another thread (20); then 300 quick forks whose children only
 * take each lock once (a large block, shard_check, a thread that comes and goes): without the fork
 * hooks (pthread_atfork) some of those children hang, in the stack of free heaps or the cache's lock.
 * While a child runs, the parent's threads wait (the fork itself still comes in the middle of their
 * work), so the children get the processors.
 *
 * A block is published in a slot when its contents are complete (its pointer stored last, with
 * release) and unpublished before it is freed or resized (its pointer cleared first), so whatever
 * moment the fork copies, a published block holds its pattern.
 *
 * Build: build/test-fork (build.ninja). Run: build/test-fork [test names]
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include <errno.h>
#include <malloc.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define SMALL_MAX (16 * KB)
#define MEDIUM_MAX MB

#define WORKERS 3
#define SLOTS 128         /* blocks per worker table */
#define ORPHAN_GROUPS 32  /* the short-lived threads' table: a group of slots per thread */
#define ORPHAN_GROUP_SLOTS 8
#define CHURN_THREADS 4   /* short-lived threads started at once */
#define CHILD_SECONDS 10  /* a child that has not exited by then has hung (they take well under 1 s) */
#define MAX_FAILED_CHILDREN 3 /* a test forks no more after these */
#define PARENT_SECONDS 600

/* ---- randomness and sizes ---- */

static uint64_t next_random(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return harness_mix64(*state);
}

/* Mostly small blocks, some medium, a few large ones (every block is filled: few big ones). */
static size_t pick_size(uint64_t *rng)
{
    uint64_t r = next_random(rng) % 200;
    if (r < 120)
        return next_random(rng) % 1024;
    if (r < 175)
        return 1 + next_random(rng) % SMALL_MAX;
    if (r < 195)
        return SMALL_MAX + 1 + next_random(rng) % (128 * KB);
    if (r < 198)
        return SMALL_MAX + 1 + next_random(rng) % (MEDIUM_MAX - SMALL_MAX);
    return MEDIUM_MAX + 1 + next_random(rng) % (2 * MB);
}

/* The child's own blocks: fewer medium and large ones (each page a child touches is a fresh one). */
static size_t pick_child_size(uint64_t *rng)
{
    uint64_t r = next_random(rng) % 100;
    if (r < 70)
        return next_random(rng) % 1024;
    if (r < 95)
        return 1 + next_random(rng) % SMALL_MAX;
    if (r < 99)
        return SMALL_MAX + 1 + next_random(rng) % (256 * KB);
    return MEDIUM_MAX + 1 + next_random(rng) % MB;
}

/* ---- published blocks ---- */

typedef struct {
    void *ptr; /* NULL: empty; stored last (release) when the block is complete, cleared first */
    size_t size;
    uint64_t seed;
} slot;

static slot worker_slots[WORKERS][SLOTS];
static slot orphan_slots[ORPHAN_GROUPS * ORPHAN_GROUP_SLOTS];
/* A mailbox holds a block whose first 16 bytes hold its size and seed, the pattern after them. */
static void *mailbox[WORKERS];

static void publish(slot *s, void *p, size_t size, uint64_t seed)
{
    s->size = size;
    s->seed = seed;
    __atomic_store_n(&s->ptr, p, __ATOMIC_RELEASE);
}

static void *unpublish(slot *s) { return __atomic_exchange_n(&s->ptr, NULL, __ATOMIC_ACQ_REL); }

/* A block with its size and seed in its first 16 bytes (sizes of at least 16). */
static void *make_letter(size_t size, uint64_t seed)
{
    unsigned char *p = malloc(size);
    if (p == NULL)
        return NULL;
    memcpy(p, &size, 8);
    memcpy(p + 8, &seed, 8);
    fill_range(p, 16, size, seed);
    return p;
}

static int letter_ok(const unsigned char *p)
{
    size_t size;
    uint64_t seed;
    memcpy(&size, p, 8);
    memcpy(&seed, p + 8, 8);
    if (size < 16 || size > 8 * MB || malloc_usable_size((void *)p) < size)
        return 0;
    for (size_t i = 16; i < size; i++)
        if (p[i] != pattern_byte(seed, i))
            return 0;
    return 1;
}

/* ---- the parent's threads ---- */

static int stop_threads;
static unsigned parent_problems; /* failures seen by the parent's threads (reported by the test) */

static void parent_problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void parent_problem(const char *fmt, ...)
{
    if (__atomic_add_fetch(&parent_problems, 1, __ATOMIC_RELAXED) <= 10) {
        va_list ap;
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
}

/* While a child runs the parent's threads wait (from their next operation on), so that the child gets
 * the processors: the fork itself still comes in the middle of their work. */
static int paused;

static int stopping(void)
{
    while (__atomic_load_n(&paused, __ATOMIC_ACQUIRE) && !__atomic_load_n(&stop_threads, __ATOMIC_RELAXED))
        sleep_ms(1);
    return __atomic_load_n(&stop_threads, __ATOMIC_RELAXED);
}

/* A new block of `size` by one of the allocation functions, with its pattern. */
static void *allocate_filled(uint64_t *rng, size_t size, uint64_t seed)
{
    void *p;
    switch (next_random(rng) % 8) {
    case 0:
        p = calloc(1, size);
        if (p != NULL && bytes_not_equal(p, size, 0) != size)
            parent_problem("calloc(1, %zu) gave a block that is not zeroed\n", size);
        break;
    case 1:
        p = aligned_alloc(64, size);
        if (((uintptr_t)p & 63) != 0)
            parent_problem("aligned_alloc(64, %zu) gave %p\n", size, p);
        break;
    default:
        p = malloc(size);
    }
    if (p != NULL)
        fill_range(p, 0, size, seed);
    return p;
}

static void *worker_thread(void *arg)
{
    unsigned w = (unsigned)(uintptr_t)arg;
    uint64_t rng = 1000 + w, serial = 0;
    slot *table = worker_slots[w];
    while (!stopping()) {
        slot *s = &table[next_random(&rng) % SLOTS];
        uint64_t action = next_random(&rng) % 16;
        if (action == 0) { /* a letter to the next worker, if its mailbox is empty */
            void *letter = make_letter(16 + next_random(&rng) % (64 * KB), (w << 24) + ++serial);
            void *none = NULL;
            if (letter != NULL &&
                !__atomic_compare_exchange_n(&mailbox[(w + 1) % WORKERS], &none, letter, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
                free(letter);
            continue;
        }
        if (action == 1) { /* take and free a letter from the previous worker */
            unsigned char *letter = __atomic_exchange_n(&mailbox[w], NULL, __ATOMIC_ACQUIRE);
            if (letter != NULL && !letter_ok(letter))
                parent_problem("worker %u: a letter lost its contents\n", w);
            free(letter);
            continue;
        }
        if (s->ptr == NULL) {
            size_t size = pick_size(&rng);
            uint64_t seed = ((uint64_t)w << 40) + ++serial;
            void *p = allocate_filled(&rng, size, seed);
            if (p == NULL)
                parent_problem("worker %u: no block of %zu bytes\n", w, size);
            else
                publish(s, p, size, seed);
            continue;
        }
        size_t size = s->size;
        uint64_t seed = s->seed;
        void *p = unpublish(s);
        if (!holds_pattern(p, size, seed))
            parent_problem("worker %u: a block of %zu bytes lost its pattern\n", w, size);
        if (action < 6) { /* resize: the common prefix kept, the rest filled anew */
            size_t to = pick_size(&rng);
            unsigned char *q = realloc(p, to);
            if (q == NULL && to != 0) {
                parent_problem("worker %u: realloc to %zu failed\n", w, to);
                free(p);
                continue;
            }
            if (q == NULL)
                continue; /* realloc(p, 0) freed it */
            if (!holds_pattern(q, size < to ? size : to, seed))
                parent_problem("worker %u: realloc from %zu to %zu lost the contents\n", w, size, to);
            if (to > size)
                fill_range(q, size, to, seed);
            publish(s, q, to, seed);
        } else {
            free(p);
        }
    }
    return NULL;
}

/* Large blocks in a tight loop: only their first and last words written, so the time goes into the
 * allocator (the cache's lock) rather than into filling. */
static void *large_thread(void *arg)
{
    uint64_t rng = 77 + (uintptr_t)arg;
    unsigned rounds = 0;
    while (!stopping()) {
        uint64_t *blocks[6];
        size_t sizes[6];
        unsigned n = 1 + (unsigned)(next_random(&rng) % 6);
        for (unsigned i = 0; i < n; i++) {
            sizes[i] = MB + 8 + (next_random(&rng) % (7 * MB) & ~(size_t)7);
            blocks[i] = malloc(sizes[i]);
            if (blocks[i] == NULL) {
                parent_problem("large thread: no block of %zu bytes\n", sizes[i]);
                n = i;
                break;
            }
            blocks[i][0] = sizes[i];
            blocks[i][sizes[i] / 8 - 1] = ~(uint64_t)sizes[i];
        }
        if (n > 0 && next_random(&rng) % 2 == 0) { /* grow one: in place, or a move */
            size_t to = sizes[0] + next_random(&rng) % (4 * MB) / 8 * 8;
            uint64_t *q = realloc(blocks[0], to);
            if (q == NULL) {
                parent_problem("large thread: realloc to %zu failed\n", to);
            } else {
                if (q[sizes[0] / 8 - 1] != ~(uint64_t)sizes[0])
                    parent_problem("large thread: realloc lost the last word\n");
                blocks[0] = q;
                sizes[0] = to;
                q[0] = to;
                q[to / 8 - 1] = ~(uint64_t)to;
            }
        }
        for (unsigned i = 0; i < n; i++) {
            unsigned k = (i + rounds) % n; /* freed in a changing order */
            if (blocks[k][0] != sizes[k] || blocks[k][sizes[k] / 8 - 1] != ~(uint64_t)sizes[k])
                parent_problem("large thread: a block lost its first or last word\n");
        }
        for (unsigned i = 0; i < n; i++)
            free(blocks[(i + rounds) % n]);
        if (++rounds % 64 == 0)
            shard_collect();
    }
    return NULL;
}

static void *checker_thread(void *arg)
{
    (void)arg;
    while (!stopping()) {
        int problems = shard_check();
        if (problems != 0)
            parent_problem("checker: shard_check() found %d problems in the parent\n", problems);
        sched_yield();
    }
    return NULL;
}

/* A short-lived thread: allocates, leaves blocks in its group of orphan slots, frees the rest, exits
 * (some through shard_thread_done first). */
static unsigned short_lived_started;

static void *short_lived_thread(void *arg)
{
    unsigned group = (unsigned)(uintptr_t)arg;
    uint64_t rng = 5000 + __atomic_add_fetch(&short_lived_started, 1, __ATOMIC_RELAXED);
    void *temp[24];
    size_t sizes[24];
    for (unsigned i = 0; i < 24; i++) {
        sizes[i] = pick_size(&rng);
        temp[i] = allocate_filled(&rng, sizes[i], group * 100 + i);
    }
    for (unsigned i = 0; i < ORPHAN_GROUP_SLOTS; i++)
        if (temp[i] != NULL)
            publish(&orphan_slots[group * ORPHAN_GROUP_SLOTS + i], temp[i], sizes[i], group * 100 + i);
    for (unsigned i = ORPHAN_GROUP_SLOTS; i < 24; i++) {
        if (temp[i] != NULL && !holds_pattern(temp[i], sizes[i], group * 100 + i))
            parent_problem("short-lived thread: a block lost its pattern\n");
        free(temp[i]);
    }
    if (group % 3 == 0)
        shard_thread_done();
    return NULL;
}

static void free_orphan_group(unsigned group)
{
    for (unsigned i = 0; i < ORPHAN_GROUP_SLOTS; i++) {
        slot *s = &orphan_slots[group * ORPHAN_GROUP_SLOTS + i];
        size_t size = s->size;
        uint64_t seed = s->seed;
        void *p = unpublish(s);
        if (p != NULL && !holds_pattern(p, size, seed))
            parent_problem("churn: a block of an exited thread lost its pattern\n");
        free(p);
    }
}

static void *churn_thread(void *arg)
{
    (void)arg;
    unsigned next_group = 0;
    while (!stopping()) {
        thread_t t[CHURN_THREADS];
        unsigned started = 0;
        for (unsigned i = 0; i < CHURN_THREADS; i++) {
            unsigned group = next_group++ % ORPHAN_GROUPS;
            free_orphan_group(group);
            if (thread_start(&t[started], short_lived_thread, (void *)(uintptr_t)group) == 0)
                started++;
        }
        for (unsigned i = 0; i < started; i++)
            thread_join(t[i]);
    }
    return NULL;
}

#define MAX_LARGE_THREADS 3

typedef struct {
    thread_t threads[WORKERS + MAX_LARGE_THREADS + 2];
    unsigned count;
} background;

static void start_background(background *b, unsigned large_threads)
{
    __atomic_store_n(&stop_threads, 0, __ATOMIC_RELAXED);
    b->count = 0;
    for (unsigned w = 0; w < WORKERS; w++)
        b->count += thread_start(&b->threads[b->count], worker_thread, (void *)(uintptr_t)w) == 0;
    for (unsigned i = 0; i < large_threads && i < MAX_LARGE_THREADS; i++)
        b->count += thread_start(&b->threads[b->count], large_thread, (void *)(uintptr_t)i) == 0;
    b->count += thread_start(&b->threads[b->count], checker_thread, NULL) == 0;
    b->count += thread_start(&b->threads[b->count], churn_thread, NULL) == 0;
    CHECK_EQ(b->count, WORKERS + large_threads + 2);
    sleep_ms(50); /* the tables fill up a little before the first fork */
}

/* Stop the threads, then check and free every block they left; shard_check of the parent. */
static void stop_background(background *b)
{
    __atomic_store_n(&stop_threads, 1, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < b->count; i++)
        thread_join(b->threads[i]);
    for (unsigned w = 0; w < WORKERS; w++) {
        for (unsigned i = 0; i < SLOTS; i++) {
            slot *s = &worker_slots[w][i];
            size_t size = s->size;
            uint64_t seed = s->seed;
            void *p = unpublish(s);
            if (p != NULL)
                CHECK_PATTERN(p, size, seed, "a worker's block at the end");
            free(p);
        }
        unsigned char *letter = __atomic_exchange_n(&mailbox[w], NULL, __ATOMIC_ACQUIRE);
        CHECK(letter == NULL || letter_ok(letter));
        free(letter);
    }
    for (unsigned g = 0; g < ORPHAN_GROUPS; g++)
        free_orphan_group(g);
    CHECK_EQ(shard_check(), 0);
    unsigned problems = __atomic_exchange_n(&parent_problems, 0, __ATOMIC_RELAXED);
    CHECKF(problems == 0, "the parent's threads saw %u problems (messages above)", problems);
}

/* ---- the child ---- */

static unsigned child_errors;
static int child_depth; /* 0 in the parent, 1 in a child, 2 in a grandchild */

static void child_problem(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void child_problem(const char *fmt, ...)
{
    if (__atomic_add_fetch(&child_errors, 1, __ATOMIC_RELAXED) <= 10) {
        va_list ap;
        va_start(ap, fmt);
        static const char *const who[] = {"parent", "child", "grandchild"};
        fprintf(stderr, "  %s %d: ", who[child_depth], (int)getpid());
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
}

/* Check one published block of the parent; 1 when it was there. */
static int check_slot(slot *s, const char *whose)
{
    void *p = __atomic_load_n(&s->ptr, __ATOMIC_ACQUIRE);
    if (p == NULL)
        return 0;
    if (!holds_pattern(p, s->size, s->seed))
        child_problem("a block of %zu bytes of %s lost its pattern\n", s->size, whose);
    if (malloc_usable_size(p) < s->size)
        child_problem("malloc_usable_size of a block of %zu bytes of %s is %zu\n", s->size, whose,
                      malloc_usable_size(p));
    return 1;
}

/* Every block the parent published; returns how many, and in how many tables there was one. */
static unsigned check_parent_blocks(unsigned *tables_with_blocks)
{
    unsigned n = 0, tables = 0;
    for (unsigned w = 0; w < WORKERS; w++) {
        unsigned before = n;
        for (unsigned i = 0; i < SLOTS; i++)
            n += (unsigned)check_slot(&worker_slots[w][i], "a worker");
        const unsigned char *letter = __atomic_load_n(&mailbox[w], __ATOMIC_ACQUIRE);
        if (letter != NULL && !letter_ok(letter))
            child_problem("a letter in mailbox %u lost its contents\n", w);
        tables += n > before;
    }
    unsigned before = n;
    for (unsigned i = 0; i < ORPHAN_GROUPS * ORPHAN_GROUP_SLOTS; i++)
        n += (unsigned)check_slot(&orphan_slots[i], "an exited thread");
    tables += n > before;
    if (tables_with_blocks != NULL)
        *tables_with_blocks = tables;
    return n;
}

/* Free every other published block of the parent and resize every fourth: frees into heaps no thread
 * of this process owns, and resizes of their blocks. */
static void free_and_resize_parent_blocks(uint64_t *rng)
{
    slot *all[WORKERS * SLOTS + ORPHAN_GROUPS * ORPHAN_GROUP_SLOTS];
    unsigned n = 0;
    for (unsigned w = 0; w < WORKERS; w++)
        for (unsigned i = 0; i < SLOTS; i++)
            all[n++] = &worker_slots[w][i];
    for (unsigned i = 0; i < ORPHAN_GROUPS * ORPHAN_GROUP_SLOTS; i++)
        all[n++] = &orphan_slots[i];
    for (unsigned i = 0; i < n; i++) {
        slot *s = all[i];
        if (s->ptr == NULL || i % 4 == 3)
            continue;
        size_t size = s->size;
        uint64_t seed = s->seed;
        void *p = unpublish(s);
        if (i % 4 == 1) {
            size_t to = pick_child_size(rng) + 1;
            unsigned char *q = realloc(p, to);
            if (q == NULL) {
                child_problem("realloc of a parent's block from %zu to %zu failed\n", size, to);
                free(p);
                continue;
            }
            if (!holds_pattern(q, size < to ? size : to, seed))
                child_problem("realloc of a parent's block from %zu to %zu lost the contents\n", size, to);
            if (to > size)
                fill_range(q, size, to, seed);
            publish(s, q, to, seed);
        } else {
            free(p);
        }
    }
    for (unsigned w = 0; w < WORKERS; w++)
        free(__atomic_exchange_n(&mailbox[w], NULL, __ATOMIC_ACQUIRE));
}

static void free_parent_blocks(void)
{
    for (unsigned w = 0; w < WORKERS; w++)
        for (unsigned i = 0; i < SLOTS; i++)
            free(unpublish(&worker_slots[w][i]));
    for (unsigned i = 0; i < ORPHAN_GROUPS * ORPHAN_GROUP_SLOTS; i++)
        free(unpublish(&orphan_slots[i]));
}

/* Blocks of every kind in the calling thread: allocate, check, resize, free; some large ones too. */
static void own_blocks(uint64_t seed)
{
    enum { N = 200 };
    void *p[N];
    size_t size[N];
    uint64_t rng = seed;
    for (unsigned i = 0; i < N; i++) {
        size[i] = pick_child_size(&rng);
        p[i] = malloc(size[i]);
        if (p[i] == NULL) {
            child_problem("malloc(%zu) failed\n", size[i]);
            size[i] = 0;
            continue;
        }
        fill_range(p[i], 0, size[i], seed + i);
    }
    for (unsigned i = 0; i < N; i += 2) {
        if (p[i] != NULL && !holds_pattern(p[i], size[i], seed + i))
            child_problem("an own block of %zu bytes lost its pattern\n", size[i]);
        free(p[i]);
        p[i] = NULL;
    }
    for (unsigned i = 1; i < N; i += 4) {
        size_t to = pick_child_size(&rng) + 1;
        unsigned char *q = realloc(p[i], to);
        if (q == NULL) {
            child_problem("realloc to %zu failed\n", to);
            continue;
        }
        if (!holds_pattern(q, size[i] < to ? size[i] : to, seed + i))
            child_problem("realloc of an own block from %zu to %zu lost the contents\n", size[i], to);
        if (to > size[i])
            fill_range(q, size[i], to, seed + i);
        p[i] = q;
        size[i] = to;
    }
    for (unsigned i = 0; i < 4; i++) { /* large blocks: the cache's lock */
        size_t n = 2 * MB + i * MB;
        unsigned char *q = malloc(n);
        if (q == NULL) {
            child_problem("malloc(%zu) failed\n", n);
            continue;
        }
        q[0] = 1;
        q[n - 1] = 2;
        free(q);
    }
    for (unsigned i = 1; i < N; i += 2) {
        if (p[i] != NULL && !holds_pattern(p[i], size[i], seed + i))
            child_problem("an own block of %zu bytes lost its pattern at the end\n", size[i]);
        free(p[i]);
    }
}

/* The child's threads: own blocks, then letters through a ring of mailboxes to the next thread. */
#define CHILD_THREADS 3
static void *child_mailbox[CHILD_THREADS];

static void *child_thread(void *arg)
{
    unsigned t = (unsigned)(uintptr_t)arg;
    own_blocks(90000 + t * 1000);
    for (unsigned i = 0; i < 300; i++) {
        unsigned char *got = __atomic_exchange_n(&child_mailbox[t], NULL, __ATOMIC_ACQUIRE);
        if (got != NULL && !letter_ok(got))
            child_problem("a letter between the child's threads lost its contents\n");
        free(got);
        void *letter = make_letter(16 + (i * 7919u + t * 31u) % (40 * KB), (uint64_t)t << 32 | i), *none = NULL;
        if (letter != NULL && !__atomic_compare_exchange_n(&child_mailbox[(t + 1) % CHILD_THREADS], &none, letter, 0,
                                                           __ATOMIC_RELEASE, __ATOMIC_RELAXED))
            free(letter); /* the next thread has not taken the last one yet */
        if (i % 16 == 0)
            sched_yield();
    }
    int problems = shard_check();
    if (problems != 0)
        child_problem("shard_check() in a child's thread found %d problems\n", problems);
    return NULL;
}

static void *child_busy_thread(void *arg)
{
    int *stop = arg;
    uint64_t rng = 4242;
    while (!__atomic_load_n(stop, __ATOMIC_RELAXED)) {
        size_t n = pick_child_size(&rng);
        void *p = malloc(n);
        if (p == NULL)
            child_problem("malloc(%zu) failed in a busy thread\n", n);
        free(p);
    }
    return NULL;
}

static _Noreturn void child_main(unsigned index);

/* Fork a grandchild while two threads of this child allocate, and wait for it. */
static void fork_grandchild(unsigned index)
{
    int stop = 0;
    thread_t busy[2];
    unsigned started = 0;
    for (unsigned i = 0; i < 2; i++)
        started += thread_start(&busy[started], child_busy_thread, &stop) == 0;
    sleep_ms(2);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        child_depth = 2;
        child_main(index);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
    for (unsigned i = 0; i < started; i++)
        thread_join(busy[i]);
    int status = 0;
    if (pid < 0)
        child_problem("fork of a grandchild failed\n");
    else if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        child_problem("the grandchild %s %d\n", WIFSIGNALED(status) ? "was killed by signal" : "exited with",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

/* Written to the parent through a pipe: what the child saw. */
typedef struct {
    unsigned parent_blocks; /* published blocks of the parent's threads at the fork */
    unsigned tables;        /* tables (workers', exited threads') that had some */
} child_report;
static int report_fd = -1;

static _Noreturn void child_main(unsigned index)
{
    signal(SIGALRM, SIG_DFL); /* the parent's handler would end a hung child quietly */
    alarm(CHILD_SECONDS);
    uint64_t rng = 31337 + index * 7 + (uint64_t)child_depth;
    child_report report = {0, 0};
    report.parent_blocks = check_parent_blocks(&report.tables);
    free_and_resize_parent_blocks(&rng);
    own_blocks(index * 1000 + (uint64_t)child_depth);
    thread_t t[CHILD_THREADS];
    unsigned started = 0;
    for (unsigned i = 0; i < CHILD_THREADS; i++)
        started += thread_start(&t[started], child_thread, (void *)(uintptr_t)i) == 0;
    if (started != CHILD_THREADS)
        child_problem("only %u of %d threads started\n", started, CHILD_THREADS);
    for (unsigned i = 0; i < started; i++)
        thread_join(t[i]);
    for (unsigned i = 0; i < CHILD_THREADS; i++)
        free(__atomic_exchange_n(&child_mailbox[i], NULL, __ATOMIC_ACQUIRE));
    int problems = shard_check();
    if (problems != 0)
        child_problem("shard_check() found %d problems\n", problems);
    check_parent_blocks(NULL);
    if (child_depth == 1 && index % 4 == 0)
        fork_grandchild(index);
    free_parent_blocks();
    shard_collect();
    problems = shard_check();
    if (problems != 0)
        child_problem("shard_check() after freeing the parent's blocks found %d problems\n", problems);
    if (child_depth == 1 && report_fd >= 0 && write(report_fd, &report, sizeof report) != (ssize_t)sizeof report)
        child_problem("could not write the report\n");
    fflush(stderr);
    _exit(__atomic_load_n(&child_errors, __ATOMIC_RELAXED) == 0 ? 0 : 1);
}

/* ---- the forks ---- */

typedef struct {
    unsigned forks;
    unsigned ok;
    unsigned failed;
    unsigned min_blocks, max_blocks; /* parent blocks a child saw */
    unsigned min_tables;
} fork_summary;

/* Fork, let the child run, wait for it and check how it ended. */
static void fork_one(unsigned index, fork_summary *sum)
{
    int fds[2];
    if (pipe(fds) != 0) {
        CHECKF(0, "pipe failed: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        report_fd = fds[1];
        child_depth = 1;
        child_main(index);
    }
    close(fds[1]);
    __atomic_store_n(&paused, 1, __ATOMIC_RELEASE);
    sum->forks++;
    if (pid < 0) {
        __atomic_store_n(&paused, 0, __ATOMIC_RELEASE);
        close(fds[0]);
        CHECKF(0, "fork %u failed: %s", index, strerror(errno));
        return;
    }
    child_report report;
    ssize_t got = read(fds[0], &report, sizeof report);
    close(fds[0]);
    int status = 0;
    pid_t waited = waitpid(pid, &status, 0);
    __atomic_store_n(&paused, 0, __ATOMIC_RELEASE);
    if (waited != pid) {
        CHECKF(0, "waitpid for child %u failed: %s", index, strerror(errno));
        return;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        sum->failed++;
    if (WIFSIGNALED(status))
        CHECKF(0, "child %u was killed by signal %d%s", index, WTERMSIG(status),
               WTERMSIG(status) == SIGALRM ? " (SIGALRM: it hung)" : "");
    else
        CHECKF(WEXITSTATUS(status) == 0, "child %u exited with %d", index, WEXITSTATUS(status));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == (ssize_t)sizeof report) {
        sum->ok++;
        if (sum->ok == 1 || report.parent_blocks < sum->min_blocks)
            sum->min_blocks = report.parent_blocks;
        if (report.parent_blocks > sum->max_blocks)
            sum->max_blocks = report.parent_blocks;
        if (sum->ok == 1 || report.tables < sum->min_tables)
            sum->min_tables = report.tables;
    }
}

static void fork_many(unsigned first, unsigned count, fork_summary *sum)
{
    uint64_t rng = first;
    for (unsigned i = 0; i < count && sum->failed < MAX_FAILED_CHILDREN; i++) {
        sleep_ms(1 + (long)(next_random(&rng) % 15)); /* at a different point of the threads' work */
        fork_one(first + i, sum);
    }
}

static void print_summary(const char *what, const fork_summary *sum)
{
    printf("  %s: %u forks, %u children exited 0; each saw %u..%u blocks of the parent's threads in at "
           "least %u of %d tables\n", what, sum->forks, sum->ok, sum->min_blocks, sum->max_blocks,
           sum->min_tables, WORKERS + 1);
    fflush(stdout);
}

static void check_summary(const fork_summary *sum, unsigned forks)
{
    CHECK_EQ(sum->forks, forks);
    CHECK_EQ(sum->ok, forks);
    CHECKF(sum->min_blocks > 0, "a child saw no block of the parent");
    CHECKF(sum->min_tables >= 2, "a child saw blocks of only %u of the parent's threads", sum->min_tables);
}

static void on_parent_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_fork: the parent did not finish in time (a fork or a thread hung)\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(2);
}

__attribute__((constructor)) static void parent_time_limit(void)
{
    signal(SIGALRM, on_parent_alarm);
    alarm(PARENT_SECONDS);
}

TEST(fork_from_main_thread_while_threads_allocate)
{
    background b;
    fork_summary sum = {0};
    start_background(&b, 1);
    fork_many(0, 40, &sum);
    stop_background(&b);
    print_summary("main thread", &sum);
    check_summary(&sum, 40);
}

static void *forking_thread(void *arg)
{
    fork_many(1000, 20, arg);
    return NULL;
}

TEST(fork_from_another_thread_while_threads_allocate)
{
    background b;
    fork_summary sum = {0};
    thread_t t;
    start_background(&b, 1);
    if (thread_start(&t, forking_thread, &sum) == 0)
        thread_join(t);
    else
        CHECKF(0, "the forking thread did not start");
    stop_background(&b);
    print_summary("another thread", &sum);
    check_summary(&sum, 20);
}

/* A child that only takes each lock of the allocator once and exits: a large block and a free (the
 * large-block cache's lock), shard_check (the stack of free heaps taken whole, the cache's lock), a
 * thread that takes a heap from the stack, allocates blocks of each kind and exits (its heap back onto
 * the stack). */
static void *probe_thread(void *arg)
{
    (void)arg;
    void *p[3] = {malloc(100), malloc(200 * KB), malloc(3 * MB)};
    for (unsigned i = 0; i < 3; i++) {
        if (p[i] == NULL)
            child_problem("a probe thread's malloc failed\n");
        free(p[i]);
    }
    return NULL;
}

static _Noreturn void probe_child(void)
{
    signal(SIGALRM, SIG_DFL);
    alarm(CHILD_SECONDS);
    child_depth = 1;
    unsigned char *p = malloc(3 * MB);
    if (p == NULL)
        child_problem("malloc(3 MB) failed\n");
    else
        p[3 * MB - 1] = 1;
    free(p);
    int problems = shard_check();
    if (problems != 0)
        child_problem("shard_check() found %d problems\n", problems);
    thread_t t;
    if (thread_start(&t, probe_thread, NULL) != 0)
        child_problem("no thread\n");
    else
        thread_join(t);
    fflush(stderr);
    _exit(__atomic_load_n(&child_errors, __ATOMIC_RELAXED) == 0 ? 0 : 1);
}

/* Many quick forks, each at a moment when another thread may hold one of the allocator's locks: three
 * threads of large blocks (the cache's lock), the checker (the stack taken whole and the cache's lock
 * held while it walks them), threads exiting (the stack). Without the fork hooks some children hang. */
TEST(fork_often_while_other_threads_hold_locks)
{
    background b;
    unsigned forks = 0, ok = 0, failed = 0;
    uint64_t rng = 99;
    start_background(&b, 3);
    for (unsigned i = 0; i < 300 && failed < MAX_FAILED_CHILDREN; i++) {
        sleep_ms((long)(next_random(&rng) % 3));
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0)
            probe_child();
        forks++;
        if (pid < 0) {
            CHECKF(0, "fork failed: %s", strerror(errno));
            failed++;
            continue;
        }
        __atomic_store_n(&paused, 1, __ATOMIC_RELEASE);
        int status = 0;
        pid_t waited = waitpid(pid, &status, 0);
        __atomic_store_n(&paused, 0, __ATOMIC_RELEASE);
        if (waited == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            ok++;
            continue;
        }
        failed++;
        if (waited != pid)
            CHECKF(0, "waitpid for probe %u failed: %s", i, strerror(errno));
        else if (WIFSIGNALED(status))
            CHECKF(0, "probe %u was killed by signal %d%s", i, WTERMSIG(status),
                   WTERMSIG(status) == SIGALRM ? " (SIGALRM: it hung)" : "");
        else
            CHECKF(0, "probe %u exited with %d", i, WEXITSTATUS(status));
    }
    stop_background(&b);
    printf("  probes: %u forks, %u children exited 0\n", forks, ok);
    CHECK_EQ(ok, 300);
}

/* After all the forks: the parent's heaps are consistent and every block kind still works. */
TEST(parent_works_after_forks)
{
    own_blocks(777);
    CHECK_EQ(child_errors, 0);
    CHECK_EQ(shard_check(), 0);
}
