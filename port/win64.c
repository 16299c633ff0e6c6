/* win64.c - the port contract (port/port.h) on Windows x64, through kernel32 only.
 *
 * The allocator links with no C runtime (-nostdlib, kernel32 alone); this file is the whole of its
 * conversation with Windows:
 * - address space: VirtualAlloc MEM_RESERVE (64 KB aligned by Windows; a larger alignment by reserving
 *   more, giving it back and reserving at the aligned address inside it), MEM_COMMIT (charged against the
 *   commit limit, so an impossible size is refused), MEM_DECOMMIT (the range faults until committed
 *   again), VirtualFree MEM_RELEASE of a whole reservation (Windows refuses a partial one).
 * - the heap slot (PORT_SLOT_TEB): an index of our own from TlsAlloc, read without a call as
 *   gs:[0x1480 + 8*index] for
 *   an index below 64 (port.h inlines that read), and through the TEB's expansion array at gs:[0x1780]
 *   (entry index - 64, NULL until this thread has set a slot of 64 or above) otherwise. Writing goes
 *   through TlsSetValue, which also creates that array.
 * - thread exit: an FLS index whose callback Windows runs at the exit of every thread that has set a
 *   value (a thread of CreateThread, of the CRT, of a pool), and for the main thread at process exit.
 *   FLS belongs to fibers, the slot to the thread: the callback acts only when the heap it is given is
 *   the one in the slot of the thread it runs on, so deleting a fiber (on any thread) never gives away
 *   a heap that a thread still uses; a heap whose fiber was deleted stays with its thread, and the
 *   DLL's DLL_THREAD_DETACH gives it back at that thread's exit (the static library has no such entry:
 *   there the heap stays out of use). After the hook ran, a second TLS index marks the thread as
 *   exited, and arming the hook is refused (PORT_SLOT_EXITED): Windows runs FLS callbacks before
 *   DLL_THREAD_DETACH and TLS callbacks, where thread-local destructors may still allocate, and would
 *   never call the callback again for a value set then.
 * - unloading: the DLL's entry frees both indexes when the DLL is unloaded (FreeLibrary) so that the
 *   callback never runs in unloaded code; at process exit it leaves everything as it is. The static
 *   library, which may be linked into a DLL of someone else's, pins the module that holds it instead
 *   (the process then keeps that module loaded).
 * - the clock: the InterruptTime of KUSER_SHARED_DATA (0x7FFE0008), 100 ns units, read without a
 *   call; it steps every 15.6 ms or so.
 * - options: the SHARDMM_ entries of GetEnvironmentStringsW's block. The exit hook is the DLL's
 *   DLL_PROCESS_DETACH, at process exit (after the C runtime's atexit handlers; the other threads are
 *   gone by then, and one that Windows ended inside the allocator's cache lock would leave the output
 *   waiting for it: the risk of asking for output at exit) and at FreeLibrary; the static library has
 *   none, so its exit-time options do nothing.
 * - waiting: SwitchToThread (callers spin with pause first, src/sync.h); the fatal message: WriteFile
 *   to the standard error handle; abort: TerminateProcess with exit code 3, as the C runtime's abort.
 * - symbolizing (the full-debug build's reports): the module that holds an address
 *   (GetModuleHandleExW, without taking a reference) and its path (GetModuleFileNameW), with the
 *   address's offset from the module's start: what a debugger or addr2line on the image turns into a
 *   line. Characters of the path above 127 are written as '?'.
 */
#include "port.h"

#define WIN32_LEAN_AND_MEAN
#include <windows.h>

enum { TEB_TLS_SLOTS = 0x1480, TEB_TLS_EXPANSION = 0x1780, TEB_TLS_SLOT_COUNT = 64 };

/* Read by port.h's inline read and the assembly below; written once by thread_exit_hook. */
uintptr_t port_win64_slot_offset;
uintptr_t port_win64_expansion_offset; /* 8 * (index - 64): the slot's place in the expansion array */
/* Our TLS index; TLS_OUT_OF_INDEXES until thread_exit_hook. Not static: the port test reads it. */
DWORD port_win64_tls_index = TLS_OUT_OF_INDEXES;
static DWORD fls_index = FLS_OUT_OF_INDEXES;
static DWORD exited_index = TLS_OUT_OF_INDEXES; /* non-NULL in a thread whose exit hook has run */
static void (*exit_fn)(void *heap);
static volatile LONG unloading; /* set when the DLL is unloaded: the FLS callbacks do nothing from then */

