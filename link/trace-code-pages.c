// Records which pages of the gpu-share binary's code a process runs, for
// link/agent-startup-order.txt (link/README.md). A development tool, loaded with LD_PRELOAD
// into an agent under the memory bench; never part of the image.
//
// Before the binary's own code runs, its code mapping is made inaccessible. The first time
// each page is executed it faults; the handler appends the page's file offset (hex) to
// $GPU_SHARE_TRACE.<pid> and makes that page executable again, so each page faults once.
// Without $GPU_SHARE_TRACE nothing is changed.
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static unsigned long code_start, code_end, code_offset;
static int trace = -1;

static void first_run_of_a_page(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)context;
    unsigned long address = (unsigned long)info->si_addr;
    if (address < code_start || address >= code_end) {
        signal(SIGSEGV, SIG_DFL); // a real fault: let it happen again, and crash
        return;
    }
    unsigned long page = address & ~4095UL;
    mprotect((void *)page, 4096, PROT_READ | PROT_EXEC);
    // Only async-signal-safe calls here: format the hex offset by hand, then write(2).
    unsigned long offset = page - code_start + code_offset;
    char digits[32], line[32];
    int n = 0, k = 0;
    do {
        digits[k++] = "0123456789abcdef"[offset & 15];
        offset >>= 4;
    } while (offset);
    while (k) line[n++] = digits[--k];
    line[n++] = '\n';
    if (write(trace, line, n) != n) _exit(90);
}

__attribute__((constructor)) static void trace_code_pages(void) {
    const char *path = getenv("GPU_SHARE_TRACE");
    if (!path) return;
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long start, end, offset;
        char perms[8];
        char *newline = strchr(line, '\n');
        if (newline) *newline = 0;
        size_t len = strlen(line);
        if (len < 10 || strcmp(line + len - 10, "/gpu-share") != 0) continue;
        if (sscanf(line, "%lx-%lx %7s %lx", &start, &end, perms, &offset) == 4 &&
            strcmp(perms, "r-xp") == 0) {
            code_start = start;
            code_end = end;
            code_offset = offset;
        }
    }
    if (maps) fclose(maps);
    if (!code_start) return; // not gpu-share (the bench harness itself)
    char name[4200];
    snprintf(name, sizeof name, "%s.%d", path, getpid());
    trace = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (trace < 0) return;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = first_run_of_a_page;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &action, 0);
    // This constructor returns into the dynamic loader, so no gpu-share code has run yet.
    // Rust's runtime keeps a SIGSEGV handler that is already installed.
    mprotect((void *)code_start, code_end - code_start, PROT_NONE);
}
