/* stress.c - the multithreaded stress test of shardmm: threads that allocate, free, resize and hand
 * blocks to each other for a given time, with the contents of every block checked.
 *
 * What runs (the seed's ShardMMStress, in C):
 * - Workers (-threads N). Each owns a table of SLOTS slots and, step after step, picks a slot at random:
 *   an empty one gets a new block (malloc mostly, calloc - checked to be zero - and realloc(NULL, n)
 *   sometimes); a full one is freed (sometimes by realloc(p, 0)), resized, handed to another worker or
 *   only checked. A handed block goes to the receiver's inbox; the receiver checks it and puts it into a
 *   slot of its own, so blocks are later resized and freed by threads that did not allocate them.
 * - Every fourth worker (0, 4, 8, ...) also supplies small blocks to its neighbour (worker i + 1), which
 *   checks and frees them at once: the producer-consumer shape, frees of small blocks by another thread.
 * - A spawner thread keeps starting short-lived threads, 1-4 at a time. Each allocates, resizes and frees
 *   some blocks of its own, sometimes calls shard_thread_done, and exits leaving blocks behind; the
 *   spawner checks them after the thread has exited and frees them, or hands some to a worker. It never
 *   allocates: its first free of a batch takes the waiting heap of the block (src/heap.c, heap_claim),
 *   and it gives that heap back with shard_thread_done after the batch.
 * - Now and then a worker calls shard_check() (a nonzero result is an error), shard_thread_done() (its
 *   blocks stay valid; its next allocation takes a heap again) and shard_collect(); so does the spawner.
 *   A worker also walks every block it may (shard_visit: its own heap, the waiting heaps, every large
 *   block) while the others go on, each block reported checked for its kind, alignment and size.
 *
 * Checks: every block is filled with the pattern of its own seed (harness.h) and checked before it is
 * freed, before and after realloc (the bytes realloc keeps), after it is handed over and when a worker
 * only looks at it; every pointer returned is 16-byte aligned; shard_usable_size is at least the size
 * asked for and stays the same while a block lives (sometimes the pattern then covers the whole usable
 * size); allocations do not fail. With shardmm (not TEST_SYSTEM_MALLOC) also: the error hook is never
 * called, shard_check() finds nothing, and at the end, once every block is freed and a thread has taken
 * each waiting heap (taking the frees made into it), the live block counts of shard_get_stats are back
 * where they started and no heap was made by those threads.
 *
 * Sizes: in thousandths of the allocations, L are large (1 MB + 1 .. 4 MB, -large L, default 2) and M
 * more are medium (16 KB + 1 .. 1 MB, log-uniform, -medium M, default 0); the rest are mostly small:
 * 50 % up to 128 bytes (0 included), 30 % up to 1 KB, 15 % up to 8 KB, 4 % up to 16 KB, and 1 % medium
 * up to 128 KB. A realloc grows or shrinks a little (often within the class), doubles, halves or takes a
 * fresh size of the mix, so blocks cross from one kind to another (at most REALLOC_MAX bytes). Memory:
 * each worker keeps about 600 blocks live; 64 workers peak near 1 GB of RSS with the defaults and near
 * 4 GB with -large 10 -medium 100.
 *
 * Repeatable as far as threads allow: each thread draws its sizes and decisions from its own xorshift64*
 * generator, seeded from -seed and the thread's number (the short-lived threads from the spawner's), so
 * a run with the same -seed does the same work until blocks handed between threads arrive at other
 * moments than before; a failure that depends on the interleaving may take a few runs to come back. The
 * first line printed names every option, the seed included; the first ERROR_MESSAGES errors print which
 * check failed, in which thread, the block's size, usable size, address and seed and the first wrong
 * byte.
 *
 * Options: -threads N (1..MAX_THREADS, default 8) -seconds S (default 10, fractions allowed)
 *          -large L -medium M (0..1000, L + M <= 1000) -seed X (decimal or 0x hex; default from the clock)
 * Output:  "stress: -threads ... -seed X (allocator)" first; error messages on stderr; the last line is
 *          the summary: threads, seconds, operations per kind, errors.
 * Exit:    the number of errors, at most 255 (a bad option also gives 255). The run stops early once
 *          STOP_AFTER_ERRORS errors were counted. A crash prints the options of the run before it ends.
 *
 * Built with -DTEST_SYSTEM_MALLOC the same file runs on the system malloc, without the checks of
 * shardmm's own rules (shard_check, shard_thread_done, shard_collect, the error hook, the statistics):
 * a check of the test itself.
 *
 * Build: see build.ninja (build/stress, build/debug/stress, build/stress-system, build/win64/stress.exe).
 * Run:   build/stress -threads 8 -seconds 3; the soak: tests/stress.sh.
 */
#include "harness.h"
#include "platform.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator.h"

/* ---- parameters ---- */

