"""What the scripts that run haul as users do share: a one-line failure and the SHA-256 of what a
server serves or a file holds."""
import hashlib
import sys
import urllib.request


def failer(name):
    """A function that prints `NAME: FAILED: message` and exits 1."""
    def fail(message):
        print(f"{name}: FAILED: {message}", file=sys.stderr)
        sys.exit(1)
    return fail


def sha256_of_url(url, timeout=30):
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=timeout) as response:
        while chunk := response.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 16):
            digest.update(chunk)
    return digest.hexdigest()
