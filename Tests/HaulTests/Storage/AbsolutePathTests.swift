import Testing

@testable import Haul

@Suite("Absolute paths")
struct AbsolutePathTests {
    @Test(
        "a path with nothing to resolve comes back as it is; any other is resolved",
        arguments: [
            ("/", "/"), ("/a", "/a"), ("/a/b.iso", "/a/b.iso"), ("/a/.b", "/a/.b"), ("/a/...", "/a/..."),
            ("/a/b/", "/a/b"), ("/a//b", "/a/b"), ("/a/./b", "/a/b"), ("/a/../b", "/b"), ("/a/.", "/a"),
            ("/a/..", "/"), ("//a", "/a"), ("/..", "/"),
        ])
    func resolvesWhatNeedsIt(path: String, expected: String) {
        #expect(POSIX.absolutePath(path) == expected)
        #expect(POSIX.isNormalAbsolutePath(path) == (path == expected))
    }

    @Test("a relative path is taken from the working directory")
    func relativePathsStartAtTheWorkingDirectory() {
        let here = POSIX.absolutePath(".")
        #expect(POSIX.isNormalAbsolutePath(here))
        #expect(POSIX.absolutePath("x/../y") == (here == "/" ? "/y" : here + "/y"))
        #expect(!POSIX.isNormalAbsolutePath("x"))
    }
}
