#ifdef __linux__
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>
#endif
#include "CHaulSystem.h"
#include <signal.h>
#include <spawn.h>

int haul_fallocate(int descriptor, int keep_size, off_t offset, off_t length) {
#ifdef __linux__
    return fallocate(descriptor, keep_size ? FALLOC_FL_KEEP_SIZE : 0, offset, length);
#else
    (void)descriptor;
    (void)keep_size;
    (void)offset;
    (void)length;
    errno = EOPNOTSUPP;
    return -1;
#endif
}

int haul_syncfs(int descriptor) {
#ifdef __linux__
    return syncfs(descriptor);
#else
    (void)descriptor;
    errno = ENOSYS;
    return -1;
#endif
}

int haul_file_system_type(int descriptor, unsigned long long *type, unsigned long long *identity) {
#ifdef __linux__
    struct statfs volume;
    if (fstatfs(descriptor, &volume) != 0) return -1;
    // f_type is a signed int on some 32-bit systems: keep its 32 bits as they are.
    *type = (unsigned long long)(unsigned int)volume.f_type;
    *identity = ((unsigned long long)(unsigned int)volume.f_fsid.__val[0] << 32)
        | (unsigned long long)(unsigned int)volume.f_fsid.__val[1];
    return 0;
#else
    (void)descriptor;
    (void)type;
    (void)identity;
    errno = ENOSYS;
    return -1;
#endif
}

int haul_open_beneath(int directory, const char *path, int flags, mode_t mode) {
#if defined(__linux__) && defined(SYS_openat2)
    struct open_how how = {0};
    how.flags = (unsigned long long)flags;
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    return (int)syscall(SYS_openat2, directory, path, &how, sizeof(how));
#else
    (void)directory;
    (void)path;
    (void)flags;
    (void)mode;
    errno = ENOSYS;
    return -1;
#endif
}

int haul_spawn_standard_descriptors_only(posix_spawn_file_actions_t *actions, short *flags) {
#if defined(__APPLE__)
    *flags |= POSIX_SPAWN_CLOEXEC_DEFAULT;
    for (int descriptor = 0; descriptor < 3; descriptor++) {
        int result = posix_spawn_file_actions_addinherit_np(actions, descriptor);
        if (result != 0) return result;
    }
    return 0;
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    (void)flags;
    return posix_spawn_file_actions_addclosefrom_np(actions, 3);
#else
    (void)actions;
    (void)flags;
    return ENOSYS;
#endif
}

void haul_spawn_default_signals(posix_spawnattr_t *attributes, short *flags) {
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGINT);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGHUP);
    posix_spawnattr_setsigdefault(attributes, &defaults);
    sigset_t unblocked;
    sigemptyset(&unblocked);
    posix_spawnattr_setsigmask(attributes, &unblocked);
    *flags |= POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
}

int haul_spawn_change_directory(posix_spawn_file_actions_t *actions, const char *path) {
#if defined(__APPLE__) || (defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 29)))
    return posix_spawn_file_actions_addchdir_np(actions, path);
#else
    (void)actions;
    (void)path;
    return ENOSYS;
#endif
}
