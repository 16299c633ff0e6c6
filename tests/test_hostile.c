/* test_hostile.c - shardmm in processes written to be hostile to their allocator (Linux).
 *
 * Each scenario is a small program of its own: it runs in a fresh process (this program started again
 * with SHARD_HOSTILE="SCENARIO MODE" in its environment) with a time limit, so that what it does to
 * the process - pthread keys used up, atfork handlers, RLIMIT_AS - is done before the allocator's first
 * allocation and touches no other scenario. A scenario prints what it found on stderr and exits 0 when
 * everything held. Every scenario runs in three modes:
 *   glibc    the C library's malloc: the reference, which shows the scenario itself is sound
 *   preload  the same program with LD_PRELOAD=build/libshardmm.so (the drop-in): glibc's own calls of
 *            malloc (pthread_setspecific, pthread_atfork, pthread_create) reach shardmm too
 *   api      build/api/libshardmm.so opened with dlopen when the scenario asks for its first block, and
 *            used through the shard_ names: the allocator starts after the process has done its worst
 *            (keys taken, atfork handlers registered before shardmm's own)
 * Checks of shardmm's own counts (heaps, statistics) are made where shard_get_stats is there.
 *
 * Build: build/test-hostile (build.ninja). Run: build/test-hostile [test names]; a scenario by hand:
 * SHARD_HOSTILE="late-destructor-heaps preload" LD_PRELOAD=build/libshardmm.so build/test-hostile
 */
#define HARNESS_MAIN
#include "harness.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "seccomp.h"
#include "shardmm.h"

#define KB ((size_t)1 << 10)
#define MB ((size_t)1 << 20)
#define SCENARIO_SECONDS 40 /* a scenario that has not ended by then has hung */

/* ---- the allocator of the scenario ---------------------------------------------------------------- */

static struct {
    void *(*malloc)(size_t);
    void (*free)(void *);
    void *(*calloc)(size_t, size_t);
    void *(*realloc)(void *, size_t);
    int (*posix_memalign)(void **, size_t, size_t);
    void *(*aligned_alloc)(size_t, size_t);
    void *(*memalign)(size_t, size_t);
    size_t (*usable)(void *);
    void (*get_stats)(shard_stats *); /* NULL under glibc */
    void (*collect)(void);
    int (*check)(void);
    shard_error_fn (*set_error_hook)(shard_error_fn, void *);
    shard_heap *(*heap_create)(const shard_heap_options *); /* the heap API, NULL under glibc */
    void (*heap_destroy)(shard_heap *);
    void *(*heap_malloc)(shard_heap *, size_t);
} A;
static const char *mode = "glibc";

static size_t usable_const(void *p) { return malloc_usable_size(p); }

/* The api mode's library: build/api/libshardmm.so beside this program. */
static void api_library(char *path, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", path, size - 32);
    if (n <= 0)
        _exit(90);
    path[n] = 0;
    strcpy(strrchr(path, '/') + 1, "api/libshardmm.so");
}

/* Binds A to the mode's allocator; the api mode opens the library now (its first use by the process). */
static void bind_allocator(void)
{
    if (strcmp(mode, "api") == 0) {
        char path[4096];
        api_library(path, sizeof path);
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
            _exit(91);
        }
        A.malloc = (void *(*)(size_t))dlsym(lib, "shard_malloc");
        A.free = (void (*)(void *))dlsym(lib, "shard_free");
        A.calloc = (void *(*)(size_t, size_t))dlsym(lib, "shard_calloc");
        A.realloc = (void *(*)(void *, size_t))dlsym(lib, "shard_realloc");
        A.posix_memalign = (int (*)(void **, size_t, size_t))dlsym(lib, "shard_posix_memalign");
        A.aligned_alloc = (void *(*)(size_t, size_t))dlsym(lib, "shard_aligned_alloc");
        A.memalign = (void *(*)(size_t, size_t))dlsym(lib, "shard_memalign");
        A.usable = (size_t(*)(void *))dlsym(lib, "shard_usable_size");
        A.get_stats = (void (*)(shard_stats *))dlsym(lib, "shard_get_stats");
        A.collect = (void (*)(void))dlsym(lib, "shard_collect");
        A.check = (int (*)(void))dlsym(lib, "shard_check");
        A.set_error_hook = (shard_error_fn(*)(shard_error_fn, void *))dlsym(lib, "shard_set_error_hook");
        A.heap_create = (shard_heap * (*)(const shard_heap_options *)) dlsym(lib, "shard_heap_create");
        A.heap_destroy = (void (*)(shard_heap *))dlsym(lib, "shard_heap_destroy");
        A.heap_malloc = (void *(*)(shard_heap *, size_t))dlsym(lib, "shard_heap_malloc");
        return;
    }
    A.malloc = malloc;
    A.free = free;
    A.calloc = calloc;
    A.realloc = realloc;
    A.posix_memalign = posix_memalign;
    A.aligned_alloc = aligned_alloc;
    A.memalign = memalign;
    A.usable = usable_const;
    A.get_stats = (void (*)(shard_stats *))dlsym(RTLD_DEFAULT, "shard_get_stats");
    A.collect = (void (*)(void))dlsym(RTLD_DEFAULT, "shard_collect");
    A.check = (int (*)(void))dlsym(RTLD_DEFAULT, "shard_check");
    A.set_error_hook = (shard_error_fn(*)(shard_error_fn, void *))dlsym(RTLD_DEFAULT, "shard_set_error_hook");
    A.heap_create = (shard_heap * (*)(const shard_heap_options *)) dlsym(RTLD_DEFAULT, "shard_heap_create");
    A.heap_destroy = (void (*)(shard_heap *))dlsym(RTLD_DEFAULT, "shard_heap_destroy");
    A.heap_malloc = (void *(*)(shard_heap *, size_t))dlsym(RTLD_DEFAULT, "shard_heap_malloc");
    if (strcmp(mode, "preload") == 0 && A.get_stats == NULL) {
        fprintf(stderr, "preload mode without shardmm in the process\n");
        _exit(92);
    }
}

/* ---- what a scenario reports ---------------------------------------------------------------------- */

static int problems;

#define EXPECT(cond, ...)                                                                                  \
    do {                                                                                                   \
        if (!(cond) && ++problems <= 20) {                                                                 \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond);                            \
            fprintf(stderr, __VA_ARGS__);                                                                  \
            fputc('\n', stderr);                                                                           \
        }                                                                                                  \
    } while (0)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The process's resident and virtual size, and its writable private memory with the stack (what
 * RLIMIT_DATA counts, and a little more), bytes (/proc/self/statm). */
