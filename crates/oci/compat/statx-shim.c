/*
 * The gvisor tier's compatibility shim, preloaded into every dynamically
 * linked program of a gvisor sandbox (through /etc/ld.so.preload).
 *
 * Debian's runsc (release 2022-12-19) answers EINVAL to statx(2) and
 * newfstatat(2) called with AT_NO_AUTOMOUNT, which coreutils 9 passes on
 * every call: `ls`, `stat`, `cp -a` all fail with "Invalid argument". The
 * flag has had no effect on stat calls since Linux 4.11 (they never
 * trigger an automount), so these wrappers clear it and make the system
 * call themselves. Nothing else changes.
 *
 * Built with -nostdlib (no libc version of its own: it takes errno's
 * location from the program's libc at load time), x86_64 only.
 */

#define AT_NO_AUTOMOUNT 0x800
#define SYS_newfstatat 262
#define SYS_statx 332

extern int *__errno_location(void);

static long sys4(long n, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

static long sys5(long n, long a, long b, long c, long d, long e) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return ret;
}

static int result(long ret) {
    if (ret < 0 && ret > -4096) {
        *__errno_location() = (int)-ret;
        return -1;
    }
    return (int)ret;
}

int statx(int dirfd, const char *path, int flags, unsigned int mask, void *buf) {
    return result(sys5(SYS_statx, dirfd, (long)path, flags & ~AT_NO_AUTOMOUNT, mask, (long)buf));
}

int fstatat(int dirfd, const char *path, void *buf, int flags) {
    return result(sys4(SYS_newfstatat, dirfd, (long)path, (long)buf, flags & ~AT_NO_AUTOMOUNT));
}

int fstatat64(int dirfd, const char *path, void *buf, int flags) {
    return fstatat(dirfd, path, buf, flags);
}
