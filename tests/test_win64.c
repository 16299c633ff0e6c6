/* test_win64.c - Windows-only behaviour of shardmm.dll, which this program loads with LoadLibrary.
 *
 * - Threads of CreateThread that used the allocator: while they run each owns a heap; when they exit
 *   the FLS callback returns their heaps to the free-heap stack; their blocks outlive them and are
 *   checked, resized and freed by the main thread.
 * - Fibers: a thread makes its first allocation in a fiber, and another thread deletes that fiber,
 *   which runs the FLS callback on the deleting thread: neither thread loses its heap, and the first
 *   one's heap comes back when it exits (through DLL_THREAD_DETACH, as its FLS value went with the
 *   fiber).
 * - FreeLibrary while a thread still holds a heap and heaps wait in the stack with frees made into them,
 *   then that thread exits: the DLL freed its FLS index (and its two TLS indexes) on unload, so Windows
 *   does not call into unloaded code and the process lives on; the DLL loads again and works.
 * - Reservations Windows refuses give NULL; a 1 GB alignment is a reservation at a multiple of 1 GB.
 * - With every FLS index taken the DLL works without its exit callback (DLL_THREAD_DETACH gives heaps back).
 * - The static library inside a DLL of someone else's (tests/wrap_dll.c): FreeLibrary of that DLL leaves
 *   it loaded (the allocator pinned it), so a thread that allocated through it exits safely later.
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
    void *(*malloc_aligned)(size_t, size_t);
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
    shard.malloc_aligned = (void *(*)(size_t, size_t))(void (*)(void))GetProcAddress(shard.dll, "shard_malloc_aligned");
    return shard.malloc_ && shard.realloc_ && shard.free_ && shard.usable_size && shard.get_stats && shard.check &&
                   shard.malloc_aligned
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

/* ---- fibers ---- */

enum { FIBER_BLOCKS = 64 };

static struct {
    void *thread_fiber, *fiber;
    void *blocks[2][FIBER_BLOCKS];
    HANDLE deleted_ready, fiber_deleted;
} fib;

static size_t fiber_size(int set, int i) { return 16 + (size_t)(set * FIBER_BLOCKS + i) * 40; }

static void fiber_allocate(int set)
{
    for (int i = 0; i < FIBER_BLOCKS; i++) {
        fib.blocks[set][i] = shard.malloc_(fiber_size(set, i));
        CHECK(fib.blocks[set][i] != NULL);
        if (fib.blocks[set][i])
            fill(fib.blocks[set][i], fiber_size(set, i), 8000 + (uint64_t)(set * FIBER_BLOCKS + i));
    }
}

static void WINAPI fiber_body(void *arg)
{
    (void)arg;
    fiber_allocate(0); /* the thread's first allocation: its FLS value is this fiber's */
    SwitchToFiber(fib.thread_fiber);
}

static void *fiber_thread(void *arg)
{
    (void)arg;
    fib.thread_fiber = ConvertThreadToFiber(NULL);
    CHECK(fib.thread_fiber != NULL);
    fib.fiber = CreateFiber(0, fiber_body, NULL);
    CHECK(fib.fiber != NULL);
    if (fib.thread_fiber == NULL || fib.fiber == NULL)
        return NULL;
    SwitchToFiber(fib.fiber);
    SetEvent(fib.deleted_ready);
    WaitForSingleObject(fib.fiber_deleted, INFINITE); /* the main thread deletes the fiber meanwhile */
    fiber_allocate(1);                                /* the heap is still this thread's */
    ConvertFiberToThread();
    return NULL;
}

TEST(deleting_a_fiber_on_another_thread_takes_no_heap_away)
{
    void *mine = shard.malloc_(100);
    CHECK(mine != NULL);
    fib.deleted_ready = CreateEventA(NULL, TRUE, FALSE, NULL);
    fib.fiber_deleted = CreateEventA(NULL, TRUE, FALSE, NULL);
    thread_t t;
    CHECK_EQ(thread_start(&t, fiber_thread, NULL), 0);
    WaitForSingleObject(fib.deleted_ready, INFINITE);
    shard_stats before = stats_now();
    CHECKF(before.heaps - before.heaps_free == 2, "%zu heaps, %zu free, with two threads", before.heaps,
           before.heaps_free);
    if (fib.fiber != NULL)
        DeleteFiber(fib.fiber); /* the FLS callback runs here, on the main thread */
    shard_stats after = stats_now();
    CHECKF(after.heaps_free == before.heaps_free, "free heaps %zu -> %zu on deleting the fiber", before.heaps_free,
           after.heaps_free);
    void *more = shard.malloc_(3000); /* the main thread still has its own heap */
    CHECK(more != NULL);
    CHECK_EQ(stats_now().heaps, before.heaps);
    SetEvent(fib.fiber_deleted);
    thread_join(t);
    shard_stats end = stats_now();
    CHECKF(end.heaps - end.heaps_free == 1, "%zu heaps, %zu free, after the fiber's thread exited", end.heaps,
           end.heaps_free);
    for (int set = 0; set < 2; set++)
        for (int i = 0; i < FIBER_BLOCKS; i++)
            if (fib.blocks[set][i]) {
                CHECK_PATTERN(fib.blocks[set][i], fiber_size(set, i), 8000 + (uint64_t)(set * FIBER_BLOCKS + i),
                              "block of a fiber's thread");
                shard.free_(fib.blocks[set][i]);
            }
    shard.free_(more);
    shard.free_(mine);
    CloseHandle(fib.deleted_ready);
    CloseHandle(fib.fiber_deleted);
    CHECK_EQ(shard.check(), 0);
}

