// The declarations live in include/CLibFuzzer.h; this file only makes the target buildable.
