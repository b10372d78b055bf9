/* Writes a file through libc (so the preload shim lends it), then reads and
 * writes it with io_uring, which the shim cannot see. Prints one line per
 * io_uring operation: "<op> <res>" (res is the CQE result: bytes or -errno),
 * then the shim's status of the descriptor. Raw system calls only, no
 * liburing: see io_uring_setup(2). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int ring_fd;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;

static int setup(void) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    ring_fd = syscall(__NR_io_uring_setup, 4, &p);
    if (ring_fd < 0) return -1;
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    char *sq = mmap(0, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, IORING_OFF_SQ_RING);
    char *cq = mmap(0, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, IORING_OFF_CQ_RING);
    sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                MAP_SHARED, ring_fd, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) return -1;
    sq_tail = (unsigned *)(sq + p.sq_off.tail);
    sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    sq_array = (unsigned *)(sq + p.sq_off.array);
    cq_head = (unsigned *)(cq + p.cq_off.head);
    cq_tail = (unsigned *)(cq + p.cq_off.tail);
    cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

/* One operation, waited for; returns the CQE result. */
static int op(int opcode, int fd, void *buf, unsigned len, unsigned long long off) {
    unsigned tail = *sq_tail, idx = tail & *sq_mask;
    struct io_uring_sqe *e = &sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = opcode;
    e->fd = fd;
    e->addr = (unsigned long long)(unsigned long)buf;
    e->len = len;
    e->off = off;
    sq_array[idx] = idx;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, ring_fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) return -9999;
    unsigned head = __atomic_load_n(cq_head, __ATOMIC_ACQUIRE);
    int res = cqes[head & *cq_mask].res;
    __atomic_store_n(cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror("open"); return 1; }
    char block[4096];
    memset(block, 'x', sizeof block);
    for (int i = 0; i < 8; i++)
        if (write(fd, block, sizeof block) != sizeof block) { perror("write"); return 1; }
    if (setup() < 0) { printf("io_uring unavailable\n"); return 0; }
    char buf[4096];
    int (*status)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "mapfs_preload_fd_status");
    printf("status %d\n", status ? status(fd) : -1);
    printf("read %d\n", op(IORING_OP_READ, fd, buf, sizeof buf, 0));
    printf("write %d\n", op(IORING_OP_WRITE, fd, block, sizeof block, 4096));
    if (close(fd) != 0) { perror("close"); return 1; }
    /* What the file holds after the close: the program's own writes. */
    fd = open(argv[1], O_RDONLY);
    long total = 0, n;
    int all_x = 1;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (long i = 0; i < n; i++) all_x &= buf[i] == 'x';
        total += n;
    }
    printf("size %ld all_x %d\n", total, all_x);
    return 0;
}
