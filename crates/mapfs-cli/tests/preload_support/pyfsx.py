# fsx-style random operations against a byte model, through libc (see
# preload_fsx.rs). Arguments: path seed ops model_out [skipped,ops]
# With PYFSX_RAW=1: copy_file_range and an extra 'rawpread' go through
# syscall(2), which the shim cannot see, and the file is closed and
# reopened every 8 operations. On a writably lent descriptor (status 6) such
# a call must fail the documented way (EBADF, ESPIPE for positioned calls);
# anywhere else it must succeed with the model's bytes.
import os, sys, mmap, random, ctypes, errno
path, seed, nops, model_out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
# Optional: operations to leave out, comma-separated.
skip = set(sys.argv[5].split(',')) if len(sys.argv) > 5 else set()
raw = os.environ.get('PYFSX_RAW') == '1'
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_PREAD64, SYS_COPY_FILE_RANGE = 17, 326
LENT = 6
documented = {}
status = libc.mapfs_preload_fd_status
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP, PUNCH, ZERO = 1, 2, 16
MAXLEN, MAXOP = 256 * 1024, 64 * 1024
rnd = random.Random(seed)
model = bytearray()
log = []
counts = {}
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

def fail(msg):
    sys.stderr.write('seed %d op %d: %s\nlast ops: %s\n' % (seed, len(log), msg, log[-10:]))
    sys.exit(1)

def check(off, got, asked=None):
    if asked is not None and len(got) != max(0, min(asked, len(model) - off)):
        fail('read at %d of %d bytes returned %d (size %d)' % (off, asked, len(got), len(model)))
    want = bytes(model[off:off + len(got)])
    if got != want:
        bad = next(i for i in range(min(len(got), len(want))) if got[i] != want[i]) if len(got) == len(want) else -1
        fail('read at %d len %d: first difference at +%d (got %d bytes, want %d)' % (off, len(got), bad, len(got), len(want)))

def set_range(off, data):
    if off > len(model): model.extend(b'\0' * (off - len(model)))
    model[off:off + len(data)] = data

def rand_range(grow=True):
    limit = MAXLEN if grow else max(len(model), 1)
    off = rnd.randrange(0, limit)
    n = rnd.randrange(1, MAXOP + 1)
    return off, min(n, MAXLEN - off) or 1

def raw_refused(name, lent):
    # The documented answer on a lent writer's placeholder; a failure
    # anywhere else is a bug.
    e = ctypes.get_errno()
    allowed = (errno.EBADF, errno.ESPIPE) if name == 'pread' else (errno.EBADF,)
    if not lent or e not in allowed:
        fail('raw %s failed with %s (lent: %s)' % (name, errno.errorcode.get(e, e), lent))
    documented[name] = documented.get(name, 0) + 1

OPS = ['pwrite', 'write', 'pread', 'read', 'trunc', 'mapread', 'mapwrite',
       'falloc', 'punch', 'zero', 'copy', 'fsync', 'reopen', 'dup', 'stat']
