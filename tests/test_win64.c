/* test_win64.c - Windows-only behaviour of shardmm.dll, which this program loads with LoadLibrary.
 *
 * - Threads of CreateThread that used the allocator: while they run each owns a heap; when they exit
 *   the FLS callback returns their heaps to the free-heap stack; their blocks outlive them and are
 *   checked, resized and freed by the main thread.
 * - FreeLibrary while a thread still holds a heap, then that thread exits: the DLL freed its FLS index
 *   on unload, so Windows does not call into unloaded code and the process lives on; the DLL loads
 *   again and works.
 * Before the DLL is loaded the program takes 70 TLS indexes, so the DLL's own index is 64 or above and
 * every heap-slot read goes through the TEB's expansion array (tests/test_port.c checks that read
 * against TlsGetValue directly).
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include "shardmm.h"

static struct {
    HMODULE dll;
    void *(*malloc_)(size_t);
    void *(*realloc_)(void *, size_t);
    void (*free_)(void *);
    size_t (*usable_size)(const void *);
    void (*get_stats)(shard_stats *);
    int (*check)(void);
} shard;

static int load_shard(void)
{
    shard.dll = LoadLibraryA("shardmm.dll");
    if (shard.dll == NULL)
        return -1;
    shard.malloc_ = (void *(*)(size_t))(void (*)(void))GetProcAddress(shard.dll, "shard_malloc");
    shard.realloc_ = (void *(*)(void *, size_t))(void (*)(void))GetProcAddress(shard.dll, "shard_realloc");
    shard.free_ = (void (*)(void *))(void (*)(void))GetProcAddress(shard.dll, "shard_free");
    shard.usable_size = (size_t (*)(const void *))(void (*)(void))GetProcAddress(shard.dll, "shard_usable_size");
    shard.get_stats = (void (*)(shard_stats *))(void (*)(void))GetProcAddress(shard.dll, "shard_get_stats");
    shard.check = (int (*)(void))(void (*)(void))GetProcAddress(shard.dll, "shard_check");
    return shard.malloc_ && shard.realloc_ && shard.free_ && shard.usable_size && shard.get_stats && shard.check
               ? 0
               : -1;
}

__attribute__((constructor)) static void take_tls_indexes_then_load(void)
{
    for (int i = 0; i < 70; i++)
        TlsAlloc();
    if (load_shard() != 0) {
        fprintf(stderr, "cannot load shardmm.dll or one of its functions (error %lu)\n", GetLastError());
        exit(1);
    }
}

static shard_stats stats_now(void)
{
    shard_stats s;
    shard.get_stats(&s);
    return s;
}

enum { THREADS = 4, BLOCKS = 300 };

struct worker {
    uint64_t seed;
    HANDLE allocated, go_on; /* events: the worker has allocated; the worker may exit */
    void *blocks[BLOCKS];
    size_t sizes[BLOCKS];
};

static size_t worker_size(uint64_t seed, int i)
{
    uint64_t x = harness_mix64(seed + (uint64_t)i);
    return i % 10 == 0 ? 16384 + (size_t)(x % 200000) : 1 + (size_t)(x % 8000); /* some above 16 KB */
}

static void *worker_thread(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < BLOCKS; i++) {
        w->sizes[i] = worker_size(w->seed, i);
        w->blocks[i] = shard.malloc_(w->sizes[i]);
        CHECK(w->blocks[i] != NULL);
        if (w->blocks[i])
            fill(w->blocks[i], w->sizes[i], w->seed + (uint64_t)i);
    }
    SetEvent(w->allocated);
    WaitForSingleObject(w->go_on, INFINITE);
    return NULL;
}

