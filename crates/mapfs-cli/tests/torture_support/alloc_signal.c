/* A program whose SIGALRM handler allocates (tests/torture.rs): not
 * async-signal-safe by POSIX, and natively it deadlocks on the allocator's
 * lock within seconds (glibc locks its arenas once a second thread
 * exists). Under mapfs's libraries no handler runs on top of an allocator
 * call, which makes it safe, and so what the libraries themselves do in a
 * handler (an embedded open, a lent write) is safe too.
 *
 *   alloc_signal [ROUNDS]
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <pthread.h>
static void *idle(void *a) { (void)a; pause(); return NULL; }
static volatile sig_atomic_t handled;
static void on_alarm(int sig) {
    (void)sig;
    void *p = malloc(3000 + handled % 1000);
    if (p) { memset(p, 1, 64); free(p); }
    handled++;
}
int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 2000000;
    /* A second thread: glibc locks its arenas only in threaded processes. */
    pthread_t t; sigset_t all, old; sigfillset(&all); pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_create(&t, NULL, idle, NULL); pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (long i = 0; i < rounds; i++) {
        void *p = malloc(3000 + i % 1000);
        if (!p) return 2;
        ((char *)p)[0] = 1;
        free(p);
    }
    struct itimerval off = {{0,0},{0,0}}; setitimer(ITIMER_REAL, &off, NULL);
    printf("ok %d\n", (int)handled);
    return 0;
}
