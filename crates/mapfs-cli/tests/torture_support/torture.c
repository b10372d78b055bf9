/* Torture program of the in-process executors (tests/torture.rs): threads
 * doing file I/O on a directory of a mapfs file system while the main
 * thread forks, vforks, posix_spawns or takes signals. Every byte written
 * is checked against what the program knows it wrote; any difference
 * exits 1 with a message. A hang is caught by the test's watchdog.
 *
 *   torture MODE DIR [ROUNDS]
 *
 * MODE: fork   - children do I/O on inherited and new descriptors, then
 *                exit, _exit or exec /bin/true
 *       spawn  - vfork+exec and posix_spawn of /bin/sh writing a file
 *       signal - SIGALRM every 100-500 us; the handler dups, preads,
 *                writes, fstats, dup2s, opens and closes tracked
 *                descriptors, and must not allocate (this program's
 *                malloc family counts what the libraries call in it)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define THREADS 3
#define BLOCK 4096
#define BLOCKS 8

static const char *dir;
static volatile int stop;

static void die(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "torture[%d]: %s (errno %d: %s)\n", getpid(), msg, errno,
            strerror(errno));
    fflush(stderr);
    _exit(1);
}

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 8));
}

static void check(const unsigned char *got, size_t n, unsigned seed,
                  const char *what) {
    unsigned char want[BLOCK];
    fill(want, n, seed);
    if (memcmp(got, want, n) != 0)
        die("%s: bytes differ from the model (seed %u)", what, seed);
}

static void write_all(int fd, const void *b, size_t n, off_t off,
                      const char *what) {
    ssize_t r = pwrite(fd, b, n, off);
    if (r != (ssize_t)n)
        die("%s: pwrite returned %zd", what, r);
}

static void read_all(int fd, void *b, size_t n, off_t off, const char *what) {
    ssize_t r = pread(fd, b, n, off);
    if (r != (ssize_t)n)
        die("%s: pread returned %zd", what, r);
}

/* One worker: its own file, rewritten block by block and read back through
 * a second open, a dup and a stdio stream. */
static void *worker(void *arg) {
    long id = (long)arg;
    char path[4096];
    unsigned char buf[BLOCK], got[BLOCK];
    unsigned round = 0;
    snprintf(path, sizeof path, "%s/t%ld", dir, id);
    while (!stop) {
        round++;
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            die("worker open %s", path);
        for (int b = 0; b < BLOCKS; b++) {
            fill(buf, BLOCK, round * 100 + b);
            write_all(fd, buf, BLOCK, (off_t)b * BLOCK, "worker");
        }
        struct stat st;
        if (fstat(fd, &st) != 0)
            die("worker fstat");
        if (st.st_size != BLOCK * BLOCKS)
            die("worker fstat size %lld", (long long)st.st_size);
        int d = dup(fd);
        if (d < 0)
            die("worker dup");
        read_all(d, got, BLOCK, BLOCK, "worker dup");
        check(got, BLOCK, round * 100 + 1, "worker dup");
        close(fd);
        int r = open(path, O_RDONLY);
        if (r < 0)
            die("worker reopen");
        read_all(r, got, BLOCK, 3 * BLOCK, "worker reopen");
        check(got, BLOCK, round * 100 + 3, "worker reopen");
        close(r);
        FILE *f = fdopen(d, "r");
        if (!f)
            die("worker fdopen");
        if (fseek(f, 5 * BLOCK, SEEK_SET) != 0)
            die("worker fseek");
        if (fread(got, 1, BLOCK, f) != BLOCK)
            die("worker fread");
        check(got, BLOCK, round * 100 + 5, "worker fread");
        fclose(f);
    }
    return NULL;
}

/* A child's work: reads a block of the parent's inherited file, writes a
 * file of its own through a new open, and checks it. */