TEST(threads_of_createthread_return_their_heaps_at_exit_and_their_blocks_outlive_them)
{
    static struct worker w[THREADS];
    thread_t t[THREADS];
    void *mine = shard.malloc_(100); /* the main thread owns a heap throughout */
    CHECK(mine != NULL);
    size_t live_before = stats_now().live_small;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < THREADS; i++) {
            w[i].seed = 7000 + (uint64_t)round * 10000 + (uint64_t)i * 1000;
            w[i].allocated = CreateEventA(NULL, TRUE, FALSE, NULL);
            w[i].go_on = CreateEventA(NULL, TRUE, FALSE, NULL);
            CHECK_EQ(thread_start(&t[i], worker_thread, &w[i]), 0);
        }
        for (int i = 0; i < THREADS; i++)
            WaitForSingleObject(w[i].allocated, INFINITE);
        shard_stats during = stats_now();
        CHECKF(during.heaps - during.heaps_free == 1 + THREADS, "round %d: %zu heaps, %zu free, while %d threads run",
               round, during.heaps, during.heaps_free, THREADS + 1);
        for (int i = 0; i < THREADS; i++)
            SetEvent(w[i].go_on);
        for (int i = 0; i < THREADS; i++) {
            thread_join(t[i]);
            CloseHandle(w[i].allocated);
            CloseHandle(w[i].go_on);
        }
        shard_stats after = stats_now();
        CHECKF(after.heaps - after.heaps_free == 1, "round %d: %zu heaps, %zu free, after the threads exited", round,
               after.heaps, after.heaps_free);
        CHECKF(after.heaps <= 1 + THREADS, "round %d: %zu heaps for %d threads at once", round, after.heaps,
               THREADS + 1);
        for (int i = 0; i < THREADS; i++) {
            for (int j = 0; j < BLOCKS; j++) {
                void *p = w[i].blocks[j];
                size_t n = w[i].sizes[j];
                if (p == NULL)
                    continue;
                CHECK_PATTERN(p, n, w[i].seed + (uint64_t)j, "block of an exited thread");
                if (j % 3 == 0) {
                    void *q = shard.realloc_(p, n + 1 + (size_t)j);
                    CHECK(q != NULL);
                    if (q == NULL)
                        continue;
                    CHECK_PATTERN(q, n, w[i].seed + (uint64_t)j, "block of an exited thread after realloc");
                    p = q;
                }
                shard.free_(p);
            }
        }
        CHECK_EQ(stats_now().live_small, live_before);
        CHECK_EQ(shard.check(), 0);
    }
    shard.free_(mine);
}

static HANDLE holder_allocated, holder_go_on;

static void *holder_thread(void *arg)
{
    (void)arg;
    void *p = shard.malloc_(1000); /* this thread now owns a heap and has set the DLL's FLS value */
    CHECK(p != NULL);
    SetEvent(holder_allocated);
    WaitForSingleObject(holder_go_on, INFINITE);
    return NULL; /* the block stays: its DLL is gone by now */
}

TEST(unloading_the_dll_while_a_thread_holds_a_heap_leaves_no_callback_behind)
{
    thread_t t;
    holder_allocated = CreateEventA(NULL, TRUE, FALSE, NULL);
    holder_go_on = CreateEventA(NULL, TRUE, FALSE, NULL);
    CHECK_EQ(thread_start(&t, holder_thread, NULL), 0);
    WaitForSingleObject(holder_allocated, INFINITE);
    CHECK(FreeLibrary(shard.dll));
    CHECK(GetModuleHandleA("shardmm.dll") == NULL); /* really unloaded */
    SetEvent(holder_go_on);
    thread_join(t); /* the thread exits: a callback into the unloaded DLL would end the process here */
    CloseHandle(holder_allocated);
    CloseHandle(holder_go_on);
    CHECK_EQ(load_shard(), 0);
    if (shard.malloc_ == NULL)
        return;
    void *p = shard.malloc_(5000);
    CHECK(p != NULL);
    if (p) {
        fill(p, 5000, 99);
        p = shard.realloc_(p, 50000);
        CHECK(p != NULL && check_pattern(p, 5000, 99));
        shard.free_(p);
    }
    CHECK_EQ(shard.check(), 0);
}