#define MAX_THREADS 1024
#define DEFAULT_THREADS 8
#define DEFAULT_SECONDS 10.0
#define DEFAULT_LARGE 2             /* thousandths of the allocations: 1-4 MB */
#define DEFAULT_MEDIUM 0            /* an extra share of 16 KB - 1 MB */
#define SLOTS 1024                  /* a worker's table; about 60 % of the slots hold a block */
#define INBOX 64                    /* blocks handed to a worker and not yet taken */
#define SUPPLY 256                  /* blocks supplied to a worker and not yet freed */
_Static_assert(SUPPLY >= INBOX, "a worker takes either mailbox into one array of SUPPLY blocks");
#define SHORT_BATCH 4               /* short-lived threads started at once, at most */
#define SHORT_BLOCKS 32             /* blocks of a short-lived thread, at most */
#define REALLOC_MAX ((size_t)8 << 20)
#define CHECK_ODDS 4096             /* a worker calls shard_check about once per this many steps, */
#define DONE_ODDS 50000             /* shard_thread_done once per this many, */
#define COLLECT_ODDS 200000         /* and shard_collect once per this many, */
#define WALK_ODDS 2048              /* and shard_visit once per this many */
#define SPAWNER_CHECK_ODDS 16       /* the spawner calls shard_check once per this many batches */
#define SPAWNER_COLLECT_ODDS 256    /* and shard_collect once per this many */
#define ERROR_MESSAGES 20           /* errors printed in full; the others are counted */
#define STOP_AFTER_ERRORS 100
#define TICK_MS 20                  /* the main thread looks at the clock and the errors this often */

#define SMALL_MAX ((size_t)16384)
#define MEDIUM_MAX ((size_t)1 << 20)
#define LARGE_TOP ((size_t)4 << 20) /* the -large share draws up to this */
#define ALIGNMENT 16

/* ---- the clock and the crash note (the only OS-specific part) ---- */

static char run_options[256];       /* "-threads N ... -seed X", for the first line and every report */

#ifdef _WIN32
static double now_seconds(void)
{
    static LARGE_INTEGER frequency;
    LARGE_INTEGER t;
    if (frequency.QuadPart == 0)
        QueryPerformanceFrequency(&frequency);
    QueryPerformanceCounter(&t);
    return (double)t.QuadPart / (double)frequency.QuadPart;
}

/* A crash ends the program with a message and exit code 99: without this, Wine starts its debugger. */
static LONG WINAPI on_crash(EXCEPTION_POINTERS *e)
{
    fprintf(stderr, "stress: crashed: unhandled exception 0x%lx at %p; the run: %s\n",
            (unsigned long)e->ExceptionRecord->ExceptionCode, e->ExceptionRecord->ExceptionAddress, run_options);
    fflush(stdout);
    fflush(stderr);
    TerminateProcess(GetCurrentProcess(), 99);
    return EXCEPTION_EXECUTE_HANDLER;
}

static void catch_crashes(void)
{
    SetErrorMode(SEM_FAILCRITICALERRORS | SEM_NOGPFAULTERRORBOX);
    SetUnhandledExceptionFilter(on_crash);
}
#else
static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One note per signal caught, written before the run starts: the handler may only write it. */
static const struct {
    int sig;
    const char *name;
} crash_signals[] = { { SIGSEGV, "SIGSEGV" }, { SIGBUS, "SIGBUS" }, { SIGILL, "SIGILL" }, { SIGFPE, "SIGFPE" },
                      { SIGABRT, "SIGABRT (an abort, its reason above)" } };
#define CRASH_SIGNALS (sizeof crash_signals / sizeof crash_signals[0])
static char crash_note[CRASH_SIGNALS][sizeof run_options + 128];
static size_t crash_note_length[CRASH_SIGNALS];

