#ifdef __linux__
#define _GNU_SOURCE
#include <fcntl.h>
#endif
#include "CHaulSystem.h"

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
