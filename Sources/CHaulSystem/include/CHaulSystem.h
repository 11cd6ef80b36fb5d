// System calls Haul needs that Swift's C library modules do not export.
#ifndef CHAUL_SYSTEM_H
#define CHAUL_SYSTEM_H

#include <errno.h>
#include <sys/types.h>

/// Reserves disk space for bytes [offset, offset + length) of the open file `descriptor`. With
/// `keep_size` the file's size stays as it is (the space lies beyond its end until written). Returns
/// 0, or -1 with errno set (EOPNOTSUPP where the file system or the platform cannot do it).
int haul_fallocate(int descriptor, int keep_size, off_t offset, off_t length);

#endif