static size_t statm_field(int field)
{
    char buf[256];
    int fd = open("/proc/self/statm", O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    unsigned long v[6] = {0, 0, 0, 0, 0, 0};
    sscanf(buf, "%lu %lu %lu %lu %lu %lu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
    return (size_t)v[field] * (size_t)sysconf(_SC_PAGESIZE);
}
static size_t rss_now(void) { return statm_field(1); }
static size_t vsz_now(void) { return statm_field(0); }
static size_t data_now(void) { return statm_field(5); }

static shard_stats stats_now(void)
{
    shard_stats s;
    memset(&s, 0, sizeof s);
    A.get_stats(&s);
    return s;
}
static size_t stats_heaps(void) { return stats_now().heaps; }

/* A block of n bytes with the pattern of seed, checked; NULL (and a problem) when the allocator refused. */
static void *filled(size_t n, uint64_t seed, const char *what)
{
    unsigned char *p = A.malloc(n);
    EXPECT(p != NULL, "%s: malloc(%zu) gave NULL", what, n);
    if (p != NULL)
        fill(p, n, seed);
    return p;
}

static void release(void *p, size_t n, uint64_t seed, const char *what)
{
    if (p == NULL)
        return;
    EXPECT(check_pattern(p, n, seed), "%s: a block of %zu bytes lost its pattern", what, n);
    A.free(p);
}

/* Small, medium and large blocks, calloc and realloc, checked and freed: the allocator works here. */
static void exercise(uint64_t seed, const char *what)
{
    static const size_t sizes[] = {1, 24, 100, 1000, 4000, 16 * KB, 40 * KB, 300 * KB, MB, 3 * MB};
    void *p[sizeof sizes / sizeof *sizes];
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        p[i] = filled(sizes[i], seed + i, what);
    unsigned char *z = A.calloc(1000, 3);
    EXPECT(z != NULL && bytes_not_equal(z, 3000, 0) == 3000, "%s: calloc", what);
    unsigned char *r = A.realloc(z, 70 * KB);
    EXPECT(r != NULL && bytes_not_equal(r, 3000, 0) == 3000, "%s: realloc kept the contents", what);
    A.free(r);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        release(p[i], sizes[i], seed + i, what);
}

static void *exercise_thread(void *arg)
{
    exercise((uint64_t)(uintptr_t)arg, "a thread");
    return NULL;
}

static void run_threads(int n, void *(*fn)(void *), uint64_t seed)
{
    pthread_t t[64];
    for (int i = 0; i < n; i++)
        EXPECT(pthread_create(&t[i], NULL, fn, (void *)(uintptr_t)(seed + 100u * (unsigned)i)) == 0, "thread %d", i);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* ---- scenarios: pthread keys ---------------------------------------------------------------------- */

/* This program's pthread_key_create, exported (build.ninja) so that it stands in for glibc's in the
 * allocator's calls too, and ended by glibc's __pthread_key_create. Its next call (one only) can stall
 * (key_stall: fork-during-start) or allocate (key_allocates: key-create-allocates) first. */
extern int __pthread_key_create(pthread_key_t *key, void (*destructor)(void *));
static int key_stall;                /* 1: the next call stalls until key_forking, then 300 ms more */
static volatile int key_inside;      /* the stalled call has begun */
static volatile int key_forking;     /* the main thread is about to fork */
static int key_allocates;            /* 1: the next call allocates, fills, checks and frees a block */
static volatile int key_allocated;   /* 1 when it did, 2 when the allocation failed */

int pthread_key_create(pthread_key_t *key, void (*destructor)(void *))
{
    if (__atomic_exchange_n(&key_stall, 0, __ATOMIC_ACQ_REL)) {
        key_inside = 1;
        while (!key_forking)
            sched_yield();
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (__atomic_exchange_n(&key_allocates, 0, __ATOMIC_ACQ_REL)) {
        void *p = filled(200, 31, "inside pthread_key_create");
        key_allocated = p != NULL ? 1 : 2;
        release(p, 200, 31, "inside pthread_key_create");
    }
    return __pthread_key_create(key, destructor);
}

/* A pthread_key_create that allocates (a library that wraps it: a profiler's, a leak checker's), called
 * by the allocator's start-up from inside the first allocation of the process: both allocations must
 * work. The start-up once waited for itself there, for ever. Under glibc and the preload the allocator
 * has started before main: the scenario's own call of pthread_key_create allocates instead. */
static void scenario_key_create_allocates(void)
{
    bind_allocator();
    __atomic_store_n(&key_allocates, 1, __ATOMIC_RELEASE);
    void *first = filled(100, 30, "the first block");
    if (strcmp(mode, "api") == 0)
        EXPECT(key_allocated != 0, "the allocator's start-up called pthread_key_create");
    pthread_key_t key;
    if (key_allocated == 0)
        EXPECT(pthread_key_create(&key, NULL) == 0, "pthread_key_create");
    EXPECT(key_allocated == 1, "the allocation inside pthread_key_create: %d", key_allocated);
    release(first, 100, 30, "the first block");
    exercise(9, "main thread");
    run_threads(4, exercise_thread, 90);
}

static int take_keys(pthread_key_t *keys, int most)
{
    int n = 0;
    while (n < most && pthread_key_create(&keys[n], NULL) == 0)
        n++;
    return n;
}

static pthread_key_t many_keys[PTHREAD_KEYS_MAX + 1];
static int many_key_count;

/* Sets every key of the process in the calling thread (glibc allocates the second-level array of keys
 * 32 and above in each thread that sets one), then allocates. */
static void *keys_thread(void *arg)
{
    for (int i = 0; i < many_key_count; i++)
        pthread_setspecific(many_keys[i], arg);
    exercise((uint64_t)(uintptr_t)arg, "a thread that set every key");
    return NULL;
}

/* The allocator's first use once the keys are taken: the main thread, threads that set every key, others. */
static void work_after_keys(uint64_t seed)
{
    bind_allocator();
    exercise(seed, "main thread");
    run_threads(8, keys_thread, seed * 10);
    run_threads(8, exercise_thread, seed * 10 + 5);
}

/* 40 keys before the first block: the allocator's own key is key 40 or above, and setting it makes glibc
 * call calloc for the thread's second-level array while the thread's heap is being set up. */
static void scenario_keys_before_first_malloc(void)
{
    many_key_count = take_keys(many_keys, 40);
    EXPECT(many_key_count == 40, "40 keys, got %d", many_key_count);
    work_after_keys(1);
}

/* Every key but one taken: the allocator may take the last one, and everything works. */
static void scenario_last_free_key(void)
{
    many_key_count = take_keys(many_keys, PTHREAD_KEYS_MAX + 1);
    EXPECT(many_key_count > 100, "keys taken: %d", many_key_count);
    pthread_key_delete(many_keys[--many_key_count]);
    work_after_keys(2);
}

/* Every key taken before the first block: small and medium blocks still work (the allocator cannot have
 * a thread-exit hook), and the heaps of threads that exited are still taken back: 120 short-lived threads,
 * 2 at a time, leave a bounded number of heaps (twice the threads alive, plus 8), not one each. */
static void scenario_no_key_left(void)
{
    many_key_count = take_keys(many_keys, PTHREAD_KEYS_MAX + 1);
    pthread_key_t extra;
    EXPECT(pthread_key_create(&extra, NULL) != 0, "all keys taken");
    bind_allocator();
    exercise(3, "main thread");
    for (int round = 0; round < 60; round++)
        run_threads(2, exercise_thread, 1000u + 10u * (unsigned)round);
    if (A.get_stats != NULL) {
        /* Twice the threads found alive, plus 8 (heap.c); a thread just joined may still count as alive
         * for a moment (the kernel reaps it after the join returns). */
        size_t heaps = stats_heaps();
        EXPECT(heaps <= 24, "heaps after 120 short-lived threads, 2 at a time: %zu", heaps);
    }
}

/* ---- scenarios: fork and atfork handlers ---------------------------------------------------------- */

static int prepared, parented, childed; /* handler calls */
static void count_prepare(void) { prepared++; }
static void count_parent(void) { parented++; }
static void count_child(void) { childed++; }

/* fork(); the child runs in_child() with a time limit (a child that hangs dies of SIGALRM) and exits 0
 * when it answered 1 and found no problem; the parent waits for it. 1 when the child exited 0. */
static int fork_and_check(int (*in_child)(void), const char *what)
{
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        int ok = in_child();
        _exit(ok && problems == 0 ? 0 : 1);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        status = -1;
    int ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    EXPECT(ok, "%s: child %s %d", what, status != -1 && WIFSIGNALED(status) ? "killed by signal" : "status",
           status != -1 && WIFSIGNALED(status) ? WTERMSIG(status) : status);
    return ok;
}

static int child_after_many_handlers(void)
{
    exercise(5, "child");
    return childed == 60;
}

/* 60 atfork handlers before the first block: glibc allocates to grow its list of handlers from the 49th
 * on, inside its own lock (and the allocator registers its own handlers too). */
static void scenario_atfork_many_before_first_malloc(void)
{
    for (int i = 0; i < 60; i++)
        EXPECT(pthread_atfork(count_prepare, count_parent, count_child) == 0, "handler %d", i);
    bind_allocator();
    exercise(4, "main thread");
    run_threads(4, exercise_thread, 50);
    fork_and_check(child_after_many_handlers, "fork after 60 handlers");
    EXPECT(prepared == 60 && parented == 60, "handlers ran: %d %d", prepared, parented);
}

/* Handlers that allocate and free blocks of every kind. The allocator's own handlers hold its locks from
 * its prepare to its parent/child handler, and handlers registered before them (in the api mode: all of
 * these) run in between; they must still be able to allocate and free, as under glibc. */
static void *kept_large;          /* a large block freed by a prepare handler */
static void *page_blocks[64];     /* small blocks of one page, freed by a prepare handler (the page empties) */
static size_t page_block_count;
static int handler_problems;

static void handler_work(uint64_t seed)
{
    static const size_t sizes[] = {32, 3000, 100 * KB, 2 * MB, 5 * MB};
    void *p[5];
    for (int i = 0; i < 5; i++) {
        p[i] = A.malloc(sizes[i]);
        if (p[i] == NULL) {
            handler_problems++;
            continue;
        }
        fill(p[i], sizes[i], seed + (uint64_t)i);
    }
    for (int i = 4; i >= 0; i--) {
        if (p[i] != NULL && !check_pattern(p[i], sizes[i], seed + (uint64_t)i))
            handler_problems++;
        A.free(p[i]);
    }
}

static void alloc_prepare(void)
{
    A.free(kept_large); /* into the large cache, under its lock */
    kept_large = NULL;
    for (size_t i = 0; i < page_block_count; i++)
        A.free(page_blocks[i]); /* the last one empties its page: a look at the large cache's age */
    page_block_count = 0;
    handler_work(100);
}
static void alloc_parent(void) { handler_work(200); }
static void alloc_child(void) { handler_work(300); }

static volatile int background_stop;

/* Keeps every lock of the allocator busy: large blocks (the cache), new threads (heaps), medium blocks. */
static void *background(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    while (!background_stop) {
        void *big = A.malloc(MB + (seed % 7) * 100 * KB);
        void *mid = A.malloc(50 * KB);
        if (big)
            memset(big, 1, 4096);
        A.free(mid);
        A.free(big);
        seed++;
    }
    return NULL;
}

static void *short_lived(void *arg)
{
    void *p = A.malloc(100 + (uintptr_t)arg % 1000);
    A.free(p);
    return NULL;
}

static void *churn(void *arg)
{
    (void)arg;
    while (!background_stop) {
        pthread_t t;
        if (pthread_create(&t, NULL, short_lived, (void *)(uintptr_t)rand()) == 0)
            pthread_join(t, NULL);
    }
    return NULL;
}

static int child_after_allocating_handlers(void)
{
    handler_work(400);
    exercise(500, "child");
    return handler_problems == 0;
}

/* fork_and_check from a new thread, which has not allocated yet (its first block is a handler's). */
struct fork_request {
    int (*in_child)(void);
    const char *what;
};

static void *fork_thread(void *arg)
{
    struct fork_request *r = arg;
    fork_and_check(r->in_child, r->what);
    return NULL;
}

static void fork_from_new_thread(int (*in_child)(void), const char *what)
{
    struct fork_request r = {in_child, what};
    pthread_t t;
    if (pthread_create(&t, NULL, fork_thread, &r) == 0)
        pthread_join(t, NULL);
}

static void scenario_atfork_handlers_allocate(void)
{
    EXPECT(pthread_atfork(alloc_prepare, alloc_parent, alloc_child) == 0, "handler");
    bind_allocator();
    exercise(6, "main thread");
    pthread_t bg[3];
    for (int i = 0; i < 2; i++)
        pthread_create(&bg[i], NULL, background, (void *)(uintptr_t)(i * 1000));
    pthread_create(&bg[2], NULL, churn, NULL);
    for (int i = 0; i < 40; i++) {
        if (i % 10 == 0) {
            /* A large block freed now waits in the cache past its delay; the page emptied by the prepare
             * handler then makes the allocator look at (and lock) the cache. */
            void *old = A.malloc(3 * MB);
            A.free(old);
            struct timespec ts = {1, 100000000};
            nanosleep(&ts, NULL);
        }
        kept_large = A.malloc(2 * MB);
        for (page_block_count = 0; page_block_count < 64; page_block_count++)
            page_blocks[page_block_count] = A.malloc(1008); /* a class of its own: 64 fill a page */
        fork_from_new_thread(child_after_allocating_handlers, "fork with allocating handlers");
    }
    background_stop = 1;
    for (int i = 0; i < 3; i++)
        pthread_join(bg[i], NULL);
    EXPECT(handler_problems == 0, "handlers' blocks: %d problems", handler_problems);
}

/* A library whose fork handlers do what libraries do (registered before shardmm's in the api mode, so
 * its prepare handler runs while shardmm holds its locks, and its child handler before shardmm's):
 * - its prepare handler takes a mutex of its own, which its other threads hold while they allocate and
 *   free large blocks (glibc takes its malloc locks after every prepare handler, so this works there:
 *   the allocator's other threads must not wait for the fork's locks);
 * - its prepare handler frees a pointer that is not a block, with an error hook installed (the hook is
 *   called, nothing waits);
 * - its child handler, on a forking thread that has no heap yet, allocates and calls shard_collect; the
 *   child then finds no heap of the parent's other threads reused (they may be in the middle of a change)
 *   and shard_check clean. */
static pthread_mutex_t library_mutex = PTHREAD_MUTEX_INITIALIZER;
static int hook_calls;
static char not_a_block[64];

static void count_hook(void *arg, int error, void *p)
{
    (void)arg, (void)error, (void)p;
    hook_calls++;
}

static void library_prepare(void)
{
    pthread_mutex_lock(&library_mutex);
    if (A.set_error_hook != NULL)
        A.free(not_a_block + 16);
}
static void library_parent(void) { pthread_mutex_unlock(&library_mutex); }
static void library_child(void)
{
    pthread_mutex_unlock(&library_mutex);
    void *p = A.malloc(64); /* this thread's first block */
    A.free(p);
    if (A.collect != NULL)
        A.collect();
}

static void *library_worker(void *arg)
{
    size_t n = MB + 4096 + (uintptr_t)arg;
    while (!background_stop) {
        pthread_mutex_lock(&library_mutex);
        void *p = A.malloc(n), *q = A.malloc(300);
        A.free(q);
        A.free(p);
        pthread_mutex_unlock(&library_mutex);
    }
    return NULL;
}

static void *small_worker(void *arg)
{
    void *b[256];
    for (int i = 0; i < 256; i++)
        b[i] = A.malloc(48 + (uintptr_t)arg);
    while (!background_stop)
        for (int i = 0; i < 256; i++) {
            A.free(b[i]);
            b[i] = A.malloc(48 + (uintptr_t)arg);
        }
    for (int i = 0; i < 256; i++)
        A.free(b[i]);
    return NULL;
}

static int child_after_library_handlers(void)
{
    shard_stats s = A.get_stats != NULL ? stats_now() : (shard_stats){0};
    int clean = A.check == NULL || (s.heaps_free <= 1 && A.check() == 0);
    exercise(600, "child");
    return clean;
}

static void scenario_atfork_library_locks(void)
{
    EXPECT(pthread_atfork(library_prepare, library_parent, library_child) == 0, "handler");
    bind_allocator();
    if (A.set_error_hook != NULL)
        A.set_error_hook(count_hook, NULL);
    pthread_t w[4];
    for (int i = 0; i < 2; i++)
        pthread_create(&w[i], NULL, library_worker, (void *)(uintptr_t)(i * 4096));
    for (int i = 2; i < 4; i++)
        pthread_create(&w[i], NULL, small_worker, (void *)(uintptr_t)(i * 16));
    for (int i = 0; i < 100; i++)
        fork_from_new_thread(child_after_library_handlers, "fork with a library's locking handlers");
    background_stop = 1;
    for (int i = 0; i < 4; i++)
        pthread_join(w[i], NULL);
    EXPECT(A.set_error_hook == NULL || hook_calls == 100, "the error hook saw %d of 100 frees of a non-block",
           hook_calls);
}

/* An engine's heap destroyed by one thread while another forks: a library's prepare handler (registered
 * before shardmm's in the api mode, so it runs while shardmm holds its locks) lets a thread destroy a heap
 * holding a large, a medium and a small block, and waits for the destroy to return, which must not wait
 * for the fork's locks. The heap's blocks must then be gone as after any destroy: once the fork is over,
 * shard_collect leaves the statistics' live large and medium blocks where they were before the heap. */
static shard_heap *fork_victim;
static int destroy_go, destroy_done;

static void *destroyer(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&destroy_go, __ATOMIC_ACQUIRE))
        sched_yield();
    A.heap_destroy(fork_victim);
    __atomic_store_n(&destroy_done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void destroyer_prepare(void)
{
    if (fork_victim == NULL || __atomic_load_n(&destroy_go, __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&destroy_go, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&destroy_done, __ATOMIC_ACQUIRE)) /* the scenario's alarm ends a destroy that waits */
        sched_yield();
}

static int child_after_destroy(void)
{
    exercise(800, "child");
    return A.check == NULL || A.check() == 0;
}

static void scenario_destroy_during_fork(void)
{
    EXPECT(pthread_atfork(destroyer_prepare, NULL, NULL) == 0, "handler");
    bind_allocator();
    if (A.heap_create == NULL) { /* glibc: the fork alone */
        fork_and_check(child_after_destroy, "fork");
        return;
    }
    shard_stats before = stats_now();
    fork_victim = A.heap_create(NULL);
    EXPECT(fork_victim != NULL, "shard_heap_create");
    if (fork_victim == NULL)
        return;
    static const size_t sizes[] = {3 * MB, 100 * KB, 100};
    for (size_t i = 0; i < 3; i++) {
        unsigned char *p = A.heap_malloc(fork_victim, sizes[i]);
        EXPECT(p != NULL, "shard_heap_malloc(%zu)", sizes[i]);
        if (p != NULL)
            fill(p, sizes[i], 900 + i);
    }
    shard_stats full = stats_now();
    EXPECT(full.live_large == before.live_large + 1 && full.live_medium == before.live_medium + 1,
           "the heap's blocks counted: large %zu to %zu, medium %zu to %zu", before.live_large, full.live_large,
           before.live_medium, full.live_medium);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, destroyer, NULL) == 0, "thread");
    fork_and_check(child_after_destroy, "fork while another thread destroys a heap");
    pthread_join(t, NULL);
    EXPECT(destroy_done, "the destroy returned");
    A.collect();
    shard_stats after = stats_now();
    EXPECT(after.live_large == before.live_large && after.live_large_bytes == before.live_large_bytes,
           "live large blocks after the destroy and shard_collect: %zu (%zu bytes), %zu (%zu bytes) before the heap",
           after.live_large, after.live_large_bytes, before.live_large, before.live_large_bytes);
    EXPECT(after.live_medium == before.live_medium, "live medium blocks after the destroy: %zu, %zu before",
           after.live_medium, before.live_medium);
    EXPECT(A.check() == 0, "shard_check after the destroy");
    exercise(810, "main thread after the fork");
}

/* The first blocks of the process are large ones, allocated and freed by two threads in a tight loop
 * (the large-block cache's lock is held much of the time), while the main thread forks: every child must
 * be able to allocate. The fork handlers must be in place from the first allocation of any kind. */
static void *large_only(void *arg)
{
    size_t n = MB + 4096 + (uintptr_t)arg; /* above 1 MB: large */
    while (!background_stop) {
        void *p = A.malloc(n);
        A.free(p);
    }
    return NULL;
}

static int child_large_block(void)
{
    void *p = A.malloc(2 * MB);
    if (p != NULL)
        memset(p, 7, 2 * MB);
    A.free(p);
    return p != NULL;
}

static void scenario_first_blocks_large_then_fork(void)
{
    bind_allocator();
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, large_only, (void *)(uintptr_t)(i * 4096));
    for (int i = 0; i < 300; i++)
        if (!fork_and_check(child_large_block, "fork while large blocks come and go"))
            break;
    background_stop = 1;
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
}

/* A fork while another thread makes the allocator's first allocation, between its start-up's reading of
 * the options and its asking for the thread-exit hook (pthread_key_create): every child must be able to
 * allocate. A child once hung here: the start-up was marked as under way by a thread the child does not
 * have, and its first allocation waited for that thread for ever (a CI run of first_blocks_large_then_fork
 * under api, whose threads start the library while the main thread forks). The api mode holds the
 * starting thread inside pthread_key_create (this program's: key_stall) from the main thread's word that
 * it forks, for 300 ms, more than a fork takes to reach its handlers. Under glibc and the preload the
 * allocator has started before main, and the fork is made while the thread allocates. */
static void *first_block_thread(void *arg)
{
    (void)arg;
    void *p = A.malloc(2 * MB);
    if (p != NULL)
        memset(p, 3, 2 * MB);
    A.free(p);
    return p;
}

static int child_blocks(void)
{
    exercise(821, "child");
    return child_large_block();
}

static void scenario_fork_during_start(void)
{
    bind_allocator();
    int api = strcmp(mode, "api") == 0;
    __atomic_store_n(&key_stall, api, __ATOMIC_RELEASE);
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, first_block_thread, NULL) == 0, "thread");
    for (uint64_t start = now_ms(); api && !key_inside && now_ms() - start < 5000;)
        sched_yield();
    EXPECT(!api || key_inside, "the allocator's start-up called pthread_key_create");
    key_forking = 1;
    fork_and_check(child_blocks, "fork while another thread starts the allocator");
    void *first = NULL;
    pthread_join(t, &first);
    EXPECT(first != NULL, "the starting thread's block");
    exercise(820, "main thread after the fork");
}

