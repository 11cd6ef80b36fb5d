// System calls Haul needs that Swift's C library modules do not export.
#ifndef CHAUL_SYSTEM_H
#define CHAUL_SYSTEM_H

#include <errno.h>
#include <spawn.h>
#include <sys/types.h>

/// Reserves disk space for bytes [offset, offset + length) of the open file `descriptor`. With
/// `keep_size` the file's size stays as it is (the space lies beyond its end until written). Returns
/// 0, or -1 with errno set (EOPNOTSUPP where the file system or the platform cannot do it).
int haul_fallocate(int descriptor, int keep_size, off_t offset, off_t length);

/// Opens `path` relative to the open directory `directory` without leaving it and without following
/// any symbolic link on the way, the last component included (Linux `openat2` with RESOLVE_BENEATH
/// and RESOLVE_NO_SYMLINKS). Returns the descriptor, or -1 with errno set: ELOOP or EXDEV where a
/// link or `..` would lead elsewhere, ENOSYS where the kernel or the platform has no such call.
int haul_open_beneath(int directory, const char *path, int flags, mode_t mode);

/// Writes the dirty data and metadata of the file system holding the open file `descriptor` to
/// stable storage (Linux `syncfs`). Returns 0, or -1 with errno set (ENOSYS where the platform
/// has no such call).
int haul_syncfs(int descriptor);

/// Stores the type of the file system holding the open file `descriptor` (Linux `fstatfs`'s
/// `f_type`, a magic number such as 0xEF53 for ext4) in `type`, and its identity (`f_fsid`, which
/// most file systems derive from their UUID; 0 where one gives none) in `identity`. Returns 0, or
/// -1 with errno set (ENOSYS where the platform has no such numbers).
int haul_file_system_type(int descriptor, unsigned long long *type, unsigned long long *identity);

/// Makes a program spawned with `actions` inherit only standard input, output and error: Haul's
/// sockets and files (many opened without close-on-exec by the libraries it uses) stay with Haul.
/// Linux closes every other descriptor in the child (glibc 2.34's addclosefrom); Apple platforms
/// add POSIX_SPAWN_CLOEXEC_DEFAULT to `flags` and inherit 0, 1 and 2. Returns 0, or an errno value
/// (ENOSYS where neither exists).
int haul_spawn_standard_descriptors_only(posix_spawn_file_actions_t *actions, short *flags);

/// Makes a program spawned with `attributes` start with SIGTERM, SIGINT, SIGPIPE and SIGHUP at
/// their default action and no signal blocked, whatever the spawning process ignores or blocks;
/// adds the flags that take effect to `flags` (give them to posix_spawnattr_setflags last).
void haul_spawn_default_signals(posix_spawnattr_t *attributes, short *flags);

/// Makes a program spawned with `actions` start in the directory `path`. Returns 0, or an errno
/// value (ENOSYS where the C library has no such action).
int haul_spawn_change_directory(posix_spawn_file_actions_t *actions, const char *path);

#endif
