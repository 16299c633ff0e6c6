/* linux.c - the port contract (port/port.h) on Linux x86-64.
 *
 * Raw system calls for everything but the thread-exit hook, which needs the C library's
 * pthread_key_create (the only way to run code at the exit of a thread we did not create):
 * - reserve: mmap PROT_NONE (an inaccessible private mapping is not charged against the commit limit);
 *   commit: mprotect read/write, which charges it, so an impossible size is refused here as on
 *   Windows (with MAP_NORESERVE it would not be, and 64 TB "succeeded"); decommit:
 *   madvise(MADV_DONTNEED), which frees the pages and keeps the range read/write. Decommit does not
 *   change the protection because every protection change splits the kernel's list of mappings:
 *   decommitting every other free page of a large heap reached vm.max_map_count (65530) and then
 *   every mmap of the process failed. A decommitted range therefore reads zeros here rather than
 *   faulting as on Windows; the core never touches it before committing it again. release: munmap.
 * - the heap slot: an initial-exec TLS word, read with one fs-relative load.
 * - the clock: clock_gettime(CLOCK_MONOTONIC_COARSE) as a system call; it is read on slow paths
 *   only, and only when something is waiting for a deadline.
 */
#include "port.h"

#include <pthread.h>

enum {
    SYS_write = 1, SYS_mmap = 9, SYS_mprotect = 10, SYS_munmap = 11, SYS_rt_sigprocmask = 14,
    SYS_sched_yield = 24, SYS_madvise = 28, SYS_getpid = 39, SYS_kill = 62, SYS_clock_gettime = 228, SYS_exit_group = 231
};
enum { PROT_NONE_ = 0, PROT_RW_ = 3 };
enum { MAP_PRIVATE_ = 0x02, MAP_ANONYMOUS_ = 0x20, MADV_DONTNEED_ = 4 };
enum { CLOCK_MONOTONIC_COARSE_ = 6, SIGABRT_ = 6, SIG_UNBLOCK_ = 1 };

static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

static long sys3(long n, long a, long b, long c) { return sys6(n, a, b, c, 0, 0, 0); }

/* A system call failed when it returns a value in [-4095, -1]. */
static int sys_failed(long r) { return (unsigned long)r > (unsigned long)-4096L; }

__thread void *port_linux_heap_slot __attribute__((tls_model("initial-exec")));

void *port_reserve(size_t size)
{
    long r = sys6(SYS_mmap, 0, (long)size, PROT_NONE_, MAP_PRIVATE_ | MAP_ANONYMOUS_, -1, 0);
    if (sys_failed(r))
        return NULL;
    /* mmap aligns to 4 KB; give the caller the 64 KB alignment of the contract by trimming. */
    uintptr_t start = (uintptr_t)r, aligned = (start + PORT_RESERVE_ALIGN - 1) & ~(PORT_RESERVE_ALIGN - 1);
    if (aligned == start)
        return (void *)start;
    sys3(SYS_munmap, (long)start, (long)size, 0);
    r = sys6(SYS_mmap, 0, (long)(size + PORT_RESERVE_ALIGN), PROT_NONE_, MAP_PRIVATE_ | MAP_ANONYMOUS_, -1, 0);
    if (sys_failed(r))
        return NULL;
    start = (uintptr_t)r;
    aligned = (start + PORT_RESERVE_ALIGN - 1) & ~(PORT_RESERVE_ALIGN - 1);
    if (aligned > start)
        sys3(SYS_munmap, (long)start, (long)(aligned - start), 0);
    uintptr_t end = start + size + PORT_RESERVE_ALIGN;
    if (end > aligned + size)
        sys3(SYS_munmap, (long)(aligned + size), (long)(end - aligned - size), 0);
    return (void *)aligned;
}

int port_commit(void *addr, size_t size)
{
    return sys_failed(sys3(SYS_mprotect, (long)addr, (long)size, PROT_RW_)) ? -1 : 0;
}

int port_decommit(void *addr, size_t size)
{
    return sys_failed(sys3(SYS_madvise, (long)addr, (long)size, MADV_DONTNEED_)) ? -1 : 0;
}

int port_release(void *addr, size_t size)
{
    return sys_failed(sys3(SYS_munmap, (long)addr, (long)size, 0)) ? -1 : 0;
}

static pthread_key_t exit_key;
static void (*exit_fn)(void *heap);

static void on_thread_exit(void *heap)
{
    port_linux_heap_slot = NULL;
    exit_fn(heap);
}

int port_thread_exit_hook(void (*fn)(void *heap))
{
    exit_fn = fn;
    return pthread_key_create(&exit_key, on_thread_exit) == 0 ? 0 : -1;
}

int port_heap_slot_set(void *heap)
{
    if (pthread_setspecific(exit_key, heap) != 0)
        return -1; /* the slot stays as it was: the caller keeps no heap it could not arm the hook for */
    port_linux_heap_slot = heap;
    return 0;
}

uint64_t port_clock_ms(void)
{
    struct { long sec, nsec; } ts;
    sys3(SYS_clock_gettime, CLOCK_MONOTONIC_COARSE_, (long)&ts, 0);
    return (uint64_t)ts.sec * 1000u + (uint64_t)ts.nsec / 1000000u;
}

void port_yield(void) { sys3(SYS_sched_yield, 0, 0, 0); }

void port_write_error(const char *msg, size_t len)
{
    while (len > 0) {
        long r = sys3(SYS_write, 2, (long)msg, (long)len);
        if (sys_failed(r) || r == 0)
            return;
        msg += r;
        len -= (size_t)r;
    }
}

_Noreturn void port_abort(void)
{
    unsigned long mask = 1ul << (SIGABRT_ - 1);
    sys6(SYS_rt_sigprocmask, SIG_UNBLOCK_, (long)&mask, 0, 8, 0, 0);
    sys3(SYS_kill, sys3(SYS_getpid, 0, 0, 0), SIGABRT_, 0);
    for (;;)
        sys3(SYS_exit_group, 127, 0, 0);
}