/* ---- scenarios: exited threads -------------------------------------------------------------------- */

/* A thread whose first block is allocated by a destructor in glibc's last round of key destructors: the
 * allocator's key was seen empty in that round, so its exit hook never runs for the heap made then. */
static pthread_key_t late_key;
static void *late_blocks[256];
static int late_count;

static void late_destructor(void *value)
{
    uintptr_t round = (uintptr_t)value;
    if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
        pthread_setspecific(late_key, (void *)(round + 1));
        return;
    }
    void *p = A.malloc(200); /* the thread's first block, kept: main frees it */
    void *q = A.malloc(40 * KB);
    if (p != NULL)
        fill(p, 200, (uint64_t)late_count);
    late_blocks[late_count++] = p;
    A.free(q);
}

static void *late_thread(void *arg)
{
    (void)arg;
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

static void scenario_late_destructor_heaps(void)
{
    bind_allocator();
    exercise(7, "main thread"); /* the allocator's key first: a lower index than late_key */
    EXPECT(pthread_key_create(&late_key, late_destructor) == 0, "key");
    for (int i = 0; i < 200; i++) {
        pthread_t t;
        EXPECT(pthread_create(&t, NULL, late_thread, NULL) == 0, "thread %d", i);
        pthread_join(t, NULL);
    }
    EXPECT(late_count == 200, "destructors that allocated: %d", late_count);
    for (int i = 0; i < late_count; i++)
        release(late_blocks[i], 200, (uint64_t)i, "a late destructor's block");
    if (A.get_stats != NULL) {
        size_t heaps = stats_heaps();
        EXPECT(heaps <= 24, "heaps after 200 threads, one at a time, each first allocating in its last "
                            "round of destructors: %zu", heaps);
    }
}

/* Waits until measure() is at most `limit`, doing a little allocator work (a medium block: a slow path)
 * every 50 ms, for at most `ms`; the time it took, or -1. */
static long wait_until(size_t (*measure)(void), size_t limit, long ms)
{
    uint64_t start = now_ms();
    for (;;) {
        long took = (long)(now_ms() - start);
        if (measure() <= limit)
            return took;
        if (took > ms)
            return -1;
        void *p = A.malloc(64 * KB);
        A.free(p);
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
}

/* A loader thread allocates 100 MB of small blocks and 100 MB of medium ones, hands them to the main
 * thread and exits; the main thread frees them all. The memory goes back within about a second. */
#define LOADED_SMALL (100 * MB)
#define LOADED_MEDIUM (100 * MB)
static void **loaded;
static size_t loaded_count;

/* Appends blocks of least + (random % spread) bytes, each filled, to `loaded` until they hold `bytes`. */
static void load(uint64_t *rng, size_t bytes, size_t least, size_t spread, size_t cap)
{
    for (size_t held = 0; held < bytes && loaded_count < cap;) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = least + (*rng >> 33) % spread;
        unsigned char *p = A.malloc(n);
        if (p == NULL)
            break;
        memset(p, (int)(n & 0xff), n);
        loaded[loaded_count++] = p;
        held += n;
    }
}

static void *loader(void *arg)
{
    (void)arg;
    size_t cap = LOADED_SMALL / 16 + LOADED_MEDIUM / (16 * KB);
    loaded = A.malloc(cap * sizeof *loaded);
    uint64_t rng = 12345;
    load(&rng, LOADED_SMALL, 16, 2000, cap);
    load(&rng, LOADED_MEDIUM, 20 * KB, 400 * KB, cap);
    return NULL;
}

static void scenario_exited_thread_memory_returned(void)
{
    bind_allocator();
    exercise(8, "main thread");
    size_t base = rss_now();
    pthread_t t;
    pthread_create(&t, NULL, loader, NULL);
    pthread_join(t, NULL);
    size_t full = rss_now();
    EXPECT(full > base + 150 * MB, "the loader's blocks are resident: %zu MB over %zu", (full - base) >> 20, base >> 20);
    for (size_t i = 0; i < loaded_count; i++)
        A.free(loaded[i]);
    A.free(loaded);
    long took = wait_until(rss_now, base + 32 * MB, 3000);
    EXPECT(took >= 0, "resident memory back within 32 MB of %zu MB in 3 s: %zu MB", base >> 20, rss_now() >> 20);
    fprintf(stderr, "exited thread's memory: %zu MB resident with the blocks, back to %zu MB (base %zu) in %ld ms\n",
            full >> 20, rss_now() >> 20, base >> 20, took);
}

/* 100 threads at once each use 5 MB of small and medium blocks, free everything and exit. The heaps
 * they leave, and the spare segments, keep their memory for about a second, then nothing. */
static pthread_barrier_t idle_barrier;

static void *five_mb_thread(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg * 7919u + 1;
    void *blocks[2000];
    size_t n = 0, bytes = 0;
    while (bytes < 5 * MB && n < 2000) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t size = (rng >> 60) < 8 ? 16 + (rng >> 33) % 4000 : 20 * KB + (rng >> 33) % (100 * KB);
        unsigned char *p = A.malloc(size);
        if (p == NULL)
            break;
        memset(p, 3, size);
        blocks[n++] = p;
        bytes += size;
    }
    pthread_barrier_wait(&idle_barrier);
    for (size_t i = 0; i < n; i++)
        A.free(blocks[i]);
    pthread_barrier_wait(&idle_barrier);
    return NULL;
}

