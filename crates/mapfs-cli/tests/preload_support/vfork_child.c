/* A vfork child runs in its parent's memory: under the shim it must not
 * change the parent's tables. Usage: vfork_child FILE_A FILE_B.
 * The parent adopts FILE_A (one data call; MAPFS_PRELOAD_ADOPT_CALLS=1) and
 * opens FILE_B (left pending), then vforks; the child replaces A's number
 * with /dev/null, closes B, opens and reads B, and execs `cat` of the
 * adopted descriptor (so the handoff runs from a vfork child). Afterwards
 * the parent's descriptors must be served as before (B pinned to the mount,
 * as before any fork), with the right bytes.
 * Prints "ok" or what went wrong; exits non-zero on failure. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int (*status)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "mapfs_preload_fd_status");
    if (!status) { puts("not under the shim"); return 1; }
    int a = open(argv[1], O_RDONLY), b = open(argv[2], O_RDONLY);
    char want[64], got[64];
    if (a < 0 || b < 0 || pread(a, want, sizeof want, 0) != sizeof want) { perror("open/pread"); return 1; }
    int sa = status(a), sb = status(b);
    if (sa != 3) { printf("A not adopted before the vfork: %d\n", sa); return 1; }
    /* fd 1 of the cat: A itself, from offset 0 (a copy of the parent's). */
    lseek(a, 0, SEEK_SET);
    pid_t pid = vfork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDONLY);
        int c = open(argv[2], O_RDONLY);
        char buf[16];
        if (read(c, buf, sizeof buf) != sizeof buf) _exit(3);
        close(c);
        dup2(null, b);
        close(b);
        dup2(a, 0);
        int dup_a = dup(a);
        dup2(null, dup_a);
        /* cat reads stdin (A, adopted: handed over) to /dev/null. */
        int out = open("/dev/null", O_WRONLY);
        dup2(out, 1);
        char *args[] = {"cat", 0};
        execv("/bin/cat", args); /* execl is not interposable (glibc calls execve inside) */
        _exit(4);
    }
    int ws;
    if (pid < 0 || waitpid(pid, &ws, 0) != pid || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        printf("child failed: %d\n", ws);
        return 1;
    }
    if (sb != 2 || status(a) != sa || status(b) != 4) {
        printf("the vfork child changed the parent's tables: A %d->%d, B %d->%d (4 expected)\n", sa, status(a), sb, status(b));
        return 1;
    }
    if (pread(a, got, sizeof got, 0) != sizeof got || memcmp(got, want, sizeof got)) { puts("A reads other bytes"); return 1; }
    if (read(b, got, 8) != 8) { puts("B unreadable"); return 1; }
    /* A vfork child whose exec fails: the parent's own opens are still
     * classified afterwards. */
    pid = vfork();
    if (pid == 0) {
        char *none[] = {"none", 0};
        execv("/nonexistent/mapfs-test", none);
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &ws, 0) != pid) { puts("second child failed"); return 1; }
    int c = open(argv[2], O_RDONLY);
    if (c < 0 || status(c) != 2) { printf("an open after a failed exec is not tracked: %d\n", status(c)); return 1; }
    puts("ok");
    return 0;
}