void *port_reserve(size_t size, size_t align)
{
    /* Windows reserves at 64 KB boundaries and releases only whole reservations, so the slack of an
     * over-sized reservation cannot be trimmed: reserve size + align to learn an aligned address inside
     * it, give it back, and reserve exactly there. Another thread may take the address in between;
     * then try again. */
    uint8_t *p = VirtualAlloc(NULL, size, MEM_RESERVE, PAGE_NOACCESS);
    if (p == NULL || ((uintptr_t)p & (align - 1)) == 0)
        return p;
    VirtualFree(p, 0, MEM_RELEASE);
    for (int attempt = 0; attempt < 16; attempt++) {
        if (size + align < size)
            return NULL;
        uint8_t *wide = VirtualAlloc(NULL, size + align, MEM_RESERVE, PAGE_NOACCESS);
        if (wide == NULL)
            return NULL;
        uintptr_t at = ((uintptr_t)wide + align - 1) & ~(uintptr_t)(align - 1);
        VirtualFree(wide, 0, MEM_RELEASE);
        p = VirtualAlloc((void *)at, size, MEM_RESERVE, PAGE_NOACCESS);
        if (p != NULL)
            return p;
    }
    return NULL;
}

int port_commit(void *addr, size_t size)
{
    return VirtualAlloc(addr, size, MEM_COMMIT, PAGE_READWRITE) != NULL ? 0 : -1;
}

int port_decommit(void *addr, size_t size)
{
    return VirtualFree(addr, size, MEM_DECOMMIT) ? 0 : -1;
}

int port_release(void *addr, size_t size)
{
    (void)size; /* Windows releases the whole reservation that starts at addr */
    return VirtualFree(addr, 0, MEM_RELEASE) ? 0 : -1;
}

/* port_win64_heap_slot_far: the slot when port.h's inline read finds no offset - an index of 64 or
 * above (through the TEB's expansion array, NULL until this thread has set a slot of 64 or above),
 * before the index exists (NULL), or while its offset is being published (the slot directly). A leaf
 * that uses no stack and changes only rax and the flags: the inline read calls it behind the
 * compiler's back. */
__asm__(".text\n"
        ".globl port_win64_heap_slot_far\n"
        "port_win64_heap_slot_far:\n\t"
        "movl port_win64_tls_index(%rip), %eax\n\t"
        "cmpl $64, %eax\n\t"                          /* TEB_TLS_SLOT_COUNT */
        "jb 1f\n\t"
        "cmpl $-1, %eax\n\t"                          /* TLS_OUT_OF_INDEXES: not started */
        "je 2f\n\t"
        "movq %gs:0x1780, %rax\n\t"                   /* TEB_TLS_EXPANSION */
        "testq %rax, %rax\n\t"
        "jz 2f\n\t"
        "addq port_win64_expansion_offset(%rip), %rax\n\t"
        "movq (%rax), %rax\n\t"
        "ret\n"
        "1:\n\t"
        "movq %gs:0x1480(,%rax,8), %rax\n\t"          /* TEB_TLS_SLOTS */
        "ret\n"
        "2:\n\t"
        "xorl %eax, %eax\n\t"
        "ret\n");
_Static_assert(TEB_TLS_SLOTS == 0x1480 && TEB_TLS_EXPANSION == 0x1780 && TEB_TLS_SLOT_COUNT == 64,
               "the assembly above spells these out");

static void thread_exited(void *heap)
{
    TlsSetValue(port_win64_tls_index, NULL);
    TlsSetValue(exited_index, (void *)1);
    exit_fn(heap);
}

/* Windows calls this for a fiber whose FLS value is not NULL: at the exit of its thread, on that thread,
 * or when the fiber is deleted, on the deleting thread. */
static void WINAPI fls_callback(void *heap)
{
    if (heap == NULL || unloading || TlsGetValue(port_win64_tls_index) != heap)
        return;
    thread_exited(heap);
}

static int win_thread_exit_hook(void (*fn)(void *heap))
{
    DWORD tls = TlsAlloc(), exited = TlsAlloc(), fls = FlsAlloc(fls_callback);
#ifndef SHARD_BUILD_DLL
    HMODULE self;
    BOOL pinned = GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS | GET_MODULE_HANDLE_EX_FLAG_PIN,
                                     (LPCWSTR)(void *)fls_callback, &self);
#else
    BOOL pinned = TRUE;