static size_t committed_now(void) { return stats_now().committed; }

/* glibc keeps some of its threads' arenas (80 MB after 100 threads, 143 MB after 500 here), so the
 * reference run only shows the scenario works; under shardmm the heaps of the exited threads keep
 * nothing but their own descriptors (about 16 KB each) once the delay has passed, or at once after
 * shard_collect. */
static void idle_heaps(int threads, int collect)
{
    bind_allocator();
    exercise(9, "main thread");
    size_t base = rss_now(), base_committed = A.get_stats ? committed_now() : 0;
    size_t slack = (size_t)threads * 16 * KB + 8 * MB;
    pthread_barrier_init(&idle_barrier, NULL, (unsigned)threads);
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 128 * KB);
    for (int i = 0; i < threads; i++)
        EXPECT(pthread_create(&t[i], &attr, five_mb_thread, (void *)(uintptr_t)i) == 0, "thread %d", i);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    size_t after = rss_now();
    long took = 0;
    if (A.get_stats != NULL) {
        /* At most 8 of the exited threads' heaps keep a reserve (of what each used, about 5 MB), and at most
         * 32 empty segments and arenas of 4 MB wait as spare ones for any thread. */
        EXPECT(committed_now() <= base_committed + slack + 8 * 6 * MB + 32 * 4 * MB,
               "committed as the threads ended: %zu MB, %zu before", committed_now() >> 20, base_committed >> 20);
        if (collect) {
            A.collect();
            EXPECT(committed_now() <= base_committed + slack, "after shard_collect: %zu MB committed, %zu before",
                   committed_now() >> 20, base_committed >> 20);
        } else {
            took = wait_until(committed_now, base_committed + slack, 3000);
            EXPECT(took >= 0, "committed within %zu MB of %zu MB after 3 s: %zu MB", slack >> 20, base_committed >> 20,
                   committed_now() >> 20);
        }
        EXPECT(rss_now() <= base + slack + 40 * MB, "resident %zu MB, base %zu (glibc's stack cache: 40 MB)",
               rss_now() >> 20, base >> 20);
    } else {
        struct timespec ts = {1, 500000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "%d exited threads: %zu MB resident at their exit, %zu MB after %ld ms (base %zu)\n", threads,
            after >> 20, rss_now() >> 20, took, base >> 20);
    free(t);
}

