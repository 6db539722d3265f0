"""The core: build, check, load and call the kernel; the cache, trace, references, timing, files and language. It imports nothing above it."""
