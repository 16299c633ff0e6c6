/* port.h - the operating-system contract, in allocator terms.
 *
 * Everything shardmm needs from an OS is here: address space (reserve, commit, decommit, release),
 * the thread's heap slot, a hook at thread exit, which threads are alive, fork hooks, a coarse
 * monotonic clock, waiting, and a way to report a fatal error. One file per OS implements it (port/linux.c, port/win64.c). The
 * functions hold no policy: no retries, no accounting, no messages; the callers in src/ decide.
 *
 * The model is Windows': a reservation is address space only; commit makes a range readable and
 * writable and reading fresh memory gives zeros; decommit gives the memory back and keeps the
 * addresses; only whole reservations are released. Sizes and addresses are multiples of
 * PORT_PAGE (4 KB); reservations are aligned as the caller asks, at least to PORT_RESERVE_ALIGN (64 KB).
 *
 * The heap slot is read on every allocation, so it is an inline function here, chosen per OS;
 * this is the one place outside the port's .c files that knows which OS it is built for.
 */
#ifndef SHARD_PORT_H
#define SHARD_PORT_H

#include <stddef.h>
#include <stdint.h>

#define PORT_PAGE ((size_t)4096)
#define PORT_RESERVE_ALIGN ((size_t)65536)

/* Reserve size bytes of address space (size a multiple of PORT_RESERVE_ALIGN) at a multiple of align (a
 * power of two, PORT_RESERVE_ALIGN or more). The reservation is exactly [start, start+size): whatever the
 * port had to take beyond it to find an aligned start is given back before it returns, so the process's
 * address space (RLIMIT_AS counts it) holds no slack. Returns the start, or NULL when the OS refuses.
 * Nothing is readable yet. */
void *port_reserve(size_t size, size_t align);

/* The most address space the process may hold (Linux: RLIMIT_AS), bytes; SIZE_MAX when unlimited. A
 * system call: for the rare decisions that depend on it (large blocks' address headroom). */
size_t port_address_space_limit(void);

/* Make [addr, addr+size) of a reservation readable and writable; fresh memory reads zero.
 * addr and size are multiples of PORT_PAGE. Returns 0, or -1 when the OS refuses (out of memory);
 * on -1 the range is left as it was. Committing a committed range is allowed and keeps its contents. */
int port_commit(void *addr, size_t size);

/* Give the memory of [addr, addr+size) back; the addresses stay reserved. The contents are lost and
 * the range must not be touched until it is committed again (Windows faults; Linux reads zeros, and
 * keeps the range charged against the commit limit until release, see linux.c).
 * addr and size are multiples of PORT_PAGE. Returns 0 or -1. */
int port_decommit(void *addr, size_t size);

/* Release a whole reservation: addr and size exactly as port_reserve gave and took them. 0 or -1. */
int port_release(void *addr, size_t size);

/* A hint that [addr, addr+size) of a reservation is used in large contiguous pieces, so that the OS may
 * back its committed parts with large pages (Linux: transparent huge pages, MADV_HUGEPAGE; one fault
 * then maps 2 MB). Only a range committed as a whole gets them, so nothing outside what was committed
 * becomes resident. Windows does nothing: its large pages need a privilege and cannot be decommitted. */
void port_hint_large_pages(void *addr, size_t size);

/* Optional, where PORT_MOVES_PAGES is 1 (Linux; Windows has no way to move private pages): move the
 * pages of [from, from+size), committed and inside the reservation [reservation, +reservation_size),
 * to [to, to+size) inside another reservation, without copying (their contents and commitment go with
 * them; what was at `to` is replaced), and release the rest of the source reservation. 0; or -1 with
 * nothing changed. One call, because after the move the source addresses are free for anyone's
 * mapping, so only the source's other parts may still be released. */
int port_move_release(void *reservation, size_t reservation_size, void *from, size_t size, void *to);

/* Register fn to be called at the exit of every thread that has set its heap slot to non-NULL, with
 * the slot's value, once per thread; the slot reads NULL when fn runs. Called once per process,
 * before the first port_heap_slot_set. 0; -1 when the OS has no hook left to give (every pthread key of
 * the process taken): the slot still works, no thread's exit is reported, and the core finds the heaps
 * of exited threads through port_thread_alive instead. */
int port_thread_exit_hook(void (*fn)(void *heap));

/* Store heap in the calling thread's slot and arm the thread-exit hook for it (where there is one). 0; -1
 * with the slot unchanged when the OS refuses; PORT_SLOT_EXITED with the slot unchanged (NULL) when the
 * thread's exit hook has already run - code that runs later in the thread's exit (a destructor of
 * thread-local data that allocates) - so that no hook would ever give the heap back. The slot holds heap
 * before the hook is armed: arming it may allocate (glibc's pthread_setspecific callocs a key array),
 * and that allocation must find the heap there rather than make another one. */