static void scenario_idle_heaps_100(void) { idle_heaps(100, 0); }
static void scenario_idle_heaps_500(void) { idle_heaps(500, 0); }
static void scenario_idle_heaps_collect(void) { idle_heaps(100, 1); }

/* The library closed (dlclose) while threads that allocated still run: a plug-in that links shardmm in,
 * or an engine that opened it, unloaded. Each such thread's exit calls the allocator's thread-exit hook,
 * which must not be code that is gone: a thread exit crashed (SIGSEGV) there. The library keeps itself
 * loaded (port/linux.c), so the threads exit and its blocks still work. Under glibc and the preload
 * there is nothing to close: the threads exit as usual. */
static volatile int closed_lib;

static void *allocates_then_waits(void *arg)
{
    void *p = filled(300, (uintptr_t)arg, "a block made before the close");
    while (!closed_lib)
        sched_yield();
    release(p, 300, (uintptr_t)arg, "a block made before the close");
    return NULL;
}

static void scenario_closed_while_threads_run(void)
{
    bind_allocator();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        EXPECT(pthread_create(&t[i], NULL, allocates_then_waits, (void *)(uintptr_t)(40 + i)) == 0, "thread");
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (strcmp(mode, "api") == 0) {
        char path[4096];
        api_library(path, sizeof path);
        void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD); /* bind_allocator's, counted again */
        EXPECT(lib != NULL, "the library is open");
        EXPECT(lib != NULL && dlclose(lib) == 0 && dlclose(lib) == 0, "dlclose, twice");
    }
    closed_lib = 1;
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    exercise(830, "main thread after the close");
    run_threads(2, exercise_thread, 840);
}

