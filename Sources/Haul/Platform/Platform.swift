/// The calls whose system interface differs between Linux and Apple platforms, one concern each:
/// the boot's identity, reserving disk space, writes that bypass the page cache, flushing data to
/// stable storage and naming the holder of a file lock.
///
/// Each function is implemented twice, with the same signature: in `Platform+Linux.swift` and in
/// `Platform+Darwin.swift`. Nothing outside those two files (and the C shim) calls a system function
/// that only one of the platforms has; `scripts/check-platform.py` checks both rules.
package enum Platform {
    /// Who holds a `flock` on a file, as far as the platform can tell.
    package enum LockHolder: Equatable, Sendable {
        /// The process with this ID.
        case process(Int32)
        /// Nobody.
        case nobody
        /// The platform cannot tell without trying the lock.
        case unknown
    }
}