/* A crash or an abort names the run, then ends the program as the signal would have. */
static void on_crash(int sig)
{
    for (size_t i = 0; i < CRASH_SIGNALS; i++)
        if (crash_signals[i].sig == sig) {
            ssize_t ignored = write(2, crash_note[i], crash_note_length[i]);
            (void)ignored;
        }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void catch_crashes(void)
{
    for (size_t i = 0; i < CRASH_SIGNALS; i++) {
        int n = snprintf(crash_note[i], sizeof crash_note[i], "stress: ended by %s; the run: %s\n",
                         crash_signals[i].name, run_options);
        crash_note_length[i] = n < 0 ? 0 : (size_t)n < sizeof crash_note[i] ? (size_t)n : sizeof crash_note[i] - 1;
        signal(crash_signals[i].sig, on_crash);
    }
}
#endif

/* ---- shared state ---- */

static int stop_flag;               /* atomic: the workers and the spawner end their loops */
static int error_count;             /* atomic */
static mutex_t print_lock = MUTEX_INIT;
static int worker_count;
static unsigned large_share, medium_share;

static int load_int(const int *p)
{
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static void store_int(int *p, int v)
{
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}

static int stopping(void)
{
    return __atomic_load_n(&stop_flag, __ATOMIC_RELAXED);
}

/* Operations of one thread, added up at the end. */
struct counts {
    unsigned long long malloc_calls, calloc_calls, realloc_calls, free_calls;
    unsigned long long handed;       /* blocks handed to a worker (by a worker or the spawner) */
    unsigned long long supplied;     /* small blocks a neighbour freed at once */
    unsigned long long short_threads;
    unsigned long long checks, thread_done, collect; /* shard_check, shard_thread_done, shard_collect */
    unsigned long long walks;        /* shard_visit */
};

static void counts_add(struct counts *to, const struct counts *c)
{
    to->malloc_calls += c->malloc_calls;
    to->calloc_calls += c->calloc_calls;
    to->realloc_calls += c->realloc_calls;
    to->free_calls += c->free_calls;
    to->handed += c->handed;
    to->supplied += c->supplied;
    to->short_threads += c->short_threads;
    to->checks += c->checks;
    to->thread_done += c->thread_done;
    to->collect += c->collect;
    to->walks += c->walks;
}

/* A thread of the test: its name for messages, its generator and its counts. */
struct actor {
    char name[48];
    uint64_t rng;
    struct counts c;
};

static void actor_init(struct actor *a, uint64_t seed, const char *name)
{
    snprintf(a->name, sizeof a->name, "%s", name);
    a->rng = harness_mix64(seed) | 1; /* xorshift64* needs a state other than 0 */
    memset(&a->c, 0, sizeof a->c);
}

static uint64_t rnd(struct actor *a)
{
    uint64_t x = a->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    a->rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

/* Uniform in 0 .. n - 1 (n below 2^32). */
static size_t rnd_below(struct actor *a, size_t n)
{
    return (size_t)(((rnd(a) >> 32) * (uint64_t)n) >> 32);
}

/* The seed of the run and of the thread with a given number. */
static uint64_t run_seed;

static uint64_t thread_seed(uint64_t number)
{
    return run_seed ^ (0x9e3779b97f4a7c15ull * (number + 1));
}

/* ---- errors ---- */

__attribute__((format(HARNESS_PRINTF, 1, 2))) static void stress_error(const char *fmt, ...)
{
    int n = __atomic_add_fetch(&error_count, 1, __ATOMIC_SEQ_CST);
    if (n > ERROR_MESSAGES)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mutex_lock(&print_lock);
    fprintf(stderr, "stress: error %d: %s\n", n, msg);
    if (n == ERROR_MESSAGES)
        fprintf(stderr, "stress: further errors are counted, not shown\n");
    fflush(stderr);
    mutex_unlock(&print_lock);
}

#if SHARD_RULES
static void on_invalid_pointer(void *arg, int error, void *ptr)
{
    static const char *const call[] = { "?", "shard_free", "shard_realloc", "shard_usable_size" };
    (void)arg;
    stress_error("the allocator's error hook: %s(%p) is not a live block (error %d)",
                 call[error >= 1 && error <= 3 ? error : 0], ptr, error);
}
#endif

/* ---- blocks with their pattern ---- */

struct blk {
    unsigned char *p;
    size_t n;       /* the pattern covers n bytes: the size asked for, or the usable size */
    size_t usable;  /* shard_usable_size when it was allocated or resized */
    uint64_t seed;
};

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

static int all_zero(const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        if (x != 0)
            return 0;
    }
    for (; i < n; i++)
        if (p[i] != 0)
            return 0;
    return 1;
}

/* The first n bytes of the block hold its pattern; else an error naming the check and the first wrong
 * byte, and those bytes are filled again (one damage, one error). */
static void blk_check_bytes(struct actor *a, const struct blk *b, size_t n, const char *what)
{
    if (holds_pattern(b->p, n, b->seed))
        return;
    size_t bad = pattern_mismatch(b->p, n, b->seed);
    if (bad == n) { /* the second look found every byte right */
        stress_error("pattern %s: %s, block of %zu bytes (usable %zu) at %p, block seed 0x%llx: a word differed, "
                     "then every byte was right (did the block change while it was checked?)",
                     what, a->name, b->n, b->usable, (void *)b->p, (unsigned long long)b->seed);
        return;
    }
    stress_error("pattern %s: %s, block of %zu bytes (usable %zu) at %p, block seed 0x%llx: byte %zu is 0x%02x, "
                 "expected 0x%02x",
                 what, a->name, b->n, b->usable, (void *)b->p, (unsigned long long)b->seed, bad, b->p[bad],
                 pattern_byte(b->seed, bad));
    fill_range(b->p, 0, n, b->seed);
}

/* The whole pattern, and the usable size as it was. */
static void blk_check(struct actor *a, const struct blk *b, const char *what)
{
    size_t usable = shard_usable_size(b->p);
    if (usable != b->usable)
        stress_error("usable size %s: %s, block of %zu bytes at %p, block seed 0x%llx: %zu, was %zu", what, a->name,
                     b->n, (void *)b->p, (unsigned long long)b->seed, usable, b->usable);
    blk_check_bytes(a, b, b->n, what);
}

/* What a call was, for a message: "shard_malloc(n)" and n; for realloc also the block it resized. */
struct call {
    const char *name;
    size_t n;
    const struct blk *from;
};

static const char *describe(const struct call *c, char *buf, size_t size)
{
    if (c->from != NULL)
        snprintf(buf, size, "%s with n = %zu, p = %p a block of %zu bytes", c->name, c->n, (void *)c->from->p,
                 c->from->n);
    else
        snprintf(buf, size, "%s with n = %zu", c->name, c->n);
    return buf;
}

/* A pointer just returned for c->n bytes: not NULL, aligned, with a usable size of n or more. 0 for
 * NULL. */
static int returned_ok(struct actor *a, const void *p, const struct call *c, size_t *usable)
{
    char buf[128];
    if (p == NULL) {
        stress_error("%s returned NULL: %s", describe(c, buf, sizeof buf), a->name);
        return 0;
    }
    if (((uintptr_t)p & (ALIGNMENT - 1)) != 0)
        stress_error("alignment: %s returned %p, not %d-byte aligned: %s", describe(c, buf, sizeof buf), p,
                     ALIGNMENT, a->name);
    *usable = shard_usable_size(p);
    if (*usable < c->n)
        stress_error("usable size: %s returned %p with a usable size of %zu: %s", describe(c, buf, sizeof buf), p,
                     *usable, a->name);
    return 1;
}

/* The pattern covers the size asked for, or one time in 8 the whole usable size. */
static size_t pattern_length(struct actor *a, size_t n, size_t usable)
{
    return usable > n && rnd_below(a, 8) == 0 ? usable : n;
}

/* A size of the mix (see the top of the file). */
static size_t pick_size(struct actor *a)
{
    size_t r = rnd_below(a, 1000);
    if (r < large_share)
        return MEDIUM_MAX + 1 + rnd_below(a, LARGE_TOP - MEDIUM_MAX);
    if (r < large_share + medium_share) { /* log-uniform: 2^e + 1 .. 2^(e+1), e in 14 .. 19 */
        size_t low = (size_t)1 << (14 + rnd_below(a, 6));
        return low + 1 + rnd_below(a, low);
    }
    r = rnd_below(a, 100);
    if (r < 50)
        return rnd_below(a, 129);
    if (r < 80)
        return 129 + rnd_below(a, 1024 - 128);
    if (r < 95)
        return 1025 + rnd_below(a, 8192 - 1024);
    if (r < 99)
        return 8193 + rnd_below(a, SMALL_MAX - 8192);
    return SMALL_MAX + 1 + rnd_below(a, 128 * 1024 - SMALL_MAX);
}

/* A new size for a block of n bytes: a little more or less, double, half, or any size of the mix. */
static size_t pick_resize(struct actor *a, size_t n)
{
    size_t m;
    switch (rnd_below(a, 8)) {
    case 0:
    case 1:
        m = n + 1 + rnd_below(a, n / 4 + 16);
        break;
    case 2:
        m = n - rnd_below(a, n / 4 + 1);
        break;
    case 3:
        m = 2 * n + rnd_below(a, 64);
        break;
    case 4:
        m = n / 4 + rnd_below(a, n / 4 + 1);
        break;
    default:
        m = pick_size(a);
        break;
    }
    if (m > REALLOC_MAX)
        m = n / 2;
    return m == 0 ? 1 : m; /* realloc to 0 is a free, done on purpose elsewhere */
}

/* Allocates a block into the empty b: malloc mostly, calloc (checked zero) and realloc(NULL, n) now and
 * then. */
static void blk_new(struct actor *a, struct blk *b)
{
    size_t n = pick_size(a), how = rnd_below(a, 16), usable;
    const char *call;
    unsigned char *p;
    if (how < 2) {
        if (n % 16 == 0 && n > 0) {
            call = "shard_calloc(n / 16, 16)";
            p = shard_calloc(n / 16, 16);
        } else {
            call = how == 0 ? "shard_calloc(1, n)" : "shard_calloc(n, 1)";
            p = how == 0 ? shard_calloc(1, n) : shard_calloc(n, 1);
        }
        a->c.calloc_calls++;
    } else if (how == 2) {
        call = "shard_realloc(NULL, n)";
        p = shard_realloc(NULL, n);
        a->c.realloc_calls++;
    } else {
        call = "shard_malloc(n)";
        p = shard_malloc(n);
        a->c.malloc_calls++;
    }
    b->p = NULL;
    struct call c = { call, n, NULL };
    if (!returned_ok(a, p, &c, &usable))
        return;
    if (how < 2 && !all_zero(p, n)) {
        char buf[128];
        size_t i = bytes_not_equal(p, n, 0);
        stress_error("calloc zero: %s returned %p: byte %zu is 0x%02x: %s", describe(&c, buf, sizeof buf), (void *)p,
                     i, i < n ? p[i] : 0, a->name);
    }
    b->p = p;
    b->n = pattern_length(a, n, usable);
    b->usable = usable;
    b->seed = rnd(a);
    fill_range(p, 0, b->n, b->seed);
}

/* Checks and frees the block (now and then by realloc(p, 0)); the slot becomes empty. */
static void blk_free(struct actor *a, struct blk *b, const char *what)
{
    blk_check(a, b, what);
    if (rnd_below(a, 32) == 0) {
        void *q = shard_realloc(b->p, 0);
        a->c.realloc_calls++;
        if (q != NULL) {
            stress_error("shard_realloc(%p, 0) of a block of %zu bytes returned %p, not NULL: %s", (void *)b->p, b->n,
                         q, a->name);
            shard_free(q);
        }
    } else {
        shard_free(b->p);
        a->c.free_calls++;
    }
    b->p = NULL;
}

/* Checks the block, resizes it to a size of pick_resize, checks the bytes realloc keeps, and fills the
 * rest. A failed realloc is an error; the block stays as it was. */
static void blk_resize(struct actor *a, struct blk *b)
{
    size_t m = pick_resize(a, b->n), usable;
    blk_check(a, b, "before realloc");
    unsigned char *q = shard_realloc(b->p, m);
    a->c.realloc_calls++;
    struct call c = { "shard_realloc(p, n)", m, b };
    if (!returned_ok(a, q, &c, &usable))
        return;
    size_t kept = min_size(b->n, m);
    if (!holds_pattern(q, kept, b->seed)) {
        struct blk moved = *b;
        char what[96];
        moved.p = q;
        snprintf(what, sizeof what, "after realloc to %zu bytes (from %p, %zu kept)", m, (void *)b->p, kept);
        blk_check_bytes(a, &moved, kept, what);
    }
    b->p = q;
    b->n = pattern_length(a, m, usable);
    b->usable = usable;
    fill_range(q, kept, b->n, b->seed);
}

/* ---- mailboxes between threads ---- */

struct mailbox {
    mutex_t lock;
    int count;                      /* atomic for the look without the lock */
    int capacity;
    struct blk *blocks;
};

static int mailbox_init(struct mailbox *m, int capacity)
{
    mutex_t unlocked = MUTEX_INIT;
    m->lock = unlocked;
    m->count = 0;
    m->capacity = capacity;
    m->blocks = calloc((size_t)capacity, sizeof *m->blocks);
    return m->blocks != NULL;
}

/* Puts b into the mailbox if there is room; 1 when it did. */
static int mailbox_put(struct mailbox *m, const struct blk *b)
{
    int done = 0;
    mutex_lock(&m->lock);
    if (m->count < m->capacity) {
        m->blocks[m->count] = *b;
        store_int(&m->count, m->count + 1);
        done = 1;
    }
    mutex_unlock(&m->lock);
    return done;
}

/* Takes every block out of the mailbox into out (room for its capacity); returns how many. */
static int mailbox_take(struct mailbox *m, struct blk *out)
{
    if (load_int(&m->count) == 0)
        return 0;
    mutex_lock(&m->lock);
    int n = m->count;
    memcpy(out, m->blocks, (size_t)n * sizeof *out);
    store_int(&m->count, 0);
    mutex_unlock(&m->lock);
    return n;
}

/* ---- workers ---- */

struct worker {
    struct actor a;
    int index;
    thread_t thread;
    int started;
    struct blk slots[SLOTS];
    struct mailbox inbox;           /* blocks handed over: checked, then kept in a slot */
    struct mailbox supply;          /* small blocks from the neighbour: checked and freed at once */
    struct blk taken[SUPPLY];       /* what the worker took out of a mailbox */
};

static struct worker **workers;

/* Hands the block in b to another worker; the slot becomes empty. 0 when that inbox is full. */
static int hand_over(struct actor *a, struct blk *b, int self)
{
    size_t to = rnd_below(a, (size_t)(self >= 0 ? worker_count - 1 : worker_count));
    if (self >= 0 && to >= (size_t)self)
        to++;
    if (!mailbox_put(&workers[to]->inbox, b))
        return 0;
    a->c.handed++;
    b->p = NULL;
    return 1;
}

static void take_inbox(struct worker *w)
{
    int n = mailbox_take(&w->inbox, w->taken);
    for (int i = 0; i < n; i++) {
        blk_check(&w->a, &w->taken[i], "after hand-over");
        struct blk *slot = &w->slots[rnd_below(&w->a, SLOTS)];
        if (slot->p != NULL)
            blk_free(&w->a, slot, "before free (making room for a handed block)");
        *slot = w->taken[i];
    }
}

static void take_supply(struct worker *w)
{
    int n = mailbox_take(&w->supply, w->taken);
    for (int i = 0; i < n; i++) {
        blk_free(&w->a, &w->taken[i], "of a supplied block, before the neighbour frees it");
        w->a.c.supplied++;
    }
}

/* A supplier (every fourth worker) gives its neighbour a small block every other step. */
static void supply_step(struct worker *w)
{
    struct mailbox *to = &workers[w->index + 1]->supply;
    size_t n, usable;
    if (rnd_below(&w->a, 2) != 0 || load_int(&to->count) >= to->capacity)
        return;
    n = 1 + rnd_below(&w->a, rnd_below(&w->a, 8) == 0 ? SMALL_MAX : 512);
    unsigned char *p = shard_malloc(n);
    w->a.c.malloc_calls++;
    struct call c = { "shard_malloc(n) for a supplied block", n, NULL };
    if (!returned_ok(&w->a, p, &c, &usable))
        return;
    struct blk b = { p, n, usable, rnd(&w->a) };
    fill_range(p, 0, n, b.seed);
    if (!mailbox_put(to, &b))
        blk_free(&w->a, &b, "before free (a supplied block that found no room)");
}

#if SHARD_RULES
/* shard_visit's callback: a block of a kind, aligned, with a usable size of that kind (a medium block
 * shrunk by realloc stays where it is, small sizes included). It neither allocates nor frees through
 * shardmm. */
static int visit_check(void *arg, void *block, size_t usable, int kind)
{
    const struct actor *a = arg;
    int size_ok = kind == SHARD_BLOCK_SMALL    ? usable > 0 && usable <= SMALL_MAX
                  : kind == SHARD_BLOCK_MEDIUM ? usable > 0 && usable <= 2 * MEDIUM_MAX
                  : kind == SHARD_BLOCK_LARGE  ? usable > MEDIUM_MAX
                                               : 0;
    if (!size_ok || ((uintptr_t)block & 15) != 0)
        stress_error("shard_visit in %s reported block %p of kind %d with %zu usable bytes", a->name, block,
                     kind, usable);
    return 0;
}
#endif

/* The calls of shardmm's own that a program makes now and then. */
static void now_and_then(struct actor *a)
{
#if SHARD_RULES
    if (rnd_below(a, WALK_ODDS) == 0) {
        shard_visit(SHARD_VISIT_ALL, visit_check, a);
        a->c.walks++;
    }
    if (rnd_below(a, CHECK_ODDS) == 0) {
        int problems = shard_check();
        a->c.checks++;
        if (problems != 0)
            stress_error("shard_check() = %d in %s", problems, a->name);
    }
    if (rnd_below(a, DONE_ODDS) == 0) {
        shard_thread_done();
        a->c.thread_done++;
    }
    if (rnd_below(a, COLLECT_ODDS) == 0) {
        shard_collect();
        a->c.collect++;
    }
#else
    (void)a;
#endif
}

static void worker_step(struct worker *w)
{
    struct actor *a = &w->a;
    struct blk *b = &w->slots[rnd_below(a, SLOTS)];
    if (b->p == NULL) {
        blk_new(a, b);
        return;
    }
    size_t r = rnd_below(a, 100);
    if (r < 50)
        blk_free(a, b, "before free");
    else if (r < 85)
        blk_resize(a, b);
    else if (r >= 95 || worker_count == 1 || !hand_over(a, b, w->index))
        blk_check(a, b, "of a live block");
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    int supplies = w->index % 4 == 0 && w->index + 1 < worker_count;
    while (!stopping()) {
        take_inbox(w);
        take_supply(w);
        if (supplies)
            supply_step(w);
        worker_step(w);
        now_and_then(&w->a);
    }
    for (int i = 0; i < SLOTS; i++)
        if (w->slots[i].p != NULL)
            blk_free(&w->a, &w->slots[i], "before free (at the end)");
    return NULL; /* the main thread takes what is left in the mailboxes */
}

/* ---- short-lived threads and the spawner ---- */

struct short_life {
    struct actor a;
    int count;
    struct blk blocks[SHORT_BLOCKS];
};

/* Allocates some blocks, frees or resizes a few, sometimes gives its heap back early (and allocates
 * once more, taking a heap again), and exits with the rest of its blocks left to the spawner. */
static void *short_main(void *arg)
{
    struct short_life *s = arg;
    struct actor *a = &s->a;
    s->count = 4 + (int)rnd_below(a, SHORT_BLOCKS - 3);
    for (int i = 0; i < s->count; i++)
        blk_new(a, &s->blocks[i]);
    for (int i = 0; i < s->count; i++) {
        size_t r = rnd_below(a, 4);
        if (s->blocks[i].p == NULL)
            continue;
        if (r == 0)
            blk_free(a, &s->blocks[i], "before free (in a short-lived thread)");
        else if (r == 1)
            blk_resize(a, &s->blocks[i]);
    }
#if SHARD_RULES
    if (rnd_below(a, 4) == 0) {
        shard_thread_done();
        a->c.thread_done++;
        if (rnd_below(a, 2) == 0 && s->blocks[0].p == NULL)
            blk_new(a, &s->blocks[0]);
    }
#endif
    return NULL;
}

struct spawner {
    struct actor a;
    thread_t thread;
    int started;
    struct short_life lives[SHORT_BATCH];
};

static void *spawner_main(void *arg)
{
    struct spawner *sp = arg;
    struct actor *a = &sp->a;
    while (!stopping()) {
        thread_t t[SHORT_BATCH];
        int started[SHORT_BATCH];
        size_t k = 1 + rnd_below(a, SHORT_BATCH);
        for (size_t j = 0; j < k; j++) {
            struct short_life *s = &sp->lives[j];
            char name[48];
            snprintf(name, sizeof name, "short-lived thread %llu", a->c.short_threads);
            memset(s, 0, sizeof *s);
            actor_init(&s->a, rnd(a), name);
            started[j] = thread_start(&t[j], short_main, s) == 0;
            if (started[j])
                a->c.short_threads++;
            else
                stress_error("a short-lived thread did not start (%s)", s->a.name);
        }
        for (size_t j = 0; j < k; j++) {
            if (!started[j])
                continue;
            thread_join(t[j]);
            struct short_life *s = &sp->lives[j];
            counts_add(&a->c, &s->a.c);
            for (int i = 0; i < s->count; i++) {
                struct blk *b = &s->blocks[i];
                if (b->p == NULL)
                    continue;
                blk_check(a, b, "of a short-lived thread's block, after the thread exited");
                if (rnd_below(a, 4) != 0 || !hand_over(a, b, -1))
                    blk_free(a, b, "before free (a short-lived thread's block)");
            }
        }
#if SHARD_RULES
        shard_thread_done(); /* the heap its frees took goes back: the next batch's frees take one again */
        a->c.thread_done++;
        /* a thread without a heap: shard_check sees the waiting heaps and the large cache */
        if (rnd_below(a, SPAWNER_CHECK_ODDS) == 0) {
            int problems = shard_check();
            a->c.checks++;
            if (problems != 0)
                stress_error("shard_check() = %d in %s", problems, a->name);
        }
        if (rnd_below(a, SPAWNER_COLLECT_ODDS) == 0) {
            shard_collect();
            a->c.collect++;
        }
#endif
    }
    return NULL;
}

/* ---- the end: takers of the waiting heaps ---- */

#if SHARD_RULES
/* One thread per heap waiting in the stack: its first allocation (a medium block) takes a heap and the
 * frees other threads made into it; it checks its heap and holds it until every taker has one. */
struct takers {
    int arrived, release;           /* atomic */
};

static struct takers takers;

static void *taker_main(void *unused)
{
    (void)unused;
    struct actor a;
    struct blk b;
    actor_init(&a, thread_seed(MAX_THREADS + 1), "a taker of a waiting heap");
    size_t usable;
    b.p = shard_malloc(20000);
    a.c.malloc_calls++;
    struct call c = { "shard_malloc(n)", 20000, NULL };
    if (returned_ok(&a, b.p, &c, &usable)) {
        b.n = 20000;
        b.usable = usable;
        b.seed = 0x7a4e;
        fill_range(b.p, 0, b.n, b.seed);
        blk_free(&a, &b, "before free (in a taker)");
    }
    int problems = shard_check();
    if (problems != 0)
        stress_error("shard_check() = %d in a thread that took a waiting heap at the end", problems);
    __atomic_add_fetch(&takers.arrived, 1, __ATOMIC_SEQ_CST);
    while (!load_int(&takers.release))
        sleep_ms(1);
    return NULL;
}

/* After every block is freed: each waiting heap is taken (and with it the frees made into it), so the
 * live counts and bytes are exact and back where they were at the start; the takers make no heap. Then
 * shard_check and shard_collect from this thread. */
static void final_checks(const shard_stats *start)
{
    shard_stats s;
    int problems = shard_check();
    if (problems != 0)
        stress_error("shard_check() = %d at the end, after every block was freed", problems);
    shard_get_stats(&s);
    size_t k = s.heaps_free, heaps = s.heaps, started = 0;
    thread_t *t = calloc(k ? k : 1, sizeof *t);
    if (t == NULL) {
        stress_error("no memory for %zu takers", k);
        return;
    }
    for (; started < k; started++)
        if (thread_start(&t[started], taker_main, NULL) != 0) {
            stress_error("taker %zu of %zu did not start", started, k);
            break;
        }
    while ((size_t)load_int(&takers.arrived) < started)
        sleep_ms(1);
    shard_get_stats(&s);
    if (started == k && (s.heaps != heaps || s.heaps_free != 0))
        stress_error("%zu threads took the %zu waiting heaps: %zu heaps -> %zu, %zu waiting afterwards", k, k, heaps,
                     s.heaps, s.heaps_free);
    if (started == k && (s.live_small != start->live_small || s.live_medium != start->live_medium ||
                         s.live_large != start->live_large))
        stress_error("live blocks at the end, every block freed and every heap taken: small/medium/large %zu/%zu/%zu, "
                     "%zu/%zu/%zu at the start",
                     s.live_small, s.live_medium, s.live_large, start->live_small, start->live_medium,
                     start->live_large);
    if (started == k && (s.live_small_bytes != start->live_small_bytes ||
                         s.live_medium_bytes != start->live_medium_bytes ||
                         s.live_large_bytes != start->live_large_bytes ||
                         s.live_large_committed != start->live_large_committed))
        stress_error("live bytes at the end, every block freed and every heap taken: small/medium/large %zu/%zu/%zu "
                     "(large committed %zu), %zu/%zu/%zu (%zu) at the start",
                     s.live_small_bytes, s.live_medium_bytes, s.live_large_bytes, s.live_large_committed,
                     start->live_small_bytes, start->live_medium_bytes, start->live_large_bytes,
                     start->live_large_committed);
    store_int(&takers.release, 1);
    for (size_t i = 0; i < started; i++)
        thread_join(t[i]);
    free(t);
    shard_collect();
    problems = shard_check();
    if (problems != 0)
        stress_error("shard_check() = %d after shard_collect at the end", problems);
}
#endif

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: stress [-threads N] [-seconds S] [-large L] [-medium M] [-seed X]\n"
               "  -threads N   workers, 1..%d (default %d), besides the spawner of short-lived threads\n"
               "  -seconds S   how long they run (default %.0f)\n"
               "  -large L     thousandths of the allocations that are 1-4 MB (default %d)\n"
               "  -medium M    thousandths more that are 16 KB - 1 MB (default %d); L + M <= 1000\n"
               "  -seed X      the seed of every thread's generator (default: from the clock)\n"
               "The exit code is the number of errors (at most 255).\n",
            MAX_THREADS, DEFAULT_THREADS, DEFAULT_SECONDS, DEFAULT_LARGE, DEFAULT_MEDIUM);
}