/* ---- scenarios: address space --------------------------------------------------------------------- */

/* RLIMIT_AS (or RLIMIT_DATA) set to what the process has now plus extra bytes. */
static void limit_address_space(int resource, size_t extra)
{
    struct rlimit rl;
    rl.rlim_cur = rl.rlim_max = (resource == RLIMIT_AS ? vsz_now() : data_now()) + extra;
    EXPECT(setrlimit(resource, &rl) == 0, "setrlimit");
}

/* How many blocks of n bytes fit (each filled), then all freed. */
static size_t fill_up(size_t n, void **blocks, size_t most)
{
    size_t count = 0;
    while (count < most) {
        unsigned char *p = A.malloc(n);
        if (p == NULL)
            break;
        memset(p, 0x5a, n < 4096 ? n : 4096);
        blocks[count++] = p;
    }
    return count;
}

static void free_all(void **blocks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        A.free(blocks[i]);
}

#define AS_LIMIT (512 * MB)
#define LARGE_N ((size_t)1100000) /* 1.1 MB */

/* Under RLIMIT_AS, or RLIMIT_DATA (writable private memory only, which the allocator's inaccessible
 * headroom is not, but a large block's commit up to its next 2 MB and a pool's 1 GB were): large blocks
 * fit about as many as the limit holds; after small blocks filled the limit and were freed, medium and
 * large blocks work again at once; cached large blocks give way. Under RLIMIT_DATA 1.1 MB blocks once
 * fitted 55 % of the ideal (each counted 2 MB). */
static void blocks_under_a_limit(int resource)
{
    static void *blocks[8 * 1024 * 1024 / 8];
    bind_allocator();
    if (resource == RLIMIT_DATA) /* before the first large block, as a shell's ulimit -d */
        limit_address_space(resource, AS_LIMIT);
    exercise(10, "main thread");
    void *probe = mmap(NULL, AS_LIMIT + 64 * MB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(probe != MAP_FAILED, "room for the test");
    munmap(probe, AS_LIMIT + 64 * MB);
    if (resource == RLIMIT_AS)
        limit_address_space(resource, AS_LIMIT);
    size_t ideal = AS_LIMIT / (LARGE_N + 4096);
    size_t large = fill_up(LARGE_N, blocks, 4096);
    fprintf(stderr, "1.1 MB blocks under a limit of %zu MB (%s): %zu (ideal %zu)\n", AS_LIMIT >> 20,
            resource == RLIMIT_AS ? "RLIMIT_AS" : "RLIMIT_DATA", large, ideal);
    EXPECT(large >= ideal * 85 / 100, "1.1 MB blocks: %zu, at least 85 %% of %zu", large, ideal);
    free_all(blocks, large);

    size_t small = fill_up(1000, blocks, sizeof blocks / sizeof *blocks);
    fprintf(stderr, "1000-byte blocks under the limit: %zu (%zu MB)\n", small, small * 1000 >> 20);
    EXPECT(small * 1000 >= AS_LIMIT / 2, "small blocks: %zu", small);
    free_all(blocks, small);
    void *m = filled(200 * KB, 11, "a medium block after the small ones were freed");
    void *l = filled(8 * MB, 12, "a large block after the small ones were freed");
    release(l, 8 * MB, 12, "large");
    release(m, 200 * KB, 11, "medium");

    for (int i = 0; i < 20; i++)
        blocks[i] = filled(1500 * KB, 13, "a 1.5 MB block");
    for (int i = 0; i < 20; i++)
        A.free(blocks[i]); /* into the cache */
    size_t big = fill_up(64 * MB, blocks, 64);
    fprintf(stderr, "64 MB blocks with 20 freed 1.5 MB blocks cached: %zu\n", big);
    EXPECT(big >= 6, "64 MB blocks: %zu", big);
    free_all(blocks, big);
    large = fill_up(LARGE_N, blocks, 4096);
    EXPECT(large >= ideal * 85 / 100, "1.1 MB blocks again: %zu", large);
    free_all(blocks, large);
}

static void scenario_address_space_limit(void) { blocks_under_a_limit(RLIMIT_AS); }
static void scenario_data_limit(void) { blocks_under_a_limit(RLIMIT_DATA); }

/* A thread's first small and medium blocks under mlockall, and what they made resident: the thread's
 * stack is locked whole when the thread starts, so the count starts in the thread. */
struct locked_thread {
    size_t grew;
};
static void *locked_thread(void *arg)
{
    struct locked_thread *r = arg;
    enum { SMALL = 100 };
    void *small[SMALL];
    size_t before = rss_now();
    for (int i = 0; i < SMALL; i++)
        small[i] = filled(64, 870u + (unsigned)i, "a thread's small block");
    unsigned char *medium = filled(100 * KB, 871, "a thread's medium block");
    r->grew = rss_now() - before;
    release(medium, 100 * KB, 871, "a thread's medium block");
    for (int i = 0; i < SMALL; i++)
        release(small[i], 64, 870u + (unsigned)i, "a thread's small block");
    return NULL;
}

/* A process that locks its memory (mlockall with MCL_FUTURE, as real-time audio programs do, with the
 * privilege or a large enough RLIMIT_MEMLOCK): every new writable mapping is made resident and locked
 * whole when it is made. The allocator's 1 GB pools (port/linux.c) then took 1 GB of resident memory
 * for a first 2 MB block, and a thread's first small and medium blocks 8 MB: a segment and an arena
 * that the Linux port commits whole for huge pages. A 2 MB block must cost about 2 MB, a thread's first
 * blocks (6.4 KB of small ones, 100 KB) less than 2 MB, as under glibc, whose arena for the thread
 * commits 132 KB; the allocator works. With MCL_CURRENT, what is mapped when it is called becomes
 * resident: blocks made before it (6 MB of small blocks and a 3 MB one, so that the pools exist) may
 * cost what they hold and a little more, not the 1 GB of a pool mapped read/write whole (as pools were
 * until 2026-12-07). Where the process may not lock its memory (mlockall refused), there is nothing to
 * test. */
static void scenario_locked_memory(void)
{
    enum { EARLY = 6 * 1024 * 1024 / 64 };
    static void *early[EARLY];
    bind_allocator();
    for (size_t i = 0; i < EARLY; i++)
        early[i] = filled(64, 840u + (unsigned)(i % 7), "a small block before mlockall");
    void *early_large = filled(3 * MB, 849, "a 3 MB block before mlockall");
    size_t unlocked = rss_now();
    if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
        fprintf(stderr, "mlockall refused (%s): not tested\n", strerror(errno));
        release(early_large, 3 * MB, 849, "a 3 MB block");
        for (size_t i = 0; i < EARLY; i++)
            release(early[i], 64, 840u + (unsigned)(i % 7), "a small block");
        return;
    }
    size_t before = rss_now();
    fprintf(stderr, "resident before mlockall %zu KB, after %zu KB\n", unlocked >> 10, before >> 10);
    EXPECT(before < unlocked + 64 * MB, "mlockall with 9 MB of blocks: resident %zu KB to %zu KB", unlocked >> 10,
           before >> 10);
    unsigned char *p = filled(2 * MB, 50, "a 2 MB block");
    size_t after = rss_now();
    fprintf(stderr, "resident before a 2 MB block %zu KB, after %zu KB\n", before >> 10, after >> 10);
    EXPECT(after < before + 16 * MB, "a 2 MB block under mlockall: resident %zu KB to %zu KB", before >> 10,
           after >> 10);
    release(p, 2 * MB, 50, "a 2 MB block");
    struct locked_thread r = {0};
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, locked_thread, &r) == 0, "a thread under mlockall");
    pthread_join(t, NULL);
    fprintf(stderr, "a thread's first small and medium blocks made %zu KB resident\n", r.grew >> 10);
    EXPECT(r.grew < 2 * MB, "a thread's first small and medium blocks under mlockall: %zu KB resident",
           r.grew >> 10);
    exercise(850, "main thread, memory locked");
    run_threads(2, exercise_thread, 860);
    munlockall();
    release(early_large, 3 * MB, 849, "a 3 MB block made before mlockall");
    for (size_t i = 0; i < EARLY; i++)
        release(early[i], 64, 840u + (unsigned)(i % 7), "a small block made before mlockall");
}