/* ---- unloading ---- */

/* How many TLS and FLS indexes are still free (takes them all, then gives them back). */
static int free_tls_indexes(void)
{
    static DWORD taken[2048];
    int n = 0;
    while (n < 2048 && (taken[n] = TlsAlloc()) != TLS_OUT_OF_INDEXES)
        n++;
    for (int i = 0; i < n; i++)
        TlsFree(taken[i]);
    return n;
}

static int free_fls_indexes(void)
{
    static DWORD taken[8192];
    int n = 0;
    while (n < 8192 && (taken[n] = FlsAlloc(NULL)) != FLS_OUT_OF_INDEXES)
        n++;
    for (int i = 0; i < n; i++)
        FlsFree(taken[i]);
    return n;
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

/* A thread that allocates blocks of every kind, frees most and exits: its heap waits in the stack with a
 * reserve (and a trim due in a second); the blocks it leaves are freed by the main thread into it. */
static void *leaver_thread(void *arg)
{
    void **left = arg;
    void *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = shard.malloc_(i % 2 ? 70000 : 3000);
    for (int i = 0; i < 8; i++)
        if (i < 6)
            shard.free_(p[i]);
        else
            left[i - 6] = p[i];
    return NULL;
}

/* FreeLibrary while a thread holds a heap, heaps wait in the stack with reserves and a trim due, and
 * frees were made into them: nothing of the DLL runs afterwards (no FLS callback, no trim), the holder
 * thread exits safely, and the DLL loads again with a fresh allocator that works. */
TEST(unloading_the_dll_while_a_thread_holds_a_heap_leaves_no_callback_behind)
{
    thread_t t;
    void *left[3][2];
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(thread_start(&t, leaver_thread, left[i]), 0);
        thread_join(t);
    }
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            shard.free_(left[i][j]); /* into a waiting heap */
    CHECK(stats_now().heaps_free >= 1);
    holder_allocated = CreateEventA(NULL, TRUE, FALSE, NULL);
    holder_go_on = CreateEventA(NULL, TRUE, FALSE, NULL);
    CHECK_EQ(thread_start(&t, holder_thread, NULL), 0);
    WaitForSingleObject(holder_allocated, INFINITE);
    int tls_before = free_tls_indexes(), fls_before = free_fls_indexes();
    CHECK(FreeLibrary(shard.dll));
    CHECK(GetModuleHandleA("shardmm.dll") == NULL); /* really unloaded */
    int tls_after = free_tls_indexes(), fls_after = free_fls_indexes();
    CHECKF(tls_after == tls_before + 2 && fls_after == fls_before + 1,
           "free TLS indexes %d -> %d, FLS %d -> %d on unloading (the DLL holds two and one)", tls_before, tls_after,
           fls_before, fls_after);
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
    Sleep(1100); /* the old DLL's trim would have been due: nothing of it runs */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(thread_start(&t, leaver_thread, left[i]), 0);
        thread_join(t);
        shard.free_(left[i][0]);
        shard.free_(left[i][1]);
    }
    CHECK_EQ(shard.check(), 0);
}

/* Reservations Windows refuses (an alignment of 128 TB needs 256 TB of address space; 1 TB of memory
 * cannot be committed here) give NULL, and the allocator goes on working. Not an alignment of 64 TB
 * nor 32 TB of memory, as this test once had: Wine keeps a byte per 4 KB page of a reservation, written
 * when it is made, so its reservation of 64 TB, which Wine grants, made this program resident for 16
 * GB, and the out-of-memory killer ended it when two test runs shared the 24 GB machine: the likely
 * "1 failed" of a CI run. An alignment of 1 GB is reserved at
 * an aligned address (Windows releases only whole reservations: the port reserves more, gives it back
 * and reserves there). */
