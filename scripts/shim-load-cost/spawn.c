// What loading a preload library costs one short-lived process: starts
// PROGRAM N times per round with posix_spawnp under each configuration
// (LD_PRELOAD=value), rounds alternating between configurations, and prints
// per process the median wall time, CPU time (user+system of the children,
// from getrusage) and minor page faults. Used by scripts/shim-load-cost.sh.
// Usage: SB_CONFIGS="name=preload,name=preload,..." spawn ROUNDS N PROGRAM [ARGS...]
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double secs(struct timeval t) { return t.tv_sec + t.tv_usec * 1e-6; }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAXC 16
#define MAXR 256

int main(int argc, char **argv) {
    if (argc < 4 || !getenv("SB_CONFIGS")) {
        fprintf(stderr, "usage: SB_CONFIGS=name=preload,... %s ROUNDS N PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    int rounds = atoi(argv[1]), n = atoi(argv[2]);
    char **prog = argv + 3;
    if (rounds < 1 || rounds > MAXR || n < 1) {
        fprintf(stderr, "ROUNDS must be 1-%d and N at least 1\n", MAXR);
        return 2;
    }
    char *spec = strdup(getenv("SB_CONFIGS"));
    char *names[MAXC], *vals[MAXC];
    int nc = 0;
    for (char *tok = strtok(spec, ","); tok && nc < MAXC; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            fprintf(stderr, "bad configuration %s (want name=preload)\n", tok);
            return 2;
        }
        *eq = 0;
        names[nc] = tok;
        vals[nc] = eq + 1;
        nc++;
    }
    int ne = 0;
    while (environ[ne])
        ne++;
    static double cpu[MAXC][MAXR], wall[MAXC][MAXR], flt[MAXC][MAXR];
    int devnull = open("/dev/null", O_WRONLY);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, devnull, 1);
    for (int r = 0; r < rounds; r++) {
        for (int c = 0; c < nc; c++) {
            char **env = calloc(ne + 2, sizeof(char *));
            int k = 0;
            for (int i = 0; i < ne; i++)
                if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
                    env[k++] = environ[i];
            char pre[4096];
            snprintf(pre, sizeof pre, "LD_PRELOAD=%s", vals[c]);
            env[k++] = pre;
            struct rusage a, b;
            getrusage(RUSAGE_CHILDREN, &a);
            double t0 = now();
            for (int i = 0; i < n; i++) {
                pid_t pid;
                int st;
                if (posix_spawnp(&pid, prog[0], &fa, NULL, prog, env) != 0) {
                    perror("posix_spawnp");
                    return 1;
                }
                waitpid(pid, &st, 0);
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    fprintf(stderr, "%s failed under %s\n", prog[0], names[c]);
                    return 1;
                }
            }
            double t1 = now();
            getrusage(RUSAGE_CHILDREN, &b);
            cpu[c][r] = (secs(b.ru_utime) + secs(b.ru_stime) - secs(a.ru_utime) - secs(a.ru_stime)) / n * 1e6;
            wall[c][r] = (t1 - t0) / n * 1e6;
            flt[c][r] = (double)(b.ru_minflt - a.ru_minflt) / n;
            free(env);
        }
    }
    printf("%-10s %9s %9s %7s  (per process: medians of %d rounds of %d)\n", "config", "cpu_us", "wall_us",
           "minflt", rounds, n);
    for (int c = 0; c < nc; c++) {
        qsort(cpu[c], rounds, sizeof(double), cmp);
        qsort(wall[c], rounds, sizeof(double), cmp);
        qsort(flt[c], rounds, sizeof(double), cmp);
        printf("%-10s %9.1f %9.1f %7.1f  (cpu %.1f-%.1f)\n", names[c], cpu[c][rounds / 2], wall[c][rounds / 2],
               flt[c][rounds / 2], cpu[c][0], cpu[c][rounds - 1]);
    }
    return 0;
}