/* ---- scenarios: a sandbox --------------------------------------------------------------------------- */

/* A seccomp filter, for every thread of the process, under which mmap of 4 MB or more fails (ENOMEM):
 * the size of a segment's or an arena's reservation of its own. 0, or -1 where the process may not
 * install one (a container's own filter may forbid it). */
static int big_mappings_refused(void)
{
    struct sock_filter code[] = {
        FILTER_ONE_CALL(SYS_mmap),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2), /* 4 GB or more */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 4u << 20, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOMEM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    return filter_install(code, sizeof code / sizeof code[0], SECCOMP_FILTER_FLAG_TSYNC);
}

struct sandboxed_thread {
    size_t medium_blocks; /* of 100 KB, filled and checked */
};

static void *sandboxed_thread(void *arg)
{
    struct sandboxed_thread *r = arg;
    void *medium[32];
    for (size_t i = 0; i < 32; i++)
        medium[i] = filled(100 * KB, 890u + (unsigned)i, "a sandboxed thread's medium block");
    void *small = filled(64, 889, "a sandboxed thread's small block");
    for (size_t i = 0; i < 32; i++)
        if (medium[i] != NULL)
            r->medium_blocks++;
    release(small, 64, 889, "a sandboxed thread's small block");
    for (size_t i = 0; i < 32; i++)
        release(medium[i], 100 * KB, 890u + (unsigned)i, "a sandboxed thread's medium block");
    return NULL;
}

/* A process whose sandbox forbids new mappings once it runs (a seccomp filter installed after start-up,
 * as browsers' renderers and plugin hosts have): here mmap of 4 MB or more fails. A heap that has grown
 * past its first segment keeps growing: the Linux port carves the segments, arenas and large blocks it
 * reserves from the 1 GB pools it keeps (port/linux.c), made before the filter, and so without a mapping
 * of their own: 24 MB more of small blocks, a new thread's first medium ones (its first arena: from the
 * pool made without the huge-page hint), a 6 MB block. glibc grows its main arena by brk instead, and
 * serves the thread there. Not tested where the kernel's overcommit mode allows no pools (strict) or the
 * process may not install the filter. */
static void scenario_mappings_forbidden(void)
{
    enum { BEFORE = 8 * 1024 * 1024 / 64, AFTER = 24 * 1024 * 1024 / 64 };
    bind_allocator();
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int overcommit = f != NULL ? fgetc(f) : '2';
    if (f != NULL)
        fclose(f);
    if (overcommit != '0' && overcommit != '1') {
        fprintf(stderr, "strict overcommit, no pools: not tested\n");
        return;
    }
    static uint64_t *blocks[BEFORE + AFTER];
    for (size_t i = 0; i < BEFORE; i++)
        blocks[i] = filled(64, i, "a small block before the filter");
    pthread_attr_t attr; /* a small stack: a thread's default 8 MB stack would be a mapping the filter refuses */
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * KB);
    if (big_mappings_refused() != 0) {
        fprintf(stderr, "no seccomp filter here: not tested\n");
        for (size_t i = 0; i < BEFORE; i++)
            release(blocks[i], 64, i, "a small block");
        return;
    }
    size_t made = 0;
    for (size_t i = BEFORE; i < BEFORE + AFTER; i++) {
        blocks[i] = filled(64, i, "a small block under the filter");
        made += blocks[i] != NULL;
        if (blocks[i] == NULL)
            break;
    }
    struct sandboxed_thread r = {0};
    pthread_t t;
    int started = pthread_create(&t, &attr, sandboxed_thread, &r) == 0;
    EXPECT(started, "a thread with a 256 KB stack under the filter");
    if (started)
        pthread_join(t, NULL);
    unsigned char *big = filled(6 * MB, 888, "a 6 MB block under the filter");
    fprintf(stderr, "under the filter: %zu small blocks of %d, %zu medium blocks of 32 in a new thread, a 6 MB "
            "block %s\n", made, AFTER, r.medium_blocks, big != NULL ? "made" : "refused");
    EXPECT(made == AFTER, "24 MB more of small blocks under the filter: %zu of %d made", made, AFTER);
    EXPECT(r.medium_blocks == 32, "a new thread's medium blocks under the filter: %zu of 32", r.medium_blocks);
    release(big, 6 * MB, 888, "a 6 MB block");
    for (size_t i = 0; i < BEFORE + made; i++)
        release(blocks[i], 64, i, "a small block");
    exercise(880, "main thread, mappings forbidden");
    pthread_attr_destroy(&attr);
}

/* ---- scenarios: aligned allocation ---------------------------------------------------------------- */

static void scenario_aligned_large(void)
{
    bind_allocator();
    static const size_t aligns[] = {4 * MB, 8 * MB, 64 * MB, (size_t)1 << 30};
    static const size_t sizes[] = {1, 100, 3 * MB, 20 * MB};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        for (size_t j = 0; j < sizeof sizes / sizeof *sizes; j++) {
            size_t a = aligns[i], n = sizes[j];
            void *p = NULL;
            int r = A.posix_memalign(&p, a, n);
            EXPECT(r == 0 && p != NULL && ((uintptr_t)p & (a - 1)) == 0, "posix_memalign(%zu, %zu): %d %p", a, n, r, p);
            if (r == 0) {
                fill(p, n, a + n);
                EXPECT(A.usable(p) >= n, "usable size %zu of %zu", A.usable(p), n);
                unsigned char *q = A.realloc(p, n + 5 * MB);
                EXPECT(q != NULL && check_pattern(q, n, a + n), "realloc of an aligned block");
                A.free(q != NULL ? q : p);
            }
            void *q = A.aligned_alloc(a, n);
            EXPECT(q != NULL && ((uintptr_t)q & (a - 1)) == 0, "aligned_alloc(%zu, %zu): %p", a, n, q);
            if (q != NULL) {
                fill(q, n, 5);
                release(q, n, 5, "aligned_alloc");
            }
            void *m = A.memalign(a, n);
            EXPECT(m != NULL && ((uintptr_t)m & (a - 1)) == 0, "memalign(%zu, %zu): %p", a, n, m);
            A.free(m);
        }
    }
    /* glibc's answers at the edges: EINVAL only for an align that is not a power of two multiple of
     * sizeof(void *); an align no process can have is ENOMEM; memalign of more than SIZE_MAX / 2 + 1 EINVAL. */
    static const struct { size_t align; int posix; } edges[] = {
        {0, EINVAL}, {4, EINVAL}, {24, EINVAL}, {8, 0}, {(size_t)1 << 47, ENOMEM},
        {(size_t)1 << 63, ENOMEM}, {SIZE_MAX, EINVAL}};
    for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
        void *p = (void *)1;
        int r = A.posix_memalign(&p, edges[i].align, 100);
        EXPECT(r == edges[i].posix && (r != 0 || p != (void *)1), "posix_memalign(%zx): %d, glibc %d", edges[i].align,
               r, edges[i].posix);
        if (r == 0)
            A.free(p);
        else
            EXPECT(p == (void *)1, "posix_memalign set *out on failure");
    }
    errno = 0;
    EXPECT(A.memalign(SIZE_MAX, 100) == NULL && errno == EINVAL, "memalign(SIZE_MAX): errno %d", errno);
    errno = 0;
    EXPECT(A.memalign((size_t)1 << 63, 100) == NULL && errno == ENOMEM, "memalign(2^63): errno %d", errno);
}

