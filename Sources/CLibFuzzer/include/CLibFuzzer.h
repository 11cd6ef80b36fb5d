#ifndef HAUL_CLIBFUZZER_H
#define HAUL_CLIBFUZZER_H

#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver (LLVM 11 and later): runs the fuzzing loop with the given callback.
/// Only linked when the fuzz target is built with -sanitize=fuzzer.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