TEST(reservations_windows_refuses_give_null_and_the_allocator_goes_on)
{
    void *p = shard.malloc_aligned(100, (size_t)1 << 47);
    CHECKF(p == NULL, "an alignment of 128 TB: %p", p);
    shard.free_(p);
    CHECK(shard.malloc_((size_t)1 << 40) == NULL);
    p = shard.malloc_aligned(3 << 20, (size_t)1 << 30);
    CHECKF(p != NULL && ((uintptr_t)p & (((size_t)1 << 30) - 1)) == 0, "an alignment of 1 GB: %p", p);
    if (p != NULL) {
        fill(p, 3 << 20, 1234);
        CHECK(check_pattern(p, 3 << 20, 1234));
        MEMORY_BASIC_INFORMATION mi;
        CHECK(VirtualQuery(p, &mi, sizeof mi) == sizeof mi);
        CHECKF(((uintptr_t)mi.AllocationBase & (((size_t)1 << 30) - 1)) == 0,
               "the reservation starts at %p, not at a multiple of 1 GB", mi.AllocationBase);
        shard.free_(p);
    }
    void *q = shard.malloc_(50000);
    CHECK(q != NULL);
    shard.free_(q);
    CHECK_EQ(shard.check(), 0);
}

/* Every FLS index of the process taken before the DLL loads: it gets no exit callback, and works all the
 * same - small and medium blocks in the main thread and in threads, whose heaps its DLL_THREAD_DETACH
 * gives back at their exit (the static library would find them by their thread ids), so 40 threads
 * one after another leave few heaps. */
static void *fls_less_thread(void *arg)
{
    (void)arg;
    void *p = shard.malloc_(300), *q = shard.malloc_(40000);
    CHECK(p != NULL && q != NULL);
    if (p != NULL)
        fill(p, 300, 17);
    CHECK(p == NULL || check_pattern(p, 300, 17));
    shard.free_(p);
    shard.free_(q);
    return NULL;
}

TEST(the_dll_works_when_every_fls_index_is_taken)
{
    static DWORD taken[8192];
    CHECK(FreeLibrary(shard.dll));
    int n = 0;
    while (n < 8192 && (taken[n] = FlsAlloc(NULL)) != FLS_OUT_OF_INDEXES)
        n++;
    CHECKF(n > 0 && n < 8192, "%d FLS indexes taken", n);
    CHECK_EQ(load_shard(), 0);
    if (shard.malloc_ != NULL) {
        fls_less_thread(NULL);
        size_t heaps = stats_now().heaps;
        for (int i = 0; i < 40; i++) {
            thread_t t;
            CHECK_EQ(thread_start(&t, fls_less_thread, NULL), 0);
            thread_join(t);
        }
        size_t after = stats_now().heaps;
        CHECKF(after <= heaps + 2, "heaps %zu -> %zu after 40 threads, one at a time", heaps, after);
        CHECK_EQ(shard.check(), 0);
    }
    for (int i = 0; i < n; i++)
        FlsFree(taken[i]);
}

/* ---- the static library inside another DLL ---- */

static struct {
    void *(*malloc_)(size_t);
    void (*free_)(void *);
    void *block;
    HANDLE allocated, go_on;
} wrap;

static void *wrap_thread(void *arg)
{
    (void)arg;
    wrap.block = wrap.malloc_(777);
    CHECK(wrap.block != NULL);
    if (wrap.block)
        fill(wrap.block, 777, 321);
    SetEvent(wrap.allocated);
    WaitForSingleObject(wrap.go_on, INFINITE);
    return NULL; /* exits after FreeLibrary of the DLL that holds the FLS callback */
}

TEST(the_static_library_pins_the_dll_it_is_linked_into)
{
    HMODULE dll = LoadLibraryA("shard-wrap.dll");
    CHECK(dll != NULL);
    if (dll == NULL)
        return;
    wrap.malloc_ = (void *(*)(size_t))(void (*)(void))GetProcAddress(dll, "wrap_malloc");
    wrap.free_ = (void (*)(void *))(void (*)(void))GetProcAddress(dll, "wrap_free");
    CHECK(wrap.malloc_ != NULL && wrap.free_ != NULL);
    if (wrap.malloc_ == NULL || wrap.free_ == NULL)
        return;
    wrap.allocated = CreateEventA(NULL, TRUE, FALSE, NULL);
    wrap.go_on = CreateEventA(NULL, TRUE, FALSE, NULL);
    thread_t t;
    CHECK_EQ(thread_start(&t, wrap_thread, NULL), 0);
    WaitForSingleObject(wrap.allocated, INFINITE);
    CHECK(FreeLibrary(dll));
    CHECK(GetModuleHandleA("shard-wrap.dll") != NULL); /* pinned: still loaded */
    SetEvent(wrap.go_on);
    thread_join(t); /* a callback into an unloaded DLL would end the process here */
    if (wrap.block) {
        CHECK_PATTERN(wrap.block, 777, 321, "block of the static library in a DLL");
        wrap.free_(wrap.block);
    }
    CloseHandle(wrap.allocated);
    CloseHandle(wrap.go_on);
}