/* ---- the scenario table and the child ------------------------------------------------------------- */

static const struct {
    const char *name;
    void (*run)(void);
} scenarios[] = {
    {"keys-before-first-malloc", scenario_keys_before_first_malloc},
    {"key-create-allocates", scenario_key_create_allocates},
    {"last-free-key", scenario_last_free_key},
    {"no-key-left", scenario_no_key_left},
    {"atfork-many-before-first-malloc", scenario_atfork_many_before_first_malloc},
    {"atfork-handlers-allocate", scenario_atfork_handlers_allocate},
    {"atfork-library-locks", scenario_atfork_library_locks},
    {"first-blocks-large-then-fork", scenario_first_blocks_large_then_fork},
    {"destroy-during-fork", scenario_destroy_during_fork},
    {"fork-during-start", scenario_fork_during_start},
    {"late-destructor-heaps", scenario_late_destructor_heaps},
    {"exited-thread-memory-returned", scenario_exited_thread_memory_returned},
    {"idle-heaps-100", scenario_idle_heaps_100},
    {"idle-heaps-500", scenario_idle_heaps_500},
    {"idle-heaps-collect", scenario_idle_heaps_collect},
    {"closed-while-threads-run", scenario_closed_while_threads_run},
    {"address-space-limit", scenario_address_space_limit},
    {"data-limit", scenario_data_limit},
    {"locked-memory", scenario_locked_memory},
    {"mappings-forbidden", scenario_mappings_forbidden},
    {"aligned-large", scenario_aligned_large},
};

/* In the child: run the scenario named in the environment and exit, before main. */
__attribute__((constructor)) static void hostile_child(void)
{
    const char *spec = getenv("SHARD_HOSTILE");
    if (spec == NULL)
        return;
    static char name[128], m[16]; /* no allocation before the scenario's own: no strdup, no stdio */
    const char *space = strchr(spec, ' ');
    if (space == NULL || (size_t)(space - spec) >= sizeof name || strlen(space + 1) >= sizeof m)
        _exit(93);
    memcpy(name, spec, (size_t)(space - spec));
    strcpy(m, space + 1);
    mode = m;
    alarm(SCENARIO_SECONDS);
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++) {
        if (strcmp(scenarios[i].name, name) == 0) {
            scenarios[i].run();
            fflush(stderr);
            _exit(problems == 0 ? 0 : 1);
        }
    }
    _exit(94);
}

/* ---- the parent: a test per scenario, each in the three modes ------------------------------------- */

static void run_scenario(const char *name)
{
    static const char *const modes[] = {"glibc", "preload", "api"};
    char self[4096], preload[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 32);
    CHECK(n > 0);
    if (n <= 0)
        return;
    self[n] = 0;
    strcpy(preload, self);
    strcpy(strrchr(preload, '/') + 1, "libshardmm.so");
    for (int i = 0; i < 3; i++) {
        int fds[2];
        CHECK(pipe(fds) == 0);
        fflush(stdout);
        uint64_t start = now_ms();
        pid_t pid = fork();
        if (pid == 0) {
            char spec[256];
            snprintf(spec, sizeof spec, "%s %s", name, modes[i]);
            setenv("SHARD_HOSTILE", spec, 1);
            if (i == 1)
                setenv("LD_PRELOAD", preload, 1);
            else
                unsetenv("LD_PRELOAD");
            dup2(fds[1], 2);
            close(fds[0]);
            close(fds[1]);
            execl(self, self, (char *)NULL);
            _exit(95);
        }
        close(fds[1]);
        char out[8192], rest[4096];
        size_t got = 0;
        ssize_t r;
        while ((r = read(fds[0], got + 1 < sizeof out ? out + got : rest,
                         got + 1 < sizeof out ? sizeof out - 1 - got : sizeof rest)) > 0)
            got += got + 1 < sizeof out ? (size_t)r : 0; /* the rest is read and dropped */
        out[got] = 0;
        close(fds[0]);
        int status = 0;
        waitpid(pid, &status, 0);
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        CHECKF(ok, "%s under %s: %s %d after %llu ms\n%s", name, modes[i],
               WIFSIGNALED(status) ? "killed by signal" : "exit status",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
               (unsigned long long)(now_ms() - start), out);
        if (ok && got > 0)
            printf("  %s, %s: %s", name, modes[i], out);
    }
}

TEST(keys_before_first_malloc) { run_scenario("keys-before-first-malloc"); }
TEST(pthread_key_create_that_allocates_inside_the_first_malloc) { run_scenario("key-create-allocates"); }
TEST(last_free_key_taken_by_the_allocator) { run_scenario("last-free-key"); }
TEST(no_key_left_before_first_malloc) { run_scenario("no-key-left"); }
TEST(atfork_many_handlers_before_first_malloc) { run_scenario("atfork-many-before-first-malloc"); }
TEST(atfork_handlers_allocate_and_free) { run_scenario("atfork-handlers-allocate"); }
TEST(atfork_handlers_that_lock_free_and_collect) { run_scenario("atfork-library-locks"); }
TEST(first_blocks_large_then_fork) { run_scenario("first-blocks-large-then-fork"); }
TEST(heap_destroyed_while_another_thread_forks) { run_scenario("destroy-during-fork"); }
TEST(fork_while_another_thread_starts_the_allocator) { run_scenario("fork-during-start"); }
TEST(first_allocation_in_last_destructor_round_leaves_no_heap) { run_scenario("late-destructor-heaps"); }
TEST(exited_thread_memory_returned_without_a_call) { run_scenario("exited-thread-memory-returned"); }
TEST(idle_heaps_of_100_threads_return_their_memory) { run_scenario("idle-heaps-100"); }
TEST(idle_heaps_of_500_threads_return_their_memory) { run_scenario("idle-heaps-500"); }
TEST(idle_heaps_return_their_memory_on_collect) { run_scenario("idle-heaps-collect"); }
TEST(library_closed_while_its_threads_run) { run_scenario("closed-while-threads-run"); }
TEST(address_space_limit) { run_scenario("address-space-limit"); }
TEST(data_limit) { run_scenario("data-limit"); }
TEST(memory_locked_by_mlockall) { run_scenario("locked-memory"); }
TEST(big_mappings_forbidden_once_the_process_runs) { run_scenario("mappings-forbidden"); }
TEST(aligned_above_2mb_as_glibc) { run_scenario("aligned-large"); }
