/* A folder that answers like a Unity Catalog Volume's FUSE mount: hard links and renames under it fail with
 * ENOSYS ("Function not implemented", os error 38), as delta-rs's commits there have failed
 * (delta-io/delta-rs#2540: the commit's hard link; a rename of a staged file fails the same way there).
 * Everything else (open, write, fsync, read, readdir, unlink, mkdir) works.
 *
 * Loaded with LD_PRELOAD into one process; SBI_VOLUME_ROOT names the folder (an absolute, real path).
 * It interposes the libc calls Rust's std (delta-rs), CPython and the JVM make: link, linkat, rename, renameat,
 * renameat2. Built at test time by tests/support/volume.py with the system C compiler.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int under_root(int dirfd, const char *path) {
    const char *root = getenv("SBI_VOLUME_ROOT");
    char joined[PATH_MAX * 2], base[PATH_MAX];
    size_t n;
    if (root == NULL || *root == '\0' || path == NULL) return 0;
    if (path[0] == '/') {
        snprintf(joined, sizeof joined, "%s", path);
    } else {
        if (dirfd == AT_FDCWD) {
            if (getcwd(base, sizeof base) == NULL) return 0;
        } else {
            char link[64];
            ssize_t len;
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            len = readlink(link, base, sizeof base - 1);
            if (len < 0) return 0;
            base[len] = '\0';
        }
        snprintf(joined, sizeof joined, "%s/%s", base, path);
    }
    n = strlen(root);
    return strncmp(joined, root, n) == 0 && (joined[n] == '/' || joined[n] == '\0');
}

static int refused(int fd1, const char *p1, int fd2, const char *p2) {
    if (under_root(fd1, p1) || under_root(fd2, p2)) {
        errno = ENOSYS;
        return 1;
    }
    return 0;
}

int link(const char *a, const char *b) {
    static int (*real)(const char *, const char *);
    if (refused(AT_FDCWD, a, AT_FDCWD, b)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "link");
    return real(a, b);
}

int linkat(int fa, const char *a, int fb, const char *b, int flags) {
    static int (*real)(int, const char *, int, const char *, int);
    if (refused(fa, a, fb, b)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "linkat");
    return real(fa, a, fb, b, flags);
}

int rename(const char *a, const char *b) {
    static int (*real)(const char *, const char *);
    if (refused(AT_FDCWD, a, AT_FDCWD, b)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "rename");
    return real(a, b);
}

int renameat(int fa, const char *a, int fb, const char *b) {
    static int (*real)(int, const char *, int, const char *);
    if (refused(fa, a, fb, b)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "renameat");
    return real(fa, a, fb, b);
}

int renameat2(int fa, const char *a, int fb, const char *b, unsigned int flags) {
    static int (*real)(int, const char *, int, const char *, unsigned int);
    if (refused(fa, a, fb, b)) return -1;
    if (!real) real = dlsym(RTLD_NEXT, "renameat2");
    return real(fa, a, fb, b, flags);
}
