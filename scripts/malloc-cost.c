/* The allocator's cost seen by a program: N free+malloc pairs of 16-528
 * bytes, 64 live at a time (docs/shim-cost.md, "The allocator's exports").
 *
 *   cc -O2 -o malloc-cost scripts/malloc-cost.c
 *   ./malloc-cost; LD_PRELOAD=target/release/libmapfs_preload.so ./malloc-cost
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000000;
    void *keep[64] = {0};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        int k = i & 63;
        free(keep[k]);
        keep[k] = malloc(16 + (i * 7919) % 512);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f ns per malloc+free\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