#endif
    /* The slot is the TLS index, and the exited mark the second one: without them there is no slot, and
     * port_heap_slot_store refuses. Without the FLS index (or, for the static library, the pin that keeps
     * its callback's code loaded) the slot works but no thread's exit is reported. */
    if (fls != FLS_OUT_OF_INDEXES && !pinned) {
        FlsFree(fls);
        fls = FLS_OUT_OF_INDEXES;
    }
    if (tls == TLS_OUT_OF_INDEXES || exited == TLS_OUT_OF_INDEXES) {
        if (tls != TLS_OUT_OF_INDEXES)
            TlsFree(tls);
        if (exited != TLS_OUT_OF_INDEXES)
            TlsFree(exited);
        if (fls != FLS_OUT_OF_INDEXES)
            FlsFree(fls);
        return -1;
    }
    exit_fn = fn;
    fls_index = fls;
    exited_index = exited;
    if (tls >= TEB_TLS_SLOT_COUNT)
        port_win64_expansion_offset = 8 * (uintptr_t)(tls - TEB_TLS_SLOT_COUNT);
    __atomic_store_n(&port_win64_tls_index, tls, __ATOMIC_RELEASE);
    if (tls < TEB_TLS_SLOT_COUNT)
        __atomic_store_n(&port_win64_slot_offset, TEB_TLS_SLOTS + 8 * (uintptr_t)tls, __ATOMIC_RELEASE);
    return fls != FLS_OUT_OF_INDEXES ? 0 : -1;
}

int port_heap_slot_store(void *heap)
{
    if (port_win64_tls_index == TLS_OUT_OF_INDEXES)
        return -1; /* no TLS index could be had: no slot */
    return TlsSetValue(port_win64_tls_index, heap) ? 0 : -1;
}

/* The FLS value arms the exit callback (set after the slot, port.h). */
static int win_thread_exit_arm(void *heap)
{
    if (TlsGetValue(exited_index) != NULL)
        return PORT_SLOT_EXITED;
    return fls_index == FLS_OUT_OF_INDEXES || FlsSetValue(fls_index, heap) ? 0 : -1;
}

static uint32_t win_thread_id(void) { return (uint32_t)GetCurrentThreadId(); /* multiples of 4, never 0 */ }

/* The TEB's own address (NT_TIB.Self, gs:[0x30]): one per live thread, read without a call. */
static uintptr_t win_thread_tag(void)
{
    uintptr_t teb;
    __asm__("movq %%gs:0x30, %0" : "=r"(teb));
    return teb;
}

static int win_thread_alive(uint32_t id)
{
    /* A thread that has exited is signalled, and an id that no thread has any more cannot be opened. Ids
     * are unique system-wide among live threads, so an id of ours cannot belong to another process's
     * thread while ours lives; one that does now (ours exited, the id was reused) means ours is gone. */
    HANDLE t = OpenThread(SYNCHRONIZE | THREAD_QUERY_LIMITED_INFORMATION, FALSE, id);
    if (t == NULL)
        return GetLastError() == ERROR_INVALID_PARAMETER ? 0 : 1;
    int alive = GetProcessIdOfThread(t) == GetCurrentProcessId() && WaitForSingleObject(t, 0) != WAIT_OBJECT_0;
    CloseHandle(t);
    return alive;
}

static void win_out_of_memory(void) { SetLastError(ERROR_NOT_ENOUGH_MEMORY); }

static void win_invalid_argument(void) { SetLastError(ERROR_INVALID_PARAMETER); }

static uint64_t win_clock_ms(void)
{
    /* KUSER_SHARED_DATA.InterruptTime: x64 Windows stores it with one 8-byte write, so one aligned
     * 8-byte read is consistent. */
    uint64_t t = *(volatile const uint64_t *)(uintptr_t)0x7FFE0008;
    return t / 10000u;
}

static void win_yield(void) { SwitchToThread(); }

/* The SHARDMM_ entries of the process's environment block (GetEnvironmentStringsW, which the process
 * heap holds, not ours), as bytes (port.h): the name upper-cased, since Windows' names are
 * case-insensitive, every character above 127 as '?', and an entry cut at PORT_OPTION_MAX bytes. */
static void win_options(void (*fn)(void *arg, const char *entry, size_t len), void *arg)
{
    static const char prefix[] = PORT_OPTION_PREFIX;
    WCHAR *block = GetEnvironmentStringsW();
    if (block == NULL)
        return;
    for (const WCHAR *s = block; *s != 0;) {
        size_t len = 0, k = 0;
        while (s[len] != 0)
            len++;
        char entry[PORT_OPTION_MAX];
        int in_name = 1;
        for (k = 0; k < len && k < PORT_OPTION_MAX; k++) {
            WCHAR c = s[k];
            in_name = in_name && c != '=';
            if (in_name && c >= 'a' && c <= 'z')
                c = (WCHAR)(c - 'a' + 'A');
            entry[k] = c < 128 ? (char)c : '?';
            if (k < sizeof prefix - 1 && entry[k] != prefix[k])
                break;
        }
        if (k >= sizeof prefix - 1) {
            if (len > PORT_OPTION_MAX)
                entry[PORT_OPTION_MAX - 1] = '?';
            fn(arg, entry, k);
        }
        s += len + 1;
    }
    FreeEnvironmentStringsW(block);
}

/* The exit hook (SHARDMM_SHOW_STATS, SHARDMM_REPORT_LEAKS): the DLL's entry calls it at
 * DLL_PROCESS_DETACH. The static library has no entry of its own to learn of the process's end. */