static void child_io(int inherited, int n) {
    unsigned char got[BLOCK], buf[BLOCK];
    read_all(inherited, got, BLOCK, 0, "child inherited");
    check(got, BLOCK, 7, "child inherited");
    char path[4096];
    snprintf(path, sizeof path, "%s/c%d", dir, n % 16);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die("child open %s", path);
    fill(buf, BLOCK, 1000 + n);
    write_all(fd, buf, BLOCK, 0, "child");
    read_all(fd, got, BLOCK, 0, "child");
    check(got, BLOCK, 1000 + n, "child");
    close(fd);
}

static int shared_fd(void) {
    char path[4096];
    unsigned char buf[BLOCK];
    snprintf(path, sizeof path, "%s/shared", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        die("open %s", path);
    fill(buf, BLOCK, 7);
    write_all(fd, buf, BLOCK, 0, "shared");
    return fd;
}

static void reap(pid_t pid, const char *what) {
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            die("waitpid %s", what);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("%s child %d ended with status 0x%x", what, pid, st);
}

static void run_fork(int rounds) {
    int fd = shared_fd();
    for (int n = 0; n < rounds; n++) {
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            child_io(fd, n);
            switch (n % 3) {
            case 0:
                exit(0);
            case 1:
                _exit(0);
            default:
                execl("/bin/true", "true", (char *)NULL);
                die("exec /bin/true");
            }
        }
        reap(pid, "fork");
        unsigned char got[BLOCK];
        char path[4096];
        snprintf(path, sizeof path, "%s/c%d", dir, n % 16);
        int c = open(path, O_RDONLY);
        if (c < 0)
            die("open the child's file %s", path);
        read_all(c, got, BLOCK, 0, "the child's file");
        check(got, BLOCK, 1000 + n, "the child's file");
        close(c);
    }
    close(fd);
}

static void expect_file(const char *path, const char *want) {
    char got[256];
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        die("open %s", path);
    ssize_t r = read(fd, got, sizeof got - 1);
    close(fd);
    if (r < 0)
        die("read %s", path);
    got[r] = 0;
    if (strcmp(got, want) != 0)
        die("%s holds '%s', not '%s'", path, got, want);
}

static void run_spawn(int rounds) {
    char path[4096], script[4200], want[64];
    for (int n = 0; n < rounds; n++) {
        snprintf(path, sizeof path, "%s/s%d", dir, n % 8);
        snprintf(want, sizeof want, "spawned %d\n", n);
        snprintf(script, sizeof script, "echo 'spawned %d' > '%s'", n, path);
        char *argv[] = {"sh", "-c", script, NULL};
        pid_t pid;
        if (n % 2 == 0) {
            pid = vfork();
            if (pid == 0) {
                execve("/bin/sh", argv, environ);
                _exit(127);
            }
            if (pid < 0)
                die("vfork");
        } else {
            int e = posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ);
            if (e != 0) {
                errno = e;
                die("posix_spawn");
            }
        }
        reap(pid, n % 2 == 0 ? "vfork" : "posix_spawn");
        expect_file(path, want);
    }
}

/* Signal mode: the handler works on descriptors the main thread keeps
 * open, one or two calls per signal (dup, pread, pwrite, fstat, dup2,
 * close, open, fcntl(F_DUPFD) in turn), so that a handler costs less than
 * the timer's interval even through a daemon. Everything it calls is
 * async-signal-safe, and so must be what the library does for it: it may
 * not allocate (the handler may have interrupted the program's own
 * malloc), which the malloc family below counts. */
static int sig_fd = -1;
static int sig_dup = -1;
static char sig_path[4096];

static volatile sig_atomic_t handled;

/* The malloc family of this program, which the libraries preloaded into
 * it call too (the executable comes first in the lookup): each call made
 * while this thread runs the handler is counted. glibc's own entry points
 * do the work. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);
static __thread volatile sig_atomic_t in_handler;
static volatile long handler_allocs;
/* The same, by the handler's step (see on_alarm). */
static volatile long step_allocs[10];