if raw: OPS.append('rawpread')
for i in range(nops):
    op = rnd.choice([o for o in OPS if o not in skip])
    if raw and i % 8 == 7: op = 'reopen'
    counts[op] = counts.get(op, 0) + 1
    log.append(op)
    size = len(model)
    if op == 'pwrite':
        off, n = rand_range()
        data = rnd.randbytes(n)
        if os.pwrite(fd, data, off) != n: fail('short pwrite')
        set_range(off, data)
    elif op == 'write':
        off, n = rand_range()
        data = rnd.randbytes(n)
        if os.lseek(fd, off, os.SEEK_SET) != off: fail('lseek')
        if os.write(fd, data) != n: fail('short write')
        if os.lseek(fd, 0, os.SEEK_CUR) != off + n: fail('offset after write')
        set_range(off, data)
    elif op == 'pread':
        off, n = rand_range(False)
        check(off, os.pread(fd, n, off), n)
    elif op == 'read':
        off, n = rand_range(False)
        os.lseek(fd, off, os.SEEK_SET)
        got = os.read(fd, n)
        check(off, got, n)
        if os.lseek(fd, 0, os.SEEK_CUR) != off + len(got): fail('offset after read')
    elif op == 'trunc':
        new = rnd.randrange(0, MAXLEN)
        os.ftruncate(fd, new)
        if new < size: del model[new:]
        else: model.extend(b'\0' * (new - size))
    elif op in ('mapread', 'mapwrite'):
        if size == 0: continue
        off, n = rand_range(False)
        n = min(n, size - off)
        page = mmap.PAGESIZE
        base = off - off % page
        m = mmap.mmap(fd, off + n - base, offset=base)
        if op == 'mapread':
            check(off, m[off - base:off - base + n])
        else:
            data = rnd.randbytes(n)
            m[off - base:off - base + n] = data
            m.flush()
            set_range(off, data)
        m.close()
    elif op in ('falloc', 'punch', 'zero'):
        off, n = rand_range(op == 'falloc')
        mode = {'falloc': rnd.choice([0, KEEP]), 'punch': PUNCH | KEEP, 'zero': ZERO}[op]
        if libc.fallocate(fd, mode, off, n) != 0:
            e = ctypes.get_errno()
            if e == errno.EOPNOTSUPP: continue
            fail('fallocate %d: %s' % (mode, os.strerror(e)))
        end = off + n
        if mode & PUNCH or mode == ZERO:
            lim = end if mode == ZERO else min(end, size)
            if lim > size: model.extend(b'\0' * (lim - size))
            model[off:lim] = b'\0' * (lim - off)
        elif mode == 0 and end > size:
            model.extend(b'\0' * (end - size))
    elif op == 'copy':
        if size < 2: continue
        n = rnd.randrange(1, min(MAXOP, size) + 1)
        src = rnd.randrange(0, size - n + 1)
        dst = rnd.randrange(0, MAXLEN - n)
        if abs(src - dst) < n: continue
        if raw:
            lent = status(fd) == LENT
            a, b = ctypes.c_longlong(src), ctypes.c_longlong(dst)
            ctypes.set_errno(0)
            done = libc.syscall(SYS_COPY_FILE_RANGE, fd, ctypes.byref(a), fd, ctypes.byref(b),
                                ctypes.c_size_t(n), ctypes.c_uint(0))
            if done < 0:
                raw_refused('copy_file_range', lent)
                continue
        else:
            done = os.copy_file_range(fd, fd, n, src, dst)
        if done != min(n, size - src): fail('copy_file_range returned %d' % done)
        set_range(dst, bytes(model[src:src + done]))
    elif op == 'rawpread':
        off, n = rand_range(False)
        lent = status(fd) == LENT
        buf = ctypes.create_string_buffer(n)
        ctypes.set_errno(0)
        got = libc.syscall(SYS_PREAD64, fd, buf, ctypes.c_size_t(n), ctypes.c_longlong(off))
        if got < 0:
            raw_refused('pread', lent)
            continue
        check(off, buf.raw[:got], n)
    elif op == 'fsync':
        (os.fsync if rnd.random() < 0.5 else os.fdatasync)(fd)
    elif op == 'reopen':
        os.close(fd)
        fd = os.open(path, os.O_RDWR)
        if os.fstat(fd).st_size != size: fail('size after reopen: %d' % os.fstat(fd).st_size)
    elif op == 'dup':
        d = os.dup(fd)
        os.lseek(fd, size // 2, os.SEEK_SET)
        if os.lseek(d, 0, os.SEEK_CUR) != size // 2: fail('dup does not share the offset')
        check(size // 2, os.read(d, 100), 100)
        os.close(d)
    elif op == 'stat':
        if os.fstat(fd).st_size != size: fail('fstat size %d, model %d' % (os.fstat(fd).st_size, size))
        if os.stat(path).st_size != size: fail('stat size %d, model %d' % (os.stat(path).st_size, size))
    if i % 500 == 499:
        check(0, os.pread(fd, MAXLEN + 1, 0), MAXLEN + 1)

check(0, os.pread(fd, MAXLEN + 1, 0), MAXLEN + 1)
st = status(fd)
os.close(fd)
open(model_out, 'wb').write(model)
print('fsx ok seed=%d ops=%d size=%d status=%d %s documented=%s' % (seed, nops, len(model), st, sorted(counts.items()), sorted(documented.items())))