#ifdef SHARD_BUILD_DLL
static void (*exit_output)(void);

static int win_process_exit_hook(void (*fn)(void))
{
    exit_output = fn;
    return 0;
}
#endif

void port_write_error(const char *msg, size_t len)
{
    HANDLE h = GetStdHandle(STD_ERROR_HANDLE);
    if (h == NULL || h == INVALID_HANDLE_VALUE)
        return;
    while (len > 0) {
        DWORD chunk = len > 0x40000000u ? 0x40000000u : (DWORD)len, written = 0;
        if (!WriteFile(h, msg, chunk, &written, NULL) || written == 0)
            return;
        msg += written;
        len -= written;
    }
}

/* C:\path\module.exe+0x1234 */
static size_t win_symbolize(const void *addr, char *buf, size_t size)
{
    HMODULE module;
    WCHAR path[MAX_PATH];
    if (size < 2 || !GetModuleHandleExW(GET_MODULE_HANDLE_EX_FLAG_FROM_ADDRESS |
                                            GET_MODULE_HANDLE_EX_FLAG_UNCHANGED_REFCOUNT,
                                        (LPCWSTR)addr, &module))
        return 0;
    DWORD len = GetModuleFileNameW(module, path, MAX_PATH);
    if (len == 0 || len >= MAX_PATH)
        return 0;
    size_t n = 0;
    for (DWORD i = 0; i < len && n + 1 < size; i++)
        buf[n++] = path[i] < 128 ? (char)path[i] : '?';
    uintptr_t off = (uintptr_t)addr - (uintptr_t)module;
    char text[20] = "+0x", rev[16];
    int k = 0;
    do {
        rev[k++] = "0123456789abcdef"[off & 15];
        off >>= 4;
    } while (off != 0);
    for (int i = 0; i < k; i++)
        text[3 + i] = rev[k - 1 - i];
    text[3 + k] = 0;
    for (int i = 0; text[i] != 0 && n + 1 < size; i++)
        buf[n++] = text[i];
    buf[n] = 0;
    return n;
}

_Noreturn void port_abort(void)
{
    TerminateProcess(GetCurrentProcess(), 3);
    for (;;)
        ExitProcess(3);
}

/* No large pages (they need SeLockMemoryPrivilege and cannot be decommitted), no moving of pages, no
 * quota on the 128 TB of address space, no fork. No fence in every thread: Windows'
 * FlushProcessWriteBuffers is one, but under Wine 8 it is not (tests/test_port.c's litmus test saw
 * neither store in 856 of 20,000 rounds), and this DLL runs under Wine too. */
port_capabilities port_caps = {
    .flags = PORT_DECOMMIT_FAULTS,
    .clock_ms = win_clock_ms,
    .yield = win_yield,
    .thread_exit_hook = win_thread_exit_hook,
    .thread_exit_arm = win_thread_exit_arm,
    .thread_id = win_thread_id,
    .thread_tag = win_thread_tag,
    .thread_alive = win_thread_alive,
    .out_of_memory = win_out_of_memory,
    .invalid_argument = win_invalid_argument,
    .options = win_options,
    .symbolize = win_symbolize,
#ifdef SHARD_BUILD_DLL
    .process_exit_hook = win_process_exit_hook,
#endif
};

#ifdef SHARD_BUILD_DLL
/* The DLL's entry point (linked with -e, no C runtime). At a thread's exit, a heap still in its slot
 * (its FLS value went with a deleted fiber) is given back. At FreeLibrary (reserved == NULL) the FLS
 * index goes, so Windows never calls fls_callback in unloaded code; FlsFree may call it for the
 * threads that still hold a heap, and `unloading` makes those calls do nothing: the heaps are abandoned
 * with the DLL. At process exit (reserved != NULL) nothing is done: the process's memory goes with it. */
BOOL WINAPI shard_dll_entry(HINSTANCE instance, DWORD reason, void *reserved)
{
    (void)instance;
    if (reason == DLL_PROCESS_DETACH && exit_output != NULL)
        exit_output(); /* at process exit (the C runtime's atexit handlers have run) or at FreeLibrary */
    if (port_win64_tls_index == TLS_OUT_OF_INDEXES) /* the allocator has not started */
        return TRUE;
    if (reason == DLL_THREAD_DETACH && !unloading) {
        void *heap = TlsGetValue(port_win64_tls_index);
        if (heap != NULL)
            thread_exited(heap);
    } else if (reason == DLL_PROCESS_DETACH && reserved == NULL) {
        unloading = 1;
        if (fls_index != FLS_OUT_OF_INDEXES)
            FlsFree(fls_index);
        TlsFree(port_win64_tls_index);
        TlsFree(exited_index);
    }
    return TRUE;
}
#endif