static void count_alloc(void) {
    if (in_handler) {
        __atomic_fetch_add(&handler_allocs, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&step_allocs[handled % 10], 1, __ATOMIC_RELAXED);
    }
}
void *malloc(size_t n) {
    count_alloc();
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t m) {
    count_alloc();
    return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n) {
    count_alloc();
    return __libc_realloc(p, n);
}
void free(void *p) {
    if (p)
        count_alloc();
    __libc_free(p);
}
void *memalign(size_t a, size_t n) {
    count_alloc();
    return __libc_memalign(a, n);
}
void *aligned_alloc(size_t a, size_t n) {
    count_alloc();
    return __libc_memalign(a, n);
}
int posix_memalign(void **out, size_t a, size_t n) {
    count_alloc();
    void *p = __libc_memalign(a, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

/* Writes message m (n bytes) and the errno and step of the failure, with
 * nothing but write(2), then exits. */
static void handler_failed(const char *m, size_t n) {
    int e = errno;
    char num[64];
    int k = 0;
    const char *tag = "torture: handler step ";
    write(2, tag, strlen(tag));
    unsigned v = (unsigned)(handled % 10);
    num[k++] = (char)('0' + v);
    num[k++] = ' ';
    num[k++] = 'e';
    num[k++] = 'r';
    num[k++] = 'r';
    num[k++] = 'n';
    num[k++] = 'o';
    num[k++] = ' ';
    char digits[16];
    int d = 0;
    unsigned u = (unsigned)e;
    do {
        digits[d++] = (char)('0' + u % 10);
        u /= 10;
    } while (u && d < 16);
    while (d)
        num[k++] = digits[--d];
    num[k++] = ':';
    num[k++] = ' ';
    write(2, num, (size_t)k);
    write(2, m, n);
    _exit(1);
}
#define FAIL(m) handler_failed(m, sizeof m - 1)

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    in_handler = 1;
    unsigned char got[64], want[64];
    struct stat st;
    int other;
    switch (handled % 10) {
    case 0:
        sig_dup = dup(sig_fd);
        if (sig_dup < 0)
            FAIL("torture: dup in the handler failed\n");
        break;
    case 1:
    case 8:
        if (pread(sig_dup, got, 64, 0) != 64)
            FAIL("torture: pread in the handler failed\n");
        fill(want, 64, 7);
        if (memcmp(got, want, 64) != 0)
            FAIL("torture: the handler read other bytes\n");
        break;
    case 2:
        fill(want, 64, 7);
        if (pwrite(sig_dup, want, 64, BLOCK) != 64)
            FAIL("torture: pwrite in the handler failed\n");
        break;
    case 3:
        if (fstat(sig_dup, &st) != 0 || st.st_size < BLOCK + 64)
            FAIL("torture: fstat in the handler failed or missed the write\n");
        break;
    case 4:
        /* Replaces the tracked duplicate by another duplicate. */
        if (dup2(sig_fd, sig_dup) != sig_dup)
            FAIL("torture: dup2 in the handler failed\n");
        break;
    case 6:
        /* Another file, written and closed before the signals: an open
         * in a handler sees a file as of the last time this process's
         * writes through an open served in-process reached the file
         * system (a handler cannot ask the daemon to take them). */
        sig_dup = open(sig_path, O_RDWR);
        if (sig_dup < 0)
            FAIL("torture: open in the handler failed\n");
        break;
    case 7:
        other = fcntl(sig_dup, F_DUPFD_CLOEXEC, 40);
        if (other < 0)
            FAIL("torture: F_DUPFD in the handler failed\n");
        if (close(sig_dup) != 0)
            FAIL("torture: close in the handler failed\n");
        sig_dup = other;
        break;
    default:
        if (close(sig_dup) != 0)
            FAIL("torture: close in the handler failed\n");
        sig_dup = -1;
    }
    handled++;
    in_handler = 0;
    errno = saved;
}

static void run_signal(int rounds) {
    sig_fd = shared_fd();
    snprintf(sig_path, sizeof sig_path, "%s/other", dir);
    {
        unsigned char b[BLOCK];
        int o = open(sig_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (o < 0)
            die("open %s", sig_path);
        fill(b, BLOCK, 7);
        write_all(o, b, BLOCK, 0, "other");
        if (close(o) != 0)
            die("close %s", sig_path);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    for (int n = 0; n < rounds; n++) {
        struct itimerval it = {{0, 100 + (n * 37) % 400}, {0, 100 + (n * 37) % 400}};
        setitimer(ITIMER_REAL, &it, NULL);
        /* The main thread does I/O of its own while the signals land. */
        char path[4096];
        unsigned char buf[BLOCK], got[BLOCK];
        snprintf(path, sizeof path, "%s/m%d", dir, n % 4);
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0)
            die("main open %s", path);
        for (int b = 0; b < BLOCKS; b++) {
            fill(buf, BLOCK, 500 + n + b);
            write_all(fd, buf, BLOCK, (off_t)b * BLOCK, "main");
        }
        for (int b = 0; b < BLOCKS; b++) {
            read_all(fd, got, BLOCK, (off_t)b * BLOCK, "main");
            check(got, BLOCK, 500 + n + b, "main");
        }
        close(fd);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    if (sig_dup >= 0)
        close(sig_dup);
    /* What the handlers wrote is in the file. */
    unsigned char got[64], want[64];
    fill(want, 64, 7);
    if (handled > 2) {
        read_all(sig_fd, got, 64, BLOCK, "the handlers' write");
        if (memcmp(got, want, 64) != 0)
            die("the handlers' write is not in the file");
    }
    close(sig_fd);
    /* TORTURE_ALLOC_CHECK says what the library may allocate in a handler
     * (tests/torture.rs): "all" (nothing), "writes" (only a write to a
     * file whose map runs in-process, a lent plfs open: its map update
     * allocates), "off" (embedded: opens and writes under a prefix run
     * the file system in the handler; the library delays every handler
     * past any allocator call instead, which its own malloc family, not
     * this program's, makes possible). */
    const char *check = getenv("TORTURE_ALLOC_CHECK");
    long enforced = handler_allocs;
    if (check && strcmp(check, "writes") == 0)
        enforced -= step_allocs[2];
    else if (check && strcmp(check, "off") == 0)
        enforced = 0;
    if (enforced != 0)
        die("the libraries allocated or freed memory %ld times in signal "
            "handlers (by step: dup %ld, pread %ld, pwrite %ld, fstat %ld, "
            "dup2 %ld, close %ld, open %ld, F_DUPFD+close %ld, pread %ld, "
            "close %ld)",
            handler_allocs, step_allocs[0], step_allocs[1], step_allocs[2],
            step_allocs[3], step_allocs[4], step_allocs[5], step_allocs[6],
            step_allocs[7], step_allocs[8], step_allocs[9]);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: torture fork|spawn|signal DIR [ROUNDS]\n");
        return 2;
    }
    dir = argv[2];
    int rounds = argc > 3 ? atoi(argv[3]) : 100;
    int threads = getenv("TORTURE_THREADS") ? atoi(getenv("TORTURE_THREADS")) : THREADS;
    if (threads > THREADS)
        threads = THREADS;
    pthread_t t[THREADS];
    /* Only the main thread takes the timer's signals: the handler is not
     * reentrant (one dup at a time), and a handler doing I/O through a
     * daemon on every thread at once could starve them all. The workers
     * inherit the blocked mask from their creation on (blocking it in the
     * worker itself left a window in which a worker ran the handler). */
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, NULL);
    for (long i = 0; i < threads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0)
            die("pthread_create");
    pthread_sigmask(SIG_UNBLOCK, &alrm, NULL);
    if (strcmp(argv[1], "fork") == 0)
        run_fork(rounds);
    else if (strcmp(argv[1], "spawn") == 0)
        run_spawn(rounds);
    else if (strcmp(argv[1], "signal") == 0)
        run_signal(rounds);
    else
        die("unknown mode %s", argv[1]);
    stop = 1;
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    if (strcmp(argv[1], "signal") == 0 && handled == 0)
        die("no signal was handled");
    printf("ok %s %d\n", argv[1], rounds);
    return 0;
}