int port_heap_slot_set(void *heap);
#define PORT_SLOT_EXITED 1

/* Threads by number, for the heaps whose threads exited without the exit hook (it ran before their first
 * allocation, or the process had no hook to give): port_thread_id() is the calling thread's number,
 * unique among the process's live threads, never 0 or PORT_THREAD_NONE (a system call: called when a
 * thread takes a heap); port_thread_alive(id) is 0 when no live thread of the process has that number
 * any more, 1 when one has or the port cannot tell. */
uint32_t port_thread_id(void);
int port_thread_alive(uint32_t id);
#define PORT_THREAD_NONE 0xffffffffu

/* A value that differs between live threads and is the same for a thread and, after fork, for the
 * child's one thread (its thread pointer): who runs the fork handlers, for the locks they hold. */
uintptr_t port_thread_tag(void);

/* Register functions the C library calls around fork() in the process (Linux: pthread_atfork; Windows
 * has no fork and ignores them): prepare in the parent before the fork, parent in the parent after it,
 * child in the child. Called once per process. 0 or -1. */
int port_fork_hooks(void (*prepare)(void), void (*parent)(void), void (*child)(void));

/* An allocation returns NULL for want of memory (or an impossible size): tell the caller the C library's
 * way (Linux: errno = ENOMEM; Windows: the thread's last error ERROR_NOT_ENOUGH_MEMORY). */
void port_out_of_memory(void);
/* The same for an invalid argument (Linux: errno = EINVAL; Windows: ERROR_INVALID_PARAMETER). */
void port_invalid_argument(void);

/* Milliseconds from an arbitrary start, monotonic, with a resolution of some 1-16 ms. */
uint64_t port_clock_ms(void);

/* Give the processor to another thread (after spinning with pause has not helped). */
void port_yield(void);

/* Write a message to the standard error channel; nothing is allocated. */
void port_write_error(const char *msg, size_t len);

/* End the process abnormally (after port_write_error). Does not return. */
_Noreturn void port_abort(void);

/* The thread's heap slot: NULL until port_heap_slot_set stored a heap. */
static inline void *port_heap_slot(void);

/* Where PORT_SLOT_STARTS_EMPTY_HEAP is 1, the slot as stored holds &heap_none (an empty heap of the core,
 * src/heap.h) rather than NULL while no heap is set, and port_heap_slot_raw() reads it as it is: the fast
 * paths then need no NULL test. port_heap_slot() still answers NULL for it. */
struct heap;
extern struct heap heap_none;

#if defined(__linux__) && defined(__x86_64__)
#define PORT_MOVES_PAGES 1
#define PORT_SLOT_STARTS_EMPTY_HEAP 1
/* Initial-exec TLS: one fs-relative load. Defined in port/linux.c, or in asm/fast.asm where the NASM fast
 * paths are built (NASM can reach a TLS variable only if it defines it itself), initialised to &heap_none. */
extern __thread void *port_linux_heap_slot __attribute__((tls_model("initial-exec")));
static inline void *port_heap_slot_raw(void) { return port_linux_heap_slot; }
static inline void *port_heap_slot(void)
{
    void *h = port_linux_heap_slot;
    return h != (void *)&heap_none ? h : NULL;
}
#elif defined(_WIN64)
#define PORT_MOVES_PAGES 0
#define PORT_SLOT_STARTS_EMPTY_HEAP 0 /* TLS slots start NULL for every thread */
/* The TEB's TLS slots: gs:[0x1480 + 8*i] for an index below 64. port_win64_slot_offset is that offset
 * once port_thread_exit_hook has taken the index, 0 before it and for an index of 64 or above, whose
 * slot lives behind the TEB's expansion pointer. Then the read calls port_win64_heap_slot_far, an
 * assembly leaf in win64.c that changes no register but rax and the flags, so that the fast paths
 * around this read need no stack frame for a call they almost never make. The asm is volatile: the
 * slot changes under the compiler's feet when port_heap_slot_set runs. */
static inline void *port_heap_slot(void)
{
    void *heap;
    __asm__ volatile("movq port_win64_slot_offset(%%rip), %0\n\t"
                     "testq %0, %0\n\t"
                     "jz 1f\n\t"
                     "movq %%gs:(%0), %0\n\t"
                     "jmp 2f\n"
                     "1:\n\t"
                     "call port_win64_heap_slot_far\n"
                     "2:"
                     : "=a"(heap)
                     :
                     : "cc");
    return heap;
}
#else
#error "shardmm: no port for this platform (port/linux.c and port/win64.c are the ones there are)"
#endif

#endif