/* Reads the option's value into *out: 1, or 0 after a message. */
static int parse_value(const char *option, const char *text, unsigned long long hi, unsigned long long *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno != 0 || *end != '\0' || end == text || text[0] == '-' || v > hi) {
        fprintf(stderr, "stress: bad %s value '%s' (want 0 .. %llu)\n", option, text, hi);
        return 0;
    }
    *out = v;
    return 1;
}

/* The options into the parameters of the run; 0 after a message when they are wrong. */
static int parse_options(int argc, char **argv, int *threads, double *seconds)
{
    unsigned long long v = 0;
    int seeded = 0;
    *threads = DEFAULT_THREADS;
    *seconds = DEFAULT_SECONDS;
    large_share = DEFAULT_LARGE;
    medium_share = DEFAULT_MEDIUM;
    for (int i = 1; i < argc; i += 2) {
        const char *opt = argv[i], *val = argv[i + 1];
        if (strcmp(opt, "-h") == 0 || strcmp(opt, "-help") == 0 || strcmp(opt, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (val == NULL) {
            fprintf(stderr, "stress: %s needs a value\n", opt);
            return 0;
        }
        if (strcmp(opt, "-threads") == 0) {
            if (!parse_value(opt, val, MAX_THREADS, &v))
                return 0;
            *threads = (int)v;
        } else if (strcmp(opt, "-seconds") == 0) {
            char *end;
            errno = 0;
            *seconds = strtod(val, &end);
            if (errno != 0 || *end != '\0' || end == val || !(*seconds >= 0 && *seconds <= 1e6)) {
                fprintf(stderr, "stress: bad -seconds value '%s' (want 0 .. 1000000)\n", val);
                return 0;
            }
        } else if (strcmp(opt, "-large") == 0) {
            if (!parse_value(opt, val, 1000, &v))
                return 0;
            large_share = (unsigned)v;
        } else if (strcmp(opt, "-medium") == 0) {
            if (!parse_value(opt, val, 1000, &v))
                return 0;
            medium_share = (unsigned)v;
        } else if (strcmp(opt, "-seed") == 0) {
            if (!parse_value(opt, val, UINT64_MAX, &v))
                return 0;
            run_seed = v;
            seeded = 1;
        } else {
            fprintf(stderr, "stress: unknown option %s\n", opt);
            usage(stderr);
            return 0;
        }
    }
    if (*threads < 1) {
        fprintf(stderr, "stress: -threads must be 1 or more\n");
        return 0;
    }
    if (large_share + medium_share > 1000) {
        fprintf(stderr, "stress: -large %u plus -medium %u is above 1000\n", large_share, medium_share);
        return 0;
    }
    if (!seeded) /* a new seed each run; the first line prints it */
        run_seed = harness_mix64((uint64_t)time(NULL) ^ ((uint64_t)(now_seconds() * 1e9) << 1));
    return 1;
}

/* ---- main ---- */

int main(int argc, char **argv)
{
    int threads;
    double seconds;
    if (!parse_options(argc, argv, &threads, &seconds))
        return 255;
    snprintf(run_options, sizeof run_options, "-threads %d -seconds %g -large %u -medium %u -seed 0x%llx", threads,
             seconds, large_share, medium_share, (unsigned long long)run_seed);
    catch_crashes();
    printf("stress: %s (%s)\n", run_options, SHARD_RULES ? "shardmm" : "the system malloc");
    fflush(stdout);

#if SHARD_RULES
    shard_stats start;
    shard_set_error_hook(on_invalid_pointer, NULL);
    shard_get_stats(&start);
#endif
    worker_count = threads;
    workers = calloc((size_t)threads, sizeof *workers);
    struct spawner *sp = calloc(1, sizeof *sp);
    if (workers == NULL || sp == NULL) {
        fprintf(stderr, "stress: no memory for the test's own tables\n");
        return 255;
    }
    for (int i = 0; i < threads; i++) {
        struct worker *w = workers[i] = calloc(1, sizeof *w);
        if (w == NULL || !mailbox_init(&w->inbox, INBOX) || !mailbox_init(&w->supply, SUPPLY)) {
            fprintf(stderr, "stress: no memory for the test's own tables\n");
            return 255;
        }
        w->index = i;
        char name[48];
        snprintf(name, sizeof name, "worker %d", i);
        actor_init(&w->a, thread_seed((uint64_t)i), name);
    }
    actor_init(&sp->a, thread_seed(MAX_THREADS), "the spawner");

    double begin = now_seconds();
    for (int i = 0; i < threads; i++) {
        workers[i]->started = thread_start(&workers[i]->thread, worker_main, workers[i]) == 0;
        if (!workers[i]->started)
            stress_error("worker %d did not start", i);
    }
    sp->started = thread_start(&sp->thread, spawner_main, sp) == 0;
    if (!sp->started)
        stress_error("the spawner did not start");
    while (now_seconds() - begin < seconds && load_int(&error_count) < STOP_AFTER_ERRORS)
        sleep_ms(TICK_MS);
    double ran = now_seconds() - begin;
    store_int(&stop_flag, 1);

    struct counts total;
    struct actor main_actor;
    memset(&total, 0, sizeof total);
    actor_init(&main_actor, thread_seed(MAX_THREADS + 2), "the main thread");
    if (sp->started)
        thread_join(sp->thread);
    counts_add(&total, &sp->a.c);
    for (int i = 0; i < threads; i++)
        if (workers[i]->started)
            thread_join(workers[i]->thread);
    for (int i = 0; i < threads; i++) { /* what is left in the mailboxes: checked and freed */
        struct worker *w = workers[i];
        int n = mailbox_take(&w->inbox, w->taken);
        for (int j = 0; j < n; j++)
            blk_free(&main_actor, &w->taken[j], "after hand-over (left in an inbox at the end)");
        n = mailbox_take(&w->supply, w->taken);
        for (int j = 0; j < n; j++)
            blk_free(&main_actor, &w->taken[j], "of a supplied block (left at the end)");
        counts_add(&total, &w->a.c);
    }
#if SHARD_RULES
    final_checks(&start);
#endif
    counts_add(&total, &main_actor.c);
    double all = now_seconds() - begin;

    int errors = load_int(&error_count);
    if (errors != 0)
        printf("stress: errors: %d; repeat with: %s %s\n", errors, argv[0], run_options);
    printf("stress: %d threads, %.1f s (%.1f s with the end): malloc %llu, calloc %llu, realloc %llu, free %llu, "
           "hand-overs %llu, supplied %llu, short-lived threads %llu, shard_check %llu, shard_thread_done %llu, "
           "shard_collect %llu, shard_visit %llu; errors %d\n",
           threads, ran, all, total.malloc_calls, total.calloc_calls, total.realloc_calls, total.free_calls,
           total.handed, total.supplied, total.short_threads, total.checks, total.thread_done, total.collect,
           total.walks, errors);
    fflush(stdout);
    for (int i = 0; i < threads; i++) {
        free(workers[i]->inbox.blocks);
        free(workers[i]->supply.blocks);
        free(workers[i]);
    }
    free(workers);
    free(sp);
    return errors > 255 ? 255 : errors;
}
